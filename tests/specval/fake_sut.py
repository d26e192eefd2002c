"""A small exact SUT for the harness's own tests (never shipped as an engine).

Target: a fixed random Markov chain over V = 16 tokens (the next-token logits depend on the last
token only). Draft: the same logits plus a fixed perturbation scaled by 1 / draft_loops. Sampling
is exact speculative decoding with K drafts per round, numpy float64, one RNG stream per seed.
`FakeSUT.bug = "residual_from_p"` plants the classic bug (the correction drawn from p instead of
max(p - q, 0)); it is only set by tests. `sampler_semantics` is the filter semantics the sampler
really applies (the declared ones, `capabilities.semantics`, may be set apart by a test).
"""

from __future__ import annotations

import numpy as np

from specval.protocol import GroupSpec, SamplingSpec
from specval.reference import transform
from specval.semantics import DEFAULT_SEMANTICS, TIES_LOWEST_INDEX, FilterSemantics
from specval.sut import SUT, Capabilities, SampleBatch, SUTError

VOCAB = 16
TABLE_SEED = 1234


def _table() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(TABLE_SEED)
    return 2.0 * rng.standard_normal((VOCAB, VOCAB)), 1.5 * rng.standard_normal((VOCAB, VOCAB))


def _categorical(weights: np.ndarray, u: float) -> int:
    cdf = np.cumsum(weights)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), np.flatnonzero(weights > 0)[-1]))


class FakeSUT(SUT):
    bug: str | None = None
    sampler_semantics = DEFAULT_SEMANTICS
    supported_modes = ("nospec", "sync")

    def __init__(self, spec, num_speculative_tokens):
        super().__init__(spec, num_speculative_tokens)
        self.logits, self.noise = _table()
        self.num_sample_calls = 0

    @property
    def vocab_size(self) -> int:
        return VOCAB

    def encode(self, text: str) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def check_groups(self, groups) -> None:
        for group in groups:
            if group.mode not in self.supported_modes:
                raise SUTError(f"group {group.name!r}: mode {group.mode!r} is not supported by FakeSUT")

    def target_logits(self, token_ids: list[int]) -> np.ndarray:
        return self.logits[token_ids[-1]].astype(np.float32)

    def draft_logits(self, group: GroupSpec, token_ids: list[int]) -> np.ndarray:
        scale = 1.0 / (group.draft_loops or 1)
        return (self.logits[token_ids[-1]] + scale * self.noise[token_ids[-1]]).astype(np.float32)

    def _transform(self, logits: np.ndarray, sampling: SamplingSpec) -> np.ndarray:
        return transform(logits, sampling, self.sampler_semantics)

    def _residual(self, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        return p if self.bug == "residual_from_p" else np.maximum(p - q, 0.0)

    def accept_single(self, draft_tokens, draft_probs, target_probs, uniforms) -> np.ndarray:
        """Vectorised over rows (the quadrature sweeps ~1e5 rows): the rule of `_round` at K = 1."""
        rows = np.arange(len(draft_tokens))
        p, q = np.asarray(target_probs, np.float64), np.asarray(draft_probs, np.float64)
        accepted = uniforms[:, 1] * q[rows, draft_tokens] < p[rows, draft_tokens]
        weights = self._residual(p, q)
        cdf = np.cumsum(weights, axis=1)
        index = (cdf <= (uniforms[:, 2] * cdf[:, -1])[:, None]).sum(axis=1)  # searchsorted, side="right"
        last = weights.shape[1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
        return np.where(accepted, draft_tokens, np.minimum(index, last)).astype(np.int64)

    def _one(self, group: GroupSpec, prompt_ids: list[int], sampling: SamplingSpec, seed: int, n: int):
        rng = np.random.default_rng(seed)
        context = list(prompt_ids)
        p = self._transform(self.target_logits(context), sampling)
        tokens, sources = [_categorical(p, rng.random())], ["plain"]
        rounds = drafts = accepted = 0
        k_max = self.num_speculative_tokens
        while len(tokens) < n:
            context = list(prompt_ids) + tokens
            if not group.is_speculative:
                tokens.append(_categorical(self._transform(self.target_logits(context), sampling), rng.random()))
                sources.append("plain")
                continue
            new, src, num_acc = self._round(group, context, sampling, rng.random(2 * k_max + 1), k_max)
            rounds, drafts, accepted = rounds + 1, drafts + k_max, accepted + num_acc
            tokens += new
            sources += src
        return tokens[:n], sources[:n], rounds, drafts, accepted

    def _round(self, group, context, sampling, u, k_max):
        new, src = [], []
        for j in range(k_max):
            ctx = context + new
            p = self._transform(self.target_logits(ctx), sampling)
            q = self._transform(self.draft_logits(group, ctx), sampling)
            x = _categorical(q, u[j])
            if u[k_max + j] * q[x] < p[x]:
                new.append(x)
                src.append("accepted")
                continue
            new.append(_categorical(self._residual(p, q), u[2 * k_max]))
            src.append("correction")
            return new, src, j
        new.append(_categorical(self._transform(self.target_logits(context + new), sampling), u[2 * k_max]))
        src.append("bonus")
        return new, src, k_max

    def sample(self, group, prompt_ids, sampling, seeds, num_tokens, max_tokens) -> SampleBatch:
        self.num_sample_calls += 1
        rows = [self._one(group, prompt_ids, sampling, int(s), max_tokens) for s in seeds]
        return SampleBatch(
            tokens=np.array([r[0][:num_tokens] for r in rows], dtype=np.int64).reshape(len(rows), num_tokens),
            sources=np.array([r[1][:num_tokens] for r in rows], dtype=object).reshape(len(rows), num_tokens),
            num_rounds=np.array([r[2] for r in rows], dtype=np.int64),
            num_draft_tokens=np.array([r[3] for r in rows], dtype=np.int64),
            num_accepted_tokens=np.array([r[4] for r in rows], dtype=np.int64),
        )


LOWEST_INDEX = FilterSemantics(top_k_ties=TIES_LOWEST_INDEX)


class TiedFakeSUT(FakeSUT):
    """Integer target logits (many exact ties) and a top-k that keeps exactly k, ties broken by the
    lowest token id; declared as such, so the reference follows it."""

    sampler_semantics = LOWEST_INDEX
    capabilities = Capabilities(semantics=LOWEST_INDEX)

    def __init__(self, spec, num_speculative_tokens):
        super().__init__(spec, num_speculative_tokens)
        self.logits = np.round(self.logits)


class MisdeclaredTiedFakeSUT(TiedFakeSUT):
    """The same sampler declaring the default semantics (top-k ties kept): the reference disagrees."""

    capabilities = Capabilities()


class BuggyFakeSUT(FakeSUT):
    """The correction drawn from p instead of max(p - q, 0)."""

    bug = "residual_from_p"


class KilledFakeSUT(FakeSUT):
    """Dies like a killed process (KeyboardInterrupt is not an Exception) at its `kill_after`-th
    batch call, in the middle of a chunk."""

    kill_after = 2 + 5  # the adapter probe's one call per group (2 groups), then 5 batches of the run

    def sample(self, *args, **kwargs):
        if self.num_sample_calls >= self.kill_after:
            raise KeyboardInterrupt("simulated kill")
        return super().sample(*args, **kwargs)
