"""Runner: one protocol run, from the frozen protocol to a verified bundle, in one linear story.

    protocol -> seed ranges (ledger) -> collect (SUT) -> reference -> quadrature -> verdict
             [-> stage-2 seed ranges -> collect -> reference -> verdict, two-stage protocols only]
             -> report -> manifest -> SHA256SUMS

A two-stage protocol whose first stage FAILs on p-valued criteria only claims a second set of
ranges (same groups and sizes) from the same ledger, so they are disjoint from every range of the
protocol, records them in run.json before sampling, and collects them into `stage2/`.

A protocol with sequential looks (`sequential`) collects and decides each stage look by look
(`specval.distribution.looks`): it stops with FAIL at the first look that crosses its level, and
the bundle then holds the samples up to that look only.

`run` refuses before any sampling: a confirmatory protocol whose hash differs from the frozen one,
seed ranges that overlap the ledger, groups the SUT does not support. `resume` continues a
killed run in its own bundle with the seed ranges recorded in run.json. `verify` re-hashes a
bundle and recomputes its summary from the raw samples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from specval import bundle as bundles
from specval import lifecycle, report, seeds
from specval.distribution import collect, looks, sharding
from specval.distribution.reference import Reference, build_reference, draft_law, needed_prefixes, point_mass, transform
from specval.distribution.verdict import (
    FAIL,
    STOP_POINT,
    applicable_groups,
    confirm,
    confirms,
    evaluate,
    gating_failures,
    needs_second_stage,
)
from specval.execution import guard_bundle
from specval.preflight import GuardedSUT, check_capabilities, check_writable_dir, open_guarded, probe
from specval.protocol import FROZEN, Protocol, ProtocolError, check_registered, load_protocol, parse_protocol, resolve
from specval.report.figure_pool import FigurePool, worker_count
from specval.semantics import FilterSemantics
from specval.stats import montecarlo, quadrature
from specval.stats.quadrature import adversarial_pairs
from specval.stopwatch import Stopwatch
from specval.sut import DRAFT_GREEDY, SUT, SutFactory, capabilities_of, open_sut

ADVERSARIAL_VOCAB = 16  # vocabulary of the synthetic adversarial (p, q) pairs
ADVERSARIAL_SEED = 0  # fixed: the adversarial pairs are part of the protocol, not of the run
QUADRATURE_GRID_SIZE = quadrature.GRID_SIZE  # rows per sweep: resolution 1/G per token
QUADRATURE_ZERO_TOKENS = 2  # zero-mass tokens kept next to the supports (zeros stay exercised)
STAGE2_RUN_SUFFIX = ":stage2"  # ledger run name of a bundle's second stage: "<bundle>:stage2"
MC_STREAM_KEY = "monte_carlo_stream"  # summary.json: the stream of every Monte Carlo p-value in it


def _ranges(plan: bundles.RunPlan, run: str) -> list[seeds.SeedRange]:
    return [seeds.SeedRange(plan.protocol, run, g, a, b) for g, a, b in plan.ranges]


# ---------------------------------------------------------------- start or resume


def prepare(
    protocol_file: Path, profile: str | None, exploratory: bool = False, parsed: Protocol | None = None
) -> tuple[Protocol, Protocol, str]:
    """Load the protocol (`parsed`, when the caller has parsed `protocol_file` already), check its
    registration in frozen.lock (a protocol that is not frozen, or changed since, runs only when
    `exploratory`), apply the profile: (as written, resolved, state)."""
    base = parsed if parsed is not None else load_protocol(protocol_file)
    state = check_registered(base, protocol_file, exploratory)
    return base, resolve(base, profile), state


def start(
    protocol_file: Path,
    base: Protocol,
    protocol: Protocol,
    output: Path,
    seed_offset: int | None = None,
    registration: str = FROZEN,
    exploratory: bool = False,
    semantics: FilterSemantics | None = None,
) -> tuple[Path, list[seeds.SeedRange]]:
    """Claim disjoint seed ranges (under the ledger lock) and create the bundle (nothing is sampled yet);
    run.json records the filter semantics the reference will follow (`semantics`, when given)."""
    groups, size = [g.name for g in protocol.groups], protocol.samples_per_group
    return lifecycle.start_bundle(
        protocol_file, base, protocol, output, groups, size, seed_offset, registration, exploratory, semantics
    )


def load_bundle_protocol(path: Path) -> tuple[Protocol, list[seeds.SeedRange]]:
    """The resolved protocol and seed ranges a bundle was (or is being) run with; BundleError unless
    protocol.yaml, protocol.json and run.json record the same protocol."""
    protocol, plan = bundles.load_plan_protocol(path, parse_protocol, load_protocol)
    return resolve(protocol, plan.profile), _ranges(plan, path.name)


# ---------------------------------------------------------------- analysis steps


def quadrature_laws(sut: SUT, protocol: Protocol, prompt_ids: list[int]) -> dict[str, list[dict]]:
    """Swept single-draft laws of the SUT's accept kernel: p, q from the model at the prompt (per
    speculative group's draft depth; groups with equal q share one sweep), the synthetic
    adversarial pairs, and the stop-point case (key STOP_POINT). q is built as the SUT drafts
    (`Capabilities.draft_kind`, `reference.draft_law`); for a greedy SUT every q, the synthetic
    ones included, is a point mass at its argmax, and the sweep then checks that the kernel emits
    exactly p from a point-mass draft."""
    tests = [t for t in protocol.tests if t.kind == "quadrature"]
    if not tests:
        return {}
    laws, swept = {}, {}
    capabilities = capabilities_of(sut)
    semantics, kind = capabilities.semantics, capabilities.draft_kind
    p = transform(sut.target_logits(prompt_ids), protocol.sampling, semantics).astype(sut.prob_dtype)
    for name in applicable_groups(protocol, tests[0]):
        q = draft_law(sut.draft_logits(protocol.group(name), prompt_ids), protocol.sampling, semantics, kind).astype(
            sut.prob_dtype
        )
        if q.tobytes() not in swept:
            swept[q.tobytes()] = _law("model_prompt", p, q, sut, tests[0].tol)
        laws[name] = [swept[q.tobytes()]]
    rng = np.random.default_rng(ADVERSARIAL_SEED)
    laws["adversarial"] = [
        _law(pair.name, pair.p.astype(sut.prob_dtype), _drafted(pair.q, kind).astype(sut.prob_dtype), sut, tests[0].tol)
        for pair in adversarial_pairs(ADVERSARIAL_VOCAB, rng)
    ]
    stop_p, stop_q = quadrature.stop_point_case(sut.prob_dtype)
    laws[STOP_POINT] = [
        {
            "name": "p_zero_at_u_accept_0",
            "kind": STOP_POINT,
            "p": stop_p.astype(np.float64).tolist(),
            "q": stop_q.astype(np.float64).tolist(),
            "first_token": quadrature.stop_point_token(sut.accept_single, sut.prob_dtype),
        }
    ]
    return laws


def _drafted(q: np.ndarray, kind: str) -> np.ndarray:
    """A synthetic q as a SUT of draft kind `kind` drafts: greedy SUTs draft the argmax (a point mass);
    the others draw from q itself."""
    return point_mass(int(np.argmax(q)), q.size) if kind == DRAFT_GREEDY else q


def _law(name: str, p: np.ndarray, q: np.ndarray, sut: SUT, tol: float) -> dict:
    """One sweep on p, q cut to their supports (plus QUADRATURE_ZERO_TOKENS zero-mass tokens)."""
    p_cut, q_cut, tokens = quadrature.restrict_to_support(p, q, QUADRATURE_ZERO_TOKENS)
    result = quadrature.quadrature_check(p_cut, q_cut, sut.accept_single, tol, grid_size=QUADRATURE_GRID_SIZE)
    return {
        "name": name,
        "tokens": tokens.tolist(),
        "prob_dtype": np.dtype(sut.prob_dtype).name,
        "grid_size": result.grid_size,
        "p": np.asarray(p_cut, dtype=np.float64).tolist(),
        "q": np.asarray(q_cut, dtype=np.float64).tolist(),
        "law": result.law.tolist(),
        "error_mass": result.error_mass,
        "num_rows": result.num_rows,
    }


def reference_for(sut: SUT, protocol: Protocol, prompt_ids: list[int], tokens: np.ndarray) -> Reference:
    """The reference laws of every prefix that occurs in `tokens` (int64[N, positions]), replayed
    through the SUT's target logits under its declared filter semantics."""
    return build_reference(
        sut.target_logits,
        prompt_ids,
        needed_prefixes(tokens, sut.vocab_size),
        protocol.sampling,
        sut.vocab_size,
        capabilities_of(sut).semantics,
    )


