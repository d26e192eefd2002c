"""Command-line interface of specval (click).

Exit status: 0 PASS, 1 FAIL, 2 usage or input error.
"""

from __future__ import annotations

import click

from specval import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specval")
def main() -> None:
    """Prove that a speculative-decoding sampler preserves the target distribution."""


if __name__ == "__main__":  # pragma: no cover
    main()
