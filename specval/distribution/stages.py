"""Stages: a bundle's summary from its files alone, stage by stage.

One stage's summary from its samples and reference.json (`stage_summary`, through
`specval.distribution.verdict.evaluate`); the stage-2 seed ranges run.json records; the Monte
Carlo stream summary.json records; what run.json adds to the summary (`with_plan`). A sequential
protocol's stages are walked look by look (`summarise_looks`), each look's samples collected by the
run or read back by verify (an `Advance`). `recompute` is the whole summary, both stages of a
two-stage protocol included: the one the run writes and the one `specval verify` compares with it,
bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from specval import bundle as bundles
from specval import seeds
from specval.distribution import collect, effects, looks
from specval.distribution.decision import FAIL, confirm, confirms, gating_failures, needs_second_stage
from specval.distribution.reference import Reference
from specval.distribution.verdict import evaluate
from specval.protocol import Protocol
from specval.stats import montecarlo

STAGE2_RUN_SUFFIX = ":stage2"  # ledger run name of a bundle's second stage: "<bundle>:stage2"
MC_STREAM_KEY = "monte_carlo_stream"  # summary.json: the stream of every Monte Carlo p-value in it


def stage2_ranges(path: Path) -> list[seeds.SeedRange]:
    """The stage-2 seed ranges recorded in the bundle's run.json (empty: none claimed)."""
    plan = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE))
    return [seeds.SeedRange(plan.protocol, path.name + STAGE2_RUN_SUFFIX, g, a, b) for g, a, b in plan.stage2_ranges]


def stage_summary(
    directory: Path,
    protocol: Protocol,
    ranges: list[seeds.SeedRange],
    laws: dict,
    samples: pd.DataFrame | None = None,
    stream: str = montecarlo.CURRENT_STREAM,
) -> dict:
    """One stage's summary from its samples (read from `directory` unless given) and reference in
    `directory` (the bundle or stage2/), its Monte Carlo draws from `stream`."""
    if samples is None:
        samples = collect.load_samples(directory, ranges)
    reference = Reference.from_dict(bundles.read_json(directory / bundles.REFERENCE_FILE))
    spans = {r.group: (r.start, r.stop) for r in ranges}
    return evaluate(protocol, samples, reference, laws, spans, stream)


def recorded_stream(path: Path) -> str:
    """The Monte Carlo stream of the bundle's summary.json (`MC_STREAM_KEY`): the legacy one when
    the summary predates the key, the current one when there is no summary yet (a new analysis)."""
    if not (path / bundles.SUMMARY_FILE).is_file():
        return montecarlo.CURRENT_STREAM
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    return (
        summary.get(MC_STREAM_KEY, montecarlo.LEGACY_STREAM) if isinstance(summary, dict) else montecarlo.CURRENT_STREAM
    )


def recorded_sizes(path: Path) -> bool:
    """Whether the bundle's summary rows carry their sizes (`effects.SIZES_KEY`): True for a new
    analysis (no summary yet), False for a summary made before sizes were recorded."""
    if not (path / bundles.SUMMARY_FILE).is_file():
        return True
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    return not isinstance(summary, dict) or effects.SIZES_KEY in summary


def recompute(
    path: Path,
    protocol: Protocol,
    ranges: list[seeds.SeedRange],
    first: dict | None = None,
    second_samples: pd.DataFrame | None = None,
) -> dict:
    """The summary recomputed from the bundle's files alone (raw samples, references, laws), both
    stages of a two-stage protocol included; `first`: stage 1's summary (`stage_summary`), and
    `second_samples`: the stage-2 samples, when the caller has just read them from these files.
    The Monte Carlo draws come from the stream the bundle recorded (`recorded_stream`)."""
    if protocol.sequential is not None:
        return with_plan(
            path, summarise_looks(path, protocol, ranges, _read_look, _recorded_stage2).summary, recorded_stream(path)
        )
    laws, stream = bundles.read_json(path / bundles.QUADRATURE_FILE), recorded_stream(path)
    first, second = first if first is not None else stage_summary(path, protocol, ranges, laws, stream=stream), None
    if needs_second_stage(protocol, first):
        stage2 = stage2_ranges(path)
        if not stage2:
            raise bundles.BundleError(
                f"{path}: stage 1 FAILed a two-stage protocol but {bundles.RUN_FILE} records no stage-2 seed ranges"
            )
        level2 = dataclasses.replace(protocol, alpha=protocol.alpha_stage2, file_hash=protocol.hash)
        second = stage_summary(path / bundles.STAGE2_DIR, level2, stage2, laws, second_samples, stream)
    return with_plan(path, confirm(protocol, first, second), stream)


def with_plan(path: Path, summary: dict, stream: str) -> dict:
    """The summary with what run.json records (registration, semantics) and its Monte Carlo stream,
    its rows sized as the bundle's version has them (`effects.finish`), as plain JSON values (a copy:
    `summary` is left as it was)."""
    plan = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE))
    summary = effects.finish(json.loads(json.dumps(summary)), recorded_sizes(path))
    summary["registration"] = plan.registration_block()
    if plan.semantics:  # bundles made before semantics were recorded keep their summary as it was
        summary["semantics"] = dict(plan.semantics)
    if stream != montecarlo.LEGACY_STREAM:  # legacy bundles keep their summary as it was
        summary[MC_STREAM_KEY] = stream
    return json.loads(json.dumps(summary))


