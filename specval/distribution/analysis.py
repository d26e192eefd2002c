"""Analysis: what a run makes of its bundle once the samples are in, or look by look.

`analyse`: the reference and the quadrature sweeps (`specval.distribution.laws`), stage 2 when
stage 1 FAILs a two-stage protocol on p-valued criteria only (its seed ranges claimed in the
ledger and recorded in run.json before any sample, `claim_stage2`), then summary.json.
`analyse_looks`, a protocol with sequential looks: the quadrature sweeps first, then each stage
collected and decided look by look (`Collector`), then summary.json. Either summary is the one
`specval.distribution.stages.recompute` derives from the bundle's files.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pandas as pd

from specval import bundle as bundles
from specval import seeds
from specval.distribution import collect, looks
from specval.distribution.decision import needs_second_stage
from specval.distribution.laws import quadrature_laws, token_matrix, write_reference
from specval.distribution.reference import Reference, build_reference, needed_prefixes
from specval.distribution.stages import (
    STAGE2_RUN_SUFFIX,
    recompute,
    recorded_stream,
    stage2_ranges,
    stage_summary,
    summarise_looks,
    with_plan,
)
from specval.protocol import Protocol
from specval.report.figure_pool import FigurePool
from specval.stopwatch import Stopwatch
from specval.sut import SUT, capabilities_of


def claim_stage2(path: Path, protocol: Protocol) -> list[seeds.SeedRange]:
    """Stage-2 ranges: those in run.json (a resumed run), else fresh ones claimed in the ledger of the
    bundle's output root (disjoint from every range of the protocol) and recorded before sampling."""
    recorded = stage2_ranges(path)
    if recorded:
        return recorded
    output = path.parent
    planned = seeds.allocate(
        seeds.read_ledger(output),
        protocol.name,
        path.name + STAGE2_RUN_SUFFIX,
        [g.name for g in protocol.groups],
        protocol.samples_per_group,
        protocol.seed_base,
    )
    seeds.claim(output, planned)
    plan = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE))
    plan = dataclasses.replace(plan, stage2_ranges=tuple((r.group, r.start, r.stop) for r in planned))
    bundles.write_json(path / bundles.RUN_FILE, plan.to_dict())
    return planned


@dataclasses.dataclass(frozen=True, eq=False)
class Analysis:
    """What `analyse` made of a bundle: its summary, the stage-1 samples it read (for the report),
    and the stage-2 samples drawn now with the seconds that collection took (0 without a stage 2)."""

    summary: dict
    samples: pd.DataFrame
    drawn_stage2: int
    collect_stage2_s: float


def analyse(
    path: Path,
    protocol: Protocol,
    ranges: list[seeds.SeedRange],
    sut: SUT,
    progress: bool = False,
    sampler: collect.ChunkSampler | None = None,
    pool: FigurePool | None = None,
    watch: Stopwatch | None = None,
) -> Analysis:
    """Reference, quadrature, stage 2 when the protocol calls for it (collected by `sampler`), and
    the summary of a bundle whose stage-1 samples are complete.

    Each stage's samples are read once and stage 1 is evaluated once (its summary decides on the
    second stage and is the summary's first stage); the summary is the one `recompute` derives
    from the bundle's files, bit for bit (the same files are read: reference.json, quadrature.json).
    `pool`: its workers start on the observed-vs-expected figures once reference.json is written.
    `watch`: times each step (names in `specval.distribution.runner.ANALYSIS_STEPS`)."""
    step = (watch or Stopwatch()).step
    prompt_ids = sut.encode(protocol.prompt)
    with step("load_s"):
        samples = collect.load_samples(path, ranges)
    with step("reference_s"):
        write_reference(path, sut, protocol, prompt_ids, samples)
    if pool is not None:
        with step("figures_submit_s"):
            pool.submit_observed(path, protocol, samples)
    with step("quadrature_s"):
        bundles.write_json(path / bundles.QUADRATURE_FILE, quadrature_laws(sut, protocol, prompt_ids))
        laws = bundles.read_json(path / bundles.QUADRATURE_FILE)
    with step("tests_s"):
        first = stage_summary(path, protocol, ranges, laws, samples, recorded_stream(path))
    drawn, collect_s, second = 0, 0.0, None
    if needs_second_stage(protocol, first):
        stage2 = claim_stage2(path, protocol)
        start = time.perf_counter()
        drawn = collect.collect(sut, protocol, prompt_ids, stage2, path / bundles.STAGE2_DIR, progress, sampler)
        collect_s = time.perf_counter() - start
        with step("stage2_load_s"):
            second = collect.load_samples(path / bundles.STAGE2_DIR, stage2)
        with step("stage2_reference_s"):
            write_reference(path / bundles.STAGE2_DIR, sut, protocol, prompt_ids, second)
    with step("summary_s"):
        summary = recompute(path, protocol, ranges, first, second)
        bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    return Analysis(summary, samples, drawn, collect_s)


