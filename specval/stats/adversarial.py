"""Adversarial pairs: synthetic (target p, draft q) pairs that stress a speculative accept rule.

Every pair is float64 and normalised by one float64 division, so p and q each sum to 1 within a
few ulps; cast them to float32 to exercise the float32 path (see `quadrature.normalisation_slack`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

MIN_VOCAB = 8  # smallest vocabulary on which every case below is distinct
TINY_MASS = 1e-9  # q's total mass on p's support in the "tiny_overlap" case
TOP_P = 0.7  # nucleus threshold of the top-p cases


@dataclasses.dataclass(frozen=True, eq=False)
class ProbPair:
    """One named synthetic case."""

    name: str
    p: np.ndarray  # [V] float64, target probabilities
    q: np.ndarray  # [V] float64, draft probabilities


def _normalised(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum()


def _top_k(probs: np.ndarray, k: int) -> np.ndarray:
    """Keep tokens with fewer than k strictly larger values (ties at the k-th value all kept)."""
    larger = (probs[None, :] > probs[:, None]).sum(axis=1)
    return _normalised(np.where(larger < k, probs, 0.0))


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep tokens whose strictly-larger mass is < top_p (the crossing token and its ties kept)."""
    larger_mass = (probs[None, :] * (probs[None, :] > probs[:, None])).sum(axis=1)
    return _normalised(np.where(larger_mass < top_p, probs, 0.0))


def _one_hot(vocab: int, token: int) -> np.ndarray:
    out = np.zeros(vocab)
    out[token] = 1.0
    return out


def adversarial_pairs(vocab: int, rng: np.random.Generator) -> Iterator[ProbPair]:
    """Yield the named cases, in a fixed order, for a vocabulary of `vocab` >= MIN_VOCAB tokens.

    Cases: dense (generic overlap), disjoint (p on the first half, q on the second), equal
    (p == q), ties (integer weights in {1..4}, q a partial permutation of p, so many exact ties
    within each and p_v == q_v on the fixed points), topk_target / topk_draft (one side top-k
    truncated with ties at the k-th value), topp_target / topp_draft (one side top-p truncated),
    tiny_overlap (q puts TINY_MASS on p's support), onehot_target, onehot_draft, onehot_both
    (one-hot at different tokens). Deterministic for a given `rng` state.
    """
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or vocab < MIN_VOCAB:
        raise ValueError(f"vocab must be an integer >= {MIN_VOCAB}, got {vocab!r}")
    half = vocab // 2
    base_p = _normalised(rng.gamma(0.5, size=vocab))
    base_q = _normalised(rng.gamma(0.5, size=vocab))
    yield ProbPair("dense", base_p, base_q)
    yield ProbPair(
        "disjoint",
        _normalised(np.r_[base_p[:half], np.zeros(vocab - half)]),
        _normalised(np.r_[np.zeros(half), base_q[half:]]),
    )
    yield ProbPair("equal", base_p, base_p.copy())
    yield _ties(vocab, rng)
    tied = _normalised(np.r_[np.full(3, 4.0), rng.integers(1, 4, size=vocab - 3).astype(float)])
    yield ProbPair("topk_target", _top_k(tied, 2), tied)
    yield ProbPair("topk_draft", tied, _top_k(tied, 2))
    yield ProbPair("topp_target", _top_p(base_p, TOP_P), base_q)
    yield ProbPair("topp_draft", base_p, _top_p(base_q, TOP_P))
    tiny = np.r_[base_q[:half] * TINY_MASS / base_q[:half].sum(), base_q[half:]]
    yield ProbPair("tiny_overlap", _normalised(np.r_[base_p[:half], np.zeros(vocab - half)]), _normalised(tiny))
    yield ProbPair("onehot_target", _one_hot(vocab, int(np.argmin(base_q))), base_q)
    yield ProbPair("onehot_draft", base_p, _one_hot(vocab, int(np.argmax(base_p))))
    yield ProbPair("onehot_both", _one_hot(vocab, 0), _one_hot(vocab, vocab - 1))


def _ties(vocab: int, rng: np.random.Generator) -> ProbPair:
    """Integer weights; q permutes the first half of p and keeps the rest (exact p_v == q_v)."""
    weights = rng.integers(1, 5, size=vocab).astype(float)
    moved = weights.copy()
    moved[: vocab // 2] = rng.permutation(weights[: vocab // 2])
    return ProbPair("ties", _normalised(weights), _normalised(moved))
