"""System under test (SUT): the only door between the harness and an inference engine.

A SUT adapter is one small class implementing `SUT`. The harness imports an engine only in
`specval/adapters/`, and this module imports no adapter. The protocol selects the adapter with `sut.adapter`:

- `engine` (default): this project's own engine, through `specval.adapters.engine.EngineSUT`;
- `package.module:ClassName`: any importable class;
- any other name: an entry point of the group `specval.sut` (`engine` and `transformers` are
  entry points of specval itself; `BUNDLED_ADAPTERS` names `engine` for installs that predate it).

Token sources are reported with the codes of `SOURCES`: "plain" (no speculation), "accepted"
(an accepted draft token), "correction" (drawn from max(p - q, 0) after a rejection), "bonus"
(drawn from p after every draft was accepted). An adapter may also report the drafted token each
accepted or correction token stands at (`SampleBatch.drafts`, the rejected draft at a correction),
which a sequence protocol's `drafts` test reads.
"""

from __future__ import annotations

import abc
import functools
import importlib
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from specval.identity import SutIdentity, package_identity, top_package
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.semantics import DEFAULT_SEMANTICS, FilterSemantics

SOURCES = ("plain", "accepted", "correction", "bonus")
NO_DRAFT = -1  # SampleBatch.drafts at a token that stands at no draft (a bonus or plain token)
ENTRY_POINT_GROUP = "specval.sut"
DEFAULT_ADAPTER = "engine"
# Adapters shipped with specval, by entry point name -> "module:Class" (pyproject.toml registers the same
# entry points); used only when the installed metadata lacks the entry point, and loaded by name so
# that this module (the adapter contract) never imports an adapter.
BUNDLED_ADAPTERS = {DEFAULT_ADAPTER: "specval.adapters.engine:EngineSUT"}
# The extra of specval that brings what each shipped adapter's module imports (torch, triton, an
# engine): `pip install specval` is the harness alone, so loading one of these without its extra
# is refused (SUTError, exit 2) with the line to install it, never a traceback.
ADAPTER_EXTRAS = {
    "specval.adapters.engine": "engine",
    "specval.adapters.transformers": "transformers",
    "specval.adapters.vllm": "vllm",
}
MODES = ("nospec", "sync", "async")
SAMPLING_PARAMETERS = ("temperature", "top_k", "top_p")
DRAFT_FILTERED = "filtered"  # drafts sampled from q after the protocol's temperature, top-k and top-p
DRAFT_TEMPERATURE = "temperature"  # drafts sampled from q after temperature only (no truncation)
DRAFT_GREEDY = "greedy"  # drafts are argmax of the draft logits (no draft probabilities)
DRAFT_KINDS = (DRAFT_FILTERED, DRAFT_TEMPERATURE, DRAFT_GREEDY)
OWN_DRAFT = "own"  # a group's `draft` when it runs the SUT's own draft model
DRAFT_OVERRIDES = (OWN_DRAFT, "noisy", "adversarial", "temperature")


class SUTError(ValueError):
    """The SUT refused a configuration (e.g. a mode it does not support)."""


@dataclass(frozen=True)
class PlantedMutant:
    """One planted bug an adapter switches on when `sut.options.mutant` names it (`specval mutate`
    runs a protocol suite against each and tabulates which are killed)."""

    name: str
    breaks: str  # one sentence: what the bug does
    equivalent: bool = False  # the same output law as the correct sampler: every protocol must PASS it
    visible_at: str = ""  # where a correct harness can see it (free text; "" when not stated)


