"""Mutants: a registry of planted sampling bugs, used to prove that the harness catches them.

A mutant is switched on only by naming it in `EngineConfig.mutant`; the default (None) builds
the runners with `engine.runners.base.DEFAULT_OPS` and nothing here runs. A named mutant
replaces one or two of the sampling operations the runners call (`SamplingOps`), chosen once
when the runner is built: no function is reassigned at run time.

Vocabulary: p is the target distribution, q the draft distribution, x a draft token, u the
round's uniforms (u_draft, u_accept, u_final; see engine.sampling.accept). "TV at t1" is the
exact total-variation distance between the law of the first emitted token of a single-draft
step and p; `specval.distribution.mutate` computes it for every mutant from the model's p and q at the
protocol's prompt (0 means the bug cannot show at t1; see `Mutant.visible_at`).
`layer="harness"` marks a mutant planted in the harness, not in the engine (the seed
collision: the seed ledger must refuse the run before any sampling).

Two registries: `MUTANTS` are the bugs today's protocols can see (the first tokens after one
prompt, one request at a time); `SEQUENCE_MUTANTS` (`needs` = NEEDS_SEQUENCE or NEEDS_PAIRS)
act only late in a sequence, past round position 2, across requests of one batch, or in batches
mixing greedy and random requests (`needs` = NEEDS_MIXED), so a
harness lists them only once it has whole-sequence / paired-request protocols. `SETTING_MUTANTS`
(`needs` = NEEDS_SETTING) act only under an engine setting (a small token budget), so a protocol
sees them only in a group whose options select that setting. `get` and `sampling_ops` know all
three; `ALL_MUTANTS` is their union.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.runners.base import DEFAULT_OPS, SamplingOps, SamplingRows, probabilities, round_uniforms
from engine.runners.layout import RowLayout
from engine.sampling import speculative_accept, uniform_blocks
from engine.sampling.categorical import INVALID_ROW, categorical_torch

ENGINE_LAYER, HARNESS_LAYER = "engine", "harness"
NEEDS_PREFIX = "prefix"  # seen in the first tokens after one prompt (today's protocols)
NEEDS_SEQUENCE = "sequence"  # seen only late in a sequence (every token / round position gated)
NEEDS_PAIRS = "pairs"  # seen only jointly across requests of one batch (each request's law exact)
NEEDS_MIXED = "mixed"  # seen only when one batch mixes greedy and random requests
NEEDS_SETTING = "setting"  # seen only under an engine setting that a group's options select


@dataclass(frozen=True)
class Mutant:
    """One planted bug: what it breaks, where it acts and whether it is equivalent."""

    name: str
    breaks: str  # one sentence: what the bug does
    visible_at: str  # where a correct harness can see it (t1, t2, stop point, ledger, nowhere)
    equivalent: bool = False  # same output law as the correct engine (must PASS)
    layer: str = ENGINE_LAYER
    ops: SamplingOps = DEFAULT_OPS
    needs: str = NEEDS_PREFIX  # what a protocol must collect to see it (NEEDS_*)


# ---------------------------------------------------------------- mutated accept rule


@dataclass(frozen=True)
class AcceptMutation:
    """Which part of the rejection-sampling rule is wrong (None: the correct part)."""

    accept_rule: Callable | None = None  # (u[R,K], q_x[R,K], p_x[R,K]) -> bool[R,K]
    residual: Callable | None = None  # (p[R,V], q[R,V]) -> weights[R,V] of the correction
    bonus_row: Callable | None = None  # (p, q, start, count, stop_target) -> weights[R,V]
    draw: Callable = categorical_torch  # (weights[R,V], u[R]) -> int64[R]
    reuse_uniform: bool = False  # one accept uniform for every position of a round
    # (target rows int64[...], round positions j int64[...], 1-based) -> the rows p is read from
    # for the accept tests and the correction at those positions (the bonus keeps its row)
    verify_row: Callable | None = None
    residual_from: int = 1  # `residual` replaces the correct one at stop positions j >= this only
    # (draft rows int64[R, ...], the round's first draft row int64[R]) -> the rows q is read from for
    # the accept tests and the correction (the drafts themselves were sampled from their own rows)
    q_row: Callable | None = None


def _correct_accept(u, q_x, p_x):
    return u * q_x < p_x


def _correct_residual(p, q):
    return (p - q).clamp_min(0.0)


def _draw_unnormalised(weights, u):
    """Inverse CDF against u * 1 instead of u * total, clamped to the last positive weight."""
    cdf = torch.cumsum(weights, dim=1)
    hit = (weights > 0) & (cdf > u.unsqueeze(1))
    last = weights.shape[1] - 1 - torch.argmax((weights.flip(1) > 0).to(torch.int8), dim=1)
    index = torch.where(hit.any(dim=1), torch.argmax(hit.to(torch.int8), dim=1), last)
    return torch.where(weights.sum(dim=1) > 0, index, INVALID_ROW)


def _mutated_accept(
    mutation: AcceptMutation,
    draft_tokens,
    cu_num_drafts,
    draft_probs,
    target_probs,
    uniforms,
    is_greedy,
    *,
    draft_limit=None,
    backend: str = "auto",
):
    """`speculative_accept` with one part of the rule replaced (torch, random rows only: greedy rows
    and rows the correct rule flags as errors keep the correct result)."""
    real = speculative_accept(
        draft_tokens,
        cu_num_drafts,
        draft_probs,
        target_probs,
        uniforms,
        is_greedy,
        draft_limit=draft_limit,
        backend=backend,
    )
    num_requests, k = uniforms.shape[0], (uniforms.shape[1] - 1) // 2
    num_drafts, dev = draft_tokens.shape[0], uniforms.device
    start, count = cu_num_drafts[:-1].long(), cu_num_drafts[1:].long() - cu_num_drafts[:-1].long()
    if draft_limit is not None:
        count = torch.minimum(count, draft_limit.long().clamp(min=0))
    in_range = torch.arange(k, device=dev).unsqueeze(0) < count.unsqueeze(1)  # [R, K]
    draft_row = torch.where(in_range, start.unsqueeze(1) + torch.arange(k, device=dev), 0)  # [R, K]
    target_row = draft_row + torch.arange(num_requests, device=dev).unsqueeze(1)  # [R, K]
    if mutation.verify_row is not None:
        target_row = mutation.verify_row(target_row, torch.arange(1, k + 1, device=dev).expand_as(target_row))
    safe = max(num_drafts, 1)
    x = torch.cat([draft_tokens.long(), draft_tokens.new_zeros(1).long()])[draft_row.clamp(max=safe - 1)]
    x = torch.where(in_range, x.clamp(min=0), 0)  # [R, K]
    q_all = draft_probs if num_drafts else target_probs.new_zeros(1, target_probs.shape[1])
    q_rows = draft_row if mutation.q_row is None else mutation.q_row(draft_row, start.unsqueeze(1))
    q_x = q_all[q_rows.clamp(max=safe - 1), x].double()
    p_x = target_probs[target_row.clamp(max=target_probs.shape[0] - 1), x].double()
    u_accept = uniforms[:, k : 2 * k]
    if mutation.reuse_uniform:
        u_accept = u_accept[:, :1].expand(-1, k)
    accepted = (mutation.accept_rule or _correct_accept)(u_accept, q_x, p_x) & in_range
    num_accepted = torch.cumprod(accepted.long(), dim=1).sum(dim=1)  # [R]
    is_bonus = num_accepted == count
    stop_target = start + num_accepted + torch.arange(num_requests, device=dev)
    stop_row = (
        stop_target
        if mutation.verify_row is None
        else torch.where(is_bonus, stop_target, mutation.verify_row(stop_target, num_accepted + 1))
    )
    p_stop = target_probs[stop_row].double()
    stop_draft = start + num_accepted
    q_stop = q_all[(stop_draft if mutation.q_row is None else mutation.q_row(stop_draft, start)).clamp(max=safe - 1)]
    q_stop = q_stop.double()
    residual = (mutation.residual or _correct_residual)(p_stop, q_stop)
    if mutation.residual_from > 1:
        late = (num_accepted + 1 >= mutation.residual_from).unsqueeze(1)  # the stop's round position j
        residual = torch.where(late, residual, _correct_residual(p_stop, q_stop))
    bonus = (
        p_stop
        if mutation.bonus_row is None
        else mutation.bonus_row(target_probs.double(), q_all.double(), start, count, stop_target)
    )
    final = mutation.draw(torch.where(is_bonus.unsqueeze(1), bonus, residual), uniforms[:, 2 * k])
    return _merge(real, x, num_accepted, final, is_greedy | (real.error != 0) | (final < 0))


def _merge(real, x, num_accepted, final, keep_real):
    """The mutated rows laid out like AcceptResult.tokens; rows in keep_real[R] stay as `real`."""
    col = torch.arange(real.tokens.shape[1], device=x.device).unsqueeze(0)
    drafts = torch.cat([x, x.new_zeros(x.shape[0], 1)], dim=1)
    na = num_accepted.unsqueeze(1)
    tokens = torch.where(col < na, drafts, torch.where(col == na, final.unsqueeze(1), real.tokens))
    tokens = torch.where(col > na, real.tokens.new_full((), -1), tokens)
    keep = keep_real.unsqueeze(1)
    return type(real)(
        torch.where(keep, real.tokens, tokens), torch.where(keep_real, real.num_accepted, num_accepted), real.error
    )


def accept_op(mutation: AcceptMutation) -> Callable:
    """An accept operation with `mutation` planted (same signature as speculative_accept)."""

    def accept(*args, draft_limit=None, backend: str = "auto"):
        return _mutated_accept(mutation, *args, draft_limit=draft_limit, backend=backend)

    return accept


def _bonus_previous_position(p, q, start, count, stop_target):
    """p_{K_r} instead of p_{K_r+1} (falls back to the right row when K_r = 0)."""
    return p[torch.where(count > 0, stop_target - 1, stop_target)]


def _bonus_from_q(p, q, start, count, stop_target):
    """q_{K_r} (the last draft's distribution) instead of p_{K_r+1}."""
    return torch.where(
        (count > 0).unsqueeze(1), q[(start + count - 1).clamp(min=0, max=q.shape[0] - 1)], p[stop_target]
    )


def _round_first_row(rows, first_rows):
    """q of the round's first draft position for every position (position 0's rows)."""
    return torch.zeros_like(rows) + first_rows


def _row_before_from(first, rows, positions):
    """p_{j-1} instead of p_j for round positions j >= `first` (earlier positions keep their rows)."""
    return torch.where(positions >= first, rows - 1, rows)


# ---------------------------------------------------------------- mutated distributions and draws


def _scaled(logits, rows):
    safe = torch.where(rows.is_greedy, 1.0, rows.temperature)
    return logits.float() / safe.unsqueeze(1)


def _temperature_only(logits, rows, backend):
    """q with temperature only (top-k / top-p skipped): the 'raw' q of a filtered draft."""
    raw = torch.softmax(_scaled(logits, rows), dim=1)
    return torch.where(rows.is_greedy.unsqueeze(1), probabilities(logits, rows, backend), raw)


def _draft_filtered_ratio_raw(logits, rows, backend):
    return probabilities(logits, rows, backend), _temperature_only(logits, rows, backend)


def _untempered(logits, rows, backend):
    """q of the raw draft logits: softmax at temperature 1, no top-k / top-p (greedy rows keep theirs)."""
    raw = torch.softmax(logits.float(), dim=1)
    return torch.where(rows.is_greedy.unsqueeze(1), probabilities(logits, rows, backend), raw)


def _draft_raw_ratio_filtered(logits, rows, backend):
    return _untempered(logits, rows, backend), probabilities(logits, rows, backend)


def _temperature_twice(logits, rows, backend):
    safe = torch.where(rows.is_greedy, 1.0, rows.temperature)
    return probabilities(logits / safe.unsqueeze(1).to(logits.dtype), rows, backend)


def _draft_temperature_twice(logits, rows, backend):
    q = _temperature_twice(logits, rows, backend)
    return q, q


def _top_k_ties_dropped(logits, rows, backend):
    """Top-k keeps exactly k tokens (the first k in a stable descending sort), dropping ties."""
    probs = probabilities(logits, rows, backend)
    x = _scaled(logits, rows)
    order = torch.sort(x, dim=1, descending=True, stable=True).indices
    k = torch.where((rows.top_k <= 0) | (rows.top_k >= x.shape[1]), x.shape[1], rows.top_k)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(x.shape[1], device=x.device).expand_as(order))
    keep = (rank < k.unsqueeze(1)) & (probs > 0)
    kept = torch.where(keep, probs, 0.0)
    return torch.where(rows.is_greedy.unsqueeze(1), probs, kept / kept.sum(dim=1, keepdim=True))


