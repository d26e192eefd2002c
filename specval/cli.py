"""Command-line interface of specval (click).

Exit status: 0 PASS, 1 FAIL (or INCONCLUSIVE, or a bundle that does not verify), 2 usage or
input error (bad protocol, overlapping seeds, unsupported group, unreadable bundle).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specval import __version__
from specval import bundle as bundles
from specval import protocol as protocols
from specval import seeds
from specval.quality_protocol import QUALITY_KIND, load_quality_protocol

EXIT_PASS, EXIT_FAIL, EXIT_INPUT = 0, 1, 2
REPORT_FILES = ("report.md", "report.html")


def _input_error(err: Exception | str) -> None:
    click.echo(f"error: {err}", err=True)
    sys.exit(EXIT_INPUT)


def _protocol_kind(path: Path | None) -> str:
    """QUALITY_KIND for a paired quality protocol, else "distribution" (the default schema)."""
    if path is None or not path.is_file():
        return "distribution"
    try:
        raw = protocols.read_yaml(path)
    except protocols.ProtocolError as err:
        _input_error(err)
    return QUALITY_KIND if isinstance(raw, dict) and raw.get("kind") == QUALITY_KIND else "distribution"


def _loader(path: Path):
    """The parser of PATH's protocol kind."""
    return load_quality_protocol if _protocol_kind(path) == QUALITY_KIND else protocols.load_protocol


def _bundle_kind(bundle: Path) -> str:
    """The `kind` recorded in a bundle's summary (QUALITY_KIND or "distribution")."""
    summary_file = bundle / bundles.SUMMARY_FILE
    if not summary_file.exists():
        return "distribution"
    return json.loads(summary_file.read_text()).get("kind", "distribution")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specval")
def main() -> None:
    """Prove that a speculative-decoding sampler preserves the target distribution."""


@main.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, path_type=Path), required=False)
@click.option("--profile", default=None, help="Scale profile of the protocol (e.g. ci, full).")
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path),
              show_default=True, help="Root directory of bundles and of the seed ledger.")
@click.option("--resume", default=None, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Continue a killed run in this bundle (its protocol and seeds are reused).")
@click.option("--confirmatory", is_flag=True, help="Refuse unless the protocol's hash matches the frozen one.")
@click.option("--seed-offset", default=None, type=click.IntRange(min=0),
              help="First seed of the run (still checked against the ledger).")
@click.option("--junit", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def run(protocol_file, profile, output, resume, confirmatory, seed_offset, junit, quiet) -> None:
    """Run PROTOCOL_FILE (or --resume BUNDLE) and print the verdict and the bundle path."""
    from specval import runner
    from specval.report.junit import write_junit
    from specval.sut import SUTError

    if (protocol_file is None) == (resume is None):
        raise click.UsageError("give exactly one of PROTOCOL_FILE or --resume BUNDLE")
    if _protocol_kind(protocol_file) == QUALITY_KIND:
        from specval import quality as runner  # same run() contract, paired quality protocols
    try:
        path, summary = runner.run(protocol_file, profile, output, resume=resume, confirmatory=confirmatory,
                                   seed_offset=seed_offset, progress=not quiet)
    except SUTError as err:  # the system under test refused the protocol's sut settings
        _input_error(f"{protocol_file or resume}: sut: {err}")
    except (protocols.ProtocolError, seeds.SeedOverlapError, bundles.BundleError) as err:
        _input_error(err)
    if junit:
        write_junit(summary, junit)
    for name, test in sorted(summary["tests"].items()):
        click.echo(f"  {test['verdict']:<12} {test['role']:<9} {name}: {test['reason']}")
    click.echo(f"{summary['verdict']}: {summary['reason']}")
    click.echo(f"bundle: {path}")
    sys.exit(EXIT_PASS if summary["verdict"] == "PASS" else EXIT_FAIL)


@main.command()
@click.argument("bundle", type=click.Path(file_okay=False, exists=True, path_type=Path))
def verify(bundle) -> None:
    """Re-hash every file of BUNDLE and recompute every verdict from its raw samples."""
    from specval import runner

    if _bundle_kind(bundle) == QUALITY_KIND:
        from specval import quality as runner  # same verify() contract

    problems = runner.verify(bundle)
    for problem in problems:
        click.echo(f"DIFFERS {problem}")
    if problems:
        click.echo(f"FAIL: {bundle} does not verify ({len(problems)} difference(s))")
        sys.exit(EXIT_FAIL)
    click.echo(f"OK: {bundle} verifies (checksums and recomputed verdicts match)")


@main.command()
@click.argument("bundle", type=click.Path(file_okay=False, exists=True, path_type=Path))
def report(bundle) -> None:
    """Re-render report.md and report.html of BUNDLE and re-seal it (other files must be intact)."""
    from specval import runner

    if _bundle_kind(bundle) == QUALITY_KIND:
        from specval import quality as runner  # same finish() contract
    problems = [p for p in bundles.check_sums(bundle) if p.split(":")[0] not in REPORT_FILES]
    if problems:
        _input_error(ValueError(f"{bundle} has changed files, refusing to re-seal: {'; '.join(problems)}"))
    runner.finish(bundle)
    click.echo(f"rendered {bundle / 'report.md'} and {bundle / 'report.html'}")


@main.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
def freeze(protocol_file) -> None:
    """Record PROTOCOL_FILE's canonical hash in the lock file next to it."""
    try:
        lock, digest = protocols.freeze(protocol_file, _loader(protocol_file))
    except protocols.ProtocolError as err:
        _input_error(err)
    click.echo(f"frozen {protocol_file}: {digest} in {lock}")


@main.command(name="seeds")
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None)
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path),
              show_default=True)