@dataclass(frozen=True)
class Capabilities:
    """What an adapter supports, declared as data on the class (`SUT.capabilities`).

    The runner compares a protocol with these before any seed is claimed and refuses (exit 2) a
    protocol that asks for something the SUT lacks, naming the capability.

    - `modes`: the group modes the adapter can run (subset of MODES).
    - `accept_single`: True iff `SUT.accept_single` maps caller-supplied uniforms to a token, which
      the exact quadrature needs (inverse-CDF samplers can; samplers that draw from their own RNG,
      or by an exponential race over the vocabulary, cannot).
    - `draft_kind`: how drafts are drawn (one of DRAFT_KINDS); the quadrature builds q the same way.
    - `sampling`: the sampling parameters the adapter honours; a protocol that sets any other
      (top_k other than -1, top_p below 1, temperature other than 1) is refused.
    - `mutants`: the planted bugs (`PlantedMutant`) the adapter switches on through
      `sut.options.mutant`; `specval mutate` takes its mutant list from here.
    - `semantics`: how the adapter applies top-k and top-p (`specval.semantics.FilterSemantics`);
      the float64 reference follows it, and a protocol pinning other semantics is refused.
    - `draft_overrides`: the draft replacements (`DRAFT_OVERRIDES` other than "own") the adapter
      runs when a group of a sequence protocol names one in `draft` (`group.draft`): "noisy" (its
      own draft logits plus Gaussian noise), "adversarial" (q ranks tokens against the target),
      "temperature" (the target at a higher temperature). The committed law must not change.
    - `mixed_sampling`: True iff the adapter implements `SUT.sample_mixed` (one call, each request
      with its own sampling parameters, greedy included); sequence groups with `companions` need it.
    - `group_options`: True iff the adapter runs each group with its own options
      (`SutSpec.options_for(group)`: `sut.options` with the group's `options` merged over them),
      e.g. one engine per distinct set; a protocol whose groups set `options` needs it, so an
      adapter that cannot honour them refuses it (exit 2) instead of ignoring them.
    """

    modes: tuple[str, ...] = MODES
    accept_single: bool = True
    draft_kind: str = DRAFT_FILTERED
    sampling: tuple[str, ...] = SAMPLING_PARAMETERS
    mutants: tuple[PlantedMutant, ...] = ()
    semantics: FilterSemantics = DEFAULT_SEMANTICS
    draft_overrides: tuple[str, ...] = ()
    mixed_sampling: bool = False
    group_options: bool = False

    def __post_init__(self) -> None:
        for name, values, allowed in (
            ("modes", self.modes, MODES),
            ("sampling", self.sampling, SAMPLING_PARAMETERS),
            ("draft_overrides", self.draft_overrides, DRAFT_OVERRIDES[1:]),
        ):
            unknown = sorted(set(values) - set(allowed))
            if unknown:
                raise ValueError(f"Capabilities.{name}: unknown {unknown}; expected a subset of {allowed}")
        if self.draft_kind not in DRAFT_KINDS:
            raise ValueError(f"Capabilities.draft_kind: {self.draft_kind!r} is not one of {DRAFT_KINDS}")
        bad = [m for m in self.mutants if not isinstance(m, PlantedMutant)]
        if bad:
            raise ValueError(f"Capabilities.mutants: expected PlantedMutant entries, got {bad[0]!r}")
        if len(set(self.mutant_names)) != len(self.mutants):
            raise ValueError(f"Capabilities.mutants: duplicate names in {list(self.mutant_names)}")
        if not isinstance(self.semantics, FilterSemantics):
            raise ValueError(f"Capabilities.semantics: expected a FilterSemantics, got {self.semantics!r}")

    @property
    def mutant_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.mutants)


def capabilities_of(sut: Any) -> Capabilities:
    """The adapter's declared capabilities (the defaults for a duck-typed adapter that declares none)."""
    return getattr(sut, "capabilities", None) or Capabilities()