def _top_p_boundary_excluded(logits, rows, backend):
    """Top-p drops the token that crosses p (keeps mass_before + own < p; p = 1 stays disabled)."""
    probs = probabilities(logits, rows, backend)
    desc = torch.sort(probs.double(), dim=1, descending=True)
    cum = torch.cumsum(desc.values, dim=1)
    keep_sorted = (cum < rows.top_p.double().unsqueeze(1)) | (torch.arange(probs.shape[1], device=probs.device) == 0)
    keep = torch.empty_like(keep_sorted).scatter_(1, desc.indices, keep_sorted)
    keep = keep | (rows.top_p >= 1.0).unsqueeze(1)
    kept = torch.where(keep, probs, 0.0)
    return torch.where(rows.is_greedy.unsqueeze(1), probs, kept / kept.sum(dim=1, keepdim=True))


def _verify_unfiltered(logits, rows, backend):
    return _temperature_only(logits, rows, backend)


def _draw_float32_cdf(probs, u, backend):
    """Inverse CDF with a float32 cumulative sum (and total)."""
    cdf = torch.cumsum(probs.float(), dim=1)
    hit = (probs > 0) & (cdf.double() > (u * cdf[:, -1].double()).unsqueeze(1))
    last = probs.shape[1] - 1 - torch.argmax((probs.flip(1) > 0).to(torch.int8), dim=1)
    return torch.where(hit.any(dim=1), torch.argmax(hit.to(torch.int8), dim=1), last)


