"""Looks: a sequence protocol with `sequential` looks, collected and decided look by look.

    for each look k (b_k = protocol.look_batches[k] whole batches of every group, level_k of alpha):
        advance: batches [b_{k-1}, b_k) of every group are on disk with their reference parts
                 (the run collects them, group by group, the re-runs with the first look, and
                 replays them into samples/<group>-reference-look<k>.parquet; verify reads them)
        evaluate: every criterion on batches [0, b_k) of every group, Holm within each role at
                  level_k (`look_protocol`: the look's level as alpha, its size as the planned one)
        stop with FAIL at the first look whose verdict is FAIL; PASS (or INCONCLUSIVE) at the last

The walk is the distribution kind's (`specval.distribution.looks.walk`), with the same spending
(`specval.stats.sequential.spend`) and stop rule. A look sees every group at the same fraction:
the collection goes look segment by look segment (`collect.plan_batches`), and a look's batches
are whole, so its adjacent and cross pairs are those of a fixed-size run of its size. Nothing is
collected after the look that stops: the bundle holds the batches up to it, and verify refuses a
bundle holding more (`check_collected`). A resumed run re-evaluates the looks already passed (the
same verdicts: each is a function of the files) and collects from the first missing batch.

Streams: the randomized-PIT uniforms and Monte Carlo nulls are keyed as in a fixed-size run
(protocol hash, group, criterion, the group's first seed), so a token's PIT uniform is the same at
every look that sees it; verify redraws every look bit for bit.

Guarantee (`specval.stats.sequential`): each look's p-values are those of a fixed-size run of the
look's size, valid at that size, and the looks' levels sum to alpha, so by Boole's inequality a
correct SUT FAILs a role's family with probability <= alpha over all looks, whatever the dependence
between looks (they share batches and uniforms) and criteria. The price is the last look's level
(alpha / K with `pocock`): every printed MDE, and `specval plan`, is at that level.
`python -m benchmarks.sequence_calibration --looks` measures the rate on the null model.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from specval import bundle as bundles
from specval.distribution import looks as distribution_looks
from specval.distribution.decision import FAIL, gating_failures
from specval.distribution.looks import Look, Walked
from specval.semantics import FilterSemantics
from specval.sequence import collect, reference, verdict
from specval.sequence.protocol import SequenceProtocol
from specval.stats.sequential import Boundary, spend
from specval.sut import SUT

RULE = (
    "at each look every criterion is decided at the look's share of alpha (Holm within each role); "
    "the run stops with FAIL at the first look that FAILs and PASSes only at the last look"
)
REFERENCE_LOOK = "-reference-look{}.parquet"  # samples/<group> + this: the parts of look k's new batches
COMPANIONS_LOOK = "-companions-look{}.parquet"  # likewise, the companions' status


def boundary(protocol: SequenceProtocol) -> Boundary:
    """The looks' levels: the protocol's alpha spent over its `sequential` looks."""
    return spend(protocol.alpha, protocol.sequential.looks, protocol.sequential.spending)


def schedule(protocol: SequenceProtocol) -> tuple[Look, ...]:
    """The looks of a resolved protocol; a look's `samples_per_group` counts sequences (whole
    batches: `protocol.look_batches`)."""
    spent, bounds = boundary(protocol), protocol.look_batches
    last = len(bounds) - 1
    return tuple(
        Look(k, fraction, batches * protocol.batch_size, level, k == last)
        for k, (fraction, batches, level) in enumerate(zip(spent.fractions, bounds, spent.levels))
    )


def final_alpha(protocol: SequenceProtocol) -> float:
    """The level a PASS is decided at: the last look's, or alpha itself without looks."""
    return protocol.alpha if protocol.sequential is None else boundary(protocol).final_level


def batches(protocol: SequenceProtocol, look: Look) -> int:
    """Batches per group the look sees."""
    return look.samples_per_group // protocol.batch_size


def new_batches(protocol: SequenceProtocol, look: Look) -> range:
    """The batches of every group first seen at `look`: [b_{k-1}, b_k)."""
    return range(0 if look.index == 0 else protocol.look_batches[look.index - 1], batches(protocol, look))


def look_protocol(protocol: SequenceProtocol, look: Look) -> SequenceProtocol:
    """The protocol one look is evaluated under: its level as alpha, its sequences as the planned
    size, no looks (the look is a fixed-size test). The hash stays the protocol's."""
    return dataclasses.replace(
        protocol,
        alpha=look.level,
        sequences_per_group=look.samples_per_group,
        sequential=None,
        file_hash=protocol.hash,
    )


# ---------------------------------------------------------------- reference parts, look by look


def suffixes(look: Look | None, companions: bool = False) -> list[str]:
    """The reference files (after `samples/<group>`) of the batches `look` sees: the one file of a
    fixed-size run (`look` None), else one per look up to `look`."""
    if look is None:
        return [reference.COMPANIONS_SUFFIX if companions else reference.REFERENCE_SUFFIX]
    template = COMPANIONS_LOOK if companions else REFERENCE_LOOK
    return [template.format(k + 1) for k in range(look.index + 1)]


