"""Bench summary: the ABBA schedule of a performance protocol, and everything computed from its timings.

Schedule: `warmup_rounds` untimed-for-the-verdict rounds, then `pairs` pairs; round or pair i runs
the arms in the order a, b when i is even and b, a when i is odd, so the runs read
A B B A A B B A ...: a drift of the machine that is linear over four runs hits both arms alike.

From the timings table (one row per run, in schedule order) this module computes, with nothing
else: each pair's statistic per arm and its ratio b / a, the median ratio with its exact
order-statistic interval (`specval.stats.median`), and the verdict against the pre-registered
threshold. `specval verify` calls the same functions on the recorded table, so the arithmetic is
re-checked; the timings themselves cannot be re-measured.

Verdict (threshold t, interval [low, high] of the median ratio; "good side" is above t for
throughput, below t for latency): PASS iff the interval lies strictly on the good side, FAIL iff
it lies strictly on the bad side, INCONCLUSIVE otherwise, and INCONCLUSIVE whatever the interval
when a timed run captured a CUDA Graph (the timing then includes the capture, which the protocol
excludes). Error rates, for independent pairs from one distribution: when the true median ratio
is on the bad side of t (or at t), PASS happens with probability <= tail = P(Bin(n, 1/2) <= k - 1)
<= (1 - confidence) / 2; when it is on the good side (or at t), FAIL happens with probability <= tail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specval.bundle import BundleError
from specval.performance.protocol import ARM_KEYS, PerformanceProtocol
from specval.stats.median import MedianInterval, median_interval

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
WARMUP, PAIR = "warmup", "pair"
NS_PER_S = 1e9
COLUMNS = (
    "run",
    "phase",
    "pair",
    "arm",
    "seed_start",
    "num_requests",
    "num_tokens",
    "num_rounds",
    "num_draft_tokens",
    "num_accepted_tokens",
    "elapsed_ns",
    "graphs_before",
    "graphs_after",
)
STATISTIC_MEANING = {
    "throughput": "generated tokens per second of wall time (higher is better)",
    "latency": "wall seconds of the whole workload, submission to last completion (lower is better)",
    "time_per_token": "wall seconds of the workload per generated token (lower is better)",
}


@dataclass(frozen=True)
class ScheduledRun:
    """One run of the schedule: warm-up round or pair `pair`, arm "a" or "b"."""

    phase: str
    pair: int
    arm: str


def schedule(protocol: PerformanceProtocol) -> list[ScheduledRun]:
    """Warm-up rounds, then pairs; round i in order a, b (i even) or b, a (i odd)."""
    runs = []
    for phase, count in ((WARMUP, protocol.warmup_rounds), (PAIR, protocol.pairs)):
        for index in range(count):
            order = ARM_KEYS if index % 2 == 0 else ARM_KEYS[::-1]
            runs += [ScheduledRun(phase, index, arm) for arm in order]
    return runs


def seed_start(protocol: PerformanceProtocol, run: ScheduledRun) -> int:
    """First request seed of a run: pair i takes [seed_base + i c, seed_base + (i + 1) c) in both arms
    (c = concurrency); warm-up rounds take pair 0's seeds."""
    pair = run.pair if run.phase == PAIR else 0
    return protocol.seed_base + pair * protocol.concurrency


def check_schedule(protocol: PerformanceProtocol, table: pd.DataFrame) -> None:
    """BundleError unless `table` has the columns of COLUMNS and one row per scheduled run, in order,
    with that run's phase, pair, arm, seeds, request count and tokens (every request max_tokens)."""
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing or len(table.columns) != len(COLUMNS):
        raise BundleError(f"timings table has columns {list(table.columns)}, expected {list(COLUMNS)}")
    expected = schedule(protocol)
    if len(table) != len(expected):
        raise BundleError(f"timings table has {len(table)} rows, the protocol schedules {len(expected)} runs")
    tokens = protocol.concurrency * protocol.max_tokens
    for index, (run, row) in enumerate(zip(expected, table.itertuples(index=False))):
        want = (index, run.phase, run.pair, run.arm, seed_start(protocol, run), protocol.concurrency, tokens)
        got = (row.run, row.phase, row.pair, row.arm, row.seed_start, row.num_requests, row.num_tokens)
        if tuple(want) != tuple(got):
            raise BundleError(
                f"timings row {index} is {got}, the schedule says {want} "
                "(run, phase, pair, arm, seed_start, num_requests, num_tokens)"
            )
        if not row.elapsed_ns > 0:
            raise BundleError(f"timings row {index}: elapsed_ns {row.elapsed_ns} is not positive")


def run_values(protocol: PerformanceProtocol, table: pd.DataFrame) -> np.ndarray:
    """float64[rows]: the protocol's statistic of every run (tokens / s, s, or s per token)."""
    seconds = table["elapsed_ns"].to_numpy(dtype=np.float64) / NS_PER_S
    tokens = table["num_tokens"].to_numpy(dtype=np.float64)
    if protocol.statistic == "throughput":
        return tokens / seconds
    if protocol.statistic == "time_per_token":
        return seconds / tokens
    return seconds


