"""Paged attention on CUDA: the torch path (gather + masked SDPA) against the Triton kernel.

    python -m benchmarks.attention [--sequences 4096] [--repeats 200]

Shapes are the harness's batched collection: B sequences of one prompt at positions
`--start`.. (t2_cuda_tv010: a 41-token prompt, so a verify round's rows sit at 41..44), one query
row per sequence (a draft or nospec step) or K + 1 = 4 (a verify step); the looped model's 4 heads
of 32 and SmolLM2's 9 of 64; blocks of 16, each sequence's blocks scattered over the pool. Each
cell draws fresh random caches and queries, checks the kernel against the torch path
(||out - ref|| / ||ref||, float32 both) with the output poisoned first, and times both with
`triton.testing.do_bench` (median of `--repeats` runs, microseconds); the key/value write that
precedes both is not timed. "bytes" is the least the kernel must read: each row's visible keys
and values once (MB); "GB/s" is that over the kernel's time.
"""

from __future__ import annotations

import argparse

import torch
import triton

from engine.models.attention import paged_attention_torch
from engine.models.kernels.paged_attention import paged_attention_triton
from engine.runners.layout import device_layout, metadata_for

BLOCK_SIZE = 16
MODELS = (("looped", 4, 32), ("smollm2", 9, 64))
ROWS_PER_SEQUENCE = (1, 4)


def cell(sequences: int, rows: int, heads: int, head: int, start: int, repeats: int) -> dict:
    device = torch.device("cuda")
    num_blocks = -(-(start + rows) // BLOCK_SIZE)
    pool = sequences * num_blocks + 2
    key_cache = torch.randn(pool, BLOCK_SIZE, heads, head, device=device)
    value_cache = torch.randn_like(key_cache)
    tables = (torch.randperm(pool - 2, device=device) + 1).view(sequences, num_blocks)
    starts = torch.full((sequences,), start, dtype=torch.int64, device=device)
    lengths = torch.full((sequences,), rows, dtype=torch.int64, device=device)
    layout = device_layout(
        starts, lengths, num_rows=sequences * rows, max_length=rows, num_blocks=num_blocks, block_size=BLOCK_SIZE
    )
    metadata = metadata_for(layout, tables)
    query = torch.randn(sequences * rows, heads, head, device=device)

    def kernel():
        return paged_attention_triton(
            query, key_cache, value_cache, metadata.block_tables, metadata.row_seq, metadata.positions
        )

    def torch_path():
        return paged_attention_torch(query, key_cache, value_cache, metadata)

    reference = torch_path()
    out = kernel()
    error = float((out - reference).norm() / reference.norm())
    kernel_us = triton.testing.do_bench(kernel, rep=repeats, return_mode="median") * 1e3
    torch_us = triton.testing.do_bench(torch_path, rep=repeats, return_mode="median") * 1e3
    visible = sum(start + r + 1 for r in range(rows)) * sequences  # keys read, rows of one sequence apart
    megabytes = visible * heads * head * 4 * 2 / 1e6
    return dict(
        torch_us=torch_us,
        kernel_us=kernel_us,
        error=error,
        megabytes=megabytes,
        gbps=megabytes / 1e3 / (kernel_us * 1e-6),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--start", type=int, default=41)
    parser.add_argument("--repeats", type=int, default=200, help="do_bench's rep, milliseconds")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    print("| model | sequences | rows each | torch path (us) | kernel (us) | speed-up | rel. error | MB | GB/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, heads, head in MODELS:
        for sequences in args.sequences:
            for rows in ROWS_PER_SEQUENCE:
                r = cell(sequences, rows, heads, head, args.start, args.repeats)
                print(
                    f"| {name} | {sequences} | {rows} | {r['torch_us']:.1f} | {r['kernel_us']:.1f} | "
                    f"{r['torch_us'] / r['kernel_us']:.2f} | {r['error']:.1e} | {r['megabytes']:.1f} | "
                    f"{r['gbps']:.0f} |"
                )


if __name__ == "__main__":
    main()
