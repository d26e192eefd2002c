"""Batched collection: B requests of one prompt and one sampling setting, rounds kept on the device.

The statistical harness sends one prompt thousands of times, each request with its own seed,
`ignore_eos` and a fixed `max_tokens` T. `BatchCollector.collect` runs such a batch without the
scheduler: every request's state (next input, its position, tokens generated) lives in device
tensors, every round runs all B rows (rows already at T tokens ride along and change nothing),
and results are read back once per batch as tensors. On CUDA one round is captured as a CUDA
Graph per (B, key blocks, T) and replayed; on the CPU, or if capture fails, it runs eagerly.

Same tokens as `LLM.generate` (the guarantee the harness relies on): a round of request r is
the runner's own device round (`SpeculativeRunner.round`, or the nospec step below) with
K_r = min(K, T - generated - 1), the scheduler's rule, applied through the plan's device
`draft_limit` exactly as the captured asynchronous rounds do; the uniforms are keyed by
(seed, committed tokens), as in the engine. So request r's tokens depend only on (mode, model,
prompt, sampling, seed, T), never on the batch or the padding, wherever the logits of a row do
not depend on the batch (tests/engine/runners/test_collection.py checks both on the CPU, the GPU
tests on CUDA).

A caller that reads only the first n tokens of each request passes `stop_after=n`: a row then
stops once it has them (rounds keep the length budget of `max_tokens`, so their drafts are as long
as in the full run), and the batch ends when every row has, often several rounds sooner.

What it does not exercise: the scheduler, the prefill-and-decode steps of mixed batches, and the
asynchronous timeline (rounds in flight, frontier slots, host collection). In this path the sync
and async groups of a protocol run the same device round; `LLM.generate` remains the path that
tests those parts (protocols choose it with `collection: engine`, the default).

KV: each request gets ceil((prompt + T + K + 1) / block_size) blocks per depth from the engine's
block manager for the call (reserved, zeroed, released at the end), so rows that keep drafting
after reaching T write only into their own blocks. The prompt is prefilled once per collector (its blocks
kept for later batches, `KEPT_PROMPTS`) and copied to every request, as the engine's shared-prompt
prefill does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from engine.kv_cache import scratch_block
from engine.params import SamplingParams
from engine.request import SOURCES, Request
from engine.runners.base import GREEDY_SEED, RoundFrame, SamplingRows
from engine.runners.graphs import warm_and_capture
from engine.runners.layout import device_layout
from engine.runners.plain import PlainRunner
from engine.runners.speculative import RoundPlan, plan_round
from engine.runners.transfer import to_device
from engine.sampling import PLACEHOLDER_TOKEN

PLAIN, ACCEPTED, CORRECTION, BONUS = (SOURCES.index(name) for name in ("plain", "accepted", "correction", "bonus"))
NUM_DUMP_COLUMNS = 1  # output column that masked scatters write to (never read)
KEPT_PROMPTS = 16  # prompts whose prefilled KV blocks a collector keeps (least recently used dropped)


@dataclass(frozen=True)
class CollectedBatch:
    """Host results of one batch, one row per request, in seed order.

    Provenance of token i of request b (every committed token, any T): it was emitted by round
    `round_index[b, i]` (0-based, the request's own rounds) at round position
    `round_position[b, i]` = j in 1..K+1, the j-th token that round emitted; `sources[b, i]`
    says what it was: "accepted" (the accepted draft x_j, j <= K), "correction" (drawn at the
    stop point j <= K after x_j was rejected), "bonus" (after all K_r drafts were accepted: j =
    K_r + 1, which is K + 1 except in a round cut back near max_tokens, K_r = min(K, T -
    generated - 1)) or "plain" (nospec: j = 1, one round per token). `slots[b]` is the row the
    request sat in (0..B-1, adjacent rows are neighbours in the same device round) and
    `batch_index` counts the collector's batches (0-based), so requests of different batches
    that sat in the same slot can be paired too.
    """

    tokens: np.ndarray  # int64[B, T]
    sources: np.ndarray  # int64[B, T] index into engine.request.SOURCES
    num_rounds: np.ndarray  # int64[B]
    num_draft_tokens: np.ndarray  # int64[B]
    num_accepted_tokens: np.ndarray  # int64[B]
    is_error: np.ndarray  # bool[B] a round hit an invalid distribution (tokens then incomplete)
    round_index: np.ndarray | None = None  # int64[B, T] round of each token (0-based)
    round_position: np.ndarray | None = None  # int64[B, T] j in 1..K+1 within its round
    slots: np.ndarray | None = None  # int64[B] row of each request in the device batch
    batch_index: int = 0  # which batch of this collector (0-based)
    # int64[B, T] the draft x_j that round position j tested, at every "accepted" token (equal to
    # it) and "correction" token (the rejected draft); PLACEHOLDER_TOKEN at a bonus or plain token
    drafts: np.ndarray | None = None

    def source_names(self) -> np.ndarray:
        """object[B, T] the sources as engine.request.SOURCES strings."""
        return np.asarray(SOURCES, dtype=object)[self.sources]


@dataclass(frozen=True)
class BatchState:
    """The device tensors one round reads and advances in place (static for graph replay)."""

    tables: torch.Tensor  # int64[D, B, num_blocks]
    inputs: torch.Tensor  # int64[B] last committed token
    starts: torch.Tensor  # int64[B] its position (committed - 1)
    generated: torch.Tensor  # int64[B]
    done: torch.Tensor  # bool[B] T tokens generated, an error, or a padding row
    error: torch.Tensor  # bool[B]
    tokens: torch.Tensor  # int64[B, T + K + 1 + NUM_DUMP_COLUMNS]
    sources: torch.Tensor  # int64[B, same]
    round_index: torch.Tensor  # int64[B, same] round that emitted each token (0-based)
    round_position: torch.Tensor  # int64[B, same] its position j (1-based) in that round
    drafts: torch.Tensor  # int64[B, same] the draft each token's position tested (CollectedBatch.drafts)
    counts: torch.Tensor  # int64[3, B] rounds, drafts, accepted
    rows: SamplingRows  # per-row params and seeds (num_committed is set per round)
    plan: RoundPlan | None  # speculative modes: K drafts per row, cut back per round
    max_tokens: int  # the length budget of K_r = min(K, max_tokens - generated - 1)
    stop_after: int  # a row is done once it has this many tokens (<= max_tokens)

    @property
    def size(self) -> int:
        return self.inputs.shape[0]


class BatchCollector:
    """Runs `collect` batches on one engine's runner, caching a captured round per shape."""

    def __init__(self, engine, capture: bool | None = None) -> None:
        self.engine = engine
        self.runner = engine.runner
        self.device = engine.device
        self.k = getattr(self.runner, "num_speculative_tokens", 0)
        self.is_plain = isinstance(self.runner, PlainRunner)
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.disabled_reason: str | None = None
        self._shapes: dict[tuple[int, int, int], tuple[BatchState, torch.cuda.CUDAGraph | None]] = {}
        self._pool = None
        self._num_batches = 0
        self._prompt_kv: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}  # prompt -> its prefilled blocks
        self._ids: tuple[np.ndarray, torch.Tensor] | None = None  # the last batch's block ids, host and device

    @property
    def graph_status(self) -> str:
        """How the rounds ran: the capture failure, or the number of captured and eager shapes."""
        if not self.capture:
            return "eager (no CUDA Graphs on this device)"
        if self.disabled_reason is not None:
            return f"eager after: {self.disabled_reason}"
        captured = sum(graph is not None for _, graph in self._shapes.values())
        return f"{captured} batch shape(s) captured as CUDA Graphs"

    def collect(
        self,
        prompt: list[int],
        params: SamplingParams | Sequence[SamplingParams],
        seeds,
        max_tokens: int,
        batch_size: int | None = None,
        stop_after: int | None = None,
    ) -> CollectedBatch:
        """Generate `max_tokens` tokens (EOS ignored) for each seed; `params` gives temperature,
        top-k and top-p (its seed and stop settings are not used), one for every request or one per
        request (a mixed batch: greedy rows beside random ones, each row its own law, as
        `LLM.generate` serves a mixed batch); `seeds` is a list of ints or an int64 array.
        `batch_size` (>= len(seeds)) pads the batch to a fixed shape, so partial batches replay
        the same graph.

        `stop_after` (1..max_tokens, default max_tokens): a request stops once it has that many
        tokens, and the batch once all have; the result then holds `stop_after` columns. They are
        the first `stop_after` tokens of the full run, with the same sources, rounds and positions:
        a round depends only on the rounds before it, and every round's draft limit K_r is still
        computed from `max_tokens`. The counts cover the rounds run, up to the one that emitted
        token `stop_after` (it may have emitted more)."""
        engine = self.engine
        if engine.has_unfinished():
            raise RuntimeError("batched collection needs an idle engine (requests are live)")
        prompt = engine.prompt_token_ids(prompt)
        count, size = len(seeds), max(batch_size or 0, len(seeds))
        per_row = [params] * count if isinstance(params, SamplingParams) else list(params)
        if len(per_row) != count or not count:
            raise ValueError(f"params has {len(per_row)} entries for {count} seeds")
        if len(prompt) + max_tokens > engine.config.max_model_len:
            raise ValueError(
                f"max_tokens={max_tokens} is invalid: prompt ({len(prompt)}) + max_tokens "
                f"exceeds max_model_len={engine.config.max_model_len}"
            )
        stop_after = max_tokens if stop_after is None else stop_after
        if not 1 <= stop_after <= max_tokens:
            raise ValueError(f"stop_after={stop_after} is invalid: it must be in 1..max_tokens ({max_tokens})")
        num_blocks = -(-(len(prompt) + max_tokens + self.k + 1) // engine.kv.layout.block_size)
        blocks = engine.scheduler.blocks
        needed = self.runner.model.num_depths * size * num_blocks
        if not blocks.can_reserve(needed):
            raise ValueError(
                f"num_kv_blocks={engine.config.num_kv_blocks} is too small for a batch of "
                f"{size} requests: it needs {needed} blocks"
            )
        blocks.reserve(needed)
        ids = blocks.take(needed)
        try:
            index = self._device_ids(np.asarray(ids, dtype=np.int64))
            engine.kv.zero_blocks(index)
            with torch.inference_mode():
                return self._run(prompt, per_row, seeds, count, size, (max_tokens, stop_after), num_blocks, index)
        finally:
            blocks.give_back(ids, needed)

    def _device_ids(self, ids: np.ndarray) -> torch.Tensor:
        """The batch's block ids as a device tensor (never written to). The block manager hands a
        batch the blocks, in the order, that the batch before it gave back, so the previous
        batch's tensor is reused when the ids are equal: most batches copy nothing to the device."""
        if self._ids is None or not np.array_equal(self._ids[0], ids):
            self._ids = (ids, to_device(ids, torch.int64, self.device))
        return self._ids[1]

    def _run(self, prompt, per_row, seeds, count, size, lengths, num_blocks, ids: torch.Tensor) -> CollectedBatch:
        depths = self.runner.model.num_depths
        tables = ids.view(depths, size, num_blocks)
        self._prefill(prompt, per_row[0], tables)
        state, graph = self._state(size, num_blocks, *lengths)
        self._reset(state, tables, prompt, per_row, seeds, count)
        self._loop(state, graph, len(prompt))
        return self._read(state, count)

    def _prefill(self, prompt: list[int], params: SamplingParams, tables: torch.Tensor) -> None:
        """Write the prompt's KV (every depth, every token but the last) into each request's first
        blocks. The first batch of a prompt prefills it in its first request's blocks and keeps a
        copy of them; every request of every later batch gets that copy. The copy holds the
        bytes a new prefill would write: the prefill is the same computation (one sequence of the
        same tokens, same shapes, same kernels) each time."""
        if len(prompt) < 2:
            return
        used = -(-(len(prompt) - 1) // self.engine.kv.layout.block_size)
        pools = self.engine.kv.key + self.engine.kv.value
        kept = self._prompt_kv.pop(tuple(prompt), None)
        first = 0 if kept is not None else 1  # requests that still need the prompt's blocks
        if kept is None:
            leader = Request("collection-leader", prompt, params, None, self.runner.model.num_depths)
            leader.block_tables = [row.tolist() for row in tables[:, 0].cpu()]
            self.runner.prefill((leader,))
            source = tables[:, 0, :used].reshape(-1)  # [depths * used], depth-major
            kept = tuple(pool.index_select(0, source) for pool in pools)
        self._prompt_kv[tuple(prompt)] = kept  # most recently used last
        while len(self._prompt_kv) > KEPT_PROMPTS:
            self._prompt_kv.pop(next(iter(self._prompt_kv)))
        depths, count = tables.shape[0], tables.shape[1] - first
        target = tables[:, first:, :used].reshape(-1)  # [depths, count, used] flattened
        for pool, blocks in zip(pools, kept):
            rows = blocks.view(depths, 1, used, *blocks.shape[1:]).expand(depths, count, used, *blocks.shape[1:])
            pool.index_copy_(0, target, rows.reshape(-1, *blocks.shape[1:]))

    def _state(self, size: int, num_blocks: int, max_tokens: int, stop_after: int):
        key = (size, num_blocks, max_tokens, stop_after)
        if key not in self._shapes:
            state = self._new_state(size, num_blocks, max_tokens, stop_after)
            graph = None
            if self.capture and self.disabled_reason is None:
                try:
                    graph = self._capture(state)
                except RuntimeError as error:  # an operation that cannot be captured
                    self.disabled_reason = f"CUDA Graph capture failed: {error}"
            self._shapes[key] = (state, graph)
        return self._shapes[key]

    def _new_state(self, size: int, num_blocks: int, max_tokens: int, stop_after: int) -> BatchState:
        device, depths = self.device, self.runner.model.num_depths

        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        width = max_tokens + self.k + 1 + NUM_DUMP_COLUMNS
        rows = SamplingRows(
            zeros(size, dtype=torch.float32),
            zeros(size),
            zeros(size, dtype=torch.float32),
            zeros(size, dtype=torch.bool),
            zeros(size),
            zeros(size),
            zeros(size),
        )
        plan = None if self.is_plain else plan_round((self.k,) * size, self.k, device)
        scratch = scratch_block(self.engine.config.num_kv_blocks)  # warm-up rows write there
        return BatchState(
            torch.full((depths, size, num_blocks), scratch, dtype=torch.int64, device=device),
            zeros(size),
            zeros(size),
            zeros(size),
            torch.ones(size, dtype=torch.bool, device=device),
            zeros(size, dtype=torch.bool),
            zeros(size, width),
            zeros(size, width),
            zeros(size, width),
            zeros(size, width),
            zeros(size, width),
            zeros(3, size),
            rows,
            plan,
            max_tokens,
            stop_after,
        )

    def _reset(self, state: BatchState, tables, prompt, per_row: list[SamplingParams], seeds, count: int) -> None:
        """Load a batch into the static state: row r samples by `per_row[r]`; rows past `count` are
        padding (done from the start, sampled like row 0 and never recorded)."""
        size = state.size
        state.tables.copy_(tables)
        state.inputs.fill_(prompt[-1])
        state.starts.fill_(len(prompt) - 1)
        state.generated.zero_()
        state.done.copy_(torch.arange(size, device=self.device) >= count)
        state.error.zero_()
        state.tokens.zero_()
        state.sources.zero_()
        state.round_index.zero_()
        state.round_position.zero_()
        state.drafts.fill_(PLACEHOLDER_TOKEN)
        state.counts.zero_()
        padded = per_row + [per_row[0]] * (size - count)
        rows = state.rows
        for tensor, field, dtype in (
            (rows.temperature, "temperature", np.float32),
            (rows.top_k, "top_k", np.int64),
            (rows.top_p, "top_p", np.float32),
            (rows.is_greedy, "is_greedy", np.bool_),
        ):
            tensor.copy_(torch.from_numpy(np.array([getattr(p, field) for p in padded], dtype=dtype)))
        rows.num_prompt.fill_(len(prompt))
        streams = np.full(size, GREEDY_SEED, dtype=np.int64)  # greedy and padding rows
        random = np.flatnonzero([not p.is_greedy for p in per_row])
        streams[random] = np.asarray(seeds, dtype=np.int64)[random]
        rows.seeds.copy_(to_device(streams, torch.int64, self.device))

    def _loop(self, state: BatchState, graph, prompt_length: int) -> None:
        """Rounds until every row is done: at least ceil(S / (K + 1)), at most S, S = `stop_after`
        (each round emits >= 1 token per live row or ends it with an error); the host reads `done`
        once per round only after the minimum. A captured round reads every block of the tables;
        an uncaptured one only the blocks its positions can reach (`_round_blocks`)."""
        least = -(-state.stop_after // (self.k + 1))
        for number in range(1, state.stop_after + 1):
            if graph is not None:
                graph.replay()
            else:
                self.round(state, self._round_blocks(state, prompt_length, number))
            if number >= least and bool(state.done.all()):
                return

    def _round_blocks(self, state: BatchState, prompt_length: int, number: int) -> int:
        """Blocks per depth that round `number` (from 1) can touch: before it a row has emitted at
        most (number - 1)(K + 1) tokens, so its input stands at position <= prompt_length - 1 +
        (number - 1)(K + 1) and the round reads and writes at most K positions past it. A function
        of the prompt and the round alone, never of the other rows, so a request's attention sees
        the same keys whatever batch it is in (the torch path otherwise gathers every block of the
        tables each round: most of a CPU run's time at 64 tokens)."""
        last = prompt_length - 1 + (number - 1) * (self.k + 1) + self.k
        return min(state.tables.shape[-1], last // self.runner.block_size + 1)

    def _capture(self, state: BatchState) -> torch.cuda.CUDAGraph:
        """Warm-ups run on the fresh state, every row done (padding): nothing changes."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return warm_and_capture(lambda: self.round(state), self._pool)[0]

    def round(self, state: BatchState, num_blocks: int | None = None) -> None:
        """One round for every row, in place; rows that are done keep their state. `num_blocks`:
        the blocks per depth the round reads (default: all of the tables, as a captured round does)."""
        remaining = state.max_tokens - state.generated
        live = ~state.done
        limit = torch.clamp(torch.minimum(remaining - 1, torch.full_like(remaining, self.k)), min=0)
        blocks = state.tables.shape[-1] if num_blocks is None else num_blocks
        frame = RoundFrame(state.inputs, state.starts, state.tables, blocks)
        rows = replace(state.rows, num_committed=state.starts + 1)
        if self.is_plain:
            tokens, accepted, error = self._plain_round(frame, rows)
            emitted, drafted = (~error).to(torch.int64), None
        else:
            result, drafted = self.runner.round_with_drafts(frame, replace(state.plan, draft_limit=limit), rows)
            tokens, accepted, error = result.tokens, result.num_accepted, result.error != 0
            emitted = result.num_emitted
        self._record(state, live, tokens, accepted, emitted, limit, drafted)
        last = tokens.gather(1, (emitted - 1).clamp(min=0)[:, None])[:, 0]
        moves = live & (emitted > 0)
        state.inputs.copy_(torch.where(moves, last, state.inputs))
        state.starts.add_(torch.where(moves, emitted, 0))
        state.generated.add_(torch.where(moves, emitted, 0))
        state.error.logical_or_(live & error)
        state.done.logical_or_(state.error | (state.generated >= state.stop_after))

    def _record(self, state: BatchState, live, tokens, accepted, emitted, limit, drafted) -> None:
        """Write each live row's emitted tokens, sources and drafts at its next columns (`drafted`:
        the round's drafts int64[B, K], None for nospec, whose rows keep PLACEHOLDER_TOKEN); count
        the round."""
        columns = torch.arange(tokens.shape[1], device=self.device)[None, :]
        writes = live[:, None] & (columns < emitted[:, None])
        dump = state.tokens.shape[1] - 1
        index = torch.where(writes, state.generated[:, None] + columns, dump)
        if self.is_plain:
            source = torch.full_like(tokens, PLAIN)
        else:
            last = torch.where(accepted == limit, BONUS, CORRECTION)[:, None]
            source = torch.where(columns < accepted[:, None], ACCEPTED, last)
        state.tokens.scatter_(1, index, tokens)
        state.sources.scatter_(1, index, source)
        state.round_index.scatter_(1, index, state.counts[0][:, None].expand_as(index))
        state.round_position.scatter_(1, index, (columns + 1).expand_as(index))
        if drafted is not None:
            state.drafts.scatter_(1, index, _tested_drafts(drafted, limit, tokens.shape[1]))
        drafts = 0 if self.is_plain else limit
        state.counts.add_(torch.stack([live.to(torch.int64), live * drafts, live * accepted]))

    def _plain_round(self, frame: RoundFrame, rows: SamplingRows):
        """nospec: PlainRunner.decode on device state -> (tokens [B, 1], accepted 0, error)."""
        runner = self.runner
        size = frame.inputs.shape[0]
        layout = device_layout(
            frame.starts,
            torch.ones_like(frame.starts),
            num_rows=size,
            max_length=1,
            num_blocks=frame.num_blocks,
            block_size=runner.block_size,
        )
        hidden = runner.run_depths_on(
            runner.model.embed(frame.inputs), layout, frame.tables, 1, runner.model.num_depths
        )
        probs = runner.ops.probabilities(runner.model.readout(hidden), rows, runner.sampling_backend)
        token = runner.ops.draw_plain(probs, runner.uniforms(rows, 1)[:, 0].contiguous(), runner.sampling_backend)
        return token[:, None], torch.zeros_like(token), token == PLACEHOLDER_TOKEN

    def _read(self, state: BatchState, count: int) -> CollectedBatch:
        """The batch's one host read (copies: the state is reused by the next batch)."""
        width = state.stop_after
        tokens, sources, rounds, positions, drafts, counts, error = (
            t.cpu().numpy().copy()
            for t in (
                state.tokens[:count, :width],
                state.sources[:count, :width],
                state.round_index[:count, :width],
                state.round_position[:count, :width],
                state.drafts[:count, :width],
                state.counts[:, :count],
                state.error[:count],
            )
        )
        self._num_batches += 1
        return CollectedBatch(
            tokens,
            sources,
            counts[0],
            counts[1],
            counts[2],
            error,
            round_index=rounds,
            round_position=positions,
            slots=np.arange(count, dtype=np.int64),
            batch_index=self._num_batches - 1,
            drafts=drafts,
        )


def _tested_drafts(drafted: torch.Tensor, limit: torch.Tensor, width: int) -> torch.Tensor:
    """int64[B, width]: column c holds the draft x_{c+1} when round position c + 1 tested one (c <
    the row's draft limit K_r: an accepted token or the correction after a rejection there), else
    PLACEHOLDER_TOKEN (the bonus after K_r accepts). `drafted` int64[B, K], `width` = K + 1."""
    columns = torch.arange(width, device=drafted.device)[None, :]
    padded = torch.cat([drafted, drafted.new_full((drafted.shape[0], width - drafted.shape[1]), PLACEHOLDER_TOKEN)], 1)
    return torch.where(columns < limit[:, None], padded, PLACEHOLDER_TOKEN)
