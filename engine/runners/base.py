"""What every runner shares: the model, the paged KV, prefill, depth ranges and per-row params.

A runner turns a scheduled batch into one `RoundOutcome` per request. Device work lives in
methods that take and return tensors; the only host reads of a step happen in `collect`-style
functions at the end (`RoundOutcome`s are built from one `.tolist()` per result tensor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.kv_cache import PagedKVCache
from engine.models.base import DepthModel
from engine.request import Request
from engine.runners.layout import RowLayout, block_table_tensor, depth_metadata, layout_rows, metadata_for
from engine.runners.transfer import to_device
from engine.sampling import batched_probabilities, categorical, speculative_accept, uniform_blocks

GREEDY_UNIFORM = 0.5  # any u works for a one-hot row; greedy requests consume no stream
GREEDY_SEED = 0  # placeholder seed of greedy rows (their uniforms are never used)


def probabilities(logits: torch.Tensor, rows: SamplingRows, backend: str) -> torch.Tensor:
    """float32[N, V] sampling distributions; a row whose logits hold NaN or +inf becomes all
    NaN, so that greedy rows fail like random ones (a one-hot argmax of NaN logits would
    otherwise look like a valid distribution) and the request ends with an error."""
    probs = batched_probabilities(logits, rows.temperature, rows.top_k, rows.top_p, backend=backend)
    is_broken = (torch.isnan(logits) | (logits == float("inf"))).any(dim=1, keepdim=True)
    return torch.where(is_broken, float("nan"), probs)


def draft_probabilities(logits: torch.Tensor, rows: SamplingRows, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(distribution the drafts are sampled from, distribution the accept ratio and the residual
    use): both are q, float32[N, V]; a planted bug may make them differ (engine.mutants)."""
    q = probabilities(logits, rows, backend)
    return q, q


def draw(probs: torch.Tensor, u: torch.Tensor, backend: str) -> torch.Tensor:
    """int64[N] categorical(probs, u) on the runner's sampling backend."""
    return categorical(probs, u, backend=backend)


def round_uniforms(rows: SamplingRows, width: int) -> torch.Tensor:
    """float64[R, width]: each request's block of the step, keyed by (seed, committed tokens)."""
    return uniform_blocks(rows.seeds, rows.num_committed, width)


@dataclass(frozen=True)
class SamplingOps:
    """The sampling operations a runner calls, chosen once when the runner is built.

    `DEFAULT_OPS` are the engine's own; `engine.mutants` builds variants with one planted bug
    (never active unless a mutant is named in `EngineConfig.mutant`).
    """

    probabilities: Callable = probabilities  # (logits, rows, backend) -> f32[N, V], plain steps
    verify_probabilities: Callable = probabilities  # same signature, p of the verify rows
    draft_probabilities: Callable = draft_probabilities  # -> (sample q, ratio q)
    draw_plain: Callable = draw  # (probs, u, backend) -> int64[N], plain steps
    draw_draft: Callable = draw  # same signature, the draft tokens
    accept: Callable = speculative_accept  # signature of engine.sampling.speculative_accept
    uniforms: Callable = round_uniforms  # (rows, width) -> float64[R, width], before greedy rows
    # (RowLayout, rows) -> RowLayout of the verify rows at the target depths; None: unchanged.
    # Only a planted bug sets it (a stale context), so the correct round does not call anything.
    verify_context: Callable | None = None
    reads_prompt_length: bool = False  # the ops read SamplingRows.num_prompt (None otherwise)


DEFAULT_OPS = SamplingOps()


@dataclass(frozen=True)
class RoundOutcome:
    """What one request got from one step (host values, read once in `collect`)."""

    tokens: tuple[int, ...]  # emitted tokens, in order
    sources: tuple[str, ...]  # one of engine.request.SOURCES per token
    num_drafts: int  # K_r
    num_accepted: int
    is_error: bool  # the round hit an invalid distribution; the request fails


