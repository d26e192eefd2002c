"""The performance kind on the command line: `specval bench`, and the run of a performance
protocol that `specval run` hands over: each pair's ratio, the interval, the verdict, its exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specval import bundle as bundles
from specval import execution, seeds
from specval import protocol as protocols
from specval.cli.common import (
    NOT_ANNOUNCED,
    fail_with,
    input_error,
    kind_of,
    no_verdict,
    read,
    recording,
    sign_sealed,
)
from specval.kinds import ProtocolFile
from specval.performance.protocol import PERFORMANCE_KIND


def run_bench(
    given: ProtocolFile, protocol_file: Path, profile, output: Path, exploratory: bool, quiet: bool, signer=None
) -> None:
    """Run a performance protocol, print each pair's ratio, the interval and the verdict; exit with its code."""
    from specval.preflight import SUTRaised

    kept = "is kept unsealed; a performance run is not resumed: start a new one"
    announced: list[Path] = []
    try:
        with execution.signals_interrupt():
            path, summary = given.kind.runner()(
                protocol_file,
                profile,
                output,
                exploratory=exploratory,
                progress=not quiet,
                parsed=given.load(),
                announce=recording(announced, lambda p: click.echo(f"bundle: {p}")),
            )
    except (protocols.ProtocolError, bundles.BundleError) as err:
        input_error(err)
    except SUTRaised as err:  # building the engines, before any bundle
        fail_with(execution.EXIT_SUT, f"error: {err}; no bundle was started")
    except execution.RunFailed as err:
        fail_with(execution.EXIT_SUT, f"error: {err}; traceback in {err.log}; the bundle {err.path} {kept}")
    except execution.RunInterrupted as err:
        fail_with(execution.EXIT_INTERRUPTED, f"interrupted; the bundle {err.path} {kept}")
    except KeyboardInterrupt:
        fail_with(execution.EXIT_INTERRUPTED, "interrupted; no bundle was started")
    except (execution.EnvironmentFailed, OSError, SystemExit, seeds.LedgerError) as err:
        no_verdict(err, announced, lambda path: f"; the bundle {path} {kept}" if path else NOT_ANNOUNCED)
    _print_bench(summary, path)
    sign_sealed(path, signer)
    sys.exit(execution.verdict_exit(summary["verdict"]))


def _print_bench(summary: dict, path: Path) -> None:
    proto, ratio = summary["protocol"], summary["ratio"]
    click.echo(
        f"{proto['statistic']} ratio b / a per pair ({summary['arms']['a']['name']} = a, "
        f"{summary['arms']['b']['name']} = b):"
    )
    for pair in summary["pairs"]:
        click.echo(
            f"  pair {pair['pair']:>3} {pair['order']}: a {pair['a']:.6g}  b {pair['b']:.6g}  ratio {pair['ratio']:.4f}"
        )
    click.echo(
        f"median ratio {ratio['median']:.4f}, exact order-statistic interval [{ratio['low']:.4f}, "
        f"{ratio['high']:.4f}] (coverage {ratio['coverage']:.4f} >= {ratio['confidence']:g}); "
        f"{proto['hypothesis']} threshold {summary['threshold']:.4f}"
    )
    marker = "EXPLORATORY " if summary.get("registration", {}).get("exploratory") else ""
    click.echo(f"{marker}{summary['verdict']}: {summary['reason']}")
    click.echo(f"bundle: {path}")


@click.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None, help="Scale profile of the protocol (e.g. ci, full).")
@click.option(
    "--output",
    default=Path("results"),
    type=click.Path(path_type=Path),
    show_default=True,
    help="Root directory of bundles.",
)
@click.option(
    "--exploratory",
    is_flag=True,
    help="Run a protocol that is not frozen in frozen.lock, or changed since; the verdict says EXPLORATORY.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def bench(protocol_file, profile, output, exploratory, quiet) -> None:
    """Time the two arms of a performance protocol (kind: performance) in ABBA order: two engine
    configurations, or two groups of another adapter.

    Exit status: 0 PASS, 1 FAIL, 2 input or usage error, 3 the engine raised or exited, 4 INCONCLUSIVE,
    5 environment error (disk full, permissions...), 130 interrupted. `specval run` on a performance
    protocol does the same."""
    given = read(protocol_file)
    if kind_of(given).name != PERFORMANCE_KIND:
        input_error(f"{protocol_file}: kind: not a performance protocol (`kind: {PERFORMANCE_KIND}`); use specval run")
    run_bench(given, protocol_file, profile, output, exploratory, quiet)