@dataclass(frozen=True)
class SampleBatch:
    """Tokens generated for one batch of requests, one row per seed."""

    tokens: np.ndarray  # int64[N, n] committed tokens t_1..t_n
    sources: np.ndarray  # object[N, n] one of SOURCES per token
    # counts over the rounds run: at least those that emitted t_1..t_n, at most the whole request
    num_rounds: np.ndarray  # int64[N] speculative rounds (0 for nospec)
    num_draft_tokens: np.ndarray  # int64[N] draft tokens proposed
    num_accepted_tokens: np.ndarray  # int64[N] draft tokens accepted
    # optional int64[N, n]: the drafted token x_j that each "accepted" token (equal to it) and each
    # "correction" token (the rejected draft) stands at; NO_DRAFT at a bonus or plain token. None:
    # the adapter does not report drafts (a sequence protocol's `drafts` test needs them)
    drafts: np.ndarray | None = None

    def validate(self, num_seeds: int, num_tokens: int) -> None:
        if self.tokens.shape != (num_seeds, num_tokens) or self.sources.shape != (num_seeds, num_tokens):
            raise SUTError(f"SUT returned tokens of shape {self.tokens.shape}, expected {(num_seeds, num_tokens)}")
        bad = set(self.sources.ravel().tolist()) - set(SOURCES)  # a set: no sort of N x n strings
        if bad:
            raise SUTError(f"SUT returned unknown token sources {sorted(bad, key=repr)}; expected {SOURCES}")


