"""Bench: one performance protocol run, from two engines to a sealed bundle, and its verification.

    protocol -> both engines built -> warm-up rounds (CUDA Graphs captured; recorded, excluded)
             -> pairs in ABBA order, each run timed -> timings table -> ratios, median, interval
             -> verdict -> report -> manifest -> SHA256SUMS

A run submits the protocol's `concurrency` requests at once to one arm's `engine.LLM.generate`
(request j: prompt j mod len(prompts), `max_tokens` tokens, `ignore_eos`, seed from
`bench_summary.seed_start`) and is timed with `time.perf_counter_ns` (a monotonic clock), with
`torch.cuda.synchronize` before the start and before the stop on CUDA, so queued device work is
inside the run that queued it. Both arms share one model (weights loaded once), each has its own
engine (KV cache, runner, CUDA Graphs). The timings table is written once, complete, after the
last run, and its sha256 recorded in chunks.json (`bundle.write_chunk`).

Layout: the distribution bundle's (`specval.bundle`) with `samples/timings.csv` as the only raw
file and no reference or quadrature. Seeds are not claimed in the ledger: a bench makes no
statistical claim about tokens, and every run of a protocol times the same workload. A bench is
not resumable: a run that is interrupted or whose engine raises keeps its bundle unsealed (with
error.log) and a new run starts from scratch, since timings of two sessions are not comparable.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Callable

import pandas as pd
from tqdm import tqdm

from specval import bundle as bundles
from specval import lifecycle, seeds
from specval.performance.report import render_files
from specval.performance.summary import COLUMNS, PAIR, ScheduledRun, schedule, seed_start, summarise
from specval.execution import guard_bundle
from specval.performance.protocol import (ARM_KEYS, PerformanceProtocol, load_performance_protocol,
                                          parse_performance_protocol, resolve)
from specval.preflight import ADAPTER_FAULTS, SUTRaised, check_writable_dir, sut_raised
from specval.protocol import ProtocolError, check_registered

TIMINGS_FILE = f"{bundles.SAMPLES_DIR}/timings.csv"
SEED_GROUP = "pairs"  # run.json's one range: the request seeds of every pair (both arms)


# ---------------------------------------------------------------- engines


def engine_config(protocol: PerformanceProtocol, key: str):
    """The EngineConfig of arm `key`; ProtocolError (an input error) when the engine refuses it."""
    from specval.adapters import engine as adapter

    arm = protocol.arm(key)
    extra = {} if arm.mode != "async" else {"rounds_in_flight": arm.rounds_in_flight}
    try:
        return adapter.engine_config(model=protocol.sut.model, dtype=protocol.sut.dtype, mode=arm.mode,
                            num_speculative_tokens=protocol.num_speculative_tokens, draft_loops=arm.draft_loops,
                            device=protocol.device, enforce_eager=arm.enforce_eager, **extra,
                            **dict(protocol.sut.options))
    except (ValueError, TypeError) as err:
        raise ProtocolError(f"{protocol.name}: arm {key} ({arm.name}): the engine refuses its configuration: "
                            f"{err}") from err


def build_engines(protocol: PerformanceProtocol) -> dict:
    """arm key -> engine.LLM; both share the first one's model and tokenizer. Configurations are
    checked first (ProtocolError); anything the engine raises while building is SUTRaised."""
    from specval.adapters import engine as adapter

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
    for llm in llms.values():
        llm.close()


def graph_shapes(llm) -> int:
    """Round shapes captured as CUDA Graphs so far by the engine's runner (0 without graphs)."""
    graphs = getattr(llm.engine.runner, "graphs", None)
    return 0 if graphs is None else len(graphs._rounds)  # noqa: SLF001 - the count is not exposed otherwise


def graph_status(llm) -> str:
    graphs = getattr(llm.engine.runner, "graphs", None)
    if graphs is None:
        return "no CUDA Graphs (eager runner, CPU, or enforce_eager)"
    return graphs.disabled_reason or f"{graph_shapes(llm)} round shape(s) captured"


# ---------------------------------------------------------------- one timed run


