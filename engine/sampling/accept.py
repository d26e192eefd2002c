"""`speculative_accept`: rejection sampling over ragged draft rows (its result layout,
`AcceptResult` and the error codes, lives in accept_result.py and is re-exported here).

Vocabulary: request r drafted K_r tokens x_1..x_K_r (0 <= K_r <= K) from draft distributions
q_1..q_K_r; the target scored K_r + 1 positions, p_1..p_{K_r+1}. Position j is *accepted* when
  random rows:  u_accept_j * q_j(x_j) < p_j(x_j)   (a token with p = 0 is never accepted)
  greedy rows:  x_j == argmax p_j                   (lowest index on ties)
The first position that is not a valid accept is the *stop point*. At a stop point j <= K_r a
random row emits the *recovered* token categorical(max(p_j - q_j, 0), u_final); if all K_r
drafts are accepted it emits the *bonus* token categorical(p_{K_r+1}, u_final). Greedy rows
emit argmax p at the stop point or the bonus position. Positions after the stop point are never
read. An invalid input at the stop point sets an error code (accept_result.py) instead of a
token.
"""

from __future__ import annotations

import torch

from engine.sampling import checks

# The result layout lives below the front and its kernel; importable from here as before.
from engine.sampling.accept_result import (  # noqa: F401
    ERR_BAD_DRAFT_TOKEN,
    ERR_BAD_OFFSETS,
    ERR_EMPTY_RESIDUAL,
    ERR_INVALID_DRAFT,
    ERR_INVALID_TARGET,
    ERR_NONE,
    ERROR_NAMES,
    PLACEHOLDER_TOKEN,
    AcceptResult,
)
from engine.sampling.backend import TORCH, resolve_backend
from engine.sampling.categorical import categorical_torch


def _check_inputs(draft_tokens, cu_num_drafts, draft_probs, target_probs, uniforms, is_greedy, draft_limit=None):
    checks.require("draft_tokens", draft_tokens, ndim=1, dtypes=checks.INDEX_DTYPES)
    checks.require("cu_num_drafts", cu_num_drafts, ndim=1, dtypes=checks.INDEX_DTYPES)
    checks.require("draft_probs", draft_probs, ndim=2, dtypes=checks.PROB_DTYPES)
    checks.require("target_probs", target_probs, ndim=2, dtypes=checks.PROB_DTYPES)
    checks.require("uniforms", uniforms, ndim=2, dtypes=(torch.float64,))
    checks.require("is_greedy", is_greedy, ndim=1, dtypes=(torch.bool,))
    num_requests = cu_num_drafts.shape[0] - 1
    if num_requests < 0:
        raise ValueError("cu_num_drafts must have R + 1 >= 1 elements, got 0")
    num_drafts, vocab = draft_tokens.shape[0], target_probs.shape[1]
    if vocab == 0:
        raise ValueError("target_probs has an empty vocabulary dimension")
    checks.require_len("draft_probs", draft_probs, 0, num_drafts)
    checks.require_len("draft_probs", draft_probs, 1, vocab)
    checks.require_len("target_probs", target_probs, 0, num_drafts + num_requests)
    checks.require_len("uniforms", uniforms, 0, num_requests)
    checks.require_len("is_greedy", is_greedy, 0, num_requests)
    if uniforms.shape[1] % 2 != 1:
        raise ValueError(f"uniforms has {uniforms.shape[1]} columns; expected 2K+1 (odd)")
    tensors = {
        "draft_tokens": draft_tokens,
        "cu_num_drafts": cu_num_drafts,
        "draft_probs": draft_probs,
        "target_probs": target_probs,
        "uniforms": uniforms,
        "is_greedy": is_greedy,
    }
    if draft_limit is not None:
        checks.require("draft_limit", draft_limit, ndim=1, dtypes=checks.INDEX_DTYPES)
        checks.require_len("draft_limit", draft_limit, 0, num_requests)
        tensors["draft_limit"] = draft_limit
    return checks.require_same_device(tensors)