class SUT(abc.ABC):
    """Adapter interface. Constructed as `Adapter(spec, num_speculative_tokens)`.

    Guarantees expected from an implementation: `sample` is a pure function of (group, prompt,
    sampling, seed) per request, whatever the batch composition; `target_logits` is the target
    model at full depth on exactly the given tokens (serial, cache-free); `accept_single` runs the
    SUT's own acceptance kernel on single-draft rows.
    """

    prob_dtype = np.float64  # dtype of the probabilities `accept_single` is given
    capabilities = Capabilities()  # what the adapter supports (see Capabilities); override on the class

    def __init__(self, spec: SutSpec, num_speculative_tokens: int):
        self.spec = spec
        self.num_speculative_tokens = num_speculative_tokens

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abc.abstractmethod
    def sample(
        self,
        group: GroupSpec,
        prompt_ids: list[int],
        sampling: SamplingSpec,
        seeds: np.ndarray,
        num_tokens: int,
        max_tokens: int,
    ) -> SampleBatch:
        """Return the first `num_tokens` tokens of a request of `max_tokens` tokens (EOS ignored)
        for each seed in int64[N]. A request may stop once it has them; the counts cover the rounds
        it ran (at least those that emitted its `num_tokens` tokens). The N requests of one call run
        together, row r in batch slot r (sequence protocols pair rows of one call). `group.draft`
        (a sequence protocol's group; absent elsewhere, meaning "own") names the draft to run."""

    def sample_mixed(
        self,
        group: GroupSpec,
        prompt_ids: list[int],
        samplings: Sequence[SamplingSpec],
        seeds: np.ndarray,
        num_tokens: int,
        max_tokens: int,
    ) -> SampleBatch:
        """`sample` with one sampling per request: row r uses `samplings[r]` (temperature 0 means
        greedy: the argmax of the raw logits) and seed `seeds[r]`, all rows in one call, row r in
        slot r. The guarantee is `sample`'s: each row is a pure function of its own request, so a
        row's tokens equal those `sample` gives the same request in a batch of its own. Adapters
        declaring `Capabilities(mixed_sampling=True)` implement it."""
        raise SUTError(f"{type(self).__name__} does not provide sample_mixed")

    @abc.abstractmethod
    def target_logits(self, token_ids: list[int]) -> np.ndarray:
        """Full-depth next-token logits f32[V] after `token_ids`."""

    def target_logits_along(self, prompt_ids: list[int], token_ids: list[int]) -> np.ndarray:
        """f32[len(token_ids), V]: row i is the full-depth next-token logits after prompt_ids +
        token_ids[:i], i.e. the target's logits for every committed token of a sequence given its
        actual prefix (sequence protocols). This default calls `target_logits` once per row;
        adapters override it with one forward pass over the sequence (same logits up to the
        model's own rounding, which `support_tolerance` of a sequence protocol absorbs)."""
        return self._rows_along(self.target_logits, prompt_ids, token_ids)

    def draft_logits(self, group: GroupSpec, token_ids: list[int]) -> np.ndarray:
        """Draft next-token logits f32[V] of `group`'s draft model after `token_ids` (needed only by
        the quadrature, i.e. when `capabilities.accept_single` is True)."""
        raise SUTError(f"{type(self).__name__} does not provide draft_logits")

    def draft_logits_along(
        self, group: GroupSpec, prompt_ids: list[int], token_ids: list[int], seed: int
    ) -> np.ndarray:
        """f32[len(token_ids), V]: row i is the logits of the draft distribution q that `group`'s
        rounds sample a draft of position i from, after prompt_ids + token_ids[:i], for the request
        of `seed` (a draft override may depend on it); the sampling parameters and filter semantics
        then give q as they give p. Needed by a sequence protocol's `source` test (the law of each
        token given its source: accepted ~ min(p, q) / beta, correction ~ (p - q)+ / (1 - beta), and
        the acceptance count against beta = sum min(p, q)). This default calls `draft_logits` once
        per row, right for a draft that does not depend on the seed; adapters override it with one
        pass over the sequence."""
        return self._rows_along(functools.partial(self.draft_logits, group), prompt_ids, token_ids)

    def target_logits_along_batch(self, prompt_ids: list[int], token_rows: np.ndarray) -> Any:
        """f32[B, L, V] (or a list of B arrays f32[L, V]): `target_logits_along(prompt_ids,
        token_rows[b])` for every row b of int64[B, L] (the sequences of one collected batch share
        their prompt). This default calls `target_logits_along` once per row and returns the list;
        an adapter whose model takes a batch overrides it with one batched forward pass (the same
        logits up to the model's own rounding, which a sequence protocol's `support_tolerance`
        absorbs). The harness checks every row (`specval.sequence.contract`) and sends at most
        `specval.sequence.reference.REPLAY_VALUES` logits per call."""
        return [self.target_logits_along(list(prompt_ids), [int(t) for t in row]) for row in token_rows]

    def draft_logits_along_batch(
        self, group: GroupSpec, prompt_ids: list[int], token_rows: np.ndarray, seeds: np.ndarray
    ) -> Any:
        """f32[B, L, V] (or a list of B arrays): `draft_logits_along(group, prompt_ids,
        token_rows[b], seeds[b])` for every row b (`target_logits_along_batch`'s batching)."""
        return [
            self.draft_logits_along(group, list(prompt_ids), [int(t) for t in row], int(seed))
            for row, seed in zip(token_rows, seeds)
        ]

    def _rows_along(
        self, logits_after: Callable[[list[int]], np.ndarray], prompt_ids: list[int], token_ids: list[int]
    ) -> np.ndarray:
        """f32[len(token_ids), V]: `logits_after(prompt_ids + token_ids[:i])` for every row i."""
        prefix = list(prompt_ids)
        rows = []
        for token in token_ids:
            rows.append(np.asarray(logits_after(prefix), dtype=np.float32))
            prefix.append(int(token))
        return np.stack(rows) if rows else np.zeros((0, self.vocab_size), dtype=np.float32)

    def accept_single(
        self, draft_tokens: np.ndarray, draft_probs: np.ndarray, target_probs: np.ndarray, uniforms: np.ndarray
    ) -> np.ndarray:
        """First committed token int64[N] of single-draft rows: draft_tokens[N], probs f64[N, V],
        uniforms f64[N, 3] laid out as (draft sample, accept test, correction/bonus). Adapters that
        cannot map caller-supplied uniforms to a token declare `Capabilities(accept_single=False)`
        and leave this undefined."""
        raise SUTError(f"{type(self).__name__} does not provide accept_single")

    def check_groups(self, groups: tuple[GroupSpec, ...]) -> None:
        """Raise SUTError naming the group if any group's mode or depth is unsupported (or, for an
        adapter declaring `Capabilities.group_options`, any option of `spec.options_for(group)`)."""
        return None  # an optional hook: the default accepts every group

    def plan_batches(self, largest: int) -> None:
        """Said once, before the preflight probe's first `sample` call: no `sample` call of this
        run carries more than `largest` seeds (the protocol's batch size). An adapter may size
        itself for it (buffers, captured shapes, kernels compiled ahead); the default does
        nothing. Results must not depend on it."""
        return None  # an optional hook: the default does nothing

    def kernel_compile_time(self) -> dict[str, float] | None:
        """Kernel compilation this SUT did since it was opened: {"compiled": kernels built,
        "compile_s": seconds building them, "loaded": kernels found in a compile cache, "load_s":
        seconds loading them}, recorded in the manifest's timing as `kernel_compile`. None (the
        default) when the adapter does not know."""
        return None

    @classmethod
    def identity(cls) -> SutIdentity:
        """The code this adapter tests, recorded in manifest.json as `sut_identity` (covered by the
        seal and the signature, shown on the report's first screen, pinned by `specval verify
        --sut-digest`). A class method: it names code, which no option of an instance changes.

        The default is `specval.identity.package_identity` of the adapter's top-level package
        (`mypkg` for `mypkg.adapters:MySUT`): the installed distribution's name and version, a
        SHA-256 over the package's files and the git commit holding them. An adapter whose engine
        is another package overrides it, e.g. `return package_identity("myengine")`."""
        return package_identity(top_package(cls.__module__))

    def describe(self) -> dict[str, Any]:
        """Name, version and device facts for the manifest."""
        return {"adapter": type(self).__name__, "python": platform.python_version()}

    def close(self) -> None:
        """Release resources."""
        return None  # an optional hook: the default does nothing


