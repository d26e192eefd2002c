"""Asynchronous block speculation: round N+1 is queued before round N's result reaches the host.

Round timeline of one request (step s = one `Engine.step`):

    step s    schedule round s -> submit round s (device) -> collect round s-1 (host) -> commit
    step s+1  schedule round s+1 -> submit round s+1 -> collect round s -> commit

The device keeps every request's *frontier* (`Frontier`): its next input token (the last
committed token) and that token's position. A round gathers its inputs and positions from the
frontier, runs the synchronous runner's `draft -> verify -> accept` unchanged, and advances the
frontier by the tokens it emitted, all on the device: submission reads nothing back. The round's
result (emitted tokens, accepted count, error flag per request) is copied into a host buffer
without blocking; the next step collects it, decoding each row with explicit ranges, so stale
values left in the reused buffer by earlier, larger rounds are never read.

The scheduler (see `engine.scheduler`) keeps at most two rounds in flight per request, grows
block tables for both, and holds a request back one step when its next K_r would depend on the
outcome still in flight (near max_tokens). A request that stops (EOS, stop token, length),
fails or is aborted while its next round is queued has that round discarded at collection;
stream order makes the discarded round's writes (to blocks and to its frontier slot) land
before anything reuses them.

RNG: each random request draws one block uniform_blocks(seed, n, 2K+1) per round with n the
committed length at the round's start, read from the frontier on the device, exactly as the
synchronous runner does from the host. So async and sync rounds of a request draw the same
uniforms, and give the same tokens wherever their logits are bitwise equal.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import torch

from engine.request import Request
from engine.runners.base import RoundFrame, RoundOutcome, SamplingRows
from engine.runners.graphs import RoundGraphs, StaticRound, padded_frame
from engine.runners.layout import block_table_tensor, table_capacity
from engine.runners.speculative import SpeculativeRunner, outcome, plan_round
from engine.runners.transfer import to_device
from engine.sampling import AcceptResult

NUM_HOST_BUFFERS = 2  # rounds awaiting collection at once: the one collected and the one queued
NUM_RESULT_EXTRA_COLUMNS = 2  # result row = K+1 tokens, then accepted count, then error flag


class Frontier:
    """Device-side frontier of every live request, one slot each (`capacity` slots).

    tokens[slot] is the request's next input (its last committed token) and positions[slot]
    that token's position (committed tokens - 1). Rounds read and advance them on the device;
    the host only writes a slot when a request arrives. The extra slot `scratch_slot` is never
    assigned: padding rows of captured rounds read and write it.
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.tokens = torch.zeros(capacity + 1, dtype=torch.int64, device=device)  # int64[S+1]
        self.positions = torch.zeros(capacity + 1, dtype=torch.int64, device=device)  # int64[S+1]
        self.scratch_slot = capacity
        self.device = device
        self._free = list(range(capacity - 1, -1, -1))  # stack: low slots first
        self._slots: dict[Request, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def slots_for(self, requests: tuple[Request, ...]) -> list[int]:
        """Each request's slot; a newcomer gets one, initialised from its host state."""
        newcomers = [r for r in requests if r not in self._slots]
        for request in newcomers:
            if not self._free:
                raise RuntimeError("no frontier slot left (more live requests than max_num_seqs)")
            self._slots[request] = self._free.pop()
        if newcomers:
            slots = to_device([self._slots[r] for r in newcomers], torch.int64, self.device)
            self.tokens.index_copy_(0, slots, to_device([r.token_ids[-1] for r in newcomers], torch.int64, self.device))
            self.positions.index_copy_(
                0, slots, to_device([r.num_computed for r in newcomers], torch.int64, self.device)
            )
        return [self._slots[r] for r in requests]

    def release(self, request: Request) -> None:
        """Free the request's slot (idempotent)."""
        slot = self._slots.pop(request, None)
        if slot is not None:
            self._free.append(slot)

    def advance(self, slots: torch.Tensor, frame: RoundFrame, result: AcceptResult) -> None:
        """Move each request past the tokens its round emitted (none after an error)."""
        emitted = result.num_emitted  # int64[R]
        last = result.tokens.gather(1, (emitted - 1).clamp(min=0)[:, None])[:, 0]
        self.tokens.index_copy_(0, slots, torch.where(emitted > 0, last, frame.inputs))
        self.positions.index_copy_(0, slots, frame.starts + emitted)


@dataclass(frozen=True)
class InFlightRound:
    """A submitted round whose result has not been read yet."""

    requests: tuple[Request, ...]
    num_drafts: tuple[int, ...]  # K_r per request
    result: torch.Tensor  # int64[R, K+3] host rows of this round (a view of a reused buffer)
    done: torch.cuda.Event | None  # recorded after the copy (CUDA); None on the CPU


def pack(result: AcceptResult) -> torch.Tensor:
    """int64[R, K+3]: tokens[0:K+1] (PLACEHOLDER_TOKEN-padded), num_accepted, error."""
    return torch.cat([result.tokens, result.num_accepted[:, None], result.error.to(torch.int64)[:, None]], dim=1)


class AsyncSpeculativeRunner(SpeculativeRunner):
    """Queues each round on the device and hands back the previous round's outcomes."""

    def __init__(
        self, *args, max_num_seqs: int, scratch_block: int | None = None, rounds_in_flight: int = 2, **kwargs
    ) -> None:
        """`scratch_block` (a KV block never handed out) turns on padded rounds, captured as
        CUDA Graphs on CUDA (see engine.runners.graphs); None: always eager.
        `rounds_in_flight` 1 collects every round in the step that submits it (the synchronous
        timeline, a baseline); 2 leaves it queued until the next step."""
        super().__init__(*args, **kwargs)
        self.rounds_in_flight = rounds_in_flight
        self.frontier = Frontier(max_num_seqs, self.device)
        self.graphs = (
            None if scratch_block is None else RoundGraphs(self, scratch_block, capture=self.device.type == "cuda")
        )
        width = self.num_speculative_tokens + 1 + NUM_RESULT_EXTRA_COLUMNS
        pin = self.device.type == "cuda"
        self.host_buffers = tuple(
            torch.empty((max_num_seqs, width), dtype=torch.int64, pin_memory=pin) for _ in range(NUM_HOST_BUFFERS)
        )
        self._pending: deque[InFlightRound] = deque()
        self._num_submitted = 0

    @property
    def in_flight(self) -> tuple[InFlightRound, ...]:
        """Rounds submitted and not collected yet, oldest first."""
        return tuple(self._pending)

    def execute(self, requests: tuple[Request, ...], num_drafts: tuple[int, ...]) -> list[tuple[Request, RoundOutcome]]:
        """Submit this step's round (if any), then collect every older round."""
        if requests:
            self._pending.append(self.submit(requests, num_drafts))
        ready = []
        while len(self._pending) > (self.rounds_in_flight - 1 if requests else 0):
            ready += self.collect(self._pending.popleft())
        return ready

    def submit(self, requests: tuple[Request, ...], num_drafts: tuple[int, ...]) -> InFlightRound:
        """Queue one round on the device; reads nothing back from it."""
        with torch.inference_mode():
            slots = self.frontier.slots_for(requests)
            tables = self._tables(requests)
            packed = None
            if self.graphs is not None:
                packed = self.graphs.run(requests, num_drafts, slots, tables)
            if packed is None:
                packed = self._eager_round(requests, num_drafts, slots, tables)
            return self._copy_out(requests, num_drafts, packed)

    def _eager_round(self, requests, num_drafts, slots: list[int], tables: torch.Tensor):
        """int64[R, K+3]: inputs and positions gathered from the frontier, which the round
        then advances."""
        slots_t = to_device(slots, torch.int64, self.device)
        frame = RoundFrame(self.frontier.tokens[slots_t], self.frontier.positions[slots_t], tables, tables.shape[-1])
        rows = SamplingRows.from_requests(
            requests, self.device, frame.starts + 1, with_prompt=self.ops.reads_prompt_length
        )
        result = self.round(frame, plan_round(num_drafts, self.num_speculative_tokens, self.device), rows)
        self.frontier.advance(slots_t, frame, result)
        return pack(result)

    def static_round(self, static: StaticRound) -> torch.Tensor:
        """The round of a padded static shape (captured by RoundGraphs): int64[B, K+3]."""
        with torch.inference_mode():
            frame = padded_frame(self, static)
            rows = replace(static.rows, num_committed=frame.starts + 1)
            result = self.round(frame, replace(static.plan, draft_limit=static.num_drafts), rows)
            self.frontier.advance(static.slots, frame, result)
            return pack(result)

    def _tables(self, requests: tuple[Request, ...]) -> torch.Tensor:
        """int64[D, R, num_blocks] block tables from the host. Their capacity, grown by the
        scheduler for every round in flight, bounds the positions a round may touch."""
        capacity = tuple(table_capacity(r.block_tables, self.block_size) for r in requests)
        num_blocks = max(capacity) // self.block_size
        return torch.stack(
            [
                block_table_tensor(
                    [r.block_tables[d] for r in requests], num_blocks, capacity, self.block_size, self.device
                )
                for d in range(self.model.num_depths)
            ]
        )

    def _copy_out(self, requests, num_drafts, packed: torch.Tensor) -> InFlightRound:
        buffer = self.host_buffers[self._num_submitted % NUM_HOST_BUFFERS][: len(requests)]
        self._num_submitted += 1
        buffer.copy_(packed, non_blocking=True)
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return InFlightRound(tuple(requests), tuple(num_drafts), buffer, done)

    def collect(self, pending: InFlightRound) -> list[tuple[Request, RoundOutcome]]:
        """Wait for a round, then decode rows 0..R-1 of its buffer; rounds of requests that
        finished meanwhile (stop, error, abort) are discarded."""
        if pending.done is not None:
            pending.done.synchronize()
        rows = pending.result.tolist()
        return [
            (request, outcome(k, row[: k + 1], row[-2], row[-1]))
            for request, k, row in zip(pending.requests, pending.num_drafts, rows)
            if not request.is_finished
        ]

    def release(self, request: Request) -> None:
        self.frontier.release(request)

    def close(self) -> None:
        """Drop the rounds not collected yet (their requests are finished)."""
        self._pending.clear()
