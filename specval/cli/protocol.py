"""The commands over protocol files that run nothing: `validate` (parse, hash, frozen state),
`freeze` (record the hash in frozen.lock), `plan` (sample sizes and MDEs) and `seeds` (the
ledger's ranges and the next run's).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specval import protocol as protocols
from specval import seeds
from specval.cli.common import EXIT_FAIL, input_error, load


@click.command()
@click.argument("protocol_files", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path))
def validate(protocol_files) -> None:
    """Parse each protocol (all profiles) and print its canonical hash and frozen state; exit 1 if
    any protocol changed since it was frozen, 2 if any does not parse or is over the Monte Carlo
    budget at a profile (specval.budget)."""
    from specval import budget

    changed = []
    for path in protocol_files:
        try:
            protocol = load(path)
            for name, _ in protocol.profiles:
                protocols.resolve(protocol, name)
            for name in (None, *(name for name, _ in protocol.profiles)):
                budget.check_profile(protocol, name, path)
            state = protocols.registration(protocol, path)
        except protocols.ProtocolError as err:
            input_error(err)
        if state == protocols.CHANGED:
            changed.append(str(path))
        click.echo(
            f"{'CHANGED' if state == protocols.CHANGED else 'ok'} {path}: {protocol.name} {protocol.hash} ({state})"
        )
    if changed:
        click.echo(f"FAIL: {len(changed)} protocol(s) changed since frozen: {', '.join(changed)}")
        sys.exit(EXIT_FAIL)


@click.command()
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
def freeze(protocol_file) -> None:
    """Record PROTOCOL_FILE's canonical hash in the lock file next to it."""
    try:
        lock, digest = protocols.freeze(protocol_file, load)
    except protocols.ProtocolError as err:
        input_error(err)
    click.echo(f"frozen {protocol_file}: {digest} in {lock}")


@click.command()
@click.option(
    "--tv",
    default=None,
    type=click.FloatRange(0, 1, min_open=True),
    help="Target total-variation distance: print the samples needed.",
)
@click.option(
    "--n", "num_samples", default=None, type=click.IntRange(1, protocols.MAX_INT), help="Samples: print the MDE."
)
@click.option(
    "--bins",
    default=None,
    type=click.IntRange(2, protocols.MAX_INT),
    help="Cells of the test (default: the protocol's top_k).",
)
@click.option(
    "--alpha",
    default=None,
    type=click.FloatRange(protocols.MIN_ALPHA, protocols.MAX_ALPHA),
    help="Level (default: the protocol's, else 0.01).",
)
@click.option(
    "--power",
    default=None,
    type=click.FloatRange(protocols.MIN_POWER, protocols.MAX_POWER),
    help="Power (default: the protocol's, else 0.8).",
)
@click.option("--protocol", "protocol_file", default=None, type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None, help="Profile of --protocol whose samples per group are planned.")
@click.option(
    "--vocab-size",
    default=None,
    type=click.IntRange(min=2),
    help="Vocabulary size: bounds the cells of a --protocol without top_k.",
)
def plan(tv, num_samples, bins, alpha, power, protocol_file, profile, vocab_size) -> None:
    """Samples needed for a target TV (--tv), or the MDE of a sample size (--n), or every criterion of
    a protocol (--protocol) at its Holm level and confirmation rule."""
    from specval.distribution import plan as planning

    try:
        if protocol_file and _print_sequence_plan(protocol_file, profile):
            return
        protocol = protocols.resolve(protocols.load_protocol(protocol_file), profile) if protocol_file else None
        if protocol is not None and tv is None and num_samples is None:
            _print_protocol_plan(protocol, planning.protocol_plan(protocol, vocab_size))
            return
        alpha = alpha if alpha is not None else (protocol.alpha if protocol else 0.01)
        power = power if power is not None else (protocol.power if protocol else 0.8)
        if bins is None:
            if protocol is None:
                raise ValueError("--bins is required without --protocol")
            bins = planning.protocol_bins(protocol, vocab_size)
        if tv is not None:
            result = planning.samples_for(tv, bins, alpha, power)
            click.echo(
                f"TV >= {tv:g} over {bins} cells at alpha {alpha:g}, power {power:g}: "
                f"{result.samples_gof} samples (goodness of fit), "
                f"{result.samples_per_group_homogeneity} per group (homogeneity)"
            )
            return
        n = num_samples
        if n is None:
            raise ValueError("give --tv, --n or --protocol")
        result = planning.mde_for(n, bins, alpha, power)
    except (protocols.ProtocolError, ValueError) as err:
        input_error(err)
    click.echo(
        f"n = {n} over {bins} cells at alpha {alpha:g}: deviations of TV >= {result.mde_gof:.4g} "
        f"(goodness of fit) or >= {result.mde_homogeneity:.4g} (homogeneity, two groups of n) would "
        f"have been detected with power >= {power:g}"
    )


