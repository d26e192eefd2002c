"""Public entry points: `Engine` (add_request / step / abort / close) and `LLM.generate`.

Admission checks every request on the host and raises ValueError naming the field and value.
It is atomic per call: `add_requests` (and `LLM.generate`) validates the whole batch first, so a
batch with any invalid request queues nothing and draws no seed. Finished, aborted and failed requests free their KV
blocks; the other requests keep running with their outputs intact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from engine.config import IMPLEMENTED_MODES, EngineConfig
from engine.kv_cache import NUM_RESERVED_BLOCKS, BlockManager, KVLayout, PagedKVCache, scratch_block
from engine.models.base import DepthModel
from engine.models.loader import build_model, build_tokenizer
from engine.mutants import sampling_ops
from engine.params import SamplingParams
from engine.request import Request, RequestOutput
from engine.runners.async_speculative import AsyncSpeculativeRunner
from engine.runners.base import ModelRunner, RoundOutcome
from engine.runners.draft_override import OWN, DraftOverride
from engine.runners.plain import PlainRunner
from engine.runners.speculative import SpeculativeRunner
from engine.sampling import warm_probabilities
from engine.scheduler import Scheduler, SchedulerLimits


class Tokenizer(Protocol):
    """What `Engine` needs from a tokenizer (text prompts in, generated text out)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


MAX_ASSIGNED_SEED = 2**63 - 1  # assigned seeds are drawn uniformly from [0, MAX_ASSIGNED_SEED)