def _draw_argmax(probs, u, backend):
    del u, backend  # the bug: the draft is the mode of q, but the ratio still treats it as q-sampled
    return torch.argmax(probs, dim=1)


# ---------------------------------------------------------------- mutated uniforms and context

LATE_POSITION = 3  # wrong_row_late_draft: first round position verified against the wrong row
DEEP_POSITION = 6  # wrong_row_deep_draft: the same from position 6, invisible to K < 6
FROZEN_AFTER = 8  # frozen_offset: generated tokens after which the RNG offset stops advancing
STALE_AFTER = 8  # stale_context: generated tokens the target still sees past its own input
LARGEST_BELOW_ONE = 1.0 - 2.0**-53  # 1 - u stays a uniform of [0, 1)


def _antithetic_pairs(rows: SamplingRows, width: int) -> torch.Tensor:
    """Odd rows of the step draw 1 - u of the even row before them (each row's law is exact)."""
    block = round_uniforms(rows, width)
    index = torch.arange(block.shape[0], device=block.device)
    is_odd = (index % 2 == 1)[:, None]
    return torch.where(is_odd, (1.0 - block[index - (index % 2)]).clamp(max=LARGEST_BELOW_ONE), block)


def _frozen_offset(rows: SamplingRows, width: int) -> torch.Tensor:
    """Rounds that start after FROZEN_AFTER generated tokens all draw the block keyed at
    prompt + FROZEN_AFTER (the offset stopped advancing there)."""
    frozen = rows.num_prompt + FROZEN_AFTER
    return uniform_blocks(rows.seeds, torch.minimum(rows.num_committed, frozen), width)


