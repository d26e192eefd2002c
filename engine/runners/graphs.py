"""CUDA Graphs of asynchronous decode rounds, one per (batch bucket, key-block bucket).

A round of R requests is padded to the smallest bucket B >= R of `GRAPH_BATCH_SIZES` and to a
power-of-two number of key blocks, and replayed from a graph captured for that shape. Every
captured round drafts K tokens per row; a request scheduled with K_r < K (near its max_tokens)
has its accept cut back to K_r through the plan's device `draft_limit`, so ragged rounds replay
the same graphs and give the tokens of the eager ragged round: its drafts K_r+1..K are computed
from its own unused draft uniforms and never read, and the KV they write beyond the request's
table lands in the scratch block. Rounds above the largest bucket run eagerly, as does
everything when `EngineConfig.enforce_eager` is set, on the CPU, or after a capture failed
(`disabled_reason` says why).

Padding rows are neutralised: they read and advance the frontier's scratch slot (their input
token and position are forced to 0), their block tables point every entry at the KV pool's
scratch block (never handed out, never read by a real request), and they sample greedily, so
they consume no uniforms, raise no flags and touch no live state. Their rows of the result are
not copied out. A real row's table entries past its own blocks also point at the scratch block
(not at PAD_BLOCK, which must stay zero): only its uncounted drafts write there, and its counted
rows read them only under the causal mask.

Capture: when a key-block bucket is first needed, every batch bucket is captured for it,
largest first, into one shared memory pool; each capture is preceded by a warm-up run on
padding rows only (Triton kernels compile there, not during capture). The same static-buffer
round also runs without capture (`capture=False`), which is how the CPU tests check the padding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.kv_cache import PAD_BLOCK
from engine.params import TOP_K_DISABLED, TOP_P_DISABLED
from engine.request import Request
from engine.runners.base import RoundFrame, SamplingRows
from engine.runners.layout import table_capacity
from engine.runners.speculative import RoundPlan, plan_round
from engine.runners.transfer import to_device

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
NUM_WARMUP_RUNS = 2


@dataclass(frozen=True)
class StaticRound:
    """The fixed tensors of one captured shape (B requests, num_blocks key blocks)."""

    plan: RoundPlan  # uniform plan: K drafts for each of the B rows
    num_drafts: torch.Tensor  # int64[B] K_r the accept uses per row (K for padding rows)
    slots: torch.Tensor  # int64[B] frontier slot per row (scratch slot for padding rows)
    tables: torch.Tensor  # int64[D, B, num_blocks] block tables (scratch block for padding rows)
    rows: SamplingRows  # [B] per-row sampling parameters (num_committed is set inside the round)
    output: torch.Tensor  # int64[B, K+3] packed result (written by every replay)
    graph: torch.cuda.CUDAGraph | None  # None: run the round eagerly on these buffers


def next_power_of_two(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


class RoundGraphs:
    """Padded, optionally captured rounds (uniform or ragged) for an `AsyncSpeculativeRunner`."""

    def __init__(
        self, runner, scratch_block: int, capture: bool, batch_sizes: tuple[int, ...] = GRAPH_BATCH_SIZES
    ) -> None:
        self.runner = runner
        self.scratch_block = scratch_block
        self.capture = capture
        self.batch_sizes = tuple(sorted(b for b in batch_sizes if b <= runner.frontier.scratch_slot))
        self.disabled_reason: str | None = None
        self._rounds: dict[tuple[int, int], StaticRound] = {}
        self._pool = None

    def run(
        self, requests: tuple[Request, ...], num_drafts: tuple[int, ...], slots: list[int], tables: torch.Tensor
    ) -> torch.Tensor | None:
        """int64[R, K+3] packed result of the round, or None when it must run eagerly.
        `tables` int64[D, R, num_blocks] are the requests' block tables."""
        if self.disabled_reason is not None or len(requests) > max(self.batch_sizes, default=0):
            return None
        size = next(b for b in self.batch_sizes if b >= len(requests))
        num_blocks = next_power_of_two(self._blocks_needed(requests, num_drafts))  # >= tables
        static = self._rounds.get((size, num_blocks)) or self._build(size, num_blocks)
        if static is None:
            return None
        self._fill(static, requests, num_drafts, slots, tables)
        if static.graph is None:
            static.output.copy_(self.runner.static_round(static))
        else:
            static.graph.replay()
        return static.output[: len(requests)]

    def _blocks_needed(self, requests: tuple[Request, ...], num_drafts: tuple[int, ...]) -> int:
        """Key blocks that hold every row's K drafts: request r's table holds its round's
        K_r + 1 positions (the scheduler grew it), and its K - K_r uncounted drafts go further.
        Never fewer than the widest table, since K - K_r >= 0."""
        k, block_size = self.runner.num_speculative_tokens, self.runner.block_size
        return max(
            -(-(table_capacity(r.block_tables, block_size) + k - k_r) // block_size)
            for r, k_r in zip(requests, num_drafts)
        )

    def _fill(
        self, static: StaticRound, requests, num_drafts: tuple[int, ...], slots: list[int], tables: torch.Tensor
    ) -> None:
        """Real rows first, then the padding rows' neutral values (every field is rewritten, so
        nothing of an earlier, larger round survives)."""
        count, size = len(requests), static.slots.shape[0]
        k = self.runner.num_speculative_tokens
        static.slots.copy_(
            to_device(slots + [self.runner.frontier.scratch_slot] * (size - count), torch.int64, static.slots.device)
        )
        static.num_drafts.copy_(
            to_device(list(num_drafts) + [k] * (size - count), torch.int64, static.num_drafts.device)
        )
        static.tables.fill_(self.scratch_block)
        static.tables[:, :count, : tables.shape[-1]] = torch.where(tables == PAD_BLOCK, self.scratch_block, tables)
        real = SamplingRows.from_requests(
            requests, static.slots.device, with_prompt=self.runner.ops.reads_prompt_length
        )
        padding = self._padding_rows(size - count)
        names = ("temperature", "top_k", "top_p", "is_greedy", "seeds")
        for name in names + (("num_prompt",) if real.num_prompt is not None else ()):
            getattr(static.rows, name).copy_(torch.cat([getattr(real, name), getattr(padding, name)]))

    def _padding_rows(self, size: int) -> SamplingRows:
        """Greedy rows: no uniforms used, no flags raised on finite logits."""
        device = self.runner.device

        def full(value, dtype):
            return torch.full((size,), value, dtype=dtype, device=device)

        return SamplingRows(
            full(0.0, torch.float32),
            full(TOP_K_DISABLED, torch.int64),
            full(TOP_P_DISABLED, torch.float32),
            full(True, torch.bool),
            full(0, torch.int64),
            full(0, torch.int64),
            full(0, torch.int64),
        )

    def _build(self, size: int, num_blocks: int) -> StaticRound | None:
        """Create (and capture, largest first) every batch bucket for this key-block bucket."""
        for bucket in sorted(self.batch_sizes, reverse=True):
            static = self._static(bucket, num_blocks)
            if self.capture:
                try:
                    static = self._capture(static)
                except RuntimeError as error:  # e.g. an operation that cannot be captured
                    self.disabled_reason = f"CUDA Graph capture failed: {error}"
                    self._rounds.clear()
                    return None
            self._rounds[(bucket, num_blocks)] = static
        return self._rounds[(size, num_blocks)]

    def _static(self, size: int, num_blocks: int) -> StaticRound:
        runner = self.runner
        k = runner.num_speculative_tokens
        tables = torch.full(
            (runner.model.num_depths, size, num_blocks), self.scratch_block, dtype=torch.int64, device=runner.device
        )
        slots = torch.full((size,), runner.frontier.scratch_slot, dtype=torch.int64, device=runner.device)
        output = torch.zeros((size, k + 3), dtype=torch.int64, device=runner.device)
        num_drafts = torch.full((size,), k, dtype=torch.int64, device=runner.device)
        return StaticRound(
            plan_round((k,) * size, k, runner.device), num_drafts, slots, tables, self._padding_rows(size), output, None
        )

    def _capture(self, static: StaticRound) -> StaticRound:
        """Warm up on a side stream (padding rows only), then capture into the shared pool."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph, output = warm_and_capture(lambda: self.runner.static_round(static), self._pool)
        return replace(static, output=output, graph=graph)


def warm_and_capture(run: Callable[[], Any], pool) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Call `run` NUM_WARMUP_RUNS times on a side stream (Triton kernels compile there, not
    during capture), then capture one call into the memory pool `pool`: (graph, its output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(NUM_WARMUP_RUNS):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = run()
    return graph, output


def padded_frame(runner, static: StaticRound) -> RoundFrame:
    """The frame of a static round; padding rows start at position 0 with input token 0."""
    frontier = runner.frontier
    is_pad = static.slots == frontier.scratch_slot
    inputs = torch.where(is_pad, 0, frontier.tokens[static.slots])
    starts = torch.where(is_pad, 0, frontier.positions[static.slots])
    return RoundFrame(inputs, starts, static.tables, static.tables.shape[-1])