def load_parts(path: Path, group: str, look: Look | None, companions: bool = False) -> pd.DataFrame:
    """The reference parts (or companions' status) of the batches `look` sees, sorted by (batch,
    slot, index)."""
    tables = [reference.load(path, group, suffix) for suffix in suffixes(look, companions)]
    return pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]


def _part_file(path: Path, group: str, suffix: str) -> Path:
    return path / bundles.SAMPLES_DIR / f"{group}{suffix}"


def extend_reference(
    sut: SUT,
    protocol: SequenceProtocol,
    prompt_ids: list[list[int]],
    path: Path,
    look: Look,
    semantics: FilterSemantics,
) -> None:
    """Replay the batches new at `look` (`new_batches`) of every group lacking their parts, into
    samples/<group>-reference-look<k>.parquet (and -companions-look<k> for a group with
    companions), written as chunks (hashes recorded, resumable). Each part is a function of its own
    row of logits (`reference.build_group`), so the parts equal those of a fixed-size run."""
    white_box, number = reference.source_groups(protocol), look.index + 1
    for group in protocol.groups:
        parts = _part_file(path, group.name, REFERENCE_LOOK.format(number))
        status = _part_file(path, group.name, COMPANIONS_LOOK.format(number)) if group.companions else None
        if parts.exists() and (status is None or status.exists()):
            continue
        main, companions, _ = collect.load_tables(path, protocol, group.name, new_batches(protocol, look))
        if not parts.exists():
            table = reference.build_group(
                sut, protocol, prompt_ids, main, semantics, group.name, group.name in white_box
            )
            bundles.write_chunk(path, parts, functools.partial(table.to_parquet, index=False))
        if status is not None and not status.exists():
            table = reference.build_companions(sut, protocol, prompt_ids, companions, group.name, semantics)
            bundles.write_chunk(path, status, functools.partial(table.to_parquet, index=False))


# ---------------------------------------------------------------- the walk and its record


def walk(protocol: SequenceProtocol, advance: Callable[[Look], None], evaluate: Callable[[Look], dict]) -> Walked:
    """Advance to each look and evaluate it, stopping at the first whose verdict is FAIL (or at the
    last): the distribution kind's walk and stop rule."""
    return distribution_looks.walk(
        schedule(protocol), advance, evaluate, lambda summary: summary["verdict"] == FAIL, gating_failures
    )


def block(protocol: SequenceProtocol, walked: Walked) -> dict:
    """The summary's `sequential` entry: the rule, the boundary (fractions, levels, batches and
    sequences per group at each look), where the run stopped and one record per look evaluated."""
    bounds = protocol.look_batches
    sizes = [b * protocol.batch_size for b in bounds]
    return distribution_looks.entry(RULE, boundary(protocol), sizes, walked) | {"batches_per_group": list(bounds)}


def stop_text(entry: dict) -> str:
    """Where a run stopped, in words: "stopped at look 1 of 2, 200 of 400 sequences per group"."""
    where = "stopped" if entry["stopped_early"] else "decided"
    return (
        f"{where} at look {entry['stopped_at_look']} of {entry['num_looks']}, "
        f"{entry['samples_per_group_at_stop']} of {entry['samples_per_group'][-1]} sequences per group"
    )


def finish(protocol: SequenceProtocol, walked: Walked) -> dict:
    """The walked look's summary with the `sequential` entry and its stop in the reason (a copy)."""
    summary = dict(walked.summary)
    summary["sequential"] = block(protocol, walked)
    summary["reason"] = f"{summary['reason']} (sequential: {stop_text(summary['sequential'])})"
    return summary


def check_collected(path: Path, protocol: SequenceProtocol, walked: Walked) -> None:
    """BundleError unless every group holds exactly the batches of the look the walk stopped at:
    a bundle whose run stopped early holds nothing of later looks."""
    expected = batches(protocol, walked.look)
    for group in protocol.groups:
        found = len(collect.batch_files(path, group.name))
        if found != expected:
            raise bundles.BundleError(
                f"{path / bundles.SAMPLES_DIR}: group {group.name!r} holds {found} batches, but the looks "
                f"stop at look {walked.look.index + 1} ({expected} batches)"
            )


def plan_lines(protocol: SequenceProtocol) -> list[str]:
    """What `specval plan` prints of a protocol's looks: the rule and, per look, its batches,
    sequences, level and Holm's first step per role (empty without looks)."""
    if protocol.sequential is None:
        return []
    sizes = verdict.family_sizes(protocol)
    lines = [
        f"  {protocol.sequential.spending} looks spending alpha {protocol.alpha:g}: stop with FAIL at the "
        "first look that FAILs, PASS only at the last (the criteria below: at the last look's level)"
    ]
    for look in schedule(protocol):
        steps = ", ".join(f"{role} {look.level / m:.3g} (m = {m})" for role, m in sorted(sizes.items()))
        lines.append(
            f"  look {look.index + 1} at {look.fraction:g}: {batches(protocol, look)} of {protocol.num_batches} "
            f"batches ({look.samples_per_group} sequences) per group, level {look.level:.3g}; "
            f"Holm's first step {steps}"
        )
    return lines
