"""Triton backend of `categorical`, and the row helpers that `kernels.accept` reuses.

`_draw_row` draws from w = p (bonus) or w = max(p - q, 0) (recovery) in one kernel, with a
float64 CDF accumulated block by block: the total and every CDF value use the same sequence
of block sums, so the draw lands inside [0, total) of the same arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024  # vocabulary entries per loop step
NUM_WARPS = 4


@triton.jit
def _is_bad(w):
    """Elementwise: NaN, infinite or negative."""
    return (w != w) | (w < 0) | (w == float("inf"))


@triton.jit
def _weights(p_ptr, q_ptr, has_q, offs, mask, BLOCK: tl.constexpr):
    """(p, q, w) of one block in float64: w = max(p - q, 0) when has_q, else p (q reads as 0)."""
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float64)
    use_q = (tl.zeros([BLOCK], tl.int32) + has_q) != 0  # explicit broadcast of the flag
    q = tl.load(q_ptr + offs, mask=mask & use_q, other=0.0).to(tl.float64)
    return p, q, tl.where(use_q, tl.maximum(p - q, 0.0), p)


@triton.jit
def _scan_totals(p_ptr, q_ptr, has_q, V, BLOCK: tl.constexpr):
    """One pass: totals of w, p and q (float64), bad-entry counts of p and q, last w > 0."""
    w_total = tl.zeros([1], tl.float64).sum(0)
    p_total = tl.zeros([1], tl.float64).sum(0)
    q_total = tl.zeros([1], tl.float64).sum(0)
    p_bad = tl.zeros([1], tl.int32).sum(0)
    q_bad = tl.zeros([1], tl.int32).sum(0)
    last = tl.full([1], -1, tl.int32).max(0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        p, q, w = _weights(p_ptr, q_ptr, has_q, offs, mask, BLOCK)
        w_total += tl.sum(w, 0)
        p_total += tl.sum(p, 0)
        q_total += tl.sum(q, 0)
        p_bad += tl.sum(_is_bad(p).to(tl.int32), 0)
        q_bad += tl.sum(_is_bad(q).to(tl.int32), 0)
        last = tl.maximum(last, tl.max(tl.where(mask & (w > 0), offs, -1), 0))
    p_ok = (p_bad == 0) & (p_total > 0) & (p_total < float("inf"))
    q_ok = (q_bad == 0) & (q_total > 0) & (q_total < float("inf"))
    return w_total, p_ok, q_ok, last


@triton.jit
def _first_above(p_ptr, q_ptr, has_q, V, target, BLOCK: tl.constexpr):
    """First index j with w_j > 0 and cdf_j > target, or -1; cdf in float64, block by block."""
    carry = tl.zeros([1], tl.float64).sum(0)
    found = tl.full([1], -1, tl.int32).max(0)
    start = 0
    while (start < V) & (found < 0):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        _, _, w = _weights(p_ptr, q_ptr, has_q, offs, mask, BLOCK)
        cdf = carry + tl.cumsum(w, 0)
        hit = mask & (w > 0) & (cdf > target)
        first = tl.min(tl.where(hit, offs, V), 0)
        found = tl.where(first < V, first, -1)
        carry += tl.sum(w, 0)
        start += BLOCK
    return found


@triton.jit
def _draw_row(p_ptr, q_ptr, has_q, V, u, BLOCK: tl.constexpr):
    """categorical(w, u) with w = max(p - q, 0) if has_q else p; also whether p, q are valid.

    Returns (token, p_ok, q_ok); token is -1 when w is not a distribution (negative or NaN
    entries, total not finite or not > 0).
    """
    total, p_ok, q_ok, last = _scan_totals(p_ptr, q_ptr, has_q, V, BLOCK)
    w_ok = (total > 0) & (total < float("inf")) & p_ok & (q_ok | (has_q == 0))
    found = _first_above(p_ptr, q_ptr, has_q, V, u * total, BLOCK)
    token = tl.where(found >= 0, found, last)
    return tl.where(w_ok, token, -1), p_ok, q_ok


@triton.jit
def _categorical_kernel(
    weights_ptr,  # [B, V] float
    u_ptr,  # [B] float64
    out_ptr,  # [B] int64
    V,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = weights_ptr + row.to(tl.int64) * V
    u = tl.load(u_ptr + row)
    token, _, _ = _draw_row(row_ptr, row_ptr, 0, V, u, BLOCK)
    tl.store(out_ptr + row, token.to(tl.int64))


def categorical_triton(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Launch one program per row; arguments were validated by
    `engine.sampling.categorical.categorical`."""
    num_rows, vocab = weights.shape
    out = torch.empty(num_rows, dtype=torch.int64, device=weights.device)
    if num_rows > 0:
        _categorical_kernel[(num_rows,)](weights, u, out, vocab, **OPTIONS)
    return out


OPTIONS = dict(BLOCK=BLOCK_V, num_warps=NUM_WARPS)  # of every `_categorical_kernel` launch


def categorical_warmup(vocab: int, weights_dtype: torch.dtype = torch.float32):
    """(kernel, arguments, grid, options) of the launch `categorical_triton` makes over `vocab`
    entries (float64 uniforms, int64 out), tensors given as dtypes (`JITFunction.warmup`)."""
    return _categorical_kernel, (weights_dtype, torch.float64, torch.int64, vocab), (1,), OPTIONS
