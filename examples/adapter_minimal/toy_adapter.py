"""A complete specval adapter for a toy speculative sampler: the example of docs/harness.md section 8.

The "engine" is a bigram model over VOCAB tokens: the target's next-token logits depend on the last
token only, and the draft model is the target plus a fixed perturbation. Sampling is speculative
decoding with K drafts per round in numpy float64, one random stream per request seed. It honours
temperature only (no top-k / top-p), so it declares that in its capabilities; specval refuses, before
any seed is claimed, a protocol that asks it for truncation.

Everything an adapter needs is here: capabilities as data on the class, `vocab_size`, `encode`,
`sample` (one row per seed, token sources, counts), `target_logits`, `draft_logits`, `describe`, and
`accept_single`, the acceptance step on caller-supplied uniforms that the exact quadrature sweeps
(vectorised over rows: it is called with thousands of rows at a time).
`specval check-adapter toy_adapter:ToySUT` (from this folder, with PYTHONPATH=.) checks all of it.
It also plants two bugs for `specval mutate` (listed in `capabilities.mutants`, switched on by
`sut.options.mutant`): one that changes the output law and one that does not.

Whole sequences (sequence.yaml) add three optional parts: `target_logits_along` and
`draft_logits_along` (the target's and the draft's logits at every position of a sequence, one call
each: the replay and the white-box `source` test), draft overrides (`Capabilities.draft_overrides`,
read from `group.draft` where the draft is built) and mixed batches (`Capabilities.mixed_sampling`,
`sample_mixed`: one sampling per request in one call, temperature 0 meaning greedy).
"""

from __future__ import annotations

import numpy as np

from specval.sut import SUT, Capabilities, PlantedMutant, SampleBatch, SUTError

VOCAB = 8
WEIGHTS_SEED = 7  # the toy model's fixed weights
TOY_VERSION = "1"  # recorded by describe(); bump when the sampler changes
RESIDUAL_FROM_P, ACCEPT_BY_DIVISION = "residual_from_p", "accept_by_division"
MUTANTS = (
    PlantedMutant(
        RESIDUAL_FROM_P,
        "the correction is drawn from p instead of max(p - q, 0)",
        visible_at="t1 (quadrature, t1 goodness of fit)",
    ),
    PlantedMutant(
        ACCEPT_BY_DIVISION,
        "accept iff u < p(x) / q(x): the same rule up to float rounding",
        equivalent=True,
        visible_at="nowhere (equivalent)",
    ),
)


