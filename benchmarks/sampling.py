"""Benchmark of batched_probabilities on a CUDA device.

Prints, for B in {1, 64, 256, 1024} and V in {32000, 152064} (temperature 0.8, top-k 50,
top-p 0.9 on every row), the median time per call of the Triton kernel, the torch backend
and a plain sort-based torch implementation, next to the floor: the bytes that must move
(logits read once + probabilities written once) over the measured device copy bandwidth;
then the Triton kernel on other row mixes at B 256 and 1024. Two timings of the Triton kernel:
- eager: triton.testing.do_bench (CUDA events around each call, median), after a warm-up,
  rotating through input sets totalling >= 4x the L2 cache so repeated calls do not measure the
  cache. A call whose host enqueue is slower than its kernels measures the host.
- graph: triton.testing.do_bench_cudagraph (calls captured in a CUDA Graph and replayed,
  median): device time without host enqueue, what a decode round captured in a graph pays.
  One input set (at small B it sits in L2).
"host" is the host time to enqueue one eager call (no synchronisation in the timed loop).

With --sweep it first times the kernel configurations that may be the default
(`CANDIDATE_CONFIGS`) at V=152064 and B=256 (or each of --sweep-batches), in total and per
kernel (torch.profiler), and one that sends every row through the whole-row fallback;
--sweep-only stops there.

Usage, from the repository root:
    python3 -m benchmarks.sampling [--out table.md] [--sweep [--sweep-batches 32,64]
        [--sweep-only]] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time

import torch
import triton
import triton.testing

from engine.sampling import batched_probabilities
from engine.sampling.kernels.probabilities import (
    BASELINE_CONFIG,
    CANDIDATE_CONFIGS,
    DEFAULT_CONFIG,
    KernelConfig,
    RowMode,
    run_probabilities,
)

BATCHES = (1, 64, 256, 1024)
VOCABS = (32000, 152064)
TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.9
LOGIT_SCALE = 4.0  # standard deviation of the random logits
L2_BYTES = 50 * 2**20
WARMUP_MS, REP_MS = 50, 300
GRAPH_REP_MS = 50  # calls captured in one graph: about this many ms of device time


def sort_based(logits, temperature, top_k, top_p):
    """The common sort-based implementation (sort, mask by rank and cumsum, scatter back)."""
    x = logits.float() / temperature.unsqueeze(1)
    sorted_x, order = torch.sort(x, dim=1, descending=True)
    rank = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    sorted_x = sorted_x.masked_fill(rank >= top_k.unsqueeze(1), float("-inf"))
    probs = torch.softmax(sorted_x, dim=1)
    before = torch.cumsum(probs, dim=1) - probs
    sorted_x = sorted_x.masked_fill(before >= top_p.unsqueeze(1), float("-inf"))
    out = torch.empty_like(x).scatter_(1, order, sorted_x)
    return torch.softmax(out, dim=1)


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s (bytes read + bytes written), 1 GiB buffers."""
    src = torch.randn(2**28, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=100, rep=500, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3)