def _offset_by_emitted(rows: SamplingRows, width: int) -> torch.Tensor:
    """One flat stream per request, chunk c = the block keyed at prompt + c; a round reads
    `width` uniforms from flat offset `generated` (advanced by the tokens emitted, <= K + 1)
    instead of `width` * rounds: round 0 reads the correct block, later rounds reuse the tail of
    the previous one. With width 1 (nospec) this is the correct stream."""
    offset = rows.num_committed - rows.num_prompt
    chunk, shift = offset // width, offset % width
    first = uniform_blocks(rows.seeds, rows.num_prompt + chunk, width)
    second = uniform_blocks(rows.seeds, rows.num_prompt + chunk + 1, width)
    columns = shift[:, None] + torch.arange(width, device=offset.device)[None, :]
    return torch.cat([first, second], dim=1).gather(1, columns)


def _stale_context(layout: RowLayout, rows: SamplingRows) -> RowLayout:
    """At the target depths, a verify row past prompt + STALE_AFTER sees the keys before that
    position and its own key only: the context of later tokens is never read."""
    query = torch.zeros(layout.attend_mask.shape[:2], dtype=torch.int64, device=layout.positions.device)
    query[layout.row_seq, layout.row_slot] = layout.positions
    key = torch.arange(layout.attend_mask.shape[2], device=query.device)[None, None, :]
    cut = (rows.num_prompt + STALE_AFTER)[:, None, None]
    visible = (key < cut) | (key == query[:, :, None])
    return dataclasses.replace(layout, attend_mask=layout.attend_mask & visible, causal=False)