def _softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """The law of one row at `temperature`: softmax(logits / T), or the point mass at the argmax when
    T is 0 (greedy; speculation then accepts a draft iff it is the target's argmax)."""
    if temperature == 0:
        return np.eye(len(logits))[np.argmax(logits)]
    z = np.asarray(logits, dtype=np.float64) / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def _inverse_cdf_rows(weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row of weights [N, V]: the first token whose cumulative weight exceeds u * total, never past
    the row's last positive-weight token (int64 [N]). Vectorised over rows: no Python loop per row."""
    cdf = np.cumsum(weights, axis=1)  # [N, V]
    first = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=1)  # searchsorted(side="right") per row
    last_positive = weights.shape[1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
    return np.minimum(first, last_positive).astype(np.int64)


def _previous(prompt_ids: list[int], token_ids: list[int]) -> np.ndarray:
    """The token before each of `token_ids` (int64 [len(token_ids)]): all a bigram model reads."""
    return np.asarray([prompt_ids[-1], *token_ids], dtype=np.int64)[: len(token_ids)]


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    """`_inverse_cdf_rows` of one row: the same draw, bit for bit, in `sample` and `accept_single`."""
    return int(_inverse_cdf_rows(np.asarray(weights)[None, :], np.array([u]))[0])


class ToySUT(SUT):
    capabilities = Capabilities(
        modes=("nospec", "sync"),
        accept_single=True,
        draft_kind="temperature",
        sampling=("temperature",),
        mutants=MUTANTS,
        draft_overrides=("noisy", "adversarial", "temperature"),
        mixed_sampling=True,
    )

    def __init__(self, spec, num_speculative_tokens):
        super().__init__(spec, num_speculative_tokens)
        self.mutant = dict(spec.options).get("mutant")  # None: the correct sampler
        if self.mutant is not None and self.mutant not in self.capabilities.mutant_names:
            raise SUTError(f"sut.options.mutant: {self.mutant!r} is not one of {self.capabilities.mutant_names}")
        rng = np.random.default_rng(WEIGHTS_SEED)
        self.target = 2.0 * rng.standard_normal((VOCAB, VOCAB))
        self.draft = self.target + rng.standard_normal((VOCAB, VOCAB))
        self.noise = rng.standard_normal((VOCAB, VOCAB))  # the `noisy` draft override's perturbation

    @property
    def vocab_size(self) -> int:
        return VOCAB

    def encode(self, text: str) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def check_groups(self, groups) -> None:
        for group in groups:
            if group.mode not in self.capabilities.modes:
                raise SUTError(f"group {group.name!r}: mode {group.mode!r} is not supported")

    def describe(self) -> dict:
        """What the bundle's manifest records about the system under test: name, version, model, device."""
        return {
            "adapter": type(self).__name__,
            "engine": "toy bigram speculative sampler",
            "version": TOY_VERSION,
            "vocab_size": VOCAB,
            "weights_seed": WEIGHTS_SEED,
            "device": "cpu (numpy float64)",
            "mutant": self.mutant,
        }

    def target_logits(self, token_ids: list[int]) -> np.ndarray:
        return self.target[token_ids[-1]].astype(np.float32)

    def target_logits_along(self, prompt_ids: list[int], token_ids: list[int]) -> np.ndarray:
        """Row i: the target logits after prompt + tokens[:i], all rows in one indexing (a bigram
        model reads only the last token; a transformer would run one forward pass here)."""
        return self.target[_previous(prompt_ids, token_ids)].astype(np.float32)

    def draft_logits(self, group, token_ids: list[int]) -> np.ndarray:
        return self._draft(group, np.asarray(token_ids[-1:]))[0].astype(np.float32)

    def draft_logits_along(self, group, prompt_ids: list[int], token_ids: list[int], seed: int) -> np.ndarray:
        """Row i: the logits of the draft a round samples position i from, after prompt + tokens[:i]
        (the `source` test filters them into q as it filters the target's into p). One indexing, as
        `target_logits_along`; the toy's drafts do not depend on the request, so `seed` is unused (a
        draft that did, e.g. noise drawn per request, would be rebuilt from it here)."""
        return self._draft(group, _previous(prompt_ids, token_ids)).astype(np.float32)

    def _draft(self, group, last: np.ndarray) -> np.ndarray:
        """The group's draft logits after each token of `last`: its own table, or the override a
        sequence protocol's group names (`group.draft`; distribution groups carry none): noisy (own +
        fixed noise), adversarial (minus the target), temperature (the target at twice the
        temperature). The committed law must not change with any of them."""
        draft = getattr(group, "draft", "own")
        if draft == "noisy":
            return self.draft[last] + 2.0 * self.noise[last]
        if draft == "adversarial":
            return -self.target[last]
        if draft == "temperature":
            return self.target[last] / 2.0
        return self.draft[last]

    def _accepts(self, u, q_x, p_x):
        """Accept iff u * q(x) < p(x); elementwise on arrays (one entry per row) as on scalars."""
        if self.mutant == ACCEPT_BY_DIVISION:
            return u < p_x / q_x
        return u * q_x < p_x

    def _residual(self, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        return p if self.mutant == RESIDUAL_FROM_P else np.maximum(p - q, 0.0)

    def accept_single(self, draft_tokens, draft_probs, target_probs, uniforms) -> np.ndarray:
        """The acceptance step of `_round` on N single-draft rows at once (the quadrature calls it with
        thousands of rows per call: a Python loop per row would dominate a run's time). The inputs
        may be read-only broadcast views: nothing is written into them."""
        p = np.asarray(target_probs, dtype=np.float64)  # [N, V]
        q = np.asarray(draft_probs, dtype=np.float64)  # [N, V]
        x = np.asarray(draft_tokens, dtype=np.int64)  # [N]
        rows = np.arange(x.size)
        accepted = self._accepts(uniforms[:, 1], q[rows, x], p[rows, x])
        corrected = _inverse_cdf_rows(self._residual(p, q), uniforms[:, 2])
        return np.where(accepted, x, corrected)

    def sample(self, group, prompt_ids, sampling, seeds, num_tokens, max_tokens) -> SampleBatch:
        return self.sample_mixed(group, prompt_ids, [sampling] * len(seeds), seeds, num_tokens, max_tokens)

    def sample_mixed(self, group, prompt_ids, samplings, seeds, num_tokens, max_tokens) -> SampleBatch:
        """`sample` with one sampling per request, all in one call (temperature 0: greedy). The toy
        runs its requests one after another; an engine would put them in one batch, each with its
        own parameters, and each row must stay a function of its own request alone."""
        for sampling in samplings:
            if sampling.top_k not in (-1, 0) or sampling.top_p < 1.0:
                raise SUTError(f"sampling {sampling}: the toy sampler honours temperature only")
        rows = [
            self._request(group, prompt_ids, sampling.temperature, int(seed), max_tokens)
            for sampling, seed in zip(samplings, seeds)
        ]
        return SampleBatch(
            tokens=np.array([r[0][:num_tokens] for r in rows], dtype=np.int64),
            sources=np.array([r[1][:num_tokens] for r in rows], dtype=object),
            num_rounds=np.array([r[2] for r in rows], dtype=np.int64),
            num_draft_tokens=np.array([r[3] for r in rows], dtype=np.int64),
            num_accepted_tokens=np.array([r[4] for r in rows], dtype=np.int64),
        )

    def _request(self, group, prompt_ids, temperature, seed, max_tokens):
        rng = np.random.default_rng(seed)  # the request's own stream: a pure function of its seed
        p = _softmax(self.target_logits(prompt_ids), temperature)
        tokens, sources, rounds, drafted, accepted = [_inverse_cdf(p, rng.random())], ["plain"], 0, 0, 0
        while len(tokens) < max_tokens:
            context = list(prompt_ids) + tokens
            if not group.is_speculative:
                tokens.append(_inverse_cdf(_softmax(self.target_logits(context), temperature), rng.random()))
                sources.append("plain")
                continue
            new, kinds, num_accepted = self._round(
                group, context, temperature, rng.random(2 * self.num_speculative_tokens + 1)
            )
            tokens, sources = tokens + new, sources + kinds
            rounds, drafted, accepted = rounds + 1, drafted + self.num_speculative_tokens, accepted + num_accepted
        return tokens[:max_tokens], sources[:max_tokens], rounds, drafted, accepted

    def _round(self, group, context, temperature, u):
        """One block: draft K, accept while u_acc * q(x) < p(x), then the correction or the bonus."""
        k = self.num_speculative_tokens
        new = []
        for j in range(k):
            p = _softmax(self.target_logits(context + new), temperature)
            q = _softmax(self.draft_logits(group, context + new), temperature)
            x = _inverse_cdf(q, u[j])
            if not self._accepts(u[k + j], q[x], p[x]):
                return new + [_inverse_cdf(self._residual(p, q), u[2 * k])], ["accepted"] * j + ["correction"], j
            new.append(x)
        bonus = _inverse_cdf(_softmax(self.target_logits(context + new), temperature), u[2 * k])
        return new + [bonus], ["accepted"] * k + ["bonus"], k
