"""The commands that check the harness and an adapter rather than a sampler: `mutate` (the kill
table of planted bugs), `calibrate` (A/A false-FAIL rates next to nominal) and `check-adapter`
(the adapter contract without a protocol run).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specval import bundle as bundles
from specval import channel, seeds
from specval import protocol as protocols
from specval.cli.common import EXIT_FAIL, EXIT_PASS, input_error


@click.command()
@click.argument("protocol_paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--profile", default="ci", show_default=True, help="Scale profile of every mutant run.")
@click.option(
    "--output",
    default=Path("results"),
    type=click.Path(file_okay=False, path_type=Path),
    show_default=True,
    help="Root under which the mutate directory (bundles, kill table) is made.",
)
@click.option(
    "--mutant",
    "names",
    multiple=True,
    help="Only these mutants of the suite's adapter (repeatable; default: all it lists).",
)
@click.option(
    "--samples",
    default=None,
    type=click.IntRange(min=1),
    help="Samples per group instead of the profile's (reduced runs, e.g. in tests).",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Mutants run in this many processes (the table's rows keep their order).",
)
def mutate(protocol_paths, profile, output, names, samples, workers) -> None:
    """Run a protocol suite (PROTOCOL_PATHS: files, or directories of *.yaml, all with one adapter)
    against every planted bug the adapter lists (`Capabilities.mutants`) and the harness's seed
    collision, and write the kill table (exit 0 iff every mutant behaves as targeted: equivalent ones
    pass every protocol, every other one is killed by one, or its exact TV lies below the t1 MDEs)."""
    from specval.distribution import mutate as mutation

    try:
        root, table = mutation.mutate(
            tuple(protocol_paths), profile, output, tuple(names), samples, " ".join(bundles.invocation()), workers
        )
    except (protocols.ProtocolError, ValueError) as err:
        input_error(err)
    click.echo((root / mutation.KILL_TABLE_MD).read_text())
    click.echo(f"kill table: {root / mutation.KILL_TABLE_JSON}")
    _exit_ok_if(all(row["as_expected"] for row in table), "mutate")


@click.command(name="check-adapter")
@click.argument("adapter")
@click.option(
    "--protocol",
    "protocol_file",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Take the sut settings, prompt, sampling, groups and K from this protocol (nothing is run).",
)
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="A sut.options entry for the adapter's constructor (VALUE read as YAML; repeatable).",
)
@click.option(
    "--num-speculative-tokens",
    "-k",
    default=None,
    type=click.IntRange(min=1),
    help="K given to the constructor (default: the protocol's, else 2).",
)
def check_adapter(adapter, protocol_file, options, num_speculative_tokens) -> None:
    """Exercise ADAPTER ("package.module:Class" or an entry point name) the way a run does, without
    a protocol run, and print what to fix: contract shapes and dtypes, token ranges and counts,
    seeded reproducibility, batch independence, distinct seeds, cache-free target logits, a coarse
    exact quadrature, vectorised accept_single, speed, describe().

    Exit status: 0 nothing to fix (advice may be printed), 1 something to fix, 2 the adapter cannot
    be loaded or constructed, or a bad --protocol / --option."""
    import dataclasses

    from specval import adapter_check as checks
    from specval.sut import SUTError

    try:
        extra = _options(options)
        k = num_speculative_tokens
        if protocol_file is not None:  # a distribution or a sequence protocol
            protocol = checks.with_adapter(checks.load_protocol(protocol_file), adapter, extra)
            protocol = protocol if k is None else dataclasses.replace(protocol, num_speculative_tokens=k)
            findings = checks.run_checks(protocol, protocol_file)
        else:
            protocol = checks.check_protocol(adapter, extra, k or checks.DEFAULT_SPECULATIVE_TOKENS)
            findings = checks.run_checks(protocol)
    except (protocols.ProtocolError, checks.CannotLoad, SUTError) as err:
        input_error(f"cannot load adapter {adapter!r}: {err}" if not isinstance(err, protocols.ProtocolError) else err)
    except SystemExit as err:  # adapter code called sys.exit (on import, say): never its status, 0 would read OK
        input_error(f"cannot load adapter {adapter!r}: its code raised SystemExit({err.code!r})")
    for finding in findings:
        click.echo(finding.line())
    fixes = [f for f in findings if f.level == checks.FIX]
    advice = sum(f.level == checks.ADVICE for f in findings)
    click.echo(
        f"{'FIX' if fixes else 'OK'}: {adapter}: {len(fixes)} to fix, {advice} advice, "
        f"{len(findings) - len(fixes) - advice} ok (docs/harness.md section 8)"
    )
    _exit_ok_if(not fixes, "check-adapter")


def _exit_ok_if(ok: bool, command: str) -> None:
    """Exit 0 if `ok` (told to the supervisor first: its 0 stands on this report), else 1."""
    if ok:
        channel.report_ok(command)
    sys.exit(EXIT_PASS if ok else EXIT_FAIL)


def _options(pairs: tuple[str, ...]) -> dict:
    """--option KEY=VALUE pairs as sut.options (values read as YAML); ValueError naming a bad pair."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise protocols.ProtocolError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise protocols.ProtocolError(f"--option {pair!r}: the value is not YAML ({err})") from err
    return out