def token_matrix(frame, positions: int) -> np.ndarray:
    """The sampled tokens of a samples table as int64[N, positions]."""
    return frame[collect.token_columns(positions)].to_numpy(dtype=np.int64)


def _write_reference(
    directory: Path, sut: SUT, protocol: Protocol, prompt_ids: list[int], samples: pd.DataFrame
) -> None:
    """reference.json of one stage, from the prefixes that occur in its `samples`."""
    reference = reference_for(sut, protocol, prompt_ids, token_matrix(samples, protocol.positions))
    bundles.write_json(directory / bundles.REFERENCE_FILE, reference.to_dict())


def stage2_ranges(path: Path) -> list[seeds.SeedRange]:
    """The stage-2 seed ranges recorded in the bundle's run.json (empty: none claimed)."""
    plan = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE))
    return [seeds.SeedRange(plan.protocol, path.name + STAGE2_RUN_SUFFIX, g, a, b) for g, a, b in plan.stage2_ranges]


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
    `watch`: times each step (names in `ANALYSIS_STEPS`)."""
    step = (watch or Stopwatch()).step
    prompt_ids = sut.encode(protocol.prompt)
    with step("load_s"):
        samples = collect.load_samples(path, ranges)
    with step("reference_s"):
        _write_reference(path, sut, protocol, prompt_ids, samples)
    if pool is not None:
        with step("figures_submit_s"):
            pool.submit_observed(path, protocol, samples)
    with step("quadrature_s"):
        bundles.write_json(path / bundles.QUADRATURE_FILE, quadrature_laws(sut, protocol, prompt_ids))
        laws = bundles.read_json(path / bundles.QUADRATURE_FILE)
    with step("tests_s"):
        first = _stage_summary(path, protocol, ranges, laws, samples, recorded_stream(path))
    drawn, collect_s, second = 0, 0.0, None
    if needs_second_stage(protocol, first):
        stage2 = claim_stage2(path, protocol)
        start = time.perf_counter()
        drawn = collect.collect(sut, protocol, prompt_ids, stage2, path / bundles.STAGE2_DIR, progress, sampler)
        collect_s = time.perf_counter() - start
        with step("stage2_load_s"):
            second = collect.load_samples(path / bundles.STAGE2_DIR, stage2)
        with step("stage2_reference_s"):
            _write_reference(path / bundles.STAGE2_DIR, sut, protocol, prompt_ids, second)
    with step("summary_s"):
        summary = recompute(path, protocol, ranges, first, second)
        bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    return Analysis(summary, samples, drawn, collect_s)


ANALYSIS_STEPS = {  # the manifest's `analysis_steps`: seconds of wall time per step after collection
    "load_s": "stage-1 samples read (parquet)",
    "reference_s": "stage-1 reference: replay of the occurring prefixes (the SUT's device), reference.json",
    "figures_submit_s": "figures handed to the figure workers, early ones and the rest (a pooled run only)",
    "quadrature_s": "quadrature sweeps (the SUT's device), quadrature.json",
    "tests_s": "stage-1 criteria: pooling, Monte Carlo p-values, Holm, group facts",
    "stage2_load_s": "stage-2 samples read (a second stage only; its collection is `collect_stage2_s`)",
    "stage2_reference_s": "stage-2 reference (a second stage only)",
    "summary_s": "stage-2 criteria when run, confirmation, summary.json",
    "sut_close_s": "the SUT closed (a pooled run: while the workers render)",
    "figures_s": "the figures: rendered here (serial), or waited for (pooled)",
}


def _stage_summary(
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


def recompute(
    path: Path,
    protocol: Protocol,
    ranges: list[seeds.SeedRange],
    first: dict | None = None,
    second_samples: pd.DataFrame | None = None,
) -> dict:
    """The summary recomputed from the bundle's files alone (raw samples, references, laws), both
    stages of a two-stage protocol included; `first`: stage 1's summary (`_stage_summary`), and
    `second_samples`: the stage-2 samples, when the caller has just read them from these files.
    The Monte Carlo draws come from the stream the bundle recorded (`recorded_stream`)."""
    if protocol.sequential is not None:
        return _with_plan(
            path, summarise_looks(path, protocol, ranges, _read_look, _recorded_stage2).summary, recorded_stream(path)
        )
    laws, stream = bundles.read_json(path / bundles.QUADRATURE_FILE), recorded_stream(path)
    first, second = first if first is not None else _stage_summary(path, protocol, ranges, laws, stream=stream), None
    if needs_second_stage(protocol, first):
        stage2 = stage2_ranges(path)
        if not stage2:
            raise bundles.BundleError(
                f"{path}: stage 1 FAILed a two-stage protocol but {bundles.RUN_FILE} records no stage-2 seed ranges"
            )
        level2 = dataclasses.replace(protocol, alpha=protocol.alpha_stage2, file_hash=protocol.hash)
        second = _stage_summary(path / bundles.STAGE2_DIR, level2, stage2, laws, second_samples, stream)
    return _with_plan(path, confirm(protocol, first, second), stream)


def _with_plan(path: Path, summary: dict, stream: str) -> dict:
    """The summary with what run.json records (registration, semantics) and its Monte Carlo stream,
    as plain JSON values."""
    plan = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE))
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
        return _stage_summary(
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
        summary = _with_plan(path, looked.summary, recorded_stream(path))
        bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    second = path / bundles.STAGE2_DIR
    analysis = Analysis(summary, looked.samples, collector.drawn.get(second, 0), collector.seconds.get(second, 0.0))
    return analysis, collector.drawn.get(path, 0), collector.seconds.get(path, 0.0)


# ---------------------------------------------------------------- the run


def open_checked(protocol: Protocol, protocol_file: Path, sut_factory: SutFactory | None) -> GuardedSUT:
    """The adapter, checked before any seed is claimed: groups it refuses and capabilities it lacks are
    input errors (SUTError / ProtocolError); a probe on reserved seeds catches a broken adapter (SUTRaised)."""
    sut = open_guarded(sut_factory or open_sut, protocol)
    try:
        sut.check_groups(protocol.groups)
        check_capabilities(protocol, sut, protocol_file)
        probe(sut, protocol)
    except BaseException:
        sut.close()
        raise
    return sut


def run(
    protocol_file: Path | None,
    profile: str | None,
    output: Path,
    *,
    resume: Path | None = None,
    exploratory: bool = False,
    seed_offset: int | None = None,
    progress: bool = True,
    sut_factory: SutFactory | None = None,
    command: list[str] | None = None,
    announce: Callable[[Path], None] | None = None,
    shards: sharding.ShardGroup | None = None,
    figure_workers: int | None = None,
    parsed: Protocol | None = None,
) -> tuple[Path, dict]:
    """Run (or resume) a protocol and write a complete bundle; returns (bundle, summary).

    Refused before any seed is claimed (nothing written): protocol errors, an unregistered protocol
    without `exploratory`, an unwritable output root, groups or capabilities the adapter lacks, a
    failed probe. Once the bundle exists, `announce(bundle)` is called; an exception raised by the
    adapter then becomes execution.RunFailed and an interrupt execution.RunInterrupted (see
    specval.execution): the bundle is kept, unsealed, for `--resume`.

    `shards`: this process is rank 0 of a multi-rank run (specval.distribution.sharding): the protocol runs on
    this rank's device, every collection is shared with the other ranks, and the manifest records
    the number of ranks. Everything else (claims, bundle, analysis) is this process's alone.

    `figure_workers`: processes rendering the report's figures beside the analysis
    (specval.report.figure_pool); None: `figure_pool.worker_count`; 0: rendered here, serially.
    Either way the figures have the same bytes.

    `parsed`: the protocol of `protocol_file` when the caller has parsed it already (the CLI reads
    a protocol file once); None: it is read here."""
    started, clock = dt.datetime.now(dt.timezone.utc).isoformat(), time.perf_counter()
    if resume is None:
        base, protocol, state = prepare(Path(protocol_file), profile, exploratory, parsed)
    else:
        bundles.check_resumable(Path(resume))  # refuse sealed or tampered bundles before touching them
        protocol, ranges = load_bundle_protocol(Path(resume))
    if shards is not None:
        protocol = sharding.place(protocol, shards)
    sampler = sharding.sampler(shards) if shards is not None else None
    check_writable_dir(Path(output if resume is None else resume), "--output" if resume is None else "--resume")
    sut = open_checked(protocol, Path(protocol_file or Path(resume) / bundles.PROTOCOL_YAML), sut_factory)
    watch = Stopwatch()
    with _figure_pool(sut, worker_count(protocol) if figure_workers is None else figure_workers) as pool:
        try:
            semantics = capabilities_of(sut).semantics
            if shards is not None:
                sharding.open_ranks(shards, protocol)  # every rank's adapter probed before any seed is claimed
            if resume is None:
                path, ranges = start(
                    Path(protocol_file), base, protocol, output, seed_offset, state, exploratory, semantics
                )
            else:
                path = Path(resume)
                check_resumed_semantics(path, semantics)
            if announce:
                announce(path)
            session = bundles.begin_session(path, command)
            with guard_bundle(path, session):
                prompt_ids = sut.encode(protocol.prompt)
                device = bundles.device_facts()  # the device, not the samples: setup, before the clock of collection
                t0 = time.perf_counter()
                if protocol.sequential is None:
                    drawn = collect.collect(sut, protocol, prompt_ids, ranges, path, progress, sampler)
                    collect_s = time.perf_counter() - t0
                    analysis = analyse(path, protocol, ranges, sut, progress, sampler, pool, watch)
                else:
                    analysis, drawn, collect_s = analyse_looks(path, protocol, ranges, sut, progress, sampler, watch)
                device["sut"] = sut.describe()
                compiled = sut.kernel_compile_time()
                t2 = time.perf_counter()
                with watch.step("figures_submit_s"):
                    pending = pool.submit(path, analysis.summary, analysis.samples) if pool else None
        finally:
            with watch.step("sut_close_s"):
                sut.close()
        with watch.step("figures_s"):
            pngs = pending() if pending else report.figures(path, analysis.summary, analysis.samples)
        if pool:
            pool.release()  # the workers exit while the bundle is sealed; leaving the block joins them
        phases = {
            "setup_s": t0 - clock,
            "collect_s": collect_s,
            "analysis_s": t2 - t0 - collect_s - analysis.collect_stage2_s,
            "report_s": time.perf_counter() - t2,
            "analysis_steps": watch.seconds(),
        }
        if compiled is not None:
            phases["kernel_compile"] = compiled
        timing = lifecycle.run_timing(started, clock, collect_s, drawn, phases)
        if protocol.confirmation.is_two_stage:
            timing["stage2_samples_drawn"] = analysis.drawn_stage2
            timing["collect_stage2_s"] = analysis.collect_stage2_s
        if shards is not None:
            timing["ranks"] = shards.size
        bundles.end_session(path, session, drawn + analysis.drawn_stage2, analysis.summary["verdict"])
        lifecycle.write_manifest(path, protocol, ranges, device, timing, command, stage2_ranges(path))
        finish(path, pngs)
    return path, analysis.summary


def _figure_pool(sut: SUT, workers: int) -> contextlib.AbstractContextManager[FigurePool | None]:
    """A FigurePool of `workers` processes (None when 0: the figures are rendered serially); the
    SUT is closed if the pool cannot start."""
    if workers < 1:
        return contextlib.nullcontext(None)
    try:
        return FigurePool(workers)
    except BaseException:
        sut.close()
        raise


def check_resumed_semantics(path: Path, semantics: FilterSemantics) -> None:
    """ProtocolError unless the adapter still declares the filter semantics run.json recorded (a
    bundle that recorded none was started under the defaults, the only semantics there were)."""
    recorded = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE)).semantics
    before = FilterSemantics.from_dict(dict(recorded))
    if before != semantics:
        raise ProtocolError(
            f"{path / bundles.RUN_FILE}: semantics: the bundle was started under filter semantics "
            f"({before.describe()}) but the adapter now declares ({semantics.describe()})"
        )


def finish(path: Path, pngs: dict[str, bytes] | None = None) -> None:
    """Render the report and seal the bundle with SHA256SUMS (temp files of a
    killed process removed first); `pngs`: the report's figures when already rendered
    (`report.figures`), else they are rendered from the bundle's files."""
    report.render(path, pngs)
    lifecycle.seal(path)


