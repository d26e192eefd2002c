"""`python -m specval ...` (and `torchrun ... -m specval run ...`): the specval command line.

`entry` is also the `specval` console script. It imports and runs the command line inside a
guard, so a missing third-party package (an environment that lacks one of specval's
dependencies), whether imported at start or on first use (cryptography, when a command signs or
checks a signature), ends in one line naming the package and exit 5, never in a traceback.
"""

from __future__ import annotations

import sys

EXIT_ENVIRONMENT = 5  # specval.execution.EXIT_ENVIRONMENT; a literal so that nothing is imported first


def entry() -> None:
    try:
        from specval.cli import main

        main(prog_name="specval")
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if not missing or missing == "specval":
            raise  # a module of specval itself: a bug, not the environment
        sys.stderr.write(
            f"specval: the package '{missing}' that specval needs is not installed in this Python "
            f"({sys.executable}): install specval's dependencies (`pip install specval`, or "
            "`bash scripts/setup.sh` in a checkout)\n"
        )
        raise SystemExit(EXIT_ENVIRONMENT) from None


if __name__ == "__main__":
    entry()