@click.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--replicates", default=200, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--samples",
    default=None,
    type=click.IntRange(min=1),
    help="Samples per group of each replicate (default: the profile's samples_per_group).",
)
@click.option("--profile", default=None)
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path), show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--resume",
    default=None,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Continue a killed calibration in its bundle (same protocol, replicates, samples).",
)
@click.option(
    "--exact",
    is_flag=True,
    help="Draw every group straight from the float64 reference (calibrates the statistics alone).",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Processes sharing the replicates (with --exact: their sampling and evaluation; else their evaluation).",
)
def calibrate(protocol_file, replicates, samples, profile, output, quiet, resume, exact, workers) -> None:
    """A/A calibration: FAIL rate per criterion, per family and per run (95% CI) next to nominal."""
    from specval.distribution import calibrate as calibration
    from specval.sut import SUTError

    try:
        size = samples or protocols.resolve(protocols.load_protocol(protocol_file), profile).samples_per_group
        if exact:
            path, result = calibration.calibrate_exact_file(protocol_file, profile, output, replicates, size, workers)
        else:
            path, result = calibration.calibrate(
                protocol_file, profile, output, replicates, size, progress=not quiet, resume=resume, workers=workers
            )
    except (protocols.ProtocolError, seeds.SeedOverlapError, SUTError, ValueError) as err:
        input_error(err)
    for name, row in list(result["criteria"].items()) + [(f"family {r}", f) for r, f in result["families"].items()]:
        ks = row.get("ks_uniformity")
        ks_text = f"; KS p = {ks['p_value']:.3g}" if ks else ""
        low, high = row["rate_ci95"]
        click.echo(
            f"  {name}: {row['failures']}/{result['replicates']} FAIL = {row['rate']:.4f} "
            f"[{low:.4f}, {high:.4f}] vs nominal {row.get('nominal', row.get('alpha'))}{ks_text}"
        )
    run = result["run"]
    click.echo(
        f"run: {run['failures']}/{result['replicates']} FAIL = {run['rate']:.4f} "
        f"[{run['rate_ci95'][0]:.4f}, {run['rate_ci95'][1]:.4f}] vs bound {run['bound']:.3g}"
    )
    for look in result.get("sequential", {}).get("looks", []):
        click.echo(
            f"look {look['look']} ({look['samples_per_group']} per group, level {look['level']:.3g}): "
            f"{look['stopped']}/{result['replicates']} stopped here, {look['failures']} with FAIL"
        )
    click.echo(f"calibration: {path}")
    _exit_ok_if(True, "calibrate")