def _all_greedy_if_any(rows: SamplingRows) -> SamplingRows:
    """Every row's temperature 0 when the step holds a greedy row (on the device, no sync)."""
    return dataclasses.replace(rows, temperature=torch.where(rows.is_greedy.any(), 0.0, rows.temperature))


def _greedy_step_probabilities(logits, rows, backend):
    return probabilities(logits, _all_greedy_if_any(rows), backend)


def _greedy_step_draft_probabilities(logits, rows, backend):
    q = _greedy_step_probabilities(logits, rows, backend)
    return q, q


def _mixed_step(rows: SamplingRows) -> torch.Tensor:
    """bool[1, 1]: the step holds requests in their first round (committed tokens = the prompt:
    just admitted) beside requests in later rounds (on the device, no host read)."""
    first = rows.num_committed == rows.num_prompt
    return (first.any() & (~first).any()).reshape(1, 1)


def _mixed_step_probabilities(logits, rows, backend):
    """Temperature only (top-k and top-p dropped) in a mixed step; the engine's own otherwise."""
    right = probabilities(logits, rows, backend)
    return torch.where(_mixed_step(rows), _temperature_only(logits, rows, backend), right)


def _mixed_step_draft_probabilities(logits, rows, backend):
    q = _mixed_step_probabilities(logits, rows, backend)
    return q, q


def _with(**ops) -> SamplingOps:
    return dataclasses.replace(DEFAULT_OPS, **ops)


def _accept(**mutation) -> SamplingOps:
    return _with(accept=accept_op(AcceptMutation(**mutation)))