class Engine:
    """A continuous-batching engine over one model (see docs/engine.md).

    `model` (optional) serves a ready-built `DepthModel` instead of the one named by the config
    (which then only supplies the engine settings); it must already be in `config.dtype` on
    `config.device`. `tokenizer` (optional) replaces the model's own tokenizer for text prompts.
    """

    def __init__(
        self, config: EngineConfig, model: DepthModel | None = None, tokenizer: Tokenizer | None = None
    ) -> None:
        if not isinstance(config, EngineConfig):
            raise ValueError(f"config={config!r} is invalid: expected an EngineConfig")
        if config.mode not in IMPLEMENTED_MODES:
            raise NotImplementedError(
                f"mode={config.mode!r} is not implemented yet; supported modes: {IMPLEMENTED_MODES}"
            )
        self.config = config
        self.device = torch.device(config.device)
        self.model = build_model(config) if model is None else model
        if config.is_speculative and config.draft_loops >= self.model.num_depths:
            raise ValueError(
                f"draft_loops={config.draft_loops} is invalid: must be < the model's loops ({self.model.num_depths})"
            )
        if config.collection == "engine":  # the batched collection's driver warms its own rows
            warm_probabilities(
                self.model.vocab_size, self._sampling_rows(), self.device, backend=config.sampling_backend
            )  # compiles while the rest is built
        self.tokenizer = build_tokenizer(config) if tokenizer is None else tokenizer
        self.kv = PagedKVCache(
            KVLayout(
                config.num_kv_blocks + NUM_RESERVED_BLOCKS,
                config.block_size,
                self.model.num_layers_per_depth,
                self.model.num_kv_heads,
                self.model.head_size,
            ),
            config.torch_dtype,
            self.device,
        )
        self.scheduler = Scheduler(self._limits(), BlockManager(config.num_kv_blocks, config.block_size))
        self.runner = self._runner()
        self._requests: dict[str, Request] = {}
        self._seed_source = np.random.default_rng(config.seed)

    def _limits(self) -> SchedulerLimits:
        k = self.config.num_speculative_tokens if self.config.is_speculative else 0
        return SchedulerLimits(self.config.max_num_seqs, self.config.max_num_batched_tokens, k, self.model.eos_token_id)

    def _sampling_rows(self) -> tuple[int, int]:
        """The fewest and the most rows of a scheduler step's sampling calls, 1 and max_num_seqs x
        (K + 1) (their kernels are compiled ahead: `warm_probabilities`)."""
        config = self.config
        rows_each = config.num_speculative_tokens + 1 if config.is_speculative else 1
        return (1, config.max_num_seqs * rows_each)

    def _runner(self) -> ModelRunner:
        args = (self.model, self.kv, self.device, self.config.sampling_backend, sampling_ops(self.config.mutant))
        speculative = dict(
            num_speculative_tokens=self.config.num_speculative_tokens,
            draft_depth=self.config.draft_loops,
            draft_override=self.draft_override(),
        )
        if self.config.mode == "nospec":
            return PlainRunner(*args)
        if self.config.mode == "sync":
            return SpeculativeRunner(*args, **speculative)
        use_graphs = self.device.type == "cuda" and not self.config.enforce_eager
        return AsyncSpeculativeRunner(
            *args,
            **speculative,
            max_num_seqs=self.config.max_num_seqs,
            rounds_in_flight=self.config.rounds_in_flight,
            scratch_block=scratch_block(self.config.num_kv_blocks) if use_graphs else None,
        )

    def draft_override(self) -> DraftOverride | None:
        """The draft replacement this engine's runners apply (None: the engine's own draft)."""
        config = self.config
        if config.draft_override == OWN:
            return None
        return DraftOverride(config.draft_override, config.draft_noise_scale, config.draft_temperature_factor)

    def add_request(self, request_id: str, prompt: str | Sequence[int], params: SamplingParams) -> None:
        """Validate and queue one request (see `add_requests`)."""
        self.add_requests([(request_id, prompt, params)])

    def add_requests(self, requests: Sequence[tuple[str, str | Sequence[int], SamplingParams]]) -> None:
        """Validate every (request_id, prompt, params) of the batch, then queue them in order.

        Guarantee: if any request is invalid, ValueError (naming the request, the field and the
        value) is raised before anything is queued or any seed drawn; the engine's state is
        then exactly what it was before the call.
        """
        checked = self._checked_batch(requests)
        for request_id, prompt_ids, params in checked:
            request = Request(request_id, prompt_ids, params, self._seed_for(params), self.model.num_depths)
            self._requests[request_id] = request
            self.scheduler.add(request)

    def _checked_batch(self, requests) -> list[tuple[str, list[int], SamplingParams]]:
        """(request_id, prompt token ids, params) of every request; reads no engine state it
        changes, so a ValueError here leaves the engine untouched."""
        requests = list(requests)
        checked, batch_ids = [], set()
        for index, (request_id, prompt, params) in enumerate(requests):
            try:
                checked.append(self._checked(request_id, prompt, params, batch_ids))
            except ValueError as error:
                if len(requests) == 1:
                    raise
                raise ValueError(
                    f"request {index} of the batch ({request_id!r}): {error}; no request of the batch was admitted"
                ) from None
            batch_ids.add(request_id)
        return checked

    def _checked(self, request_id, prompt, params, batch_ids: set[str]) -> tuple[str, list[int], SamplingParams]:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id={request_id!r} is invalid: expected a non-empty str")
        if request_id in self._requests or request_id in batch_ids:
            raise ValueError(f"request_id={request_id!r} is still in use")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params={params!r} is invalid: expected a SamplingParams")
        prompt_ids = self.prompt_token_ids(prompt)
        self._check_fits(len(prompt_ids), params.max_tokens)
        return request_id, prompt_ids, params

    def prompt_token_ids(self, prompt: str | Sequence[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or len(ids) == 0:
            raise ValueError(f"prompt={prompt!r} is invalid: expected a non-empty str or list of ids")
        vocab = self.model.vocab_size
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt contains token ids outside [0, {vocab}): {bad[:5]}")
        return [int(t) for t in ids]

    def _seed_for(self, params: SamplingParams) -> int | None:
        """The request's stream: its own seed, else (random requests) the next engine seed."""
        if params.seed is not None or params.is_greedy:
            return params.seed
        return int(self._seed_source.integers(0, MAX_ASSIGNED_SEED))

    def _check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """ValueError unless a request of this prompt length and max_tokens can ever run."""
        config = self.config
        if prompt_len >= config.max_model_len:
            raise ValueError(
                f"prompt of {prompt_len} tokens is too long: it must be shorter than "
                f"max_model_len={config.max_model_len} (room for one generated token)"
            )
        if prompt_len + max_tokens > config.max_model_len:
            raise ValueError(
                f"max_tokens={max_tokens} is invalid: prompt ({prompt_len}) + "
                f"max_tokens exceeds max_model_len={config.max_model_len}"
            )
        needed = self.scheduler.worst_case_blocks(prompt_len + max_tokens, self.model.num_depths)
        if needed > config.num_kv_blocks:
            raise ValueError(f"num_kv_blocks={config.num_kv_blocks} is too small: the request needs {needed} blocks")
        step_cost = prompt_len + self.scheduler.limits.num_speculative_tokens
        if step_cost > config.max_num_batched_tokens:
            raise ValueError(
                f"prompt of {prompt_len} tokens is too long for max_num_batched_tokens={config.max_num_batched_tokens}"
            )

    def step(self) -> list[RequestOutput]:
        """Run one step: prefill newcomers, submit one round for every scheduled request, and
        commit the outcomes that are ready (this round's; the previous round's in async mode).

        Outcomes with an error flag go first through `_fail`, the one fatal-cleanup path, before
        any commit: the flagged request finishes with finish_reason "error", the others go on.
        """
        batch = self.scheduler.schedule()
        self.kv.zero_blocks(self.scheduler.blocks.take_allocated())
        self.runner.prefill(batch.prefill)
        ready = self.runner.execute(batch.decode, batch.num_drafts)
        self.scheduler.submitted(batch)
        for request, outcome in ready:
            if outcome.is_error:
                self._fail(request, outcome)
        for request, outcome in ready:
            if not outcome.is_error and not request.is_finished:
                self._count(request, outcome)
                self.scheduler.commit(request, list(outcome.tokens), list(outcome.sources))
        finished = self.scheduler.take_finished()
        for output in finished:
            self.runner.release(self._requests.pop(output.request_id))
        return finished

    @staticmethod
    def _count(request: Request, outcome: RoundOutcome) -> None:
        request.num_rounds += 1
        request.num_draft_tokens += outcome.num_drafts
        request.num_accepted_tokens += outcome.num_accepted

    def _fail(self, request: Request, outcome: RoundOutcome) -> None:
        """Fatal cleanup of one request whose round raised an error flag: it finishes with
        "error" and no tokens from that round; its blocks, reservation, rounds in flight and
        frontier slot are released (the slot when its output is taken at the end of the step)."""
        if request.is_finished:
            return
        self._count(request, outcome)
        self.scheduler.fail(request)

    def abort(self, request_id: str) -> None:
        """Abort a live request; its output (finish_reason "abort") comes from the next step."""
        if request_id not in self._requests:
            raise ValueError(f"request_id={request_id!r} is not a live request")
        self.scheduler.abort(self._requests[request_id])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def close(self) -> None:
        """Abort everything still live and release the cache."""
        for request_id in list(self._requests):
            self.abort(request_id)
        self.scheduler.take_finished()
        for request in self._requests.values():
            self.runner.release(request)
        self._requests.clear()
        self.runner.close()
        self.kv = None


ProgressCallback = Callable[[int, int], None]  # (num_finished, num_total)


def _as_list(ids):
    """A 1-D numpy array of ids as a list (the harness keeps sequences as arrays); else `ids`."""
    return ids.tolist() if isinstance(ids, np.ndarray) and ids.ndim == 1 else ids


class LLM:
    """Offline batch generation over an `Engine`, plus serial reference logits."""

    def __init__(
        self, config: EngineConfig | None = None, model: DepthModel | None = None, tokenizer: Tokenizer | None = None
    ) -> None:
        """See `Engine` for `model` and `tokenizer` (both optional)."""
        self.engine = Engine(config if config is not None else EngineConfig(), model, tokenizer)
        self.tokenizer = self.engine.tokenizer
        self._num_calls = 0

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        progress: ProgressCallback | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (continuous batching); outputs are in input order.

        A batch with any invalid prompt or params raises ValueError and admits nothing.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise ValueError("prompts is invalid: expected a list of str or a list of token-id lists")
        per_prompt = self._params_list(params, len(prompts))
        ids = [f"generate-{self._num_calls + 1}-{i}" for i in range(len(prompts))]
        self.engine.add_requests(list(zip(ids, prompts, per_prompt)))  # all or nothing
        self._num_calls += 1
        outputs: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for output in self.engine.step():
                outputs[output.request_id] = output
            if progress is not None:
                progress(len(outputs), len(ids))
        return [outputs[request_id] for request_id in ids]

    @staticmethod
    def _params_list(params, count: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * count
        if isinstance(params, SamplingParams):
            return [params] * count
        params = list(params)
        if len(params) != count:
            raise ValueError(f"params has {len(params)} entries for {count} prompts")
        return params

    def full_depth_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """float32[V]: next-token logits after `token_ids` at full depth (serial, cache-free)."""
        return self._replay_logits(token_ids, self.engine.model.num_depths)

    def target_logits_along(self, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> torch.Tensor:
        """float32[len(token_ids), V] on the CPU: row i holds the full-depth (target) logits that
        predict token_ids[i] after prompt_ids + token_ids[:i].

        Guarantee: one serial, cache-free forward pass (`DepthModel.target_logits`: the last readout
        of `DepthModel.replay`, bit for bit) over prompt_ids + token_ids[:-1] on the engine's
        device: no sampling, no RNG, and the paged KV of running requests is not touched. Row i
        equals what the engine's decode computes for that position up to float summation order
        (the paged batched path and the dense serial path reduce in different orders; see
        tests/engine/test_api.py for the bound).
        ValueError for empty or out-of-vocabulary ids, and when prompt + token_ids exceeds
        max_model_len (the longest sequence the engine serves).
        """
        prompt = self.engine.prompt_token_ids(_as_list(prompt_ids))
        tokens = self._token_ids(_as_list(token_ids))
        limit = self.engine.config.max_model_len
        if len(prompt) + len(tokens) > limit:
            raise ValueError(
                f"token_ids of {len(tokens)} tokens after a prompt of {len(prompt)} tokens is too "
                f"long: prompt + token_ids = {len(prompt) + len(tokens)} exceeds "
                f"max_model_len={limit}"
            )
        ids = torch.tensor(prompt + tokens[:-1], dtype=torch.int64, device=self.engine.device)
        with torch.inference_mode():
            logits = self.engine.model.target_logits(ids)
        return logits[len(prompt) - 1 :].float().cpu()

    def _token_ids(self, token_ids: Sequence[int]) -> list[int]:
        """token_ids as a list of ints in [0, V); ValueError naming the field otherwise."""
        vocab = self.engine.model.vocab_size
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence) or len(token_ids) == 0:
            raise ValueError(f"token_ids={token_ids!r} is invalid: expected a non-empty list of token ids")
        bad = [
            t for t in token_ids if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab
        ]
        if bad:
            raise ValueError(f"token_ids contains token ids outside [0, {vocab}): {bad[:5]}")
        return [int(t) for t in token_ids]

    def draft_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """float32[V]: next-token logits after `token_ids` at the draft depth (draft_loops)."""
        return self._replay_logits(token_ids, self.engine.config.draft_loops)

    def draft_logits_along(self, prompt_ids: Sequence[int], token_ids: Sequence[int], seed: int) -> torch.Tensor:
        """float32[len(token_ids), V] on the CPU: row i holds the draft logits a round would sample
        token_ids[i] from as a draft after prompt_ids + token_ids[:i]: the draft depth's readout,
        replaced by this engine's draft override as its runners replace it (`noisy` keyed by
        `seed` and the input's position, `adversarial` / `temperature` from the target logits).

        Guarantee: as `target_logits_along` (one serial, cache-free pass at the draft depth; the
        override a pure function of seed, position and logits), so row i equals the draft logits
        of a round that drafted position i up to float summation order. ValueError as there.
        """
        target = self.target_logits_along(prompt_ids, token_ids)  # checks the ids and the length
        prompt = self.engine.prompt_token_ids(_as_list(prompt_ids))
        tokens = self._token_ids(_as_list(token_ids))
        ids = torch.tensor(prompt + tokens[:-1], dtype=torch.int64, device=self.engine.device)
        with torch.inference_mode():
            draft = self.engine.model.replay(ids, self.engine.config.draft_loops).logits[-1][len(prompt) - 1 :]
        override = self.engine.draft_override()
        if override is None:
            return draft.float().cpu()
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens), device=self.engine.device)
        seeds = torch.full_like(positions, int(seed))
        replaced = override.logits(draft.float(), target.to(self.engine.device), seeds, positions)
        return replaced.float().cpu()

    def target_logits_along_batch(self, prompt_ids: Sequence[int], token_rows) -> torch.Tensor:
        """float32[B, L, V] on the CPU: `target_logits_along(prompt_ids, token_rows[b])` for every
        row b of int64[B, L] (array-like), in one batched cache-free pass when the model has one
        (`depth_logits_batch`; the looped model), else one serial pass per row.

        Guarantee: row b equals `target_logits_along` of that row up to the summation order of a
        batched matmul (tests/engine/test_api.py bounds it); no sampling, no RNG, the paged KV of
        running requests untouched. ValueError as `target_logits_along`."""
        prompt, rows = self._batch_ids(prompt_ids, token_rows)
        return self._depth_along(prompt, rows, self.engine.model.num_depths)

    def draft_logits_along_batch(self, prompt_ids: Sequence[int], token_rows, seeds) -> torch.Tensor:
        """float32[B, L, V] on the CPU: `draft_logits_along(prompt_ids, token_rows[b], seeds[b])`
        for every row b, batched as `target_logits_along_batch` (the override applied to all rows
        at once: it is a pure function of seed, position and logits)."""
        prompt, rows = self._batch_ids(prompt_ids, token_rows)
        draft = self._depth_along(prompt, rows, self.engine.config.draft_loops)
        override = self.engine.draft_override()
        if override is None:
            return draft
        count, length, vocab = draft.shape
        device = self.engine.device
        target = self._depth_along(prompt, rows, self.engine.model.num_depths) if override.needs_target else None
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + length, device=device).repeat(count)
        seed_rows = torch.as_tensor(np.array(seeds, dtype=np.int64), device=device).repeat_interleave(length)
        replaced = override.logits(
            draft.reshape(-1, vocab).to(device),
            None if target is None else target.reshape(-1, vocab).to(device),
            seed_rows,
            positions,
        )
        return replaced.float().cpu().reshape(count, length, vocab)

    def _batch_ids(self, prompt_ids: Sequence[int], token_rows) -> tuple[list[int], np.ndarray]:
        """(the prompt's ids, int64[B, L] rows), checked as `target_logits_along` checks one row."""
        prompt = self.engine.prompt_token_ids(_as_list(prompt_ids))
        rows = np.asarray(token_rows)
        vocab, limit = self.engine.model.vocab_size, self.engine.config.max_model_len
        if rows.ndim != 2 or rows.shape[1] == 0 or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(f"token_rows of shape {rows.shape} and dtype {rows.dtype} is invalid: expected int[B, L]")
        if rows.size and (rows.min() < 0 or rows.max() >= vocab):
            raise ValueError(f"token_rows contains token ids outside [0, {vocab})")
        if len(prompt) + rows.shape[1] > limit:
            raise ValueError(
                f"token_rows of {rows.shape[1]} tokens after a prompt of {len(prompt)} tokens is too long: "
                f"prompt + tokens = {len(prompt) + rows.shape[1]} exceeds max_model_len={limit}"
            )
        return prompt, rows.astype(np.int64)

    def _depth_along(self, prompt: list[int], rows: np.ndarray, depth: int) -> torch.Tensor:
        """float32[B, L, V] on the CPU: the readout after `depth` predicting every token of every row."""
        model, device = self.engine.model, self.engine.device
        with torch.inference_mode():
            if hasattr(model, "depth_logits_batch"):  # the prompt once, then every row's tokens
                prompt_ids = torch.as_tensor(np.asarray(prompt, dtype=np.int64), device=device)
                logits = model.depth_logits_batch(prompt_ids, torch.as_tensor(rows[:, :-1], device=device), depth)
                return logits.float().cpu()
            ids = np.concatenate([np.tile(np.asarray(prompt, dtype=np.int64), (len(rows), 1)), rows[:, :-1]], axis=1)
            batch = torch.as_tensor(ids, device=device)
            if depth == model.num_depths:
                logits = torch.stack([model.target_logits(row) for row in batch])
            else:
                logits = torch.stack([model.replay(row, depth).logits[-1] for row in batch])
        return logits[:, len(prompt) - 1 :].float().cpu()

    def _replay_logits(self, token_ids: Sequence[int], depth: int) -> torch.Tensor:
        ids = torch.tensor(self.engine.prompt_token_ids(token_ids), dtype=torch.int64, device=self.engine.device)
        return self.engine.model.replay(ids, depth).logits[-1, -1].cpu()

    def close(self) -> None:
        self.engine.close()
