"""Jit helpers that several stages of the probabilities kernels share: the order-preserving
key of a float32, the packed (x, index) candidate, and the pivot levels of the chunk and select
stages (docs/sampling.md, "The Triton kernel of batched_probabilities").
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.sampling.kernels.probabilities.config import FLT_MAX, LEVEL_ZERO


@triton.jit
def _key(x):
    """Signed int32 image of float32 x whose order is the order of x (-0.0 is folded to 0)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _pack(x, index):
    """int64 candidate: the bits of float32 x in the high word, the vocabulary index below."""
    return (x.to(tl.int32, bitcast=True).to(tl.int64) << 32) | index.to(tl.int64)


@triton.jit
def _unpack_x(packed):
    return (packed >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _unpack_index(packed):
    return packed.to(tl.int32)  # the low word


@triton.jit
def _pivot(m, spread, level):
    """Level 0 is m; level j >= 1 is m - spread * 2**((j - LEVEL_ZERO) / 4). Nonincreasing in
    j and never below -FLT_MAX, so a -inf logit is never a candidate."""
    drop = spread * tl.exp2((level - LEVEL_ZERO).to(tl.float32) * 0.25)
    return tl.maximum(tl.where(level == 0, m, m - drop), -FLT_MAX)
