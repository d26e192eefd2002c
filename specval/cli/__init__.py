"""Command-line interface of specval (click): the group `main`, every command registered on it.

Exit status, one meaning each (see specval.execution): 0 PASS (only once a PASS verdict is
written), 1 FAIL (or a bundle that does not verify, a protocol changed since frozen), 2 usage or
input error (bad protocol, overlapping seeds, unsupported group, unreadable bundle), 3 the system
under test raised or exited, 4 INCONCLUSIVE, 5 environment error (an OSError: disk full, file too
large, permissions; a bundle is kept and resumes), 130 interrupted. No command prints a traceback
for any of these.

A command reads a protocol file once and dispatches on its kind through `specval.kinds`. The
modules, each importing `common` and none importing this one:

- `common`: exit statuses and one-line errors, the group class, protocol and bundle reading, the
  option checks of `run`, the keys of --sign and --key;
- `run`: `run`, handing over to `suite`, `performance`, `ranks` (several processes) or `runner`
  (a run in this process);
- `performance`: `bench`; `verify`: `verify`, `report`, `ls`; `protocol`: `validate`, `freeze`,
  `plan`, `seeds`; `sign`: `sign`, `keygen`; `selfcheck`: `mutate`, `calibrate`, `check-adapter`.
"""

from __future__ import annotations

import click

from specval.cli import performance, protocol, run, selfcheck, sign, verify
from specval.cli.common import Cli
from specval.version import __version__


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specval")
def main() -> None:
    """Prove that a speculative-decoding sampler preserves the target distribution."""


for command in (
    run.run,
    performance.bench,
    verify.verify,
    verify.report,
    verify.ls_command,
    protocol.validate,
    protocol.freeze,
    protocol.plan,
    protocol.seeds_command,
    sign.sign,
    sign.keygen,
    selfcheck.mutate,
    selfcheck.check_adapter,
    selfcheck.calibrate,
):
    main.add_command(command)
del command

__all__ = ["main"]
