"""Bench: one performance protocol run, from two engines to a sealed bundle, and its verification.

    protocol -> both engines built -> warm-up rounds (CUDA Graphs captured; recorded, excluded)
             -> pairs in ABBA order, each run timed -> timings table -> ratios, median, interval
             -> verdict -> report -> manifest -> SHA256SUMS

On the engine adapter (`sut.adapter: engine`), a run submits the protocol's `concurrency` requests
at once to one arm's `engine.LLM.generate` (request j: prompt j mod len(prompts), `max_tokens`
tokens, `ignore_eos`, seed from `bench_summary.seed_start`). Both arms share one model (weights
loaded once), each has its own engine (KV cache, runner, CUDA Graphs).

On any other adapter (`specval.sut.SUT`, resolved by name as `specval run` resolves it), both arms
are groups of one adapter instance, opened on the protocol's device and checked before any bundle
exists (the arms' modes and sampling against its `Capabilities`, `check_groups`, every prompt
encoded, the model loaded through `vocab_size`); a run is `SUT.sample(group, prompt, sampling,
seeds, max_tokens, max_tokens)` for the run's requests, one call per prompt in prompt order (request
j: prompt j mod len(prompts), the same seeds as on the engine), each batch checked against the
adapter contract. The adapter counts no CUDA Graphs (0 before and after every run).

Either way a run is timed with `clock_ns` (`time.perf_counter_ns`, a monotonic clock), with
`torch.cuda.synchronize` before the start and before the stop on CUDA, so queued device work is
inside the run that queued it. The timings table is written once, complete, after the last run,
and its sha256 recorded in chunks.json (`bundle.write_chunk`).

Layout: the distribution bundle's (`specval.bundle`) with `samples/timings.csv` as the only raw
file and no reference or quadrature. Seeds are not claimed in the ledger: a bench makes no
statistical claim about tokens, and every run of a protocol times the same workload. A bench is
not resumable: a run that is interrupted or whose engine raises keeps its bundle unsealed (with
error.log) and a new run starts from scratch, since timings of two sessions are not comparable.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from specval import bundle as bundles
from specval import lifecycle, seeds
from specval.execution import guard_bundle
from specval.performance.protocol import (
    ARM_KEYS,
    PerformanceProtocol,
    load_performance_protocol,
    parse_performance_protocol,
    resolve,
)
from specval.performance.report import render_files
from specval.performance.summary import COLUMNS, PAIR, ScheduledRun, schedule, seed_start, summarise
from specval.preflight import ADAPTER_FAULTS, GuardedSUT, SUTRaised, check_writable_dir, sut_raised
from specval.protocol import GroupSpec, ProtocolError, check_registered
from specval.sut import ADAPTER_EXTRAS

TIMINGS_FILE = f"{bundles.SAMPLES_DIR}/timings.csv"
SEED_GROUP = "pairs"  # run.json's one range: the request seeds of every pair (both arms)
ENGINE_ADAPTER = "specval.adapters.engine"  # the bundled engine's adapter module (its extra: ADAPTER_EXTRAS)
clock_ns = time.perf_counter_ns  # the clock of every timed run (module-level, so a test can plant one)


# ---------------------------------------------------------------- engines


def engine_adapter(protocol: PerformanceProtocol) -> ModuleType:
    """The bundled engine's adapter module, or ProtocolError (an input error: exit 2, before any
    bundle) with the install line when a package of its extra (torch, triton) is not installed."""
    try:
        from specval.adapters import engine as adapter
    except ModuleNotFoundError as err:
        package = (err.name or "specval").split(".")[0]
        if package == "specval":
            raise
        extra = ADAPTER_EXTRAS[ENGINE_ADAPTER]
        raise ProtocolError(
            f"{protocol.name}: its arms run the bundled engine, which needs {package}, which is not "
            f'installed: pip install "specval[{extra}]"'
        ) from err
    return adapter


def engine_config(protocol: PerformanceProtocol, key: str):
    """The EngineConfig of arm `key`; ProtocolError (an input error) when the engine refuses it."""
    from specval.adapters import engine as adapter

    arm = protocol.arm(key)
    extra = {} if arm.mode != "async" else {"rounds_in_flight": arm.rounds_in_flight}
    try:
        return adapter.engine_config(
            model=protocol.sut.model,
            dtype=protocol.sut.dtype,
            mode=arm.mode,
            num_speculative_tokens=protocol.num_speculative_tokens,
            draft_loops=arm.draft_loops,
            device=protocol.device,
            enforce_eager=arm.enforce_eager,
            **extra,
            **dict(protocol.sut.options),
        )
    except (ValueError, TypeError) as err:
        raise ProtocolError(
            f"{protocol.name}: arm {key} ({arm.name}): the engine refuses its configuration: {err}"
        ) from err


def build_engines(protocol: PerformanceProtocol) -> dict:
    """arm key -> engine.LLM (both share the first one's model and tokenizer), or, for another
    adapter than the engine, arm key -> AdapterArm (`build_adapter_arms`). Configurations are
    checked first (ProtocolError); anything the engine raises while building is SUTRaised."""
    if not protocol.on_engine:
        return build_adapter_arms(protocol)
    adapter = engine_adapter(protocol)
    configs = {key: engine_config(protocol, key) for key in ARM_KEYS}
    llms: dict = {}
    try:
        for key in ARM_KEYS:
            llms[key] = adapter.build_llm(configs[key], llms.get(ARM_KEYS[0]))
    except ValueError as err:  # e.g. draft_loops >= the model's loops: checked against the model
        close_engines(llms)
        raise ProtocolError(f"{protocol.name}: the engine refuses an arm: {err}") from err
    except ADAPTER_FAULTS as err:  # SystemExit of engine code included
        close_engines(llms)
        raise sut_raised("building the engines", err) from err
    return llms


def close_engines(llms: dict) -> None:
    """Close every engine, and an adapter shared by both arms once."""
    closed: list = []
    for llm in llms.values():
        target = llm.sut if isinstance(llm, AdapterArm) else llm
        if not any(target is done for done in closed):
            closed.append(target)
            target.close()


def graph_shapes(llm) -> int:
    """Round shapes captured as CUDA Graphs so far by the engine's runner (0 without graphs, and for
    an adapter arm, which counts none)."""
    if isinstance(llm, AdapterArm):
        return 0
    graphs = getattr(llm.engine.runner, "graphs", None)
    return 0 if graphs is None else len(graphs._rounds)  # noqa: SLF001 - the count is not exposed otherwise


def graph_status(llm) -> str:
    if isinstance(llm, AdapterArm):
        return f"not counted (adapter {llm.adapter!r} reports no CUDA Graph captures)"
    graphs = getattr(llm.engine.runner, "graphs", None)
    if graphs is None:
        return "no CUDA Graphs (eager runner, CPU, or enforce_eager)"
    return graphs.disabled_reason or f"{graph_shapes(llm)} round shape(s) captured"


# ---------------------------------------------------------------- arms of another adapter


@dataclasses.dataclass(frozen=True)
class AdapterArm:
    """One arm of a bench of another adapter than the engine: a group of the adapter both arms share,
    and every prompt of the protocol encoded by it (index j mod len(prompts) for request j)."""

    sut: Any  # preflight.GuardedSUT: whatever the adapter raises is SUTRaised, naming the call
    group: GroupSpec
    prompt_ids: tuple[tuple[int, ...], ...]
    adapter: str


def _needs(protocol: PerformanceProtocol) -> list[tuple[str, str, str]]:
    """(capability, value, protocol key) of everything the arms ask of the adapter: their modes and
    the sampling parameters each arm sets (as `preflight.needs` for a distribution protocol)."""
    out = []
    for key in ARM_KEYS:
        arm, sampling = protocol.arm(key), protocol.arm_sampling(key)
        where = f"{key}.sampling" if arm.sampling is not None else "sampling"
        out.append(("modes", arm.mode, f"{key}.mode"))
        if sampling.temperature != 1.0:
            out.append(("sampling", "temperature", f"{where}.temperature"))
        if sampling.top_k not in (0, -1):
            out.append(("sampling", "top_k", f"{where}.top_k"))
        if sampling.top_p < 1.0:
            out.append(("sampling", "top_p", f"{where}.top_p"))
    return out


def check_capabilities(protocol: PerformanceProtocol, sut: Any) -> None:
    """ProtocolError naming the protocol, the key and the capability when the arms ask the adapter
    for a mode or a sampling parameter its `Capabilities` do not declare."""
    from specval.sut import capabilities_of

    capabilities = capabilities_of(sut)
    for capability, value, key in _needs(protocol):
        declared = getattr(capabilities, capability)
        if value not in declared:
            raise ProtocolError(
                f"{protocol.name}: {key}: adapter {protocol.sut.adapter!r} does not support "
                f"{value!r} (its capabilities.{capability}: {list(declared)})"
            )


def build_adapter_arms(protocol: PerformanceProtocol) -> dict:
    """arm key -> AdapterArm over one adapter opened on the protocol's device. Refused (ProtocolError,
    nothing written) when the adapter cannot be resolved or refuses the configuration (SUTError of
    its constructor or `check_groups`), or lacks a capability the arms need; SUTRaised when it
    raises otherwise (import, constructor, encoding the prompts, loading the model)."""
    from specval.sut import SUTError, open_sut

    spec = dataclasses.replace(protocol.sut, device=protocol.device)
    try:
        sut = GuardedSUT(open_sut(spec, protocol.num_speculative_tokens))
    except SUTError as err:
        raise ProtocolError(f"{protocol.name}: sut: {err}") from err
    except ADAPTER_FAULTS as err:  # SystemExit of adapter code included
        raise sut_raised("the adapter's import or constructor", err) from err
    try:
        check_capabilities(protocol, sut)
        sut.check_groups(tuple(protocol.arm(key).group for key in ARM_KEYS))
        prompt_ids = tuple(tuple(int(t) for t in sut.encode(prompt)) for prompt in protocol.prompts)
        if not int(sut.vocab_size) > 0:  # loads the model (adapters load lazily) before any timed run
            raise SUTRaised("vocab_size", f"{sut.vocab_size!r} is not a positive vocabulary size")
    except SUTError as err:
        sut.close()
        raise ProtocolError(f"{protocol.name}: sut: {err}") from err
    except BaseException:
        sut.close()
        raise
    return {key: AdapterArm(sut, protocol.arm(key).group, prompt_ids, protocol.sut.adapter) for key in ARM_KEYS}


def _adapter_calls(protocol: PerformanceProtocol, run: ScheduledRun) -> list[tuple[int, np.ndarray]]:
    """(prompt index, int64 seeds) of each `SUT.sample` call of a run: request j (seed first + j) has
    prompt j mod len(prompts); one call per prompt that has requests, in prompt order."""
    seeds = seed_start(protocol, run) + np.arange(protocol.concurrency, dtype=np.int64)
    count = len(protocol.prompts)
    return [(p, seeds[p::count]) for p in range(min(count, protocol.concurrency))]


def time_adapter_run(protocol: PerformanceProtocol, arm: AdapterArm, index: int, run: ScheduledRun) -> dict:
    """One row of the timings table from `SUT.sample` calls; SUTRaised if the adapter raises or a
    batch breaks the contract (shape, sources)."""
    from specval.sut import SUTError

    call = f"sample ({run.phase} {run.pair}, arm {run.arm})"
    calls, sampling = _adapter_calls(protocol, run), protocol.arm_sampling(run.arm)
    try:
        _synchronize(protocol)
        start = clock_ns()
        batches = [
            arm.sut.sample(
                arm.group, list(arm.prompt_ids[p]), sampling, seeds, protocol.max_tokens, protocol.max_tokens
            )
            for p, seeds in calls
        ]
        _synchronize(protocol)
        elapsed = clock_ns() - start
    except SUTRaised as err:
        raise SUTRaised(call, err.message, err.details) from err
    try:
        for (_, seeds), batch in zip(calls, batches):
            batch.validate(len(seeds), protocol.max_tokens)
    except (SUTError, AttributeError) as err:
        raise SUTRaised(call, f"the adapter broke the contract of SUT.sample: {err}") from err
    total = {
        name: sum(int(np.sum(getattr(b, name))) for b in batches)
        for name in ("num_rounds", "num_draft_tokens", "num_accepted_tokens")
    }
    return {
        "run": index,
        "phase": run.phase,
        "pair": run.pair,
        "arm": run.arm,
        "seed_start": seed_start(protocol, run),
        "num_requests": sum(len(s) for _, s in calls),
        "num_tokens": sum(b.tokens.size for b in batches),
        **total,
        "elapsed_ns": elapsed,
        "graphs_before": 0,
        "graphs_after": 0,
    }


# ---------------------------------------------------------------- one timed run


def _requests(protocol: PerformanceProtocol, run: ScheduledRun) -> tuple[list[str], list]:
    from specval.adapters import engine as adapter

    sampling, first = protocol.arm_sampling(run.arm), seed_start(protocol, run)
    prompts = [protocol.prompts[j % len(protocol.prompts)] for j in range(protocol.concurrency)]
    params = [
        adapter.request_params(sampling, protocol.max_tokens, seed=first + j, ignore_eos=True)
        for j in range(protocol.concurrency)
    ]
    return prompts, params


def _synchronize(protocol: PerformanceProtocol) -> None:
    if protocol.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(protocol.device)


def time_run(protocol: PerformanceProtocol, llm, index: int, run: ScheduledRun) -> dict:
    """One row of the timings table: the run's counts and its wall time in integer nanoseconds.
    SUTRaised if the engine raises or a request ends before max_tokens."""
    if isinstance(llm, AdapterArm):
        return time_adapter_run(protocol, llm, index, run)
    prompts, params = _requests(protocol, run)
    before = graph_shapes(llm)
    try:
        _synchronize(protocol)
        start = clock_ns()
        outputs = llm.generate(prompts, params)
        _synchronize(protocol)
        elapsed = clock_ns() - start
    except ADAPTER_FAULTS as err:  # SystemExit of engine code included
        raise sut_raised(f"generate ({run.phase} {run.pair}, arm {run.arm})", err) from err
    short = [o.finish_reason for o in outputs if len(o.token_ids) != protocol.max_tokens]
    if short:
        raise SUTRaised(
            f"generate ({run.phase} {run.pair}, arm {run.arm})",
            f"{len(short)} request(s) ended before max_tokens ({short[0]!r})",
        )
    return {
        "run": index,
        "phase": run.phase,
        "pair": run.pair,
        "arm": run.arm,
        "seed_start": params[0].seed,
        "num_requests": len(outputs),
        "num_tokens": sum(len(o.token_ids) for o in outputs),
        "num_rounds": sum(o.num_rounds for o in outputs),
        "num_draft_tokens": sum(o.num_draft_tokens for o in outputs),
        "num_accepted_tokens": sum(o.num_accepted_tokens for o in outputs),
        "elapsed_ns": elapsed,
        "graphs_before": before,
        "graphs_after": graph_shapes(llm),
    }


def time_schedule(protocol: PerformanceProtocol, llms: dict, progress: bool) -> pd.DataFrame:
    """Every run of the schedule, in order; the table of COLUMNS."""
    runs = schedule(protocol)
    rows = []
    with tqdm(total=len(runs), unit="run", disable=not progress, desc=protocol.name) as bar:
        for index, run in enumerate(runs):
            rows.append(time_run(protocol, llms[run.arm], index, run))
            bar.update(1)
    return pd.DataFrame(rows, columns=list(COLUMNS))


# ---------------------------------------------------------------- bundle


def read_timings(path: Path) -> pd.DataFrame:
    """The bundle's timings table (integers and strings only, so the CSV round trip is exact)."""
    try:
        return pd.read_csv(path / TIMINGS_FILE, dtype={"phase": str, "arm": str})
    except FileNotFoundError as err:
        raise bundles.BundleError(f"{path / TIMINGS_FILE}: missing") from err
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise bundles.BundleError(f"{path / TIMINGS_FILE}: not a table ({err})") from err


