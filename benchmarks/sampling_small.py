"""Small batches of batched_probabilities on a CUDA device: three launches against one.

For each (B, V, row mix) it times the three-launch path (`DEFAULT_CONFIG` with
`single_launch_entries=0`) and every configuration of `SINGLE_LAUNCH_CONFIGS` forced onto the
single launch, all through `probabilities_triton` (the public call's path: cached scratch,
compiled launches):
- "eager": `triton.testing.do_bench` median (CUDA events around each call, inputs rotated over
  >= 4x L2): device time with a cold L2. do_bench zeroes a 256 MB buffer before each call and
  the host enqueues the call while that runs, so host time below that zeroing's duration does
  not show here (three launches on a DENSE row read ~20 us although their enqueue takes ~55);
- "graph": `triton.testing.do_bench_cudagraph` median: device time alone, warm L2;
- "host": host time to enqueue one call (median over HOST_REPEATS loops of HOST_CALLS calls,
  no synchronisation inside a loop);
- "stream": what back-to-back eager calls cost each, host and device together: HOST_CALLS
  calls (inputs rotated as for "eager") then one torch.cuda.synchronize, divided by HOST_CALLS
  (median of HOST_REPEATS loops). About the larger of host and device time;
- "latency": one call from the host's call to its result on the device (the call, then
  torch.cuda.synchronize; median of LATENCY_CALLS): what a caller waiting for one small batch
  sees, host and device together, with no other call queued behind it.
Then the cost of FALLBACK rows: one candidate slot per chunk sends every truncating row into
the fallback (split over the write programs in three launches, counted by one program in the
single launch).

With --default-only ROUNDS, only the default configuration (the path `batched_probabilities`
takes) on DEFAULT_CASES (B = 1-64, both vocabularies, truncating and DENSE rows), measured in
ROUNDS rounds over every case: per case the median and the range of each column over the
rounds, since host time on a shared machine moves from one measurement to the next; with
--overlap also the default with programmatic dependent launch (`overlap_launches`) flipped.

Usage, from the repository root:
python3 -m benchmarks.sampling_small [--out small.md] [--default-only ROUNDS [--overlap]]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time

import torch
import triton
import triton.testing

from benchmarks.sampling import L2_BYTES, inputs
from benchmarks.sampling_host import per_call_us
from benchmarks.select_kernel import VARIANTS as SELECT_VARIANTS
from engine.sampling.kernels.probabilities import (
    DEFAULT_CONFIG,
    SINGLE_LAUNCH_CONFIGS,
    RowMode,
    launch_plan,
    probabilities_triton,
    run_probabilities,
)

WARMUP_MS, REP_MS, GRAPH_REP_MS = 25, 100, 20
LATENCY_CALLS = 200
HOST_REPEATS, HOST_CALLS = 20, 25
ANY_SIZE = 2**40  # single_launch_entries that sends every batch of this script to one launch
MIXES = {"top-k 50 + top-p 0.9": (50, 0.9), "no truncation": (-1, 1.0), "top-k 1000 + top-p 0.95": (1000, 0.95)}
# (B, V, mix): the default mix at every size up to past the threshold, the others at 1/8/64
CASES = (
    [(b, v, "top-k 50 + top-p 0.9") for v in (32000, 152064) for b in (1, 2, 4, 8, 32, 64, 128)]
    + [(b, 32000, "no truncation") for b in (1, 8)]
    + [(b, 152064, mix) for mix in list(MIXES)[1:] for b in (1, 8, 64)]
)
FALLBACK_BATCHES = (1, 8, 64)
DEFAULT_CASES = [(b, v, mix) for v in (32000, 152064) for mix in list(MIXES)[:2] for b in (1, 2, 4, 8, 16, 32, 64)]
COLUMNS = ("eager", "graph", "host", "stream", "latency")


def variants(base=DEFAULT_CONFIG):
    """(name, config): three launches, then each single-launch configuration."""
    three = dataclasses.replace(base, single_launch_entries=0)
    singles = [
        (f"single {i}", dataclasses.replace(c, single_launch_entries=ANY_SIZE))
        for i, c in enumerate(SINGLE_LAUNCH_CONFIGS)
    ]
    return [("three", three), *singles]


def input_sets(batch, vocab, mix):
    k, p = MIXES[mix]
    num_sets = max(1, min(16, -(-4 * L2_BYTES // (batch * vocab * 8))))
    sets = []
    for seed in range(num_sets):
        logits, t, _, _ = inputs(batch, vocab, seed)
        sets.append((logits, t, torch.full_like(t, k, dtype=torch.int64), torch.full_like(t, p)))
    return sets


def latency_us(fn, args, calls=LATENCY_CALLS) -> float:
    """Median time of one call followed by torch.cuda.synchronize (host and device)."""
    fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def stream_us(fn, sets, calls=HOST_CALLS, repeats=HOST_REPEATS) -> float:
    """Wall time per call of `calls` back-to-back calls and one synchronize (median)."""
    cycle = itertools.cycle(sets)
    loops = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*next(cycle))
        torch.cuda.synchronize()
        loops.append((time.perf_counter() - start) / calls)
    return statistics.median(loops) * 1e6


def timings(config, sets) -> tuple[float, ...]:
    """(eager, graph, host, stream, latency) us of probabilities_triton with `config`."""
    fn = lambda *a: probabilities_triton(*a, config=config)  # noqa: E731
    cycle = itertools.cycle(sets)
    eager = triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
    graph = triton.testing.do_bench_cudagraph(lambda: fn(*sets[0]), rep=GRAPH_REP_MS, return_mode="median")
    host = per_call_us(lambda: fn(*sets[0]), HOST_CALLS, HOST_REPEATS)
    return eager * 1e3, graph * 1e3, host, stream_us(fn, sets), latency_us(fn, sets[0])


def modes(config, args) -> str:
    """Row modes of one call, e.g. 'SPARSE 8' or 'FALLBACK 6, WHOLE_ROW 2'."""
    found = run_probabilities(*args, config).row_mode.cpu().tolist()
    return ", ".join(f"{RowMode(m).name} {found.count(m)}" for m in sorted(set(found)))


def table(cases, named_configs) -> list[str]:
    names = [name for name, _ in named_configs]
    columns = " / ".join(COLUMNS)
    lines = [
        "| B | V | rows | " + " | ".join(f"{n} {columns}" for n in names) + " | row modes |",
        "|---:|---:|---|" + "---:|" * len(names) + "---|",
    ]
    for batch, vocab, mix in cases:
        sets = input_sets(batch, vocab, mix)
        cells = [" / ".join(f"{x:.1f}" for x in timings(config, sets)) for _, config in named_configs]
        lines.append(
            f"| {batch} | {vocab} | {mix} | " + " | ".join(cells) + f" | {modes(named_configs[-1][1], sets[0])} |"
        )
        print(lines[-1], flush=True)
    return lines


def default_rounds(rounds: int, named_configs=(("default", DEFAULT_CONFIG),), cases=DEFAULT_CASES) -> list[str]:
    """Median [min-max] over `rounds` rounds of each column, for each configuration (the
    default; with --overlap also the default with `overlap_launches` flipped, with --variants
    the named variants), interleaved case by case within each round."""
    sets = {case: input_sets(*case) for case in cases}
    found = {(case, name): [] for case in cases for name, _ in named_configs}
    for _ in range(rounds):
        for case in cases:
            for name, config in named_configs:
                found[case, name].append(timings(config, sets[case]))
    lines = [
        "| B | V | rows | path | config | " + " | ".join(COLUMNS) + " |",
        "|---:|---:|---|---|---|" + "---:|" * len(COLUMNS),
    ]
    for ((batch, vocab, mix), name), runs in found.items():
        path = "single" if launch_plan(DEFAULT_CONFIG, batch, vocab).single else "three"
        cells = [f"{statistics.median(column):.1f} [{min(column):.1f}-{max(column):.1f}]" for column in zip(*runs)]
        lines.append(f"| {batch} | {vocab} | {mix} | {path} | {name} | " + " | ".join(cells) + " |")
    return lines


def device_line() -> str:
    return (
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {triton.__version__}; microseconds per call"
    )


def comparison() -> list[str]:
    """Three launches against each single-launch configuration, then the FALLBACK rows."""
    configs = variants()
    lines = [device_line(), "", *(f"- {name}: {config}" for name, config in configs), ""]
    print("\n".join(lines), flush=True)
    lines += table(CASES, configs)
    forced = dataclasses.replace(DEFAULT_CONFIG, chunk_capacity=1)
    fallback = [
        ("three", dataclasses.replace(forced, single_launch_entries=0)),
        ("single", dataclasses.replace(forced, single_launch_entries=ANY_SIZE)),
    ]
    lines += ["", "Every truncating row FALLBACK (one candidate slot per chunk):", ""]
    lines += table([(b, 152064, "top-k 50 + top-p 0.9") for b in FALLBACK_BATCHES], fallback)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the tables to this file")
    parser.add_argument(
        "--default-only", type=int, metavar="ROUNDS", help="only the default configuration, in this many rounds"
    )
    parser.add_argument(
        "--overlap", action="store_true", help="with --default-only: also the default with overlap_launches flipped"
    )
    parser.add_argument(
        "--variants",
        default="",
        help="with --default-only: also these variants of benchmarks.select_kernel "
        "(comma-separated names; three launches, as the default at these "
        "sizes)",
    )
    parser.add_argument("--batches", default="", help="with --default-only: only these batch sizes (comma-separated)")
    args = parser.parse_args()
    if args.default_only:
        named = [("default", DEFAULT_CONFIG)]
        if args.overlap:
            flipped = not DEFAULT_CONFIG.overlap_launches
            named.append(
                (f"overlap {'on' if flipped else 'off'}", dataclasses.replace(DEFAULT_CONFIG, overlap_launches=flipped))
            )
        named += [(name, SELECT_VARIANTS[name]) for name in args.variants.split(",") if name]
        batches = {int(b) for b in args.batches.split(",") if b}
        cases = [case for case in DEFAULT_CASES if not batches or case[0] in batches]
        lines = [
            f"{device_line()}, median [min-max] of {args.default_only} rounds; {DEFAULT_CONFIG}",
            "",
            *default_rounds(args.default_only, named, cases),
        ]
        print("\n".join(lines), flush=True)
    else:
        lines = comparison()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