def seeds_command(protocol_file, profile, output) -> None:
    """List the seed ranges held in the ledger and those the next run would take."""
    try:
        protocol = protocols.resolve(protocols.load_protocol(protocol_file), profile)
        ledger = seeds.read_ledger(output)
    except (protocols.ProtocolError, ValueError) as err:
        _input_error(err)
    held = [r for r in ledger if r.protocol == protocol.name]
    for r in held:
        click.echo(f"held  {r.run:<40} {r.group:<12} [{r.start}, {r.stop})")
    nxt = seeds.allocate(ledger, protocol.name, "next", [g.name for g in protocol.groups],
                         protocol.samples_per_group, protocol.seed_base)
    for r in nxt:
        click.echo(f"next  {'(next run)':<40} {r.group:<12} [{r.start}, {r.stop})")


@main.command(name="ls")
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path),
              show_default=True)
def ls_command(output) -> None:
    """List the bundles under --output with their verdicts."""
    for path in sorted(p for p in Path(output).glob("*") if (p / bundles.RUN_FILE).exists()):
        summary_file = path / bundles.SUMMARY_FILE
        verdict = json.loads(summary_file.read_text())["verdict"] if summary_file.exists() else "INCOMPLETE"
        sealed = "sealed" if (path / bundles.SUMS_FILE).exists() else "unsealed"
        click.echo(f"{verdict:<13} {sealed:<9} {path}")


@main.command()
@click.argument("protocol_files", nargs=-1, required=True,
                type=click.Path(dir_okay=False, exists=True, path_type=Path))
def validate(protocol_files) -> None:
    """Parse each protocol (all profiles) and print its canonical hash and frozen state."""
    for path in protocol_files:
        try:
            protocol = _loader(path)(path)
            for name, _ in protocol.profiles:
                protocols.resolve(protocol, name)
        except protocols.ProtocolError as err:
            _input_error(err)
        frozen = protocols.read_lock(protocols.lock_path(path)).get(protocol.name)
        state = "frozen" if frozen == protocol.hash else ("CHANGED since frozen" if frozen else "not frozen")
        click.echo(f"ok {path}: {protocol.name} {protocol.hash} ({state})")



@main.command()
@click.argument("protocol_paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--profile", default="ci", show_default=True, help="Scale profile of every mutant run.")
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path),
              show_default=True, help="Root under which the mutate directory (bundles, kill table) is made.")
@click.option("--mutant", "names", multiple=True, help="Only these mutants (repeatable; default: all).")
@click.option("--samples", default=None, type=click.IntRange(min=1),
              help="Samples per group instead of the profile's (reduced runs, e.g. in tests).")
def mutate(protocol_paths, profile, output, names, samples) -> None:
    """Run a protocol suite (PROTOCOL_PATHS: files, or directories of *.yaml) against every planted
    bug and write the kill table (exit 0 iff every mutant behaves as targeted: equivalent ones pass
    every protocol, every other one is killed by one, or its exact TV lies below the t1 MDEs)."""
    from specval import mutate as mutation

    try:
        root, table = mutation.mutate(tuple(protocol_paths), profile, output, tuple(names), samples,
                                        " ".join(bundles.invocation()))
    except (protocols.ProtocolError, ValueError) as err:
        _input_error(err)
    click.echo((root / mutation.KILL_TABLE_MD).read_text())
    click.echo(f"kill table: {root / mutation.KILL_TABLE_JSON}")
    sys.exit(EXIT_PASS if all(row["as_expected"] for row in table) else EXIT_FAIL)