def _print_sequence_plan(protocol_file: Path, profile: str | None) -> bool:
    """Print the plan of a sequence protocol and return True; False for a protocol of another kind."""
    from specval import budget
    from specval.kinds import read_protocol_file
    from specval.sequence.looks import plan_lines
    from specval.sequence.plan import protocol_plan
    from specval.sequence.protocol import SEQUENCE_KIND, resolve

    loaded = read_protocol_file(protocol_file)
    if loaded.kind.name != SEQUENCE_KIND:
        return False
    protocol = resolve(loaded.load(), profile)
    click.echo(
        f"{protocol.name} ({protocol.profile or 'default'}): {protocol.sequences_per_group} sequences of "
        f"{protocol.sequence_length} tokens per group, alpha {protocol.alpha:g}, power {protocol.power:g}"
    )
    for line in plan_lines(protocol):
        click.echo(line)
    click.echo(budget.planned_cost(protocol).line())
    for row in protocol_plan(protocol):
        mde = f">= {row.mde:.4g}" if row.mde is not None else ""
        click.echo(
            f"  {row.criterion} ({row.role}, m = {row.family_size}, level {row.level:.3g}, n = {row.n}): "
            f"{row.label} {mde}".rstrip()
        )
    return True


def _print_protocol_plan(protocol, rows) -> None:
    from specval import budget
    from specval.distribution import looks

    stages = "two-stage confirmation" if protocol.confirmation.is_two_stage else "one stage"
    if protocol.sequential is not None:
        sizes = looks.schedule(protocol, protocol.alpha)
        stages += (
            f", {protocol.sequential.spending} looks at {', '.join(str(x.samples_per_group) for x in sizes)} "
            f"samples per group (levels below: the last look's)"
        )
    click.echo(
        f"{protocol.name} ({protocol.profile or 'default'}): {protocol.samples_per_group} samples per group, "
        f"alpha {protocol.alpha:g}, power {protocol.power:g}, {stages}"
    )
    click.echo(budget.planned_cost(protocol).line())
    for row in rows:
        levels = ", ".join(f"{level:.3g}" for level in row.levels)
        click.echo(
            f"  {row.criterion} ({row.role}, m = {row.family_size}, level {levels}, df <= {row.df_bound}): "
            f"{row.label} >= {row.mde_tv:.4g}"
        )


@click.command(name="seeds")
@click.argument("protocol_file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--profile", default=None)
@click.option("--output", default=Path("results"), type=click.Path(file_okay=False, path_type=Path), show_default=True)
def seeds_command(protocol_file, profile, output) -> None:
    """List the seed ranges held in the ledger and those the next run would take."""
    try:
        protocol = protocols.resolve(protocols.load_protocol(protocol_file), profile)
        ledger = seeds.read_ledger(output)
    except (protocols.ProtocolError, ValueError) as err:
        input_error(err)
    held = [r for r in ledger if r.protocol == protocol.name]
    for r in held:
        click.echo(f"held  {r.run:<40} {r.group:<12} [{r.start}, {r.stop})")
    nxt = seeds.allocate(
        ledger, protocol.name, "next", [g.name for g in protocol.groups], protocol.samples_per_group, protocol.seed_base
    )
    for r in nxt:
        click.echo(f"next  {'(next run)':<40} {r.group:<12} [{r.start}, {r.stop})")
