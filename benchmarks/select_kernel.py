"""Device time of the three launches of batched_probabilities by kernel, for variants of the
select kernel's configuration, on a CUDA device.

For each (B, row mix) at V = 152,064 it runs `DEFAULT_CONFIG` on the three launches (single
launch off) and the chosen variants of it (by default: `tiny_compact=0`, every row searches
a block for its cut), checks that each gives the first's probabilities (bitwise) or at
least keeps its tokens, and prints the graph time of one call
(`triton.testing.do_bench_cudagraph` median) and each kernel's mean device time
(torch.profiler, `benchmarks.sampling.kernel_times`), in us. Rows: N(0, 5^2) logits,
temperature 0.8 (those of benchmarks/sampling.py).

Usage, from the repository root:
    python3 -m benchmarks.select_kernel [--out select.md] [--variants NAME,NAME,...]
        [--batches 1,8,64,256] [--mixes "top-k 50 + top-p 0.9,no truncation"]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import triton
import triton.testing

from benchmarks.sampling import KERNEL_NAMES, MIXES, inputs, kernel_times
from engine.sampling.kernels.probabilities import DEFAULT_CONFIG, probabilities_triton

VOCAB = 152064
GRAPH_REP_MS = 20
PROFILED_CALLS = 50
# row mixes of benchmarks.sampling (name -> (top-k, top-p)) that truncate, so the select runs
MIX_NAMES = ("top-k 50 + top-p 0.9", "top-k 1000 + top-p 0.95", "top-p 0.9 only")
BATCHES = (1, 8, 64, 256)
THREE = dataclasses.replace(DEFAULT_CONFIG, single_launch_entries=0)
VARIANTS = {
    "default": THREE,  # always first
    "no tiny block": dataclasses.replace(THREE, tiny_compact=0),
    "no small block": dataclasses.replace(THREE, small_compact=0, tiny_compact=0),
    "small block 1024": dataclasses.replace(THREE, small_compact=1024),
    "small block 1024 / 4 select warps": dataclasses.replace(THREE, small_compact=1024, select_warps=4),
    "select block 4096": dataclasses.replace(THREE, select_block=4096),
    "overlapped launches": dataclasses.replace(THREE, overlap_launches=True),
    "overlapped write": dataclasses.replace(THREE, overlap_write=True),
    "serial write": dataclasses.replace(THREE, overlap_write=False),
    "uncapped write": dataclasses.replace(THREE, write_registers=0),
    "write registers 128": dataclasses.replace(THREE, write_registers=128),
    "write registers 80": dataclasses.replace(THREE, write_registers=80),
    "write registers 48": dataclasses.replace(THREE, write_registers=48),
    "write registers 40": dataclasses.replace(THREE, write_registers=40),
    "no chunk list": dataclasses.replace(THREE, chunk_list=False),
    "capacity 16": dataclasses.replace(THREE, chunk_capacity=16),
    "capacity 16 / small block 1024": dataclasses.replace(THREE, chunk_capacity=16, small_compact=1024),
    "loads in place": dataclasses.replace(THREE, hoist_loads=False),
    "no ftz sum": dataclasses.replace(THREE, ftz_sum=False),
    "loads in place / no ftz sum": dataclasses.replace(THREE, hoist_loads=False, ftz_sum=False),
    "no keep in l2": dataclasses.replace(THREE, keep_in_l2=False),
    "ieee division": dataclasses.replace(THREE, reciprocal_division=False),
    "forward write": dataclasses.replace(THREE, reverse_write=False),
    "top-k floor at its level": dataclasses.replace(THREE, top_k_floor_steps=0),
    "top-k floor steps 6": dataclasses.replace(THREE, top_k_floor_steps=6),
    "write chunk 4096": dataclasses.replace(THREE, write_chunk=4096),
    "write chunk 16384": dataclasses.replace(THREE, write_chunk=16384),
    # the chunk kernel's programs: the default's 16 entries per thread in twice the
    # entries per program, or the same chunk over more threads (same quick-floor share)
    "chunk 1024 / 2 warps": dataclasses.replace(THREE, chunk=1024, chunk_capacity=64, chunk_warps=2),
    "chunk 1024 / 4 warps": dataclasses.replace(THREE, chunk=1024, chunk_capacity=64, chunk_warps=4),
    "chunk 512 / 2 warps": dataclasses.replace(THREE, chunk_warps=2),
    # one warp (reductions by shuffles alone) with 8, 32 or 64 entries per thread
    "chunk 256 / 1 warp": dataclasses.replace(THREE, chunk=256, chunk_capacity=16),
    "chunk 1024 / 1 warp": dataclasses.replace(THREE, chunk=1024, chunk_capacity=64),
    "chunk 2048 / 1 warp": dataclasses.replace(THREE, chunk=2048, chunk_capacity=128),
}
DEFAULT_VARIANTS = ("default", "no tiny block")


def row(batch: int, mix: str, variants: dict) -> str:
    k, p = MIXES[mix]
    logits, t, _, _ = inputs(batch, VOCAB, 7)
    args = (logits, t, torch.full_like(t, k, dtype=torch.int64), torch.full_like(t, p))
    cells, probs = [], []
    for config in variants.values():
        probs.append(probabilities_triton(*args, config=config))
        graph = (
            triton.testing.do_bench_cudagraph(
                lambda c=config: probabilities_triton(*args, config=c), rep=GRAPH_REP_MS, return_mode="median"
            )
            * 1e3
        )
        kernels = kernel_times(args, config, calls=PROFILED_CALLS)
        cells.append(f"{graph:.1f} | " + " / ".join(f"{kernels.get(name, 0.0):.1f}" for name in KERNEL_NAMES[:3]))
    same = (
        "bitwise"
        if all(torch.equal(probs[0], other) for other in probs[1:])
        else "kept"
        if all(torch.equal(probs[0] > 0, other > 0) for other in probs[1:])
        else "NO"
    )
    return f"| {batch} | {mix} | {' | '.join(cells)} | {same} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help=f"comma-separated, from: {', '.join(VARIANTS)} (the default configuration is always the first)",
    )
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument(
        "--mixes", default=",".join(MIX_NAMES), help=f"comma-separated row mixes, from: {', '.join(MIXES)}"
    )
    args = parser.parse_args()
    default = DEFAULT_VARIANTS[0]
    names = [default, *(n for n in args.variants.split(",") if n != default)]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
    variants = {name: VARIANTS[name] for name in names}
    mixes = args.mixes.split(",")
    if any(mix not in MIXES for mix in mixes):
        parser.error(f"--mixes: choose from {list(MIXES)}")
    lines = [
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {triton.__version__}; V = {VOCAB}, us",
        "",
        "| B | rows | " + " | ".join(f"{n}: graph | chunk / select / write" for n in names) + " | same as the first |",
        "|---:|---|" + "---:|---|" * len(names) + "---|",
    ]
    print("\n".join(lines), flush=True)
    for batch in (int(b) for b in args.batches.split(",")):
        for mix in mixes:
            lines.append(row(batch, mix, variants))
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