@main.command()
@click.option("--tv", default=None, type=float, help="Target total-variation distance: print the samples needed.")
@click.option("--n", "num_samples", default=None, type=click.IntRange(min=1), help="Samples: print the MDE.")
@click.option("--bins", default=None, type=click.IntRange(min=2), help="Cells of the test (default: the protocol's top_k).")
@click.option("--alpha", default=None, type=float, help="Level (default: the protocol's, else 0.01).")
@click.option("--power", default=None, type=float, help="Power (default: the protocol's, else 0.8).")
@click.option("--protocol", "protocol_file", default=None, type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None, help="Profile of --protocol whose samples per group are planned.")
def plan(tv, num_samples, bins, alpha, power, protocol_file, profile) -> None:
    """Samples needed for a target TV (--tv), or the MDE of a sample size (--n or --protocol)."""
    from specval import plan as planning

    try:
        protocol = protocols.resolve(protocols.load_protocol(protocol_file), profile) if protocol_file else None
        alpha = alpha if alpha is not None else (protocol.alpha if protocol else 0.01)
        power = power if power is not None else (protocol.power if protocol else 0.8)
        if bins is None:
            if protocol is None:
                raise ValueError("--bins is required without --protocol")
            bins = planning.protocol_bins(protocol)
        if tv is not None:
            result = planning.samples_for(tv, bins, alpha, power)
            click.echo(f"TV >= {tv:g} over {bins} cells at alpha {alpha:g}, power {power:g}: "
                       f"{result.samples_gof} samples (goodness of fit), "
                       f"{result.samples_per_group_homogeneity} per group (homogeneity)")
            return
        n = num_samples or (protocol.samples_per_group if protocol else None)
        if n is None:
            raise ValueError("give --tv, --n or --protocol")
        result = planning.mde_for(n, bins, alpha, power)
    except (protocols.ProtocolError, ValueError) as err:
        _input_error(err)
    click.echo(f"n = {n} over {bins} cells at alpha {alpha:g}: deviations of TV >= {result.mde_gof:.4g} "
               f"(goodness of fit) or >= {result.mde_homogeneity:.4g} (homogeneity, two groups of n) would "
               f"have been detected with power >= {power:g}")



@main.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--replicates", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--samples", default=None, type=click.IntRange(min=1),
              help="Samples per group of each replicate (default: the profile's samples_per_group).")
@click.option("--profile", default=None)
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path),
              show_default=True)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--resume", default=None, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Continue a killed calibration in its bundle (same protocol, replicates, samples).")
def calibrate(protocol_file, replicates, samples, profile, output, quiet, resume) -> None:
    """A/A calibration: FAIL rate per criterion (95% CI) next to alpha, and KS of p-value uniformity."""
    from specval import calibrate as calibration
    from specval.sut import SUTError

    try:
        size = samples or protocols.resolve(protocols.load_protocol(protocol_file), profile).samples_per_group
        path, result = calibration.calibrate(protocol_file, profile, output, replicates, size,
                                             progress=not quiet, resume=resume)
    except (protocols.ProtocolError, seeds.SeedOverlapError, SUTError, ValueError) as err:
        _input_error(err)
    for name, row in result["criteria"].items():
        ks = row.get("ks_uniformity")
        ks_text = f"; KS p = {ks['p_value']:.3g}" if ks else ""
        low, high = row["rate_ci95"]
        click.echo(f"  {name}: {row['failures']}/{row['replicates']} FAIL = {row['rate']:.3f} "
                   f"[{low:.3f}, {high:.3f}] vs alpha {row['alpha']}{ks_text}")
    run = result["run"]
    click.echo(f"run: {run['failures']}/{result['replicates']} FAIL = {run['rate']:.3f} "
               f"[{run['rate_ci95'][0]:.3f}, {run['rate_ci95'][1]:.3f}] vs bound {run['bound']:.3g}")
    click.echo(f"calibration: {path / calibration.CALIBRATION_FILE}")


if __name__ == "__main__":  # pragma: no cover
    main()