@dataclass(frozen=True)
class SamplingRows:
    """Per-request sampling parameters of one step as device tensors."""

    temperature: torch.Tensor  # float32[R]
    top_k: torch.Tensor  # int64[R]
    top_p: torch.Tensor  # float32[R]
    is_greedy: torch.Tensor  # bool[R]
    seeds: torch.Tensor  # int64[R] request streams (GREEDY_SEED for greedy rows)
    num_committed: torch.Tensor  # int64[R] committed tokens (prompt + generated) at step start
    num_prompt: torch.Tensor | None = None  # int64[R] prompt tokens; only for ops that read it

    @classmethod
    def from_requests(
        cls,
        requests: tuple[Request, ...],
        device: torch.device,
        num_committed: torch.Tensor | None = None,
        with_prompt: bool = False,
    ) -> SamplingRows:
        """`num_committed` (device int64[R]) replaces the host counts when the committed
        lengths live on the device (asynchronous rounds); `with_prompt` also sends the prompt
        lengths (`SamplingOps.reads_prompt_length`: no transfer for the engine's own ops)."""
        params = [request.params for request in requests]

        def tensor(values, dtype):
            return to_device(values, dtype, device)

        return cls(
            temperature=tensor([p.temperature for p in params], torch.float32),
            top_k=tensor([p.top_k for p in params], torch.int64),
            top_p=tensor([p.top_p for p in params], torch.float32),
            is_greedy=tensor([p.is_greedy for p in params], torch.bool),
            seeds=tensor([GREEDY_SEED if r.seed is None else r.seed for r in requests], torch.int64),
            num_committed=(
                tensor([len(r.token_ids) for r in requests], torch.int64) if num_committed is None else num_committed
            ),
            num_prompt=(tensor([len(r.prompt_token_ids) for r in requests], torch.int64) if with_prompt else None),
        )

    def repeat(self, counts: torch.Tensor, total: int) -> SamplingRows:
        """Row r repeated counts[r] times (e.g. once per verify row); `total` = sum(counts),
        known on the host, so no device read is needed to size the result."""
        return SamplingRows(
            *(None if t is None else torch.repeat_interleave(t, counts, output_size=total) for t in self._fields())
        )

    def select(self, index: torch.Tensor) -> SamplingRows:
        return SamplingRows(*(None if t is None else t[index] for t in self._fields()))

    def _fields(self) -> tuple[torch.Tensor | None, ...]:
        return (
            self.temperature,
            self.top_k,
            self.top_p,
            self.is_greedy,
            self.seeds,
            self.num_committed,
            self.num_prompt,
        )


@dataclass(frozen=True)
class RoundFrame:
    """Where the requests of a round stand: their next input and position, and their KV.

    Built from host values by the synchronous runner, and from the device-side frontier by
    the asynchronous one; the round's device functions only read these tensors.
    """

    inputs: torch.Tensor  # int64[R] t_0, the last committed token (the round's first input)
    starts: torch.Tensor  # int64[R] position of t_0 (= committed tokens - 1)
    tables: torch.Tensor  # int64[D, R, num_blocks] every depth's block table, PAD_BLOCK-padded
    num_blocks: int  # host bound: no position of the round lies beyond num_blocks * block_size

    def select(self, index: torch.Tensor) -> RoundFrame:
        return RoundFrame(self.inputs[index], self.starts[index], self.tables[:, index], self.num_blocks)