def inputs(batch: int, vocab: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(batch, vocab, device="cuda", generator=g) * LOGIT_SCALE
    full = lambda value, dtype: torch.full((batch,), value, dtype=dtype, device="cuda")  # noqa
    return (logits, full(TEMPERATURE, torch.float32), full(TOP_K, torch.int64), full(TOP_P, torch.float32))


def time_ms(fn, sets) -> float:
    cycle = itertools.cycle(sets)
    return triton.testing.do_bench(lambda: fn(*next(cycle)), warmup=WARMUP_MS, rep=REP_MS, return_mode="median")


def graph_ms(fn, args) -> float:
    """Median device time per call of `fn(*args)` replayed from a CUDA Graph."""
    return triton.testing.do_bench_cudagraph(lambda: fn(*args), rep=GRAPH_REP_MS, return_mode="median")


def implementations(config: KernelConfig | None = None):
    """The timed implementations; `config` None is the public default of `batched_probabilities`."""
    triton_fn = (
        (lambda *a: batched_probabilities(*a, backend="triton"))
        if config is None
        else (lambda *a: run_probabilities(*a, config).probs)
    )
    return {
        "triton": triton_fn,
        "torch": lambda *a: batched_probabilities(*a, backend="torch"),
        "sort": sort_based,
    }


def host_us(fn, args, calls=50) -> float:
    """Host time per call to enqueue `fn` (no synchronisation inside the timed loop)."""
    fn(*args)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def row(batch, vocab, bandwidth, config=None, baselines=True):
    """One line of the main table; without `baselines` the torch and sort columns are nan."""
    nbytes = batch * vocab * 4 * 2
    num_sets = max(1, min(16, -(-4 * L2_BYTES // nbytes)))
    sets = [inputs(batch, vocab, seed) for seed in range(num_sets)]
    impls = implementations(config)
    times = {name: time_ms(fn, sets) if baselines or name == "triton" else float("nan") for name, fn in impls.items()}
    floor_ms = nbytes / bandwidth * 1e3
    host = host_us(impls["triton"], sets[0])
    graph = graph_ms(impls["triton"], sets[0])
    return (batch, vocab, times["triton"], graph, times["torch"], times["sort"], floor_ms, host)


MIX_BATCHES = (256, 1024)
MIXES = {
    "no truncation": (-1, 1.0),
    "top-k 50 only": (50, 1.0),
    "top-p 0.9 only": (-1, 0.9),
    "top-k 50 + top-p 0.9": (TOP_K, TOP_P),
    "top-k 1000 + top-p 0.95": (1000, 0.95),
}


def variants(bandwidth, vocab=152064, config=None):
    """Row mixes at B >= 256: eager and graph time per call, device time per kernel."""
    lines = []
    fn = implementations(config)["triton"]
    for batch, (name, (k, p)) in itertools.product(MIX_BATCHES, MIXES.items()):
        sets = []
        for seed in range(2):
            logits, t, _, _ = inputs(batch, vocab, seed)
            top_k = torch.full_like(t, k, dtype=torch.int64)
            sets.append((logits, t, top_k, torch.full_like(t, p)))
        ms, graph = time_ms(fn, sets), graph_ms(fn, sets[0])
        fallback = fallback_rows(run_probabilities(*sets[0], config or DEFAULT_CONFIG))
        times = kernel_times(sets[0], config or DEFAULT_CONFIG)
        kernels = " / ".join(f"{times.get(kernel, 0.0):.1f}" for kernel in KERNEL_NAMES)
        floor_ms = batch * vocab * 8 / bandwidth * 1e3
        lines.append(
            f"| {batch} | {name} | {ms * 1e3:.1f} | {graph * 1e3:.1f} | "
            f"{graph / floor_ms:.2f} | {kernels} | {fallback} |"
        )
        print(lines[-1], flush=True)
    return lines


def fallback_rows(result) -> str:
    """'split / whole-row' counts of the rows not proven on the chunk candidates, of B."""
    split = int((result.row_mode == RowMode.FALLBACK).sum())
    whole_row = getattr(RowMode, "WHOLE_ROW", None)  # versions without it count none
    whole = 0 if whole_row is None else int((result.row_mode == whole_row).sum())
    return f"{split} / {whole} of {result.row_mode.numel()}"


# the GPU tests check every one of these configurations too
# last: every row falls back
SWEEP = (*CANDIDATE_CONFIGS, dataclasses.replace(BASELINE_CONFIG, chunk_capacity=1))


def sweep(bandwidth, batch=256, vocab=152064):
    """Time per call, and per kernel, of other kernel configurations (the benchmark's rows)."""
    sets = [inputs(batch, vocab, seed) for seed in range(2)]
    floor_ms = batch * vocab * 8 / bandwidth * 1e3
    lines = [
        "| chunk | capacity | chunk warps | compact | select warps | write chunk "
        "| triton (us) | triton/floor | chunk / select / write / split kernels (us) "
        "| fallback rows (split / whole-row) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for config in SWEEP:
        ms = time_ms(lambda *a, config=config: run_probabilities(*a, config).probs, sets)
        fallback = fallback_rows(run_probabilities(*sets[0], config))
        times = kernel_times(sets[0], config)
        kernels = " / ".join(f"{times.get(name, 0.0):.1f}" for name in KERNEL_NAMES)
        lines.append(
            f"| {config.chunk} | {config.chunk_capacity} | {config.chunk_warps} | "
            f"{config.compact} | {config.select_warps} | {config.write_chunk} | "
            f"{ms * 1e3:.1f} | "
            f"{ms / floor_ms:.2f} | {kernels} | {fallback} |"
        )
        print(lines[-1], flush=True)
    return lines


# kernels of this and earlier versions (a version without one reports 0.0 for it)
KERNEL_NAMES = ("_chunk_kernel", "_select_kernel", "_write_kernel", "_split_kernel")


def kernel_times(args, config, calls=20) -> dict:
    """Mean device time (us) of each kernel of one call (torch.profiler, CUDA activity)."""
    run_probabilities(*args, config)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run_probabilities(*args, config)
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if event.key in KERNEL_NAMES:
            times[event.key] = total / calls
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--sweep", action="store_true", help="also time other configurations")
    parser.add_argument("--sweep-batches", default="256", help="batch sizes of the sweep")
    parser.add_argument("--sweep-only", action="store_true", help="stop after the sweep")
    parser.add_argument(
        "--config", type=int, default=None, help="time CANDIDATE_CONFIGS[N] instead of the default in the main tables"
    )
    parser.add_argument(
        "--quick", action="store_true", help="skip the torch backend and sort-based columns (printed as nan)"
    )
    args = parser.parse_args()
    config = None if args.config is None else CANDIDATE_CONFIGS[args.config]
    bandwidth = copy_bandwidth()
    header = [
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {triton.__version__}, copy bandwidth {bandwidth / 1e12:.2f} TB/s",
        f"rows: temperature {TEMPERATURE}, top-k {TOP_K}, top-p {TOP_P}, logits ~ N(0, "
        f"{LOGIT_SCALE}^2), float32; times in microseconds (median)",
        f"triton kernel configuration: {config or DEFAULT_CONFIG}",
        "",
        "| B | V | triton eager | triton graph | torch backend | sort-based | floor "
        "| eager/floor | graph/floor | sort/eager | triton host |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    emit(header[:3], args.out, "w")
    if args.sweep:  # first: the configurations decide the default
        for batch in (int(b) for b in args.sweep_batches.split(",")):
            emit(["", f"B={batch}, V=152064, kernel configurations:", ""] + sweep(bandwidth, batch), args.out, "a")
        if args.sweep_only:
            return
    lines = ["", *header[3:]]
    for batch, vocab in itertools.product(BATCHES, VOCABS):
        b, v, tri, graph, tor, srt, flo, host = row(batch, vocab, bandwidth, config, not args.quick)
        lines.append(
            f"| {b} | {v} | {tri * 1e3:.1f} | {graph * 1e3:.1f} | {tor * 1e3:.1f} | "
            f"{srt * 1e3:.1f} | {flo * 1e3:.1f} | {tri / flo:.2f} | {graph / flo:.2f} | "
            f"{srt / tri:.1f} | {host:.0f} |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "V=152064, Triton kernel, row mixes (kernels: torch.profiler device time):",
        "",
        "| B | rows | eager (us) | graph (us) | graph/floor "
        "| chunk / select / write / split kernels (us) | fallback rows (split / whole-row) |",
        "|---:|---|---:|---:|---:|---|---:|",
    ]
    lines += variants(bandwidth, config=config)
    emit(lines, args.out, "a")


def emit(lines, path, mode) -> None:
    """Print `lines` and, with --out, write (mode "w") or append ("a") them to the file."""
    text = "\n".join(lines)
    print(text, flush=True)
    if path:
        with open(path, mode) as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
