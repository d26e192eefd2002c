"""Calls of batched_probabilities for an external profiler (Nsight Compute), on a CUDA device.

Runs WARMUP_CALLS calls (compilation, caches) and then `--calls` more of the same shape, then
synchronises, so that a profiler told to skip the warm-up launches (`ncu --launch-skip`) sees
steady-state calls. Rows as in benchmarks.sampling (N(0, 4^2) logits, temperature 0.8).

Usage, from the repository root:
    ncu --clock-control none --kernel-name regex:_select_kernel --launch-skip 3 \\
        --launch-count 1 --set full --import-source yes -o select \\
        python3 -m benchmarks.profile_call --batch 1 --mix "top-k 50 + top-p 0.9"
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.sampling import MIXES, inputs
from engine.sampling import batched_probabilities

WARMUP_CALLS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--mix", default="top-k 50 + top-p 0.9", choices=sorted(MIXES))
    parser.add_argument("--calls", type=int, default=1)
    args = parser.parse_args()
    k, p = MIXES[args.mix]
    logits, t, _, _ = inputs(args.batch, args.vocab, 7)
    call_args = (logits, t, torch.full_like(t, k, dtype=torch.int64), torch.full_like(t, p))
    for _ in range(WARMUP_CALLS + args.calls):
        batched_probabilities(*call_args, backend="triton")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
