"""Triton backend of `speculative_accept`: one program per request, no host read.

The program walks the request's drafts until the stop point, then draws the recovered or
bonus token (random rows, via `kernels.categorical._draw_row`) or takes the argmax (greedy
rows), and finally writes the whole padded result row, so a reused output buffer never
leaks a stale value. Semantics: accept.py; result layout and error codes: accept_result.py
(docs/sampling.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.sampling.accept_result import (
    ERR_BAD_DRAFT_TOKEN,
    ERR_BAD_OFFSETS,
    ERR_EMPTY_RESIDUAL,
    ERR_INVALID_DRAFT,
    ERR_INVALID_TARGET,
    PLACEHOLDER_TOKEN,
    AcceptResult,
)
from engine.sampling.kernels.categorical import _draw_row, _is_bad

BLOCK_V = 1024
NUM_WARPS = 4
# the result codes as compile-time constants of the kernel
_PLACEHOLDER = tl.constexpr(PLACEHOLDER_TOKEN)
_BAD_OFFSETS = tl.constexpr(ERR_BAD_OFFSETS)
_BAD_DRAFT_TOKEN = tl.constexpr(ERR_BAD_DRAFT_TOKEN)
_INVALID_TARGET = tl.constexpr(ERR_INVALID_TARGET)
_INVALID_DRAFT = tl.constexpr(ERR_INVALID_DRAFT)
_EMPTY_RESIDUAL = tl.constexpr(ERR_EMPTY_RESIDUAL)


@triton.jit
def _argmax_row(row_ptr, V, BLOCK: tl.constexpr):
    """(first index of the maximum, row is a distribution) for one float32 row."""
    best = tl.full([1], float("-inf"), tl.float32).max(0)
    best_idx = tl.zeros([1], tl.int32).max(0)
    bad = tl.zeros([1], tl.int32).sum(0)
    total = tl.zeros([1], tl.float64).sum(0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        p = tl.load(row_ptr + offs, mask=mask, other=float("-inf"))
        block_max = tl.max(p, 0)
        block_idx = start + tl.argmax(p, 0, tie_break_left=True)
        take = block_max > best  # strict: an earlier block wins ties
        best_idx = tl.where(take, block_idx, best_idx)
        best = tl.where(take, block_max, best)
        pm = tl.where(mask, p, 0.0)
        bad += tl.sum(_is_bad(pm).to(tl.int32), 0)
        total += tl.sum(pm.to(tl.float64), 0)
    is_ok = (bad == 0) & (total > 0) & (total < float("inf"))
    return best_idx, is_ok


@triton.jit
def _is_prob(x):
    return (x == x) & (x >= 0) & (x < float("inf"))


@triton.jit
def _accept_kernel(
    draft_tokens_ptr,  # [N] int32/int64
    cu_ptr,  # [R+1] int32/int64
    draft_probs_ptr,  # [N, V] float32
    target_probs_ptr,  # [N+R, V] float32
    uniforms_ptr,  # [R, 2K+1] float64
    is_greedy_ptr,  # [R] bool
    limit_ptr,  # [R] int32/int64 draft limit (read only when HAS_LIMIT)
    tokens_ptr,  # [R, K+1] int64 (out)
    num_accepted_ptr,  # [R] int64 (out)
    error_ptr,  # [R] int32 (out)
    N,
    V,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_LIMIT: tl.constexpr,
):
    r = tl.program_id(0)
    start = tl.load(cu_ptr + r).to(tl.int64)
    count = tl.load(cu_ptr + r + 1).to(tl.int64) - start
    bad_offsets = (count < 0) | (count > K) | (start < 0) | (start + count > N)
    if HAS_LIMIT:
        limit = tl.load(limit_ptr + r).to(tl.int64)
        bad_offsets = bad_offsets | (limit < 0)
        count = tl.minimum(count, limit)
    count = tl.where(bad_offsets, 0, count)
    start = tl.where(bad_offsets, 0, start)
    greedy = tl.load(is_greedy_ptr + r).to(tl.int32) != 0
    u_row = uniforms_ptr + r.to(tl.int64) * (2 * K + 1)
    target_base = start + r  # target row of draft position 0

    j = tl.zeros([1], tl.int64).sum(0)  # number of accepted drafts so far
    stop_token_bad = tl.zeros([1], tl.int32).sum(0) != 0
    argmax_idx = tl.zeros([1], tl.int32).max(0)
    argmax_ok = tl.zeros([1], tl.int32).sum(0) != 0
    walking = tl.zeros([1], tl.int32).sum(0) == 0
    while walking:
        t_row = target_probs_ptr + (target_base + j) * V
        if greedy:
            argmax_idx, argmax_ok = _argmax_row(t_row, V, BLOCK)
        if j >= count:
            walking = j < 0  # bonus position reached: stop
        else:
            x = tl.load(draft_tokens_ptr + start + j).to(tl.int64)
            x_bad = (x < 0) | (x >= V)
            xs = tl.minimum(tl.maximum(x, 0), V - 1)
            q_x = tl.load(draft_probs_ptr + (start + j) * V + xs)
            p_x = tl.load(t_row + xs)
            u_acc = tl.load(u_row + K + j)
            ok_random = (u_acc * q_x.to(tl.float64) < p_x.to(tl.float64)) & _is_prob(q_x)
            ok_random = ok_random & _is_prob(p_x)
            ok_greedy = (x == argmax_idx) & argmax_ok
            accepted = tl.where(greedy, ok_greedy, ok_random) & ~x_bad
            stop_token_bad = x_bad
            walking = accepted
            j = tl.where(accepted, j + 1, j)

    is_bonus = j >= count
    has_q = tl.where(is_bonus | greedy, 0, 1)
    d_row = draft_probs_ptr + tl.minimum(start + j, tl.maximum(N - 1, 0)) * V
    u_final = tl.load(u_row + 2 * K)
    drawn = tl.full([1], -1, tl.int32).max(0)
    p_ok = argmax_ok
    q_ok = tl.zeros([1], tl.int32).sum(0) == 0
    if greedy == 0:
        drawn, p_ok, q_ok = _draw_row(target_probs_ptr + (target_base + j) * V, d_row, has_q, V, u_final, BLOCK)
    final = tl.where(greedy, argmax_idx, drawn).to(tl.int64)

    error = tl.zeros([1], tl.int32).sum(0)
    rejected = has_q != 0
    error = tl.where(rejected & (drawn < 0), _EMPTY_RESIDUAL, error)
    error = tl.where(rejected & ~q_ok, _INVALID_DRAFT, error)
    error = tl.where(~p_ok, _INVALID_TARGET, error)
    error = tl.where(~is_bonus & stop_token_bad, _BAD_DRAFT_TOKEN, error)
    error = tl.where(bad_offsets, _BAD_OFFSETS, error)
    is_ok = error == 0

    col = tl.arange(0, BLOCK_K)
    drafts = tl.load(draft_tokens_ptr + start + col, mask=col < j, other=0).to(tl.int64)
    row = tl.where(col < j, drafts, tl.where(col == j, final, _PLACEHOLDER))
    row = tl.where(is_ok, row, _PLACEHOLDER)
    tl.store(tokens_ptr + r.to(tl.int64) * (K + 1) + col, row, mask=col < K + 1)
    tl.store(num_accepted_ptr + r, tl.where(is_ok, j, 0))
    tl.store(error_ptr + r, error)


def accept_triton(draft_tokens, cu_num_drafts, draft_probs, target_probs, uniforms, is_greedy, draft_limit=None):
    """Launch one program per request; arguments were validated by
    `engine.sampling.accept.speculative_accept`."""
    num_requests, max_drafts = uniforms.shape[0], (uniforms.shape[1] - 1) // 2
    dev = uniforms.device
    tokens = torch.empty((num_requests, max_drafts + 1), dtype=torch.int64, device=dev)
    num_accepted = torch.empty(num_requests, dtype=torch.int64, device=dev)
    error = torch.empty(num_requests, dtype=torch.int32, device=dev)
    if num_requests > 0:
        _accept_kernel[(num_requests,)](
            draft_tokens,
            cu_num_drafts,
            draft_probs,
            target_probs,
            uniforms,
            is_greedy,
            cu_num_drafts if draft_limit is None else draft_limit,
            tokens,
            num_accepted,
            error,
            draft_tokens.shape[0],
            target_probs.shape[1],
            **_options(max_drafts, draft_limit is not None),
        )
    return AcceptResult(tokens=tokens, num_accepted=num_accepted, error=error)


def _options(max_drafts: int, has_limit: bool) -> dict:
    """The constexprs and warps of a launch with at most `max_drafts` drafts per request."""
    return dict(
        K=max_drafts,
        BLOCK_K=triton.next_power_of_2(max_drafts + 1),
        BLOCK=BLOCK_V,
        HAS_LIMIT=has_limit,
        num_warps=NUM_WARPS,
    )


def accept_warmup(num_drafts: int, vocab: int, max_drafts: int, has_limit: bool):
    """(kernel, arguments, grid, options) of the launch `accept_triton` makes for `num_drafts`
    flat drafts, at most `max_drafts` per request, over `vocab` entries, with a draft limit or
    without, on the engine's dtypes (int64 tokens, offsets and limits, float32 probabilities,
    float64 uniforms, bool greedy flags), tensors given as dtypes (`JITFunction.warmup`)."""
    i64 = torch.int64
    arguments = (
        i64,
        i64,
        torch.float32,
        torch.float32,
        torch.float64,
        torch.bool,
        i64,
        i64,
        i64,
        torch.int32,
        num_drafts,
        vocab,
    )
    return _accept_kernel, arguments, (1,), _options(max_drafts, has_limit)