def speculative_accept(
    draft_tokens: torch.Tensor,  # [N] int32/int64, all requests' drafts, flattened
    cu_num_drafts: torch.Tensor,  # [R+1] int32/int64, request r owns drafts cu[r]..cu[r+1]-1
    draft_probs: torch.Tensor,  # [N, V] float32, q of each draft position
    target_probs: torch.Tensor,  # [N+R, V] float32, request r owns rows cu[r]+r..cu[r+1]+r
    uniforms: torch.Tensor,  # [R, 2K+1] float64: u_draft[0:K], u_accept[K:2K], u_final[2K]
    is_greedy: torch.Tensor,  # [R] bool
    *,
    draft_limit: torch.Tensor | None = None,  # [R] int32/int64, optional
    backend: str = "auto",
) -> AcceptResult:
    """Accept or reject every request's drafts in one call (see the module docstring).

    `draft_limit` lets a fixed-shape layout carry ragged rounds (CUDA Graphs): request r keeps
    its rows at cu[r].. and cu[r]+r.. but uses only its first min(cu[r+1] - cu[r],
    draft_limit[r]) drafts, so its bonus is target row cu[r] + r + draft_limit[r]; the rows
    after that are never read. A negative limit is a bad offset.

    Guarantees: inputs are never modified; no host read of device data; metadata (shapes,
    dtypes, devices, contiguity) is checked on the host with ValueError; bad data (offsets,
    token ids, distributions) is reported per request in AcceptResult.error.
    """
    device = _check_inputs(draft_tokens, cu_num_drafts, draft_probs, target_probs, uniforms, is_greedy, draft_limit)
    args = (draft_tokens, cu_num_drafts, draft_probs, target_probs, uniforms, is_greedy, draft_limit)
    if resolve_backend(backend, device) == TORCH:
        return accept_torch(*args)
    from engine.sampling.kernels.accept import accept_triton

    return accept_triton(*args)


def _rows_valid(probs: torch.Tensor) -> torch.Tensor:  # [M] bool
    """A row is a distribution when all entries are finite and >= 0 and the total is > 0."""
    finite_nonneg = _is_probability(probs).all(dim=1)
    return finite_nonneg & (probs.double().sum(dim=1) > 0)


def _first_false(ok: torch.Tensor) -> torch.Tensor:  # [R] int64
    """Length of the leading run of True in each row of ok[R, K]."""
    return torch.cumprod(ok.long(), dim=1).sum(dim=1)