def _start(
    protocol_file: Path,
    base: PerformanceProtocol,
    protocol: PerformanceProtocol,
    output: Path,
    registration: str,
    exploratory: bool,
) -> Path:
    path = lifecycle.new_bundle(output, protocol.name)
    lifecycle.record_run(path, protocol_file, base, protocol, [_seed_range(protocol)], registration, exploratory)
    return path


def _seed_range(protocol: PerformanceProtocol) -> tuple[str, int, int]:
    return SEED_GROUP, protocol.seed_base, protocol.seed_base + protocol.pairs * protocol.concurrency


def load_bundle_protocol(path: Path) -> tuple[PerformanceProtocol, bundles.RunPlan]:
    """The resolved protocol and the plan of a bench bundle (BundleError unless its three records agree)."""
    protocol, plan = bundles.load_plan_protocol(path, parse_performance_protocol, load_performance_protocol)
    return resolve(protocol, plan.profile), plan


def recompute(path: Path) -> dict:
    """The summary recomputed from the bundle's protocol, run.json and timings table alone."""
    protocol, plan = load_bundle_protocol(path)
    return summarise(protocol, read_timings(path), plan.registration_block())


def bench(
    protocol_file: Path,
    profile: str | None,
    output: Path,
    *,
    exploratory: bool = False,
    progress: bool = True,
    command: list[str] | None = None,
    announce: Callable[[Path], None] | None = None,
    parsed: PerformanceProtocol | None = None,
) -> tuple[Path, dict]:
    """Run a performance protocol and write a sealed bundle; returns (bundle, summary).

    Refused before any bundle exists (ProtocolError: exit 2): a bad or unregistered protocol (unless
    `exploratory`), an unwritable output root, an arm the engine refuses. Engines that raise while
    being built give SUTRaised (exit 3, no bundle). Once the bundle exists, an engine that raises
    gives execution.RunFailed and an interrupt execution.RunInterrupted; the bundle stays unsealed.
    `parsed`: the protocol of `protocol_file` when the caller has parsed it already; None: read here."""
    started, clock = dt.datetime.now(dt.timezone.utc).isoformat(), time.perf_counter()
    base = parsed if parsed is not None else load_performance_protocol(protocol_file)
    state = check_registered(base, protocol_file, exploratory)
    protocol = resolve(base, profile)
    check_writable_dir(Path(output), "--output")
    llms = build_engines(protocol)
    try:
        path = _start(Path(protocol_file), base, protocol, Path(output), state, exploratory)
        if announce:
            announce(path)
        session = bundles.begin_session(path, command)
        with guard_bundle(path, session):
            t0 = time.perf_counter()
            table = time_schedule(protocol, llms, progress)
            bench_s = time.perf_counter() - t0
            engines = {key: {"name": protocol.arm(key).name, "graphs": graph_status(llms[key])} for key in ARM_KEYS}
            described = _described(llms)
    finally:
        close_engines(llms)
    (path / bundles.SAMPLES_DIR).mkdir(exist_ok=True)
    bundles.write_chunk(path, path / TIMINGS_FILE, lambda tmp: table.to_csv(tmp, index=False))
    summary = recompute(path)
    bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    timed = int((table["phase"] == PAIR).sum())
    bundles.end_session(path, session, timed, summary["verdict"])
    _write_manifest(
        path, protocol, {**bundles.device_facts(), "engines": engines, **described}, started, clock, bench_s, command
    )
    finish(path)
    return path, summary


