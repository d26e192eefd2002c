"""Sequential looks: the per-look levels of a pre-registered group-sequential test, and its stop rule.

A protocol may look at its data K times, after fractions t_1 < ... < t_K = 1 of its planned
samples, and stop with FAIL at the first look whose evidence crosses that look's level; it PASSes
only at the last look. The levels spend the protocol's alpha over the looks by Boole's inequality:
level_1 + ... + level_K = alpha.

Spending functions (`SPENDINGS`):

- `pocock`: the same level alpha / K at every look (Pocock's constant boundary, in its Bonferroni
  form). A gross bug is caught at the first look as surely as at the last; the final look is
  decided at alpha / K.
- `linear`: level_k = alpha (t_k - t_{k-1}), the spending function alpha t. The last look keeps the
  largest share (a smaller loss of power at the planned size); early looks are stricter.

Why Boole's inequality, not the classical boundaries computed from the joint normal law of the
looks (Pocock's or O'Brien-Fleming's constants): the criteria are stratified chi-square tests whose
strata are pooled afresh at every look (their df change), decided by Monte Carlo p-values and
corrected by Holm; no Brownian-motion approximation of their joint law across looks is exact. The
union bound needs only that each look's p-values are valid, whatever their dependence, so the
guarantee is as exact as the fixed-size one. The bound is nearly tight for looks as far apart as
10/25/50/100 % (weakly dependent): tests/specval/stats/test_sequential.py measures the rate.
O'Brien-Fleming-type spending is not offered: its first looks would be decided at levels around
1e-15, which no Monte Carlo p-value resolves (`montecarlo.num_draws`).

Assumptions: at every look, every criterion's p-value P is valid under its null at any sample size
(P(P <= a) <= a for all a), as the Monte Carlo p-values of `specval.stats.montecarlo` are.
Guarantee: rejecting at the first look k where Holm at level_k rejects some criterion of a family
has family-wise error <= alpha under any dependence between criteria and looks.
Scaling: K evaluations of the criteria at most; a criterion rejected at look k costs
montecarlo.num_draws(level_k / m) null draws.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from specval.stats import checks
from specval.stats.results import StatResult

POCOCK, LINEAR = "pocock", "linear"
SPENDINGS = (POCOCK, LINEAR)
MIN_LOOKS = 2  # one look is the fixed-size design
MAX_LOOKS = 10  # each look costs an evaluation; more looks spend alpha thinner for little gain
FRACTION_SLACK = 1e-9  # 0.1 * 3000 is 300.00000000000006 in binary: ceil must give 300


@dataclasses.dataclass(frozen=True)
class Boundary(StatResult):
    """The levels of K looks: look k (at fraction `fractions[k]` of the planned samples) decides
    at `levels[k]`; `sum(levels) == alpha` up to rounding (never above it by more than 1 ulp per look)."""

    alpha: float
    spending: str
    fractions: tuple[float, ...]
    levels: tuple[float, ...]

    @property
    def num_looks(self) -> int:
        return len(self.levels)

    @property
    def final_level(self) -> float:
        """The level of the last look: the one a PASS is decided at (and the printed MDE uses)."""
        return self.levels[-1]


def check_fractions(fractions: Sequence[float]) -> tuple[float, ...]:
    """`fractions` as a tuple if it holds MIN_LOOKS..MAX_LOOKS strictly increasing numbers in (0, 1]
    ending at 1; ValueError naming the first problem otherwise."""
    values = tuple(float(f) for f in fractions)
    if not MIN_LOOKS <= len(values) <= MAX_LOOKS:
        raise ValueError(f"looks: expected {MIN_LOOKS} to {MAX_LOOKS} fractions, got {len(values)}")
    if any(not 0.0 < f <= 1.0 for f in values):
        raise ValueError(f"looks: every fraction must lie in (0, 1], got {list(values)}")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"looks: fractions must increase strictly, got {list(values)}")
    if values[-1] != 1.0:
        raise ValueError(f"looks: the last look must be at 1.0 (the planned size), got {values[-1]}")
    return values


def spend(alpha: float, fractions: Sequence[float], spending: str = POCOCK) -> Boundary:
    """The per-look levels that spend `alpha` over looks at `fractions` with `spending`.

    Guarantee: levels are positive and sum to alpha (up to rounding), so the rule of the module
    docstring has family-wise error <= alpha. Deterministic in its arguments."""
    alpha = checks.probability("alpha", alpha)
    values = check_fractions(fractions)
    if spending == POCOCK:
        levels = tuple(alpha / len(values) for _ in values)
    elif spending == LINEAR:
        levels = tuple(alpha * (b - a) for a, b in zip((0.0,) + values[:-1], values))
    else:
        raise ValueError(f"spending must be one of {list(SPENDINGS)}, got {spending!r}")
    return Boundary(alpha, spending, values, levels)


def look_sizes(n: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Samples per group at each look: ceil(t_k n) (the last one n). ValueError when two looks
    would see the same number of samples (n too small for the fractions)."""
    n = checks.count("n", n, minimum=1)
    sizes = tuple(max(1, math.ceil(f * n - FRACTION_SLACK)) for f in check_fractions(fractions))
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"looks at {list(fractions)} of {n} samples repeat a size: {list(sizes)}")
    return sizes


def first_crossing(p_values: np.ndarray, boundary: Boundary) -> np.ndarray:
    """The look at which each replicate stops: p_values f64[R, K, m] (replicate, look, criterion of
    one family); Holm at look k's level rejects some criterion iff min_j p <= level_k / m. Returns
    int64[R]: the first crossing look (0-based), or K when the replicate PASSes the last look.

    Guarantee: the same decision as `multiplicity.holm` applied look by look (a test checks it);
    vectorised so that the Monte Carlo checks of the boundary cost milliseconds per 10^4 replicates."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 3 or p.shape[1] != boundary.num_looks:
        raise ValueError(f"p_values: expected shape [R, {boundary.num_looks}, m], got {p.shape}")
    levels = np.asarray(boundary.levels) / p.shape[2]
    crossed = p.min(axis=2) <= levels  # bool[R, K]
    return np.where(crossed.any(axis=1), np.argmax(crossed, axis=1), boundary.num_looks)