# ---------------------------------------------------------------- the registry


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "residual_from_p",
        "the correction after a rejection is drawn from p instead of max(p - q, 0)",
        "t1",
        ops=_accept(residual=lambda p, q: p),
    ),
    Mutant(
        "residual_unnormalised",
        "the correction's inverse CDF compares with u instead of u * total "
        "(not renormalised; the overflow is clamped to the last positive token)",
        "t1",
        ops=_accept(draw=_draw_unnormalised),
    ),
    Mutant(
        "residual_abs",
        "the correction is drawn from |p - q| instead of max(p - q, 0)",
        "t1",
        ops=_accept(residual=lambda p, q: (p - q).abs()),
    ),
    Mutant(
        "ratio_inverted",
        "accept iff u * p(x) < q(x) (the ratio q / p instead of p / q)",
        "t1",
        ops=_accept(accept_rule=lambda u, q_x, p_x: u * p_x < q_x),
    ),
    Mutant(
        "accept_le",
        "accept iff u * q(x) <= p(x): at u = 0 a token with p = 0 is accepted",
        "stop point",
        ops=_accept(accept_rule=lambda u, q_x, p_x: u * q_x <= p_x),
    ),
    Mutant(
        "uniform_reused",
        "one accept uniform is reused at every position of a round",
        "t2",
        ops=_accept(reuse_uniform=True),
    ),
    Mutant(
        "bonus_wrong_position",
        "the bonus token is drawn from p_K instead of p_{K+1}",
        "t_{K+1} after K accepts",
        ops=_accept(bonus_row=_bonus_previous_position),
    ),
    Mutant(
        "bonus_from_q",
        "the bonus token is drawn from the last draft's q instead of p_{K+1}",
        "t_{K+1} after K accepts",
        ops=_accept(bonus_row=_bonus_from_q),
    ),
    Mutant(
        "draft_filtered_ratio_raw",
        "drafts are sampled from the top-k/top-p filtered q, but the accept "
        "ratio and the residual use the unfiltered q",
        "t1",
        ops=_with(draft_probabilities=_draft_filtered_ratio_raw),
    ),
    Mutant(
        "draft_raw_ratio_filtered",
        "drafts are sampled from the raw draft logits (softmax at temperature 1, no top-k/top-p) "
        "while the accept ratio and the residual use the processed q: the engine accepts against a "
        "q it did not sample from (dishonest proposals, as transformers #47932 and DeepSpec #31 "
        "shipped)",
        "t1 when T != 1 or top-k/top-p truncates; every drafted token (pit_draft)",
        ops=_with(draft_probabilities=_draft_raw_ratio_filtered),
    ),
    Mutant(
        "target_unfiltered",
        "top-k/top-p is applied to the draft but not to the target of the verify rows",
        "t1",
        ops=_with(verify_probabilities=_verify_unfiltered),
    ),
    Mutant(
        "temperature_twice",
        "the logits are divided by the temperature twice (every runner); equivalent at temperature 1",
        "t1 when T != 1",
        ops=_with(
            probabilities=_temperature_twice,
            verify_probabilities=_temperature_twice,
            draft_probabilities=_draft_temperature_twice,
        ),
    ),
    Mutant(
        "argmax_draft",
        "the draft token is argmax q, but the accept rule treats it as a sample of q",
        "t1",
        ops=_with(draw_draft=_draw_argmax),
    ),
    Mutant(
        "top_k_ties_dropped",
        "top-k keeps exactly k tokens, dropping ties at the k-th value (every runner)",
        "t1 when the k-th value is tied",
        ops=_with(
            probabilities=_top_k_ties_dropped,
            verify_probabilities=_top_k_ties_dropped,
            draft_probabilities=lambda lg, r, b: (_top_k_ties_dropped(lg, r, b),) * 2,
        ),
    ),
    Mutant(
        "top_p_boundary_excluded",
        "top-p drops the token that crosses p (every runner)",
        "t1 when top_p < 1",
        ops=_with(
            probabilities=_top_p_boundary_excluded,
            verify_probabilities=_top_p_boundary_excluded,
            draft_probabilities=lambda lg, r, b: (_top_p_boundary_excluded(lg, r, b),) * 2,
        ),
    ),
    Mutant(
        "float32_cdf",
        "plain and draft draws use a float32 CDF (steps of 2**-24 of the total)",
        "t1, by at most ~V * 2**-24",
        ops=_with(draw_plain=_draw_float32_cdf, draw_draft=_draw_float32_cdf),
    ),
    Mutant(
        "seed_collision",
        "every group of a run gets the same seed range",
        "the seed ledger (refused before sampling)",
        layer=HARNESS_LAYER,
    ),
    Mutant(
        "accept_by_division",
        "accept iff u < p(x) / q(x): the same rule up to float rounding",
        "nowhere (equivalent)",
        equivalent=True,
        ops=_accept(accept_rule=lambda u, q_x, p_x: u < p_x / q_x),
    ),
)
SEQUENCE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "correlated_streams",
        "two requests with distinct seeds in one step draw antithetic uniforms "
        "(the odd row uses 1 - u of the even row's block); each request's own law stays exact",
        "pairs of requests (adjacent rows of one step)",
        ops=_with(uniforms=_antithetic_pairs),
        needs=NEEDS_PAIRS,
    ),
    Mutant(
        "wrong_row_late_draft",
        "drafts at round position j >= 3 are verified against p_{j-1} "
        "(accept test and correction); positions 1-2 and the bonus use the right rows",
        "t3+ (round positions 3..K, K >= 3)",
        ops=_accept(verify_row=functools.partial(_row_before_from, LATE_POSITION)),
        needs=NEEDS_SEQUENCE,
    ),
    Mutant(
        "residual_from_p_late",
        f"after a rejection at round position j >= {LATE_POSITION} the correction is drawn from p "
        "instead of max(p - q, 0); earlier positions draw the right residual",
        f"corrections at t{LATE_POSITION}+ (round positions {LATE_POSITION}..K, K >= {LATE_POSITION})",
        ops=_accept(residual=lambda p, q: p, residual_from=LATE_POSITION),
        needs=NEEDS_SEQUENCE,
    ),
    Mutant(
        "q_first_row",
        "every draft position's accept test and correction read q of the round's first draft "
        "position (position 0's rows), while each draft was sampled from its own q: the engine "
        "accepts against a q it did not sample from",
        "t2+ (round positions 2..K+1)",
        ops=_accept(q_row=_round_first_row),
        needs=NEEDS_SEQUENCE,
    ),
    Mutant(
        "wrong_row_deep_draft",
        f"drafts at round position j >= {DEEP_POSITION} are verified against "
        f"p_{{j-1}} (accept test and correction); earlier positions and the bonus use the right rows",
        f"t{DEEP_POSITION}+ (round positions {DEEP_POSITION}..K, K >= {DEEP_POSITION}): no protocol "
        f"with K < {DEEP_POSITION} can see it",
        ops=_accept(verify_row=functools.partial(_row_before_from, DEEP_POSITION)),
        needs=NEEDS_SEQUENCE,
    ),
    Mutant(
        "frozen_offset",
        f"the RNG offset stops advancing after {FROZEN_AFTER} generated tokens: every "
        f"later round reuses the block keyed at prompt + {FROZEN_AFTER} (every runner)",
        f"token {FROZEN_AFTER + 2}+ (rounds that start after {FROZEN_AFTER} generated tokens)",
        ops=_with(uniforms=_frozen_offset, reads_prompt_length=True),
        needs=NEEDS_SEQUENCE,
    ),
    Mutant(
        "offset_overlap",
        "serial reuse: the RNG offset advances by the tokens a round emitted "
        "(<= K + 1) instead of 2K + 1, so a round's first uniforms are the previous round's last "
        "ones (speculative modes; nospec is unchanged)",
        "round 2+",
        ops=_with(uniforms=_offset_by_emitted, reads_prompt_length=True),
        needs=NEEDS_SEQUENCE,
    ),
    Mutant(
        "stale_context",
        f"past prompt + {STALE_AFTER} positions the target depths of the verify rows "
        f"see a stale context: the keys of generated tokens {STALE_AFTER + 1}.. except the row's own "
        "input are skipped (speculative modes)",
        f"token {STALE_AFTER + 3}+",
        ops=_with(verify_context=_stale_context, reads_prompt_length=True),
        needs=NEEDS_SEQUENCE,
    ),
    Mutant(
        "greedy_step",
        "a step holding any greedy request samples every request greedily (an "
        "all-greedy shortcut tested with any instead of all; every runner)",
        "requests sharing a step with a greedy one",
        ops=_with(
            probabilities=_greedy_step_probabilities,
            verify_probabilities=_greedy_step_probabilities,
            draft_probabilities=_greedy_step_draft_probabilities,
        ),
        needs=NEEDS_MIXED,
    ),
)
SETTING_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "mixed_step_unfiltered",
        "a step that admits requests beside others already decoding takes a fallback sampling path "
        "that applies the temperature but drops top-k and top-p (every runner); a step of one kind is "
        "exact (continuous-batching paths that sampled with a fallback sampler ignoring the request's "
        "filters: waybarrios/vllm-mlx#404, paiml/aprender#2080)",
        "every token of a step mixing admission and decoding: only when max_num_batched_tokens admits "
        "a call's requests over several steps (never when one step admits them all)",
        ops=_with(
            probabilities=_mixed_step_probabilities,
            verify_probabilities=_mixed_step_probabilities,
            draft_probabilities=_mixed_step_draft_probabilities,
            reads_prompt_length=True,
        ),
        needs=NEEDS_SETTING,
    ),
)
ALL_MUTANTS = MUTANTS + SEQUENCE_MUTANTS + SETTING_MUTANTS
MUTANT_NAMES = tuple(m.name for m in ALL_MUTANTS)
WRONG_BONUS_ROW = "bonus_wrong_position"  # the wrong-bonus-row class is in MUTANTS already


def get(name: str) -> Mutant:
    """The registered mutant `name`; ValueError naming the field and the value otherwise."""
    for mutant in ALL_MUTANTS:
        if mutant.name == name:
            return mutant
    raise ValueError(f"mutant={name!r} is invalid: expected None or one of {MUTANT_NAMES}")


def sampling_ops(name: str | None) -> SamplingOps:
    """The operations a runner is built with: DEFAULT_OPS for None, else the mutant's."""
    return DEFAULT_OPS if name is None else get(name).ops