# ---------------------------------------------------------------- sequential looks


class Collector:
    """A run's `Advance`: collects the missing chunks up to the look (chunks cut at every look's
    size, `looks.segments`), then extends the stage's reference.json with the laws of the prefixes
    new since the previous look (earlier laws are kept, not replayed: each prefix has one law). A
    resumed run may find chunks of a later look already written (it was killed inside that look):
    each look reads only its own first seeds. Counts the samples drawn and the seconds spent
    collecting, per stage directory."""

    def __init__(
        self, sut: SUT, protocol: Protocol, progress: bool, sampler: collect.ChunkSampler | None, watch: Stopwatch
    ) -> None:
        self.sut, self.protocol, self.progress, self.sampler, self.watch = sut, protocol, progress, sampler, watch
        self.prompt_ids = sut.encode(protocol.prompt)
        self.drawn: dict[Path, int] = {}
        self.seconds: dict[Path, float] = {}
        self._laws: dict[Path, dict] = {}

    def __call__(self, directory: Path, ranges: list[seeds.SeedRange], look: looks.Look) -> pd.DataFrame:
        done = looks.schedule(self.protocol, self.protocol.alpha)[: look.index + 1]
        start = time.perf_counter()
        drawn = collect.collect(
            self.sut,
            self.protocol,
            self.prompt_ids,
            looks.segments(ranges, done),
            directory,
            self.progress,
            self.sampler,
        )
        self.seconds[directory] = self.seconds.get(directory, 0.0) + time.perf_counter() - start
        self.drawn[directory] = self.drawn.get(directory, 0) + drawn
        with self.watch.step("load_s"):
            samples = collect.load_samples(directory, looks.prefix(ranges, look.samples_per_group), exact=False)
        with self.watch.step("reference_s"):
            self._extend_reference(directory, samples)
        return samples

    def _extend_reference(self, directory: Path, samples: pd.DataFrame) -> None:
        known = self._laws.setdefault(directory, {})
        tokens = token_matrix(samples, self.protocol.positions)
        new = [p for p in needed_prefixes(tokens, self.sut.vocab_size) if p not in known]
        fresh = build_reference(
            self.sut.target_logits,
            self.prompt_ids,
            new,
            self.protocol.sampling,
            self.sut.vocab_size,
            capabilities_of(self.sut).semantics,
        )
        known.update(fresh.dists)
        reference = Reference(self.sut.vocab_size, tuple(self.prompt_ids), dict(known))
        bundles.write_json(directory / bundles.REFERENCE_FILE, reference.to_dict())


def analyse_looks(
    path: Path,
    protocol: Protocol,
    ranges: list[seeds.SeedRange],
    sut: SUT,
    progress: bool = False,
    sampler: collect.ChunkSampler | None = None,
    watch: Stopwatch | None = None,
) -> tuple[Analysis, int, float]:
    """Collect and decide a sequential protocol's bundle look by look (`summarise_looks` with a
    `Collector`), write summary.json: (analysis, stage-1 samples drawn now, seconds collecting them).
    The quadrature sweeps come first: a broken accept kernel FAILs at the first look."""
    watch = watch or Stopwatch()
    with watch.step("quadrature_s"):
        bundles.write_json(path / bundles.QUADRATURE_FILE, quadrature_laws(sut, protocol, sut.encode(protocol.prompt)))
    collector = Collector(sut, protocol, progress, sampler, watch)
    looked = summarise_looks(path, protocol, ranges, collector, claim_stage2)
    with watch.step("summary_s"):
        summary = with_plan(path, looked.summary, recorded_stream(path))
        bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    second = path / bundles.STAGE2_DIR
    analysis = Analysis(summary, looked.samples, collector.drawn.get(second, 0), collector.seconds.get(second, 0.0))
    return analysis, collector.drawn.get(path, 0), collector.seconds.get(path, 0.0)
