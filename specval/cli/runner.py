"""A run of one distribution, quality or sequence protocol in this process (alone, a suite's
member, or rank 0 of a sharded run) through the Python API: its verdict lines, its JUnit file,
its signature, and its exit status.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specval import bundle as bundles
from specval import execution, seeds
from specval import protocol as protocols
from specval.cli.common import (
    EXIT_ENVIRONMENT,
    NOT_ANNOUNCED,
    fail_with,
    input_error,
    interrupted,
    kept,
    no_verdict,
    recording,
    sign_sealed,
)
from specval.kinds import ProtocolFile


def print_verdict(summary: dict, path: Path) -> None:
    for name, test in sorted(summary["tests"].items()):
        click.echo(f"  {test['verdict']:<12} {test['role']:<9} {name}: {test['reason']}")
    marker = "EXPLORATORY " if summary.get("registration", {}).get("exploratory") else ""
    click.echo(f"{marker}{summary['verdict']}: {summary['reason']}")
    click.echo(f"bundle: {path}")


def _announce(path: Path) -> None:
    click.echo(f"bundle: {path} (resume with: {execution.resume_command(path)})")


def run_here(
    given: ProtocolFile | None,
    protocol_file,
    profile,
    output,
    resume,
    exploratory,
    seed_offset,
    junit,
    quiet,
    signer=None,
    shards=None,
    announced: list[Path] | None = None,
) -> None:
    """The run of `given` (PROTOCOL_FILE as read by `common.read`; None for --resume) through the Python
    API's `specval.api.run_protocol_file` (its kind's runner: distribution or quality, the same run()
    contract) in this process (rank 0 of a sharded run: with the other ranks collecting); exits.
    `announced` (a suite's member run) receives the bundle's path once it exists."""
    from specval import api
    from specval.preflight import SUTRaised
    from specval.report.junit import check_target, write_junit
    from specval.sut import SUTError

    extra = {} if shards is None else {"shards": shards}
    announced = [] if announced is None else announced
    try:
        if junit:
            check_target(junit, "--junit")
        with execution.signals_interrupt():
            result = api.run_protocol_file(
                given,
                protocol_file,
                profile,
                output,
                resume=resume,
                exploratory=exploratory,
                seed_offset=seed_offset,
                progress=not quiet,
                announce=recording(announced, _announce),
                **extra,
            )
    except SUTError as err:  # the system under test refused the protocol's sut settings
        input_error(f"{protocol_file or resume}: sut: {err}")
    except (protocols.ProtocolError, seeds.SeedOverlapError, bundles.BundleError) as err:
        input_error(err)
    except SUTRaised as err:  # the probe, before any seed was claimed
        log = execution.append_log(resume / execution.ERROR_LOG, err) if resume else execution.probe_log(output, err)
        fail_with(execution.EXIT_SUT, f"error: {err}; no seed was claimed; traceback in {log}")
    except execution.RunFailed as err:
        fail_with(
            execution.EXIT_SUT,
            f"error: {err}; traceback in {err.log}; the bundle {err.path} is marked "
            f"ERROR and kept; resume with: {execution.resume_command(err.path)}",
        )
    except execution.RunInterrupted as err:
        interrupted(err.path)
    except KeyboardInterrupt:
        interrupted(None)
    except (execution.EnvironmentFailed, OSError, SystemExit, seeds.LedgerError) as err:
        no_verdict(err, announced, lambda path: kept(path) if path else NOT_ANNOUNCED)
    print_verdict(result.summary, result.bundle)
    sign_sealed(result.bundle, signer)
    if junit:
        try:
            write_junit(result.summary, junit, result.bundle)
        except OSError as err:
            fail_with(
                EXIT_ENVIRONMENT,
                f"error: environment: --junit {junit}: cannot write "
                f"({execution.describe_os_error(err)}); the verdict above stands",
            )
    sys.exit(execution.verdict_exit(result.verdict))