def load_adapter(name: str) -> type[SUT]:
    """Resolve `sut.adapter` to a SUT subclass; ValueError naming the adapter on failure."""
    if ":" in name:
        cls = _import_class(name)
    else:
        points = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not points and name in BUNDLED_ADAPTERS:  # an install whose metadata predates the entry point
            cls = _import_class(BUNDLED_ADAPTERS[name])
        elif not points:
            raise SUTError(
                f"sut.adapter: no adapter {name!r}: use 'engine', 'module:Class' or an entry point "
                f"of group {ENTRY_POINT_GROUP!r}"
            )
        else:
            try:
                cls = points[0].load()
            except (ImportError, AttributeError) as err:
                _refuse_missing_extra(name, points[0].value, err)
                raise SUTError(
                    f"sut.adapter: entry point {name!r} ({points[0].value}) cannot be loaded ({err})"
                ) from err
    if not (isinstance(cls, type) and issubclass(cls, SUT)):
        raise SUTError(f"sut.adapter: {name!r} is not a subclass of specval.sut.SUT")
    return cls


def _import_class(path: str) -> Any:
    """The attribute named by "package.module:Name"; SUTError naming `path` if it cannot be imported."""
    module_name, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        _refuse_missing_extra(path, path, err)
        raise SUTError(f"sut.adapter: cannot import {path!r} ({err})") from err


def _refuse_missing_extra(name: str, path: str, err: BaseException) -> None:
    """SUTError with the install line when the shipped adapter at `path` ("module:Class") failed to
    import because a package of its extra is missing (a module outside specval); else nothing."""
    extra = ADAPTER_EXTRAS.get(path.partition(":")[0])
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    package = (missing or "specval").split(".")[0]
    if extra is None or package == "specval":  # another adapter, or no package missing outside specval
        return
    raise SUTError(
        f'sut.adapter: {name!r} needs {package}, which is not installed: pip install "specval[{extra}]"'
    ) from err


SutFactory = Callable[[SutSpec, int], SUT]  # open_sut, or a test's adapter class: (spec, K) -> SUT


def open_sut(spec: SutSpec, num_speculative_tokens: int) -> SUT:
    return load_adapter(spec.adapter)(spec, num_speculative_tokens)