def pair_frame(protocol: PerformanceProtocol, table: pd.DataFrame) -> pd.DataFrame:
    """One row per timed pair: pair, order ("ab" or "ba"), a, b (the statistic) and ratio = b / a."""
    timed = table.assign(value=run_values(protocol, table))[table["phase"] == PAIR]
    wide = timed.pivot(index="pair", columns="arm", values="value").sort_index()
    order = ["".join(ARM_KEYS if pair % 2 == 0 else ARM_KEYS[::-1]) for pair in wide.index]  # as `schedule`
    return pd.DataFrame(
        {
            "pair": wide.index.to_numpy(),
            "order": order,
            "a": wide["a"].to_numpy(),
            "b": wide["b"].to_numpy(),
            "ratio": (wide["b"] / wide["a"]).to_numpy(),
        }
    )


def verdict(interval: MedianInterval, protocol: PerformanceProtocol) -> tuple[str, str]:
    """PASS / FAIL / INCONCLUSIVE of the interval against the protocol's threshold, with the reason."""
    low, high, threshold = interval.low, interval.high, protocol.threshold
    good, bad = (
        (low > threshold, high < threshold) if protocol.higher_is_better else (high < threshold, low > threshold)
    )
    side = "above" if protocol.higher_is_better else "below"
    where = f"interval [{low:.4f}, {high:.4f}] of the median ratio b / a"
    if good:
        return PASS, f"{protocol.hypothesis}: the {where} lies {side} {threshold:.4f}"
    if bad:
        return FAIL, f"{protocol.hypothesis} refuted: the {where} lies entirely on the wrong side of {threshold:.4f}"
    return INCONCLUSIVE, (f"the {where} contains {threshold:.4f}: too wide to decide at {interval.n} pairs; not a PASS")


def _arm_facts(protocol: PerformanceProtocol, table: pd.DataFrame, key: str) -> dict:
    arm = protocol.arm(key)
    timed = table[(table["phase"] == PAIR) & (table["arm"] == key)]
    values = run_values(protocol, timed)
    drafts, accepted = int(timed["num_draft_tokens"].sum()), int(timed["num_accepted_tokens"].sum())
    sampling = protocol.arm_sampling(key)
    engine = protocol.on_engine  # enforce_eager and rounds_in_flight are engine options (None elsewhere)
    return {
        "name": arm.name,
        "mode": arm.mode,
        "draft_loops": arm.draft_loops,
        "enforce_eager": arm.enforce_eager if engine else None,
        "rounds_in_flight": arm.rounds_in_flight if engine and arm.mode == "async" else None,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "runs": len(timed),
        "median": float(np.median(values)),
        "min": float(values.min()),
        "max": float(values.max()),
        "acceptance_rate": accepted / drafts if drafts else None,
        "rounds_per_request": float(timed["num_rounds"].sum() / timed["num_requests"].sum()),
    }


def _order_effect(pairs: pd.DataFrame) -> dict:
    """Median ratio of the pairs run a-first and of those run b-first (a diagnostic, never gating)."""
    by_order = {order: float(np.median(group["ratio"])) for order, group in pairs.groupby("order")}
    return {"median_ratio_ab": by_order.get("ab"), "median_ratio_ba": by_order.get("ba")}


def summarise(protocol: PerformanceProtocol, table: pd.DataFrame, registration: dict) -> dict:
    """The summary of a bench, computed from its timings table alone (BundleError if the table
    does not follow the protocol's schedule)."""
    check_schedule(protocol, table)
    pairs = pair_frame(protocol, table)
    interval = median_interval(pairs["ratio"].to_numpy(), protocol.confidence)
    timed = table[table["phase"] == PAIR]
    captured = int((timed["graphs_after"] != timed["graphs_before"]).sum())
    outcome, reason = verdict(interval, protocol)
    facts = _protocol_facts(protocol)
    if captured:
        outcome, reason = (
            INCONCLUSIVE,
            (
                f"{captured} timed run(s) captured CUDA Graphs, so their timings include "
                "the capture (more warm-up rounds are needed); no verdict"
            ),
        )
    return {
        "kind": "performance",
        "verdict": outcome,
        "reason": reason,
        "registration": registration,
        "ratio": interval.to_dict(),
        "threshold": protocol.threshold,
        "false_pass_bound": interval.tail,
        "false_fail_bound": interval.tail,
        "pairs": [
            {"pair": int(r.pair), "order": r.order, "a": float(r.a), "b": float(r.b), "ratio": float(r.ratio)}
            for r in pairs.itertuples(index=False)
        ],
        "arms": {key: _arm_facts(protocol, table, key) for key in ARM_KEYS},
        "order_effect": _order_effect(pairs),
        "timed_runs_capturing_graphs": captured,
        "protocol": facts,
    }


def _protocol_facts(protocol: PerformanceProtocol) -> dict:
    """The summary's `protocol` block; `adapter` only for adapters other than the engine, so that the
    summary of an engine bench is what it was before other adapters could be timed."""
    facts = {
        "name": protocol.name,
        "hash": protocol.hash,
        "profile": protocol.profile,
        "device": protocol.device,
        "statistic": protocol.statistic,
        "statistic_meaning": STATISTIC_MEANING[protocol.statistic],
        "hypothesis": protocol.hypothesis,
        "margin": protocol.margin,
        "confidence": protocol.confidence,
        "pairs": protocol.pairs,
        "warmup_rounds": protocol.warmup_rounds,
        "concurrency": protocol.concurrency,
        "max_tokens": protocol.max_tokens,
        "num_prompts": len(protocol.prompts),
        "num_speculative_tokens": protocol.num_speculative_tokens,
        "model": protocol.sut.model,
        "dtype": protocol.sut.dtype,
    }
    if not protocol.on_engine:
        facts["adapter"] = protocol.sut.adapter
    return facts
