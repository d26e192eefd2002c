"""Synchronous block speculation: draft -> verify -> accept -> commit, one round per step.

For request r with K_r drafts (0 <= K_r <= K), committed tokens c_1..c_n and input t_0 = c_n:
1. draft: for j = 1..K_r, run depths 1..draft_depth on t_{j-1} at position n-1+j-1, read out
   q_j and sample x_j = t_j = categorical(q_j, u[j-1]); the shallow hidden state is kept.
2. verify: run depths 1..draft_depth on t_{K_r} (the last draft's own shallow pass), then depths
   draft_depth+1..D on all K_r+1 rows t_0..t_{K_r}, continuing from the kept shallow states, and
   read out p_1..p_{K_r+1}. Each depth is computed once per position; the shallow KV written
   while drafting is the KV the verify rows attend to.
3. accept: `speculative_accept` with the request's block u[0:2K+1].
4. commit (scheduler): append x_1..x_m and the correction/bonus; truncate the KV to the new
   committed length minus one, which drops the rejected tail at every depth.

RNG: each random request draws exactly one block uniform_blocks(seed, n, 2K+1) per round, with
n its committed tokens at the start of the round and K the configured K (also when K_r < K):
u[0:K] sample drafts, u[K:2K] are the accept tests, u[2K] the correction or bonus.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import Request
from engine.runners.base import ModelRunner, RoundFrame, RoundOutcome, SamplingRows
from engine.runners.draft_override import DraftOverride
from engine.runners.layout import RowLayout, device_layout
from engine.runners.transfer import to_device
from engine.sampling import PLACEHOLDER_TOKEN, AcceptResult


@dataclass(frozen=True)
class DraftStep:
    """Draft step j of a round: the requests with K_r >= j."""

    num_active: int  # A
    active: torch.Tensor  # int64[A] indices of those requests in the round
    draft_rows: torch.Tensor  # int64[A] flat draft row cu[r] + j - 1
    verify_rows: torch.Tensor  # int64[A] verify row of t_{j-1}: cu[r] + r + j - 1


@dataclass(frozen=True)
class RoundPlan:
    """Everything about a round's shape that the host knows before any device work."""

    num_drafts: tuple[int, ...]  # K_r
    num_speculative_tokens: int  # K, the width of the uniform block is 2K + 1
    cu_num_drafts: torch.Tensor  # int64[R+1]
    num_drafts_t: torch.Tensor  # int64[R]
    steps: tuple[DraftStep, ...]  # j = 1..max K_r
    last_rows: torch.Tensor  # int64[R] verify row of t_{K_r}: cu[r+1] + r
    flat_request: torch.Tensor  # int64[N] request of each flat draft
    flat_index: torch.Tensor  # int64[N] j - 1 of each flat draft
    # Device K_r <= num_drafts[r] that the accept uses instead (None: num_drafts). A captured
    # round drafts K for every request and cuts each one back to its K_r here, so one graph
    # serves ragged rounds; the drafts past K_r are computed and never read.
    draft_limit: torch.Tensor | None = None  # int64[R]

    @property
    def num_requests(self) -> int:
        return len(self.num_drafts)


@dataclass(frozen=True)
class Drafts:
    tokens: torch.Tensor  # int64[R, max(K, 1)] x_j at column j - 1, PLACEHOLDER_TOKEN beyond K_r
    probs: torch.Tensor  # float32[N, V] q_j per flat draft row
    shallow: torch.Tensor  # [N + R, D] hidden after draft_depth per verify row (verify fills the
    #                        last row of each request, t_{K_r}, whose shallow pass it runs)


def plan_round(num_drafts: tuple[int, ...], k: int, device: torch.device) -> RoundPlan:
    """The round's shape from host values only (K_r per request, K)."""
    counts = to_device(num_drafts, torch.int64, device)
    cu = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    index = torch.arange(len(num_drafts), device=device)
    steps = []
    for j in range(1, max(num_drafts, default=0) + 1):
        active = [i for i, n in enumerate(num_drafts) if n >= j]
        active_t = to_device(active, torch.int64, device)
        steps.append(DraftStep(len(active), active_t, cu[active_t] + j - 1, cu[active_t] + active_t + j - 1))
    flat_request = torch.repeat_interleave(index, counts, output_size=sum(num_drafts))
    return RoundPlan(
        tuple(num_drafts),
        k,
        cu,
        counts,
        tuple(steps),
        cu[1:] + index,
        flat_request,
        torch.arange(flat_request.numel(), device=device) - cu[flat_request],
    )