def _requests(protocol: PerformanceProtocol, run: ScheduledRun) -> tuple[list[str], list]:
    from specval.adapters import engine as adapter

    sampling, first = protocol.arm_sampling(run.arm), seed_start(protocol, run)
    prompts = [protocol.prompts[j % len(protocol.prompts)] for j in range(protocol.concurrency)]
    params = [adapter.sampling_params(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                             seed=first + j, max_tokens=protocol.max_tokens, ignore_eos=True)
              for j in range(protocol.concurrency)]
    return prompts, params


def _synchronize(protocol: PerformanceProtocol) -> None:
    if protocol.device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(protocol.device)


def time_run(protocol: PerformanceProtocol, llm, index: int, run: ScheduledRun) -> dict:
    """One row of the timings table: the run's counts and its wall time in integer nanoseconds.
    SUTRaised if the engine raises or a request ends before max_tokens."""
    prompts, params = _requests(protocol, run)
    before = graph_shapes(llm)
    try:
        _synchronize(protocol)
        start = time.perf_counter_ns()
        outputs = llm.generate(prompts, params)
        _synchronize(protocol)
        elapsed = time.perf_counter_ns() - start
    except ADAPTER_FAULTS as err:  # SystemExit of engine code included
        raise sut_raised(f"generate ({run.phase} {run.pair}, arm {run.arm})", err) from err
    short = [o.finish_reason for o in outputs if len(o.token_ids) != protocol.max_tokens]
    if short:
        raise SUTRaised(f"generate ({run.phase} {run.pair}, arm {run.arm})",
                        f"{len(short)} request(s) ended before max_tokens ({short[0]!r})")
    return {"run": index, "phase": run.phase, "pair": run.pair, "arm": run.arm, "seed_start": params[0].seed,
            "num_requests": len(outputs), "num_tokens": sum(len(o.token_ids) for o in outputs),
            "num_rounds": sum(o.num_rounds for o in outputs),
            "num_draft_tokens": sum(o.num_draft_tokens for o in outputs),
            "num_accepted_tokens": sum(o.num_accepted_tokens for o in outputs), "elapsed_ns": elapsed,
            "graphs_before": before, "graphs_after": graph_shapes(llm)}


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


def _start(protocol_file: Path, base: PerformanceProtocol, protocol: PerformanceProtocol, output: Path,
           registration: str, exploratory: bool) -> Path:
    path = lifecycle.new_bundle(output, protocol.name)
    plan = bundles.RunPlan(protocol.name, protocol.hash, protocol.profile, (_seed_range(protocol),),
                           registration=registration, exploratory=exploratory)
    lifecycle.record_plan(path, protocol_file, base, plan)
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


def bench(protocol_file: Path, profile: str | None, output: Path, *, exploratory: bool = False,
          progress: bool = True, command: list[str] | None = None,
          announce: Callable[[Path], None] | None = None,
          parsed: PerformanceProtocol | None = None) -> tuple[Path, dict]:
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
    finally:
        close_engines(llms)
    (path / bundles.SAMPLES_DIR).mkdir(exist_ok=True)
    bundles.write_chunk(path, path / TIMINGS_FILE, lambda tmp: table.to_csv(tmp, index=False))
    summary = recompute(path)
    bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    timed = int((table["phase"] == PAIR).sum())
    bundles.end_session(path, session, timed, summary["verdict"])
    _write_manifest(path, protocol, {**bundles.device_facts(), "engines": engines}, started, clock, bench_s,
                    command)
    finish(path)
    return path, summary


def _write_manifest(path: Path, protocol: PerformanceProtocol, device: dict, started: str, clock: float,
                    bench_s: float, command: list[str] | None) -> None:
    group, start, stop = _seed_range(protocol)
    timing = {"started": started, "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
              "wall_s": time.perf_counter() - clock, "bench_s": bench_s, "runs": len(schedule(protocol))}
    lifecycle.write_manifest(path, protocol, [seeds.SeedRange(protocol.name, path.name, group, start, stop)],
                             device, timing, command)


def finish(path: Path) -> None:
    """Render report.md / report.html and seal the bundle with SHA256SUMS."""
    bundles.write_files(path, render_files(path))
    lifecycle.seal(path)


def verify(path: Path) -> list[str]:
    """Every difference between the bundle and its seals, its summary recomputed from the recorded
    timings (schedule, ratios, median, interval, verdict) and its reports re-rendered. The timings
    themselves cannot be re-measured; verify shows the bundle is consistent, not that it was timed."""
    return bundles.verify_bundle(path, recompute, render_files)