def _pick(rows: torch.Tensor, row_index: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """rows[row_index, col] elementwise, without materialising whole rows."""
    return rows.reshape(-1)[row_index * rows.shape[1] + col]


def _at_stop(flags: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:  # [R] bool
    """flags[r, stop[r]] for flags[R, K]; False where stop[r] == K (the bonus position)."""
    padded = torch.cat([flags, flags.new_zeros(flags.shape[0], 1)], dim=1)  # [R, K+1]
    return padded.gather(1, stop.unsqueeze(1)).squeeze(1)


def _is_probability(x: torch.Tensor) -> torch.Tensor:
    """Elementwise: finite and >= 0 (False for NaN)."""
    return torch.isfinite(x) & (x >= 0)


def accept_torch(draft_tokens, cu_num_drafts, draft_probs, target_probs, uniforms, is_greedy, draft_limit=None):
    """Torch backend of `speculative_accept` (vectorised over requests and positions)."""
    num_requests, max_drafts = uniforms.shape[0], (uniforms.shape[1] - 1) // 2
    num_drafts, vocab = draft_tokens.shape[0], target_probs.shape[1]
    dev = uniforms.device
    start = cu_num_drafts[:-1].long()  # [R]
    count = cu_num_drafts[1:].long() - start  # [R] K_r
    bad_offsets = (count < 0) | (count > max_drafts) | (start < 0) | (start + count > num_drafts)
    if draft_limit is not None:
        bad_offsets = bad_offsets | (draft_limit < 0)
        count = torch.minimum(count, draft_limit.long())
    count = torch.where(bad_offsets, 0, count)
    start = torch.where(bad_offsets, 0, start)
    pos = torch.arange(max_drafts, device=dev)  # [K]
    in_range = pos.unsqueeze(0) < count.unsqueeze(1)  # [R, K]
    draft_row = torch.where(in_range, start.unsqueeze(1) + pos, 0)  # [R, K]
    target_row = start.unsqueeze(1) + pos + torch.arange(num_requests, device=dev).unsqueeze(1)
    target_row = torch.where(in_range, target_row, 0)  # [R, K]
    padded_tokens = torch.cat([draft_tokens.long(), draft_tokens.new_zeros(1).long()])
    token = torch.where(in_range, padded_tokens[draft_row.clamp(max=num_drafts)], 0)  # [R, K]
    bad_token = (token < 0) | (token >= vocab)
    token_safe = token.clamp(0, vocab - 1)
    target_valid = _rows_valid(target_probs)  # [N+R]
    target_argmax = torch.argmax(target_probs, dim=1)  # [N+R]

    if num_drafts > 0:
        q_x = _pick(draft_probs, draft_row, token_safe).double()
    else:
        q_x = torch.zeros(num_requests, max_drafts, dtype=torch.float64, device=dev)
    p_x = _pick(target_probs, target_row, token_safe).double()
    u_accept = uniforms[:, max_drafts : 2 * max_drafts]  # [R, K]
    accept_random = (u_accept * q_x < p_x) & _is_probability(q_x) & _is_probability(p_x)
    accept_greedy = (token == target_argmax[target_row]) & target_valid[target_row]
    accept = torch.where(is_greedy.unsqueeze(1), accept_greedy, accept_random)
    accept = accept & ~bad_token & in_range
    num_accepted = _first_false(accept)  # [R], stop point
    is_bonus = num_accepted == count

    stop_target = start + num_accepted + torch.arange(num_requests, device=dev)  # [R]
    stop_draft = (start + num_accepted).clamp(max=max(num_drafts - 1, 0))  # [R]
    p_stop = target_probs[stop_target]  # [R, V]
    q_stop = draft_probs[stop_draft] if num_drafts > 0 else torch.zeros_like(p_stop)
    residual = torch.where(is_bonus.unsqueeze(1), p_stop, (p_stop - q_stop).clamp_min(0.0))
    u_final = uniforms[:, 2 * max_drafts]
    drawn = categorical_torch(residual, u_final)
    final = torch.where(is_greedy, target_argmax[stop_target], drawn)

    stop_token_bad = ~is_bonus & _at_stop(bad_token, num_accepted)
    is_rejection = ~is_bonus & ~is_greedy
    error = torch.full((num_requests,), ERR_NONE, dtype=torch.int32, device=dev)
    conditions = [
        (is_rejection & (drawn < 0), ERR_EMPTY_RESIDUAL),
        (is_rejection & ~_rows_valid(q_stop), ERR_INVALID_DRAFT),
        (~target_valid[stop_target], ERR_INVALID_TARGET),
        (stop_token_bad, ERR_BAD_DRAFT_TOKEN),
        (bad_offsets, ERR_BAD_OFFSETS),
    ]  # lowest priority first: later assignments win
    for condition, code in conditions:
        error = torch.where(condition, code, error)
    return _layout(token, num_accepted, final, error, max_drafts)


def _layout(token, num_accepted, final, error, max_drafts) -> AcceptResult:
    """Place accepted drafts and the final token into the padded [R, K+1] result."""
    is_ok = error == ERR_NONE
    col = torch.arange(max_drafts + 1, device=token.device).unsqueeze(0)  # [1, K+1]
    drafts = torch.cat([token, token.new_zeros(token.shape[0], 1)], dim=1)  # [R, K+1]
    na = num_accepted.unsqueeze(1)
    tokens = torch.where(col < na, drafts, torch.where(col == na, final.unsqueeze(1), PLACEHOLDER_TOKEN))
    tokens = torch.where(is_ok.unsqueeze(1), tokens, PLACEHOLDER_TOKEN)
    num_accepted = torch.where(is_ok, num_accepted, 0)
    return AcceptResult(tokens=tokens, num_accepted=num_accepted, error=error)