class SpeculativeRunner(ModelRunner):
    """Runs one synchronous speculative round for a batch of requests.

    `draft`, `verify` and `accept` are the round's device work: they read only the `RoundFrame`,
    the plan and the sampling rows, never the host state of a request, so the asynchronous
    runner drives them unchanged from its device-side frontier.
    """

    def __init__(
        self,
        *args,
        num_speculative_tokens: int,
        draft_depth: int,
        draft_override: DraftOverride | None = None,
        **kwargs,
    ) -> None:
        """`draft_override` (None: the model's own draft) replaces the draft logits (see
        engine.runners.draft_override); chosen here, once."""
        super().__init__(*args, **kwargs)
        self.num_speculative_tokens = num_speculative_tokens
        self.draft_depth = draft_depth
        self.draft_override = draft_override

    def run(self, requests: tuple[Request, ...], num_drafts: tuple[int, ...]) -> list[RoundOutcome]:
        with torch.inference_mode():
            plan = plan_round(num_drafts, self.num_speculative_tokens, self.device)
            frame = self.frame(requests, [r.num_computed + k + 1 for r, k in zip(requests, num_drafts)])
            rows = SamplingRows.from_requests(requests, self.device, with_prompt=self.ops.reads_prompt_length)
            result = self.round(frame, plan, rows)
            return collect(plan, result)

    def round(self, frame: RoundFrame, plan: RoundPlan, rows: SamplingRows) -> AcceptResult:
        """draft -> verify -> accept, all on the device; `rows.num_committed` keys the uniforms."""
        return self.round_with_drafts(frame, plan, rows)[0]

    def round_with_drafts(
        self, frame: RoundFrame, plan: RoundPlan, rows: SamplingRows
    ) -> tuple[AcceptResult, torch.Tensor]:
        """`round`, and the drafts the accept step was given: int64[R, max(K, 1)], x_j at column
        j - 1 (the tokens `draft` sampled; columns at or past a request's K_r, or past its
        `plan.draft_limit`, were not tested and are not part of the round)."""
        uniforms = self.uniforms(rows, 2 * self.num_speculative_tokens + 1)
        drafts = self.draft(frame, plan, rows, uniforms)
        target_probs = self.verify(frame, plan, rows, drafts)
        return self.accept(plan, rows, drafts, target_probs, uniforms), drafts.tokens

    def draft(self, frame: RoundFrame, plan: RoundPlan, rows: SamplingRows, uniforms: torch.Tensor) -> Drafts:
        num_rows, count = sum(plan.num_drafts), plan.num_requests
        tokens = torch.full(
            (count, max(plan.num_speculative_tokens, 1)), PLACEHOLDER_TOKEN, dtype=torch.int64, device=self.device
        )
        probs = torch.empty(num_rows, self.model.vocab_size, device=self.device)
        template = self.model.embed(frame.inputs[:0])  # [0, D]: the hidden size and dtype
        shallow = template.new_empty(num_rows + count, template.shape[-1])
        for j, step in enumerate(plan.steps, start=1):
            step_inputs = frame.inputs[step.active] if j == 1 else tokens[step.active, j - 2]
            layout = self._single_rows(frame.starts[step.active] + (j - 1), frame.num_blocks)
            hidden = self.model.embed(step_inputs.clamp(min=0))
            hidden = self.run_depths_on(hidden, layout, frame.tables[:, step.active], 1, self.draft_depth)
            shallow[step.verify_rows] = hidden
            logits = self.model.readout(hidden)
            if self.draft_override is not None:
                logits = self._overridden(logits, hidden, layout, frame, step, rows)
            q, q_ratio = self.ops.draft_probabilities(logits, rows.select(step.active), self.sampling_backend)
            probs[step.draft_rows] = q_ratio
            tokens[step.active, j - 1] = self.ops.draw_draft(
                q, uniforms[step.active, j - 1].contiguous(), self.sampling_backend
            )
        return Drafts(tokens, probs, shallow)

    def _overridden(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor,
        layout: RowLayout,
        frame: RoundFrame,
        step: DraftStep,
        rows: SamplingRows,
    ) -> torch.Tensor:
        """The draft override's logits of one draft step (target depths run on the draft's own
        row when the override reads the target; verify rewrites that KV before it is read)."""
        override, target = self.draft_override, None
        if override.needs_target:
            deep = self.run_depths_on(
                hidden, layout, frame.tables[:, step.active], self.draft_depth + 1, self.model.num_depths
            )
            target = self.model.readout(deep)
        return override.logits(logits, target, rows.seeds[step.active], layout.positions)

    def verify(self, frame: RoundFrame, plan: RoundPlan, rows: SamplingRows, drafts: Drafts) -> torch.Tensor:
        """float32[N + R, V]: p_1..p_{K_r+1} of every request, packed in request order."""
        count = plan.num_requests
        chain = torch.cat([frame.inputs[:, None], drafts.tokens], dim=1)
        last_inputs = chain[torch.arange(count, device=self.device), plan.num_drafts_t]
        layout = self._single_rows(frame.starts + plan.num_drafts_t, frame.num_blocks)
        hidden = self.run_depths_on(
            self.model.embed(last_inputs.clamp(min=0)), layout, frame.tables, 1, self.draft_depth
        )
        shallow = drafts.shallow
        shallow[plan.last_rows] = hidden
        num_rows = sum(plan.num_drafts) + count
        layout = device_layout(
            frame.starts,
            plan.num_drafts_t + 1,
            num_rows=num_rows,
            max_length=max(plan.num_drafts) + 1,
            num_blocks=frame.num_blocks,
            block_size=self.block_size,
        )
        if self.ops.verify_context is not None:  # a planted bug only (engine.mutants)
            layout = self.ops.verify_context(layout, rows)
        deep = self.run_depths_on(shallow, layout, frame.tables, self.draft_depth + 1, self.model.num_depths)
        return self.ops.verify_probabilities(
            self.model.readout(deep), rows.repeat(plan.num_drafts_t + 1, num_rows), self.sampling_backend
        )

    def accept(
        self, plan: RoundPlan, rows: SamplingRows, drafts: Drafts, target_probs: torch.Tensor, uniforms: torch.Tensor
    ) -> AcceptResult:
        flat_tokens = drafts.tokens[plan.flat_request, plan.flat_index].contiguous()
        return self.ops.accept(
            flat_tokens,
            plan.cu_num_drafts,
            drafts.probs,
            target_probs,
            uniforms,
            rows.is_greedy,
            draft_limit=plan.draft_limit,
            backend=self.sampling_backend,
        )

    def _single_rows(self, starts: torch.Tensor, num_blocks: int) -> RowLayout:
        """One query row per sequence at device positions `starts`."""
        count = starts.shape[0]
        return device_layout(
            starts,
            torch.ones(count, dtype=torch.int64, device=self.device),
            num_rows=count,
            max_length=1,
            num_blocks=num_blocks,
            block_size=self.block_size,
        )


def collect(plan: RoundPlan, result: AcceptResult) -> list[RoundOutcome]:
    """The round's single host read: emitted tokens and their sources per request."""
    rows = zip(result.tokens.tolist(), result.num_accepted.tolist(), result.error.tolist())
    return [
        outcome(num_drafts, tokens, num_accepted, error)
        for (tokens, num_accepted, error), num_drafts in zip(rows, plan.num_drafts)
    ]


def outcome(num_drafts: int, tokens: list[int], num_accepted: int, error: int) -> RoundOutcome:
    """Decode one request's result row with explicit ranges: only tokens[:num_accepted + 1]
    is read; an error flag, or an accepted count outside [0, K_r], yields no tokens."""
    if error or not 0 <= num_accepted <= num_drafts:
        return RoundOutcome((), (), num_drafts, 0, True)
    last = "bonus" if num_accepted == num_drafts else "correction"
    return RoundOutcome(
        tuple(tokens[: num_accepted + 1]), ("accepted",) * num_accepted + (last,), num_drafts, num_accepted, False
    )
