"""`python -m specval ...` (and `torchrun ... -m specval run ...`): the specval command line.

`entry` is also the `specval` console script. A command that runs adapter code (`run`, `bench`,
`check-adapter`, `mutate`, `calibrate`) is supervised: this process runs it again in a worker and
exits with the status that specval.supervisor decides from the worker's report and the sealed
bundle, so no adapter behaviour (`os._exit`, a signal, a crash) makes it exit 0 without a sealed
PASS. The worker (and any other command) imports and runs the command line inside a guard, so a
missing third-party package (an environment that lacks one of specval's dependencies), whether
imported at start or on first use (cryptography, when a command signs or checks a signature), ends
in one line naming the package and exit 5, never in a traceback.
"""

from __future__ import annotations

import sys

from specval.exits import EXIT_ENVIRONMENT  # the standard library only: nothing third-party is imported first


def entry() -> None:
    from specval import channel, supervisor  # the standard library only: nothing supervised is imported here

    if supervisor.wanted(sys.argv[1:]):
        raise SystemExit(supervisor.supervise(sys.argv))
    with channel.exit_reported():  # a supervised worker tells its supervisor the status it leaves with
        _command_line()


def _command_line() -> None:
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
