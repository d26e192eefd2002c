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

The steps are modules of this package: `analysis` (what the run makes of its samples), `laws`
(the reference and the quadrature sweeps, through the SUT), `stages` (the summary from the
bundle's files: `recompute`, which `verify` compares with summary.json).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import time
from collections.abc import Callable
from pathlib import Path

from specval import bundle as bundles
from specval import lifecycle, report, seeds
from specval.distribution import collect, sharding
from specval.distribution.analysis import analyse, analyse_looks
from specval.distribution.stages import recompute, stage2_ranges
from specval.execution import guard_bundle
from specval.preflight import GuardedSUT, check_capabilities, check_writable_dir, open_guarded, probe
from specval.protocol import FROZEN, Protocol, ProtocolError, check_registered, load_protocol, parse_protocol, resolve
from specval.report.figure_pool import FigurePool, worker_count
from specval.semantics import FilterSemantics
from specval.stopwatch import Stopwatch
from specval.sut import SUT, SutFactory, capabilities_of, open_sut


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


# ---------------------------------------------------------------- verify


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
