"""Where a sequence run's seconds go: collection, replays and parts, criteria, per group.

Runs `specval.sequence.runner.run` in this process (no supervisor: a benchmark, not a gate) as an
exploratory run into OUTPUT, timing each phase by wrapping the functions the runner calls:
every adapter call by name (`adapter.sample`, `adapter.target_logits_along_batch`, ...: the
guard's `preflight._guard_call`), `collect.sample_batch` (the call, its check and its frame), the
chunk writes, the float64 reference parts, the companions' status, `runner.summarise` (loading the
tables and every criterion) and within it `verdict.evaluate` per group. With --cprofile FILE the
whole run is also profiled (cProfile; read with `python -m pstats FILE`); cProfile sees the main
thread only, so --serial runs the parts and criteria there too (`workers.pipelined` inline).

    python -m benchmarks.sequence_phases PROTOCOL --profile full --output OUTPUT [--cprofile FILE] [--serial]
        [--switch-interval SECONDS]

--switch-interval sets `sys.setswitchinterval` (Python's default 0.005): how long a thread waiting
for the GIL (the collection's, between device rounds) lets the holder run on.

Prints one table: phase, calls, seconds; then the run's verdict and process wall.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import sys
import time
from collections import defaultdict
from pathlib import Path

from specval import preflight
from specval.sequence import collect, reference, runner, verdict, workers

SECONDS: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def _timed(owner, name: str, label: str) -> None:
    """Replace owner.name by a wrapper adding its seconds to SECONDS[label]."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - start
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def _guard_call_timed(name: str, method):
    """preflight._guard_call whose calls add to SECONDS["adapter.<name>"]."""
    guarded = GUARD_CALL(name, method)

    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return guarded(*args, **kwargs)
        finally:
            SECONDS[f"adapter.{name}"] += time.perf_counter() - start
            CALLS[f"adapter.{name}"] += 1

    return call


GUARD_CALL = preflight._guard_call


def instrument() -> None:
    """Wrap the phases (module docstring). The runner calls them through their modules."""
    preflight._guard_call = _guard_call_timed
    _timed(collect, "sample_batch", "sample_batch (call + check + frame)")
    _timed(collect.bundles, "write_chunk", "chunk writes (parquet + sha256)")
    _timed(collect, "load_tables", "load tables")
    _timed(reference, "sequence_parts", "reference parts (float64)")
    _timed(reference, "build_companions", "companion replays + status")
    _timed(runner, "summarise", "summarise (load + criteria)")
    _timed(verdict, "evaluate", "criteria (verdict.evaluate)")


def _inline(jobs, _workers):
    """workers.pipelined on the caller's thread: the same results in the same order."""
    return [job() for job in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("protocol", type=Path)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--cprofile", type=Path, default=None)
    parser.add_argument("--serial", action="store_true", help="parts and criteria on the main thread")
    parser.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval")
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    instrument()
    if args.serial:
        workers.pipelined = _inline
    profiler = cProfile.Profile() if args.cprofile else None
    wall = time.perf_counter()
    if profiler:
        profiler.enable()
    path, summary = runner.run(args.protocol, args.profile, args.output, exploratory=True, progress=False)
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.cprofile)
    wall = time.perf_counter() - wall
    print(f"{'phase':<40} {'calls':>6} {'seconds':>9}")
    for label, seconds in SECONDS.items():
        print(f"{label:<40} {CALLS[label]:>6} {seconds:>9.2f}")
    print(f"{path.name}: {summary['verdict']}, {wall:.1f} s in run()")


if __name__ == "__main__":
    main()
