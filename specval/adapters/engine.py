"""EngineSUT: the default SUT adapter, this project's own `engine` package.

One `engine.LLM` is built per distinct (mode, draft_loops, draft, options) of the protocol's groups
and reused for every batch: a group's options are `sut.options` with its own `options` merged over
them (`SutSpec.options_for`), so groups that differ only by options (a batch cap, the collection, the
sampling backend) run on engines of their own (`Capabilities.group_options`). Requests carry their
own seed (`SamplingParams.seed`), `max_tokens` from
`Protocol.max_tokens(group)` and `ignore_eos=True`, so every request yields exactly that many
tokens; the first `positions` of them are returned. All engines of one adapter share the first
engine's model and tokenizer (one load of the weights).
For paired quality protocols (`specval.quality`), `render_chat` applies the model's chat template
and `complete` generates text completions of many prompts (EOS stops a request).
The reference logits come from `LLM.full_depth_logits` (serial, cache-free replay) and the draft
logits from `LLM.draft_logits` of the group's engine; `accept_single` calls
`engine.sampling.speculative_accept` with one draft per request (or, when `sut.options.mutant`
names a planted bug, that mutant's accept rule, so the quadrature sees the rule the runners use).

This module is the only one of specval that imports `engine` (specval/adapters/ holds every
engine-facing module): the bench (`specval.performance.bench`) builds and drives its engines through
`engine_config`, `build_llm` and `request_params`, and the quadrature's engine-backed kernels
(`engine_accept_fn`, `engine_draft_fn`) live here. `specval.sut` finds `EngineSUT` by name (the
entry point `engine` of the group `specval.sut`), never by an import statement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.mutants import ALL_MUTANTS, ENGINE_LAYER
from specval.identity import SutIdentity, package_identity
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.stats.quadrature import AcceptFn, DraftFn
from specval.sut import DRAFT_OVERRIDES, OWN_DRAFT, SUT, Capabilities, PlantedMutant, SampleBatch, SUTError


@dataclass(frozen=True)
class Completion:
    """One generated completion and its speculative counts."""

    text: str
    num_tokens: int
    num_draft_tokens: int
    num_accepted_tokens: int
    finish_reason: str


Options = tuple[tuple[str, Any], ...]  # adapter options as (key, value) pairs (`SutSpec.options`)
EngineKey = tuple[str, int, str, str]  # (mode, draft depth, draft override, `options_key` of the options)
NO_OPTIONS = "{}"  # `options_key(())`


class EngineSUT(SUT):
    """Adapter over `engine.LLM`; a group's options (`sut.options` with the group's own merged over
    them) are passed to its `EngineConfig` as keywords."""

    capabilities = Capabilities(
        mutants=tuple(
            PlantedMutant(m.name, m.breaks, m.equivalent, m.visible_at) for m in ALL_MUTANTS if m.layer == ENGINE_LAYER
        ),
        draft_overrides=DRAFT_OVERRIDES[1:],
        mixed_sampling=True,
        group_options=True,
    )

    prob_dtype = np.float32  # the engine's probabilities are float32

    def __init__(self, spec: SutSpec, num_speculative_tokens: int):
        super().__init__(spec, num_speculative_tokens)
        self._llms: dict[EngineKey, Any] = {}
        self._collectors: dict[EngineKey, Any] = {}  # collection: batched
        self._batch_size = 0
        self._compile_start = None
        if spec.device == "cuda":  # Triton compiles only there (the CPU interpreter compiles nothing)
            from engine.sampling.kernels import compile_clock

            self._compile_start = compile_clock.install()

    def _key(self, mode: str, draft_loops: int | None, draft: str, options: Options) -> EngineKey:
        """The key of one engine: (mode, draft depth, draft override, `options_key(options)`)."""
        from engine.config import DEFAULT_DRAFT_LOOPS

        return (mode, draft_loops or DEFAULT_DRAFT_LOOPS.get(self.spec.model, 1), draft, options_key(options))

    def _llm(self, mode: str, draft_loops: int | None, draft: str = OWN_DRAFT, options: Options | None = None):
        """The engine of one (mode, draft depth, draft override, options), built on first use;
        `options` None: `sut.options`."""
        import engine

        options = self.spec.options if options is None else options
        key = self._key(mode, draft_loops, draft, options)
        if key not in self._llms:
            shared = next(iter(self._llms.values()), None)  # same model, dtype and device: load once
            override = {} if draft == OWN_DRAFT else {"draft_override": draft}
            try:
                config = engine.EngineConfig(
                    model=self.spec.model,
                    dtype=self.spec.dtype,
                    mode=mode,
                    num_speculative_tokens=self.num_speculative_tokens,
                    draft_loops=key[1],
                    device=self.spec.device,
                    **override,
                    **dict(options),
                )
                self._llms[key] = engine.LLM(config, *((shared.engine.model, shared.tokenizer) if shared else ()))
            except (ValueError, TypeError, NotImplementedError) as err:
                where = f" options={key[3]}" if options != self.spec.options else ""
                raise SUTError(
                    f"engine refuses mode={mode!r} draft_loops={key[1]} draft={draft!r}{where}: {err}"
                ) from err
        return self._llms[key]

    def _group_key(self, group: GroupSpec) -> EngineKey:
        return self._key(group.mode, group.draft_loops, _draft_of(group), self.spec.options_for(group))

    def _group_llm(self, group: GroupSpec):
        return self._llm(group.mode, group.draft_loops, _draft_of(group), self.spec.options_for(group))

    def _any_llm(self):
        return next(iter(self._llms.values())) if self._llms else self._llm("nospec", None)

    def check_groups(self, groups: tuple[GroupSpec, ...]) -> None:
        for group in groups:
            try:
                self._group_llm(group)
            except SUTError as err:
                raise SUTError(f"group {group.name!r}: {err}") from err

    @property
    def vocab_size(self) -> int:
        return int(self._any_llm().engine.model.vocab_size)

    def encode(self, text: str) -> list[int]:
        return list(self._any_llm().tokenizer.encode(text))

    def sample(
        self,
        group: GroupSpec,
        prompt_ids: list[int],
        sampling: SamplingSpec,
        seeds: np.ndarray,
        num_tokens: int,
        max_tokens: int,
    ) -> SampleBatch:
        llm = self._group_llm(group)
        samplings = [sampling] * len(seeds)
        if llm.engine.config.collection == "batched":
            return self._sample_batched(group, llm, prompt_ids, samplings, seeds, num_tokens, max_tokens)
        return self._generate(group, llm, prompt_ids, samplings, seeds, num_tokens, max_tokens)

    def sample_mixed(
        self,
        group: GroupSpec,
        prompt_ids: list[int],
        samplings: Sequence[SamplingSpec],
        seeds: np.ndarray,
        num_tokens: int,
        max_tokens: int,
    ) -> SampleBatch:
        """One `LLM.generate` call (or, with `collection: batched`, one `BatchCollector.collect`
        batch) with each request's own `SamplingParams` (temperature 0: greedy)."""
        llm = self._group_llm(group)
        if llm.engine.config.collection == "batched":
            return self._sample_batched(group, llm, prompt_ids, samplings, seeds, num_tokens, max_tokens)
        return self._generate(group, llm, prompt_ids, samplings, seeds, num_tokens, max_tokens)

    def _generate(
        self,
        group: GroupSpec,
        llm,
        prompt_ids: list[int],
        samplings: Sequence[SamplingSpec],
        seeds: np.ndarray,
        num_tokens: int,
        max_tokens: int,
    ) -> SampleBatch:
        params = [request_params(sp, max_tokens, seed=int(s), ignore_eos=True) for sp, s in zip(samplings, seeds)]
        outs = llm.generate([list(prompt_ids)] * len(params), params)
        bad = [o.finish_reason for o in outs if len(o.token_ids) != max_tokens]
        if bad:
            raise SUTError(f"group {group.name!r}: {len(bad)} request(s) ended early ({bad[0]!r})")
        return SampleBatch(
            tokens=np.array([o.token_ids[:num_tokens] for o in outs], dtype=np.int64).reshape(len(outs), num_tokens),
            sources=np.array([o.token_sources[:num_tokens] for o in outs], dtype=object).reshape(len(outs), num_tokens),
            num_rounds=np.array([o.num_rounds for o in outs], dtype=np.int64),
            num_draft_tokens=np.array([o.num_draft_tokens for o in outs], dtype=np.int64),
            num_accepted_tokens=np.array([o.num_accepted_tokens for o in outs], dtype=np.int64),
        )

    def plan_batches(self, largest: int) -> None:
        """With the batched collection on CUDA, every batch runs as `largest` rows at least (the
        probe's two requests too): one captured round shape serves the whole run, and its
        sampling kernels start compiling in the background now (`warm_round`). Elsewhere nothing
        changes."""
        llm = self._any_llm()
        if llm.engine.config.collection != "batched" or llm.engine.device.type != "cuda":
            return
        from engine.sampling import warm_round

        self._batch_size = max(self._batch_size, int(largest))
        warm_round(
            llm.engine.model.vocab_size,
            self._batch_size,
            self.num_speculative_tokens,
            llm.engine.device,
            backend=llm.engine.config.sampling_backend,
        )

    def _sample_batched(
        self,
        group: GroupSpec,
        llm,
        prompt_ids: list[int],
        samplings: Sequence[SamplingSpec],
        seeds: np.ndarray,
        num_tokens: int,
        max_tokens: int,
    ) -> SampleBatch:
        """`sample` (or `sample_mixed`: one sampling per row) through the engine's batched collection
        (`collection: batched`): columns come back as arrays, no per-request objects. Batches are
        padded to the largest batch seen so far, so the last, shorter batch of a chunk replays the
        same captured round (on CUDA to the planned batch size from the first: `plan_batches`).
        Only this path reports `SampleBatch.drafts` (the rounds' drafted tokens); `LLM.generate`
        (`collection: engine`) returns none."""
        from engine.runners.collection import BatchCollector

        key = self._group_key(group)
        if key not in self._collectors:
            self._collectors[key] = BatchCollector(llm.engine)
        self._batch_size = max(self._batch_size, len(seeds))
        params = [request_params(sampling, max_tokens, ignore_eos=True) for sampling in samplings]
        try:
            out = self._collectors[key].collect(
                list(prompt_ids),
                params,
                np.asarray(seeds, dtype=np.int64),
                max_tokens,
                batch_size=self._batch_size,
                stop_after=num_tokens,
            )
        except ValueError as err:
            raise SUTError(f"group {group.name!r}: {err}") from err
        if out.is_error.any():
            raise SUTError(f"group {group.name!r}: {int(out.is_error.sum())} request(s) ended early ('error')")
        return SampleBatch(
            tokens=out.tokens[:, :num_tokens],
            sources=out.source_names()[:, :num_tokens],
            num_rounds=out.num_rounds,
            num_draft_tokens=out.num_draft_tokens,
            num_accepted_tokens=out.num_accepted_tokens,
            drafts=None if out.drafts is None else out.drafts[:, :num_tokens],
        )

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """The model's chat template applied to `messages`, ending with the assistant's turn."""
        tokenizer = self._any_llm().tokenizer
        if not hasattr(tokenizer, "apply_chat_template"):
            raise SUTError(f"sut.model={self.spec.model!r} has no chat template; use prompt_format: plain")
        return tokenizer.apply_chat_template(messages)

    def complete(
        self,
        group: GroupSpec,
        prompts: Sequence[str],
        sampling: SamplingSpec,
        seeds: np.ndarray,
        max_tokens: int,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[Completion]:
        """One completion per (prompt, seed): at most `max_tokens` tokens, stopped by EOS."""
        params = [request_params(sampling, max_tokens, seed=int(s)) for s in seeds]
        llm = self._group_llm(group)
        outs = llm.generate(list(prompts), params, progress=progress)
        return [
            Completion(
                text=llm.tokenizer.decode(o.token_ids),
                num_tokens=len(o.token_ids),
                num_draft_tokens=int(o.num_draft_tokens),
                num_accepted_tokens=int(o.num_accepted_tokens),
                finish_reason=str(o.finish_reason),
            )
            for o in outs
        ]

    def target_logits(self, token_ids: list[int]) -> np.ndarray:
        return self._any_llm().full_depth_logits(token_ids).float().numpy()

    def target_logits_along(self, prompt_ids: list[int], token_ids: list[int]) -> np.ndarray:
        """One full-depth replay of prompt + tokens (`LLM.target_logits_along`): f32[len, V]."""
        return self._any_llm().target_logits_along(list(prompt_ids), list(token_ids)).float().numpy()

    def draft_logits(self, group: GroupSpec, token_ids: list[int]) -> np.ndarray:
        return self._group_llm(group).draft_logits(token_ids).float().numpy()

    def draft_logits_along(
        self, group: GroupSpec, prompt_ids: list[int], token_ids: list[int], seed: int
    ) -> np.ndarray:
        """One draft-depth replay of prompt + tokens with the group's draft override
        (`LLM.draft_logits_along`): f32[len, V]."""
        llm = self._group_llm(group)
        return llm.draft_logits_along(list(prompt_ids), list(token_ids), int(seed)).float().numpy()

    def target_logits_along_batch(self, prompt_ids: list[int], token_rows: np.ndarray) -> np.ndarray:
        """One batched full-depth replay of the rows (`LLM.target_logits_along_batch`): f32[B, L, V]."""
        return self._any_llm().target_logits_along_batch(list(prompt_ids), token_rows).numpy()

    def draft_logits_along_batch(
        self, group: GroupSpec, prompt_ids: list[int], token_rows: np.ndarray, seeds: np.ndarray
    ) -> np.ndarray:
        """One batched draft-depth replay with the group's override (`LLM.draft_logits_along_batch`)."""
        return self._group_llm(group).draft_logits_along_batch(list(prompt_ids), token_rows, seeds).numpy()

    def accept_single(
        self, draft_tokens: np.ndarray, draft_probs: np.ndarray, target_probs: np.ndarray, uniforms: np.ndarray
    ) -> np.ndarray:
        """The accept rule the runners use (`sut.options.mutant`'s, if named) on the protocol's device
        and `sampling_backend` (default "auto": the Triton kernel on CUDA, torch on the CPU). The
        quadrature is not a group's: it runs `sut.options`, whatever a group's `options` override."""
        import torch

        from engine.mutants import sampling_ops

        options = dict(self.spec.options)
        speculative_accept = sampling_ops(options.get("mutant")).accept

        device = self.spec.device
        rows = len(draft_tokens)
        result = speculative_accept(
            _tensor(draft_tokens, np.int64, device),
            torch.arange(rows + 1, dtype=torch.int64, device=device),
            _tensor(draft_probs, np.float32, device),
            _tensor(np.repeat(np.asarray(target_probs), 2, axis=0), np.float32, device),  # [2R, V]: p, then bonus p
            _tensor(uniforms, np.float64, device),
            torch.zeros(rows, dtype=torch.bool, device=device),
            backend=options.get("sampling_backend", "auto"),
        )
        return result.tokens[:, 0].cpu().numpy()

    def kernel_compile_time(self) -> dict[str, float] | None:
        """Triton's compiles and cache loads since this adapter opened (every kernel of the process)."""
        if self._compile_start is None:
            return None
        from engine.sampling.kernels import compile_clock

        return asdict(compile_clock.totals().since(self._compile_start))

    def describe(self) -> dict[str, Any]:
        import engine

        facts = super().describe()
        facts.update(
            engine=getattr(engine, "__version__", None),
            model=self.spec.model,
            dtype=self.spec.dtype,
            device=self.spec.device,
            configs=[self._label(key) for key in self._llms],
        )
        if self._collectors:  # collection: batched
            facts["collection"] = {self._label(key): c.graph_status for key, c in self._collectors.items()}
        return facts

    def _label(self, key: EngineKey) -> str:
        """`_config_label` of an engine, naming its options where a group's override `sut.options`."""
        mode, draft_loops, draft, options = key
        return _config_label(
            mode, draft_loops, draft, NO_OPTIONS if options == options_key(self.spec.options) else options
        )

    def close(self) -> None:
        """Free the engines; kernel warm-ups not yet started are dropped (`plan_batches`)."""
        from engine.sampling import cancel_warmups

        cancel_warmups()
        self._collectors.clear()
        for llm in self._llms.values():
            llm.close()
        self._llms.clear()

    @classmethod
    def identity(cls) -> SutIdentity:
        """The bundled engine's code: the `engine` package's files (this adapter's own file is the
        manifest's `adapter`), not the top-level `specval` package of the default."""
        package = "engine"  # the package this module drives (`engine.*` imports)
        return package_identity(package, name=package)


def _config_label(mode: str, draft_loops: int | None, draft: str, options: str = NO_OPTIONS) -> str:
    """ "mode/draft_loops=d[/draft=x][/options={...}]": one engine configuration in describe()
    (`options`: an `options_key`, shown unless NO_OPTIONS)."""
    label = mode if draft_loops is None else f"{mode}/draft_loops={draft_loops}"
    label = label if draft == OWN_DRAFT else f"{label}/draft={draft}"
    return label if options == NO_OPTIONS else f"{label}/options={options}"


def options_key(options: tuple[tuple[str, Any], ...]) -> str:
    """A group's effective options as the key of its engine: canonical JSON (sorted keys), so any
    value a protocol can write keys an engine, and equal option sets share one."""
    return json.dumps(dict(options), sort_keys=True, separators=(",", ":"), default=str)


def _draft_of(group: GroupSpec) -> str:
    """The draft a group runs: a sequence group's `draft`, else the engine's own."""
    return getattr(group, "draft", OWN_DRAFT)


# ---------------------------------------------------------------- the engine for the bench


def engine_config(**settings: Any):  # -> engine.EngineConfig
    """`engine.EngineConfig(**settings)`; its ValueError / TypeError name the refused setting."""
    import engine

    return engine.EngineConfig(**settings)


def build_llm(config: Any, shared: Any = None):  # -> engine.LLM
    """`engine.LLM` of `config`; with `shared` (another LLM of the same model, dtype and device) it
    reuses that one's model and tokenizer instead of loading the weights again."""
    import engine

    return engine.LLM(config, *((shared.engine.model, shared.tokenizer) if shared else ()))


def request_params(sampling: SamplingSpec, max_tokens: int, seed: int | None = None, ignore_eos: bool = False):
    """`engine.SamplingParams` of one request sampled by `sampling` (temperature, top-k, top-p), of
    at most `max_tokens` tokens; `seed` None lets the engine pick one."""
    from engine import SamplingParams

    return SamplingParams(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        seed=seed,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
    )


# ---------------------------------------------------------------- the engine's accept rule for the quadrature


def _require_float32(name: str, array: np.ndarray) -> None:
    """The engine takes float32 probabilities: refuse other dtypes instead of rounding silently,
    because the rows are computed from the values given and must match what the engine sees."""
    if array.dtype != np.float32:
        raise ValueError(
            f"{name} must be float32 for the engine adapter (cast p and q before "
            f"calling quadrature_check), got {array.dtype}"
        )


def _tensor(array: np.ndarray, dtype: type, device: str):  # -> torch.Tensor
    """A writable contiguous copy of `array` (possibly a read-only broadcast view) on `device`."""
    import torch

    return torch.from_numpy(np.array(array, dtype=dtype, order="C")).to(device)


def engine_accept_fn(*, backend: str = "torch", device: str = "cpu") -> AcceptFn:
    """An `AcceptFn` running `engine.sampling.speculative_accept` with K = 1 on every row.

    Each row is one random request with one draft: cu_num_drafts = 0, 1, ..., N; its two target
    rows (the draft position and the bonus position) are both p; the first emitted token is
    tokens[:, 0], PLACEHOLDER_TOKEN (an error) counting as error mass. p and q must be float32.
    The engine is imported when this is called, never when this module is imported.
    """
    import torch

    from engine.sampling import speculative_accept

    def accept(
        draft_tokens: np.ndarray, draft_probs: np.ndarray, target_probs: np.ndarray, uniforms: np.ndarray
    ) -> np.ndarray:
        _require_float32("draft_probs", draft_probs)
        _require_float32("target_probs", target_probs)
        rows, vocab = target_probs.shape
        p = _tensor(target_probs, np.float32, device)
        result = speculative_accept(
            _tensor(draft_tokens, np.int64, device),
            torch.arange(rows + 1, dtype=torch.int64, device=device),
            _tensor(draft_probs, np.float32, device),
            p.unsqueeze(1).expand(rows, 2, vocab).reshape(2 * rows, vocab).contiguous(),
            _tensor(uniforms, np.float64, device),
            torch.zeros(rows, dtype=torch.bool, device=device),
            backend=backend,
        )
        return result.tokens[:, 0].cpu().numpy()

    return accept


def engine_draft_fn(*, backend: str = "torch", device: str = "cpu") -> DraftFn:
    """A `DraftFn` running `engine.sampling.categorical` (imported when called); q must be float32."""
    import torch  # noqa: F401  (the engine's categorical takes torch tensors)

    from engine.sampling import categorical

    def draft(draft_probs: np.ndarray, u_draft: np.ndarray) -> np.ndarray:
        _require_float32("draft_probs", draft_probs)
        weights = _tensor(draft_probs, np.float32, device)
        return categorical(weights, _tensor(u_draft, np.float64, device), backend=backend).cpu().numpy()

    return draft