class ModelRunner:
    """Holds the model and its KV; runs depth ranges over laid-out rows."""

    def __init__(
        self,
        model: DepthModel,
        kv: PagedKVCache,
        device: torch.device,
        sampling_backend: str,
        ops: SamplingOps = DEFAULT_OPS,
    ) -> None:
        self.model = model
        self.ops = ops
        self.kv = kv
        self.device = device
        self.block_size = kv.layout.block_size
        self.sampling_backend = sampling_backend

    def layout(self, starts: list[int], lengths: list[int]) -> RowLayout:
        return layout_rows(starts, lengths, self.block_size, self.device)

    def run_depths(
        self, hidden: torch.Tensor, layout: RowLayout, requests: tuple[Request, ...], first: int, last: int
    ) -> torch.Tensor:
        """Apply depths first..last (1-based, inclusive) to hidden[N, D]; writes their KV."""
        for depth in range(first, last + 1):
            tables = [request.block_tables[depth - 1] for request in requests]
            metadata = depth_metadata(layout, tables)
            hidden = self.model.forward_depth(depth, hidden, layout.positions, metadata, self.kv)
        return hidden

    def run_depths_on(
        self, hidden: torch.Tensor, layout: RowLayout, tables: torch.Tensor, first: int, last: int
    ) -> torch.Tensor:
        """`run_depths` with device block tables int64[D, B, >= layout.num_blocks] (no host
        data involved, so it can be captured in a CUDA Graph)."""
        for depth in range(first, last + 1):
            metadata = metadata_for(layout, tables[depth - 1])
            hidden = self.model.forward_depth(depth, hidden, layout.positions, metadata, self.kv)
        return hidden

    def frame(self, requests: tuple[Request, ...], num_positions: list[int]) -> RoundFrame:
        """Frame of a round from host state; request r's tables must already hold
        num_positions[r] positions (the scheduler grew them)."""
        num_blocks = -(-max(num_positions) // self.block_size)
        tables = [
            block_table_tensor(
                [r.block_tables[d] for r in requests], num_blocks, tuple(num_positions), self.block_size, self.device
            )
            for d in range(self.model.num_depths)
        ]
        starts = to_device([r.num_computed for r in requests], torch.int64, self.device)
        return RoundFrame(self.last_tokens(requests), starts, torch.stack(tables), num_blocks)

    def execute(self, requests: tuple[Request, ...], num_drafts: tuple[int, ...]) -> list[tuple[Request, RoundOutcome]]:
        """Run one round for `requests` and return the outcomes that are ready now. Synchronous
        runners return this round's; the asynchronous runner returns the previous round's."""
        if not requests:
            return []
        return list(zip(requests, self.run(requests, num_drafts)))

    def release(self, request: Request) -> None:
        """Forget a finished request (the asynchronous runner frees its frontier slot)."""

    def close(self) -> None:
        """Drop any work not collected yet (nothing for synchronous runners)."""

    @torch.inference_mode()
    def prefill(self, requests: tuple[Request, ...]) -> None:
        """Compute every depth's KV for all committed tokens but the last of each request.

        Requests of one step with the same tokens share the work: the first of each group is
        computed and its blocks are copied to the others (the harness sends one prompt
        thousands of times). A copy holds exactly what the follower's own prefill in a batch
        of the same shape would have written.
        """
        groups: dict[tuple[int, ...], list[Request]] = {}
        for request in requests:
            if request.num_computed > 0:
                groups.setdefault(tuple(request.token_ids[:-1]), []).append(request)
        if not groups:
            return
        leaders = tuple(group[0] for group in groups.values())
        layout = self.layout([0] * len(leaders), [r.num_computed for r in leaders])
        tokens = to_device([t for key in groups for t in key], torch.int64, self.device)
        self.run_depths(self.model.embed(tokens), layout, leaders, 1, self.model.num_depths)
        self._copy_blocks(groups.values())

    def _copy_blocks(self, groups) -> None:
        """Copy each group leader's prefilled blocks (every depth) into its followers' blocks."""
        sources, targets = [], []
        for leader, *followers in groups:
            num_blocks = -(-leader.num_computed // self.block_size)
            for follower in followers:
                for source, target in zip(leader.block_tables, follower.block_tables):
                    sources += source[:num_blocks]
                    targets += target[:num_blocks]
        if targets:
            source_t = to_device(sources, torch.int64, self.device)
            target_t = to_device(targets, torch.int64, self.device)
            for pool in self.kv.key + self.kv.value:
                pool.index_copy_(0, target_t, pool.index_select(0, source_t))

    def uniforms(self, rows: SamplingRows, width: int) -> torch.Tensor:
        """float64[R, width]: each random request's block for this step, keyed by
        (seed, committed tokens); greedy rows get GREEDY_UNIFORM and consume nothing."""
        block = self.ops.uniforms(rows, width)
        return torch.where(rows.is_greedy[:, None], GREEDY_UNIFORM, block).contiguous()

    def last_tokens(self, requests: tuple[Request, ...]) -> torch.Tensor:
        """int64[R] the last committed token of each request (its next input)."""
        return to_device([r.token_ids[-1] for r in requests], torch.int64, self.device)