VERIFY_MIN_WORKERS = 2  # verify has nothing beside its figures: one worker would move them, not overlap them


def verify(path: Path, figure_workers: int | None = None) -> list[str]:
    """Every difference between the bundle and its seals, its summary recomputed from the raw
    samples and its reports re-rendered (`bundles.verify_bundle`). `figure_workers`: processes
    that re-render the figures in parallel, started first so that their imports overlap the
    checks; None: `figure_pool.worker_count` of the bundle's protocol when at least
    VERIFY_MIN_WORKERS, else 0 (serial). The same bytes either way."""
    workers = _verify_workers(path) if figure_workers is None else figure_workers
    with FigurePool(workers) if workers > 0 else contextlib.nullcontext(None) as pool:
        render = functools.partial(report.render_files, render_figures=pool.figures) if pool else report.render_files
        return bundles.verify_bundle(path, _recompute_bundle, render)


def _verify_workers(path: Path) -> int:
    try:
        protocol, _ = load_bundle_protocol(path)
    except (bundles.BundleError, ProtocolError, *bundles.READ_ERRORS):
        return 0  # verify reports what is wrong with the bundle; its figures render serially
    workers = worker_count(protocol)
    return workers if workers >= VERIFY_MIN_WORKERS else 0


def _recompute_bundle(path: Path) -> dict:
    protocol, ranges = load_bundle_protocol(path)
    return recompute(path, protocol, ranges)