# ---------------------------------------------------------------- sequential looks


Advance = Callable[[Path, list[seeds.SeedRange], looks.Look], pd.DataFrame]
"""(stage directory, the stage's ranges, look) -> the stage's samples of the look's first seeds, with
the stage's reference.json covering them: collected by a run (`Collector`), read by verify (`_read_look`)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Looked:
    """What `summarise_looks` made of a bundle: its summary (looks, stop and confirmation in it) and
    the stage-1 samples up to the look stage 1 stopped at (for the report)."""

    summary: dict
    samples: pd.DataFrame


def _walk_stage(
    directory: Path,
    protocol: Protocol,
    ranges: list[seeds.SeedRange],
    alpha: float,
    context: tuple[dict, str, float | None],
    advance: Advance,
    stops: Callable[[dict], bool],
) -> tuple[looks.Walked, pd.DataFrame]:
    """One stage (`directory`: the bundle or stage2/) walked look by look (`looks.walk`), each look
    evaluated from the stage's files; `context`: the quadrature laws, the Monte Carlo stream, the
    second stage's final level (None: one stage). BundleError when the stage holds samples beyond
    the look it stopped at."""
    laws, stream, final2 = context
    held: dict[str, pd.DataFrame] = {}

    def reach(look: looks.Look) -> None:
        held["samples"] = advance(directory, ranges, look)

    def evaluate(look: looks.Look) -> dict:
        return stage_summary(
            directory,
            looks.look_protocol(protocol, look, final2),
            looks.prefix(ranges, look.samples_per_group),
            laws,
            held["samples"],
            stream,
        )

    walked = looks.walk(looks.schedule(protocol, alpha), reach, evaluate, stops, gating_failures)
    collected = collect.collected_size(directory, ranges)
    if collected != walked.look.samples_per_group:
        raise bundles.BundleError(
            f"{directory / bundles.SAMPLES_DIR}: {collected} samples per group, but the looks "
            f"stop at look {walked.look.index + 1} ({walked.look.samples_per_group})"
        )
    return walked, held["samples"]


def summarise_looks(
    path: Path,
    protocol: Protocol,
    ranges: list[seeds.SeedRange],
    advance: Advance,
    stage2: Callable[[Path, Protocol], list[seeds.SeedRange]],
) -> Looked:
    """The summary of a sequential protocol's bundle: stage 1 look by look (stopping at its first
    FAIL), then, when it FAILed on p-valued criteria only and the protocol has two stages, stage 2
    look by look on `stage2(path, protocol)`'s ranges (stopping at the first look that confirms a
    stage-1 failure), combined by `confirm`. The summary's `sequential` (and stage 2's) say where
    each stage stopped; `protocol` keeps the protocol's alpha and planned size."""
    two = protocol.confirmation.is_two_stage
    final2 = looks.final_level(protocol, protocol.alpha_stage2) if two else None
    context = (bundles.read_json(path / bundles.QUADRATURE_FILE), recorded_stream(path), final2)
    first, samples = _walk_stage(
        path, protocol, ranges, protocol.alpha, context, advance, lambda s: s["verdict"] == FAIL
    )
    second = None
    if needs_second_stage(protocol, first.summary):
        second, _ = _walk_stage(
            path / bundles.STAGE2_DIR,
            protocol,
            stage2(path, protocol),
            protocol.alpha_stage2,
            context,
            advance,
            lambda s: confirms(first.summary, s),
        )
    summary = confirm(protocol, first.summary, second.summary if second else None)
    summary["protocol"] = {
        **summary["protocol"],
        "alpha": protocol.alpha,
        "samples_per_group": protocol.samples_per_group,
    }
    summary["sequential"] = looks.block(protocol, protocol.alpha, first)
    summary["reason"] += f" (sequential: {looks.stop_text(summary['sequential'])})"
    if second is not None:
        block = looks.block(protocol, protocol.alpha_stage2, second)
        summary["confirmation"]["stage2"]["sequential"] = block
        summary["reason"] += f" (stage 2 sequential: {looks.stop_text(block)})"
    return Looked(summary, samples)


def _read_look(directory: Path, ranges: list[seeds.SeedRange], look: looks.Look) -> pd.DataFrame:
    """verify's `Advance`: the stage's samples of the look's first seeds, from the chunks present."""
    collected = collect.collected_size(directory, ranges)
    if look.samples_per_group > collected:
        raise bundles.BundleError(
            f"{directory / bundles.SAMPLES_DIR}: {collected} samples per group end before "
            f"look {look.index + 1} ({look.samples_per_group}), and no earlier look stopped"
        )
    return collect.load_samples(directory, looks.prefix(ranges, look.samples_per_group), exact=False)


def _recorded_stage2(path: Path, protocol: Protocol) -> list[seeds.SeedRange]:
    recorded = stage2_ranges(path)
    if not recorded:
        raise bundles.BundleError(
            f"{path}: stage 1 FAILed a two-stage protocol but {bundles.RUN_FILE} records no stage-2 seed ranges"
        )
    return recorded
