"""Continuous batching: admission, per-step token budget, commits, stops, aborts.

Policy, read top to bottom by `schedule`:
1. Running requests first, in admission order: each gets 1 + K_r query rows, with
   K_r = min(K, tokens still allowed - 1, budget left - 1); a request that finds no budget waits.
2. Then waiting requests, first come first served, while the budget covers their prompt (all
   tokens but the last are prefilled at every depth) plus their first round, `max_num_seqs` is not
   reached and their worst-case KV fits the pool's reservations. The first that does not fit stops
   admission, so no request is overtaken.
A newly admitted request is prefilled and runs its first round in the same step.

Rounds in flight (asynchronous mode): `submitted` records the K_r of every round handed to the
runner and `commit` / `finish` retire them, oldest first. A request whose previous round is still
in flight gets its next round only if that round's K_r cannot depend on the previous outcome,
i.e. tokens still allowed - (K_prev + 1) - 1 >= min(K, budget left - 1): so K_r equals the
synchronous choice, a round never drafts past `max_tokens`, and every position a round may
write lies inside the request's reservation. Otherwise it waits one step for the collection
(at most twice per request, near its end). Its block tables are grown for both rounds
(committed + K_prev + 1 + K_r + 1 positions) and commits keep the positions of the round still
in flight.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from engine.kv_cache import BlockManager
from engine.request import Request, RequestOutput, RequestStatus


@dataclass(frozen=True)
class ScheduledBatch:
    """One step's work: prefill these, then run one round for each decode request."""

    prefill: tuple[Request, ...]
    decode: tuple[Request, ...]
    num_drafts: tuple[int, ...]  # K_r per decode request (always 0 for nospec)

    @property
    def is_empty(self) -> bool:
        return not self.decode


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    num_speculative_tokens: int  # K (0 for nospec)
    eos_token_id: int  # the model's end-of-sequence token (a stop unless ignore_eos)


class Scheduler:
    """Owns the waiting queue, the running list and the block manager."""

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager) -> None:
        self.limits = limits
        self.blocks = blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._finished: list[RequestOutput] = []
        self.in_flight: defaultdict[Request, deque[int]] = defaultdict(deque)  # K_r, oldest first

    def worst_case_blocks(self, max_length: int, num_depths: int) -> int:
        """Blocks over all depths for a sequence of at most `max_length` tokens."""
        return num_depths * self.blocks.blocks_for(max_length)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        budget = self.limits.max_num_batched_tokens
        decode, drafts = [], []
        for request in self.running:
            if budget < 1:
                break
            num_drafts = self._num_drafts(request, budget)
            if not self._can_submit(request, num_drafts):
                continue
            drafts.append(num_drafts)
            decode.append(request)
            budget -= drafts[-1] + 1
        prefill = self._admit(budget, decode, drafts)
        for request, num_drafts in zip(decode, drafts):
            for table in request.block_tables:
                self.blocks.grow(table, self.num_positions(request) + num_drafts + 1)
        return ScheduledBatch(tuple(prefill), tuple(decode), tuple(drafts))

    def num_positions(self, request: Request) -> int:
        """Positions the request's KV may hold now: committed - 1, plus every position that its
        rounds in flight may commit."""
        return request.num_computed + sum(k + 1 for k in self.in_flight.get(request, ()))

    def _can_submit(self, request: Request, num_drafts: int) -> bool:
        """True when the next round's K_r does not depend on the outcome of rounds in flight."""
        pending = self.in_flight.get(request)
        if not pending:
            return True
        if len(pending) > 1:
            return False  # at most two rounds in flight
        return request.num_remaining - (pending[0] + 1) - 1 >= num_drafts

    def submitted(self, batch: ScheduledBatch) -> None:
        """Record the rounds just handed to the runner (retired by commit / finish)."""
        for request, num_drafts in zip(batch.decode, batch.num_drafts):
            self.in_flight[request].append(num_drafts)

    def _num_drafts(self, request: Request, budget: int) -> int:
        return max(0, min(self.limits.num_speculative_tokens, request.num_remaining - 1, budget - 1))

    def _admit(self, budget: int, decode: list[Request], drafts: list[int]) -> list[Request]:
        admitted = []
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            num_prefill = len(request.prompt_token_ids) - 1
            num_drafts = self._num_drafts(request, budget - num_prefill)
            worst = self.worst_case_blocks(
                len(request.prompt_token_ids) + request.params.max_tokens, request.num_depths
            )
            if budget < num_prefill + num_drafts + 1 or not self.blocks.can_reserve(worst):
                break
            self.waiting.popleft()
            self.blocks.reserve(worst)
            request.num_reserved_blocks = worst
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            admitted.append(request)
            decode.append(request)
            drafts.append(num_drafts)
            budget -= num_prefill + num_drafts + 1
        return admitted

    def commit(self, request: Request, tokens: list[int], sources: list[str]) -> None:
        """Retire the request's oldest round in flight: append its emitted tokens, applying stop
        tokens and max_tokens, then trim the KV to what is committed or still in flight."""
        pending = self.in_flight.get(request)
        if pending:
            pending.popleft()
        stops = set(request.params.stop_token_ids)
        if not request.params.ignore_eos:
            stops.add(self.limits.eos_token_id)
        for token, source in zip(tokens, sources):
            request.token_ids.append(token)
            request.token_sources.append(source)
            if token in stops:
                return self.finish(request, "stop")
            if request.num_remaining == 0:
                return self.finish(request, "length")
        for table in request.block_tables:
            self.blocks.truncate(table, self.num_positions(request))

    def finish(self, request: Request, reason: str) -> None:
        """Mark finished, free its blocks and reservation, queue its output (idempotent)."""
        if request.is_finished:
            return
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.in_flight.pop(request, None)  # a queued round of a finished request is discarded
        self.blocks.release(request.block_tables, request.num_reserved_blocks)
        request.num_reserved_blocks = 0
        self._finished.append(request.to_output())

    def fail(self, request: Request) -> None:
        """A round of the request raised an error flag: finish it with "error" (this drops its
        rounds in flight and frees its blocks and reservation)."""
        self.finish(request, "error")

    def abort(self, request: Request) -> None:
        """Finish a live request now: it leaves the queue or the running list at once, so the
        next `schedule` never grows blocks for it."""
        if request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        elif request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        self.finish(request, "abort")

    def take_finished(self) -> list[RequestOutput]:
        """Outputs finished since the last call; drops finished requests from the running list."""
        self.running = [request for request in self.running if not request.is_finished]
        finished, self._finished = self._finished, []
        return finished