def _described(llms: dict) -> dict:
    """{"sut": the adapter's `describe()`} for a bench of another adapter than the engine, else {}."""
    arms = [arm for arm in llms.values() if isinstance(arm, AdapterArm)]
    return {"sut": arms[0].sut.describe()} if arms else {}


def _write_manifest(
    path: Path,
    protocol: PerformanceProtocol,
    device: dict,
    started: str,
    clock: float,
    bench_s: float,
    command: list[str] | None,
) -> None:
    group, start, stop = _seed_range(protocol)
    timing = {
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "wall_s": time.perf_counter() - clock,
        "bench_s": bench_s,
        "runs": len(schedule(protocol)),
    }
    lifecycle.write_manifest(
        path, protocol, [seeds.SeedRange(protocol.name, path.name, group, start, stop)], device, timing, command
    )


def finish(path: Path) -> None:
    """Render report.md / report.html and seal the bundle with SHA256SUMS."""
    bundles.write_files(path, render_files(path))
    lifecycle.seal(path)


def verify(path: Path) -> list[str]:
    """Every difference between the bundle and its seals, its summary recomputed from the recorded
    timings (schedule, ratios, median, interval, verdict) and its reports re-rendered. The timings
    themselves cannot be re-measured; verify shows the bundle is consistent, not that it was timed."""
    return bundles.verify_bundle(path, recompute, render_files)
