"""Looks: one stage of a protocol with `sequential` looks, collected and decided look by look.

    for each look k (n_k = ceil(t_k n) samples per group, level_k of the spent alpha):
        advance: seeds [start, start + n_k) of every group are in the stage (collected, or read)
        evaluate: the stage's criteria on those samples, Holm at level_k
        stop with the stage's verdict at the first look where `stops(summary)`, else at the last

`walk` is the one loop of both the run and `specval verify`: the run's `advance` collects (chunks
break at every look's size, so a resumed run finds the chunks it wrote) and extends the
reference; verify's slices the samples already in the bundle. Both evaluate from the same
files with the same Monte Carlo keys (the seed range of each look), so a recomputed summary,
the look it stopped at and every earlier look's verdict equal the run's.

Guarantee (`specval.stats.sequential`): a stage whose looks are decided at levels summing to its
alpha FAILs a correct SUT with probability <= alpha per p-valued family, however the looks depend
on each other; it PASSes only at its last look, on every planned sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specval.protocol import Protocol
from specval.seeds import SeedRange
from specval.stats.sequential import Boundary, look_sizes, spend

RULE = (
    "at each look the gating criteria are decided at the look's share of alpha (Holm within each family); "
    "the stage stops with FAIL at the first look that FAILs and PASSes only at the last look"
)


@dataclass(frozen=True)
class Look:
    """One pre-registered look: the `index`-th (0-based), after `samples_per_group` samples of each
    group (`fraction` of the planned size), decided at `level`."""

    index: int
    fraction: float
    samples_per_group: int
    level: float
    is_final: bool


def boundary(protocol: Protocol, alpha: float) -> Boundary:
    """The protocol's looks spending `alpha` (its alpha, or alpha_stage2 for a second stage)."""
    return spend(alpha, protocol.sequential.looks, protocol.sequential.spending)


def schedule(protocol: Protocol, alpha: float) -> tuple[Look, ...]:
    """The looks of one stage of `protocol` (resolved: its profile's samples per group)."""
    spent = boundary(protocol, alpha)
    sizes = look_sizes(protocol.samples_per_group, spent.fractions)
    last = len(sizes) - 1
    return tuple(
        Look(k, f, n, level, k == last) for k, (f, n, level) in enumerate(zip(spent.fractions, sizes, spent.levels))
    )


def final_level(protocol: Protocol, alpha: float) -> float:
    """The level the last look decides at: `alpha` itself without looks (the printed MDE uses it)."""
    return alpha if protocol.sequential is None else boundary(protocol, alpha).final_level


def prefix(ranges: Sequence[SeedRange], size: int) -> list[SeedRange]:
    """The first `size` seeds of every range."""
    return [dataclasses.replace(r, stop=r.start + size) for r in ranges]


def segments(ranges: Sequence[SeedRange], looks: Sequence[Look]) -> list[SeedRange]:
    """Every range cut at each look's size: [start + n_{k-1}, start + n_k) for the `looks` given,
    in the order of `ranges`, so that chunks never straddle a look (`collect.plan_chunks` splits
    each segment)."""
    bounds = [0] + [look.samples_per_group for look in looks]
    return [
        dataclasses.replace(r, start=r.start + a, stop=r.start + b) for r in ranges for a, b in zip(bounds, bounds[1:])
    ]


def look_protocol(protocol: Protocol, look: Look, alpha_stage2: float | None = None) -> Protocol:
    """The protocol one look is evaluated under: its level as alpha, its size as the samples per
    group, no looks (the look is a fixed-size test); `alpha_stage2`: the final level of the second
    stage (the MDE of a two-stage criterion). The hash stays the protocol's."""
    confirmation = protocol.confirmation
    if alpha_stage2 is not None:
        confirmation = dataclasses.replace(confirmation, alpha_stage2=alpha_stage2)
    return dataclasses.replace(
        protocol,
        alpha=look.level,
        samples_per_group=look.samples_per_group,
        sequential=None,
        confirmation=confirmation,
        file_hash=protocol.hash,
    )


@dataclass(frozen=True)
class Walked:
    """Where a stage's walk ended: the summary of its last evaluated look, that look, and one
    record per evaluated look (look, size, level, verdict, failing gating criteria)."""

    summary: dict
    look: Look
    records: tuple[dict, ...]


def _record(look: Look, summary: dict, failing: Callable[[dict], list[str]]) -> dict:
    return {
        "look": look.index + 1,
        "fraction": look.fraction,
        "samples_per_group": look.samples_per_group,
        "level": look.level,
        "verdict": summary["verdict"],
        "failing": failing(summary),
    }


def walk(
    looks: Sequence[Look],
    advance: Callable[[Look], None],
    evaluate: Callable[[Look], dict],
    stops: Callable[[dict], bool],
    failing: Callable[[dict], list[str]],
) -> Walked:
    """Advance to each look, evaluate it, and stop at the first look whose summary `stops` (or at
    the last). `failing(summary)`: the gating criteria that FAIL, for the look's record."""
    records = []
    for look in looks:
        advance(look)
        summary = evaluate(look)
        records.append(_record(look, summary, failing))
        if look.is_final or stops(summary):
            return Walked(summary, look, tuple(records))
    raise ValueError("a schedule ends with its final look")  # unreachable: `schedule` marks the last look


def block(protocol: Protocol, alpha: float, walked: Walked) -> dict:
    """The summary's `sequential` entry of one stage: the rule, the boundary, where it stopped."""
    spent = boundary(protocol, alpha)
    return entry(RULE, spent, look_sizes(protocol.samples_per_group, spent.fractions), walked)


def entry(rule: str, spent: Boundary, sizes: Sequence[int], walked: Walked) -> dict:
    """A `sequential` entry of any kind: `rule`, the boundary `spent` with the samples per group at
    each look (`sizes`), where the walk stopped and one record per look it evaluated."""
    return {
        "rule": rule,
        "spending": spent.spending,
        "alpha": spent.alpha,
        "looks": list(spent.fractions),
        "levels": list(spent.levels),
        "samples_per_group": list(sizes),
        "num_looks": spent.num_looks,
        "stopped_at_look": walked.look.index + 1,
        "stopped_early": not walked.look.is_final,
        "samples_per_group_at_stop": walked.look.samples_per_group,
        "records": list(walked.records),
    }


def stop_text(entry: dict) -> str:
    """Where a stage stopped, in words: "stopped at look 1 of 4, 300 of 3000 samples per group"."""
    where = "stopped" if entry["stopped_early"] else "decided"
    return (
        f"{where} at look {entry['stopped_at_look']} of {entry['num_looks']}, "
        f"{entry['samples_per_group_at_stop']} of {entry['samples_per_group'][-1]} samples per group"
    )
