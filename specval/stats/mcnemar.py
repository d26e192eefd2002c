"""McNemar: paired comparison of per-item correctness between two groups (same items, same seeds)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from specval.stats import checks
from specval.stats.results import StatResult


@dataclasses.dataclass(frozen=True)
class McNemarResult(StatResult):
    """Paired comparison of group b against group a.

    wins: items b got right and a got wrong; losses: a right, b wrong; ties: both equal.
    diff = acc_b - acc_a = (wins - losses) / n; [ci_low, ci_high] is Newcombe's (1998, method 10)
    1 - alpha interval for the paired difference. `non_inferior` is ci_low > -margin, or None
    when no margin was given.
    """

    n: int
    wins: int
    losses: int
    ties: int
    acc_a: float
    acc_b: float
    diff: float
    p_value: float
    ci_low: float
    ci_high: float
    alpha: float
    margin: float | None
    non_inferior: bool | None


def paired_comparison(
    correct_a: np.ndarray, correct_b: np.ndarray, *, alpha: float, margin: float | None = None
) -> McNemarResult:
    """Exact McNemar test and a paired-difference interval for correctness vectors a [n], b [n].

    Assumptions: item i of a and b is the same question with the same seed (paired); items are
    independent. The p-value is the exact binomial McNemar test (statsmodels, exact=True) on the
    discordant pairs. The interval is Newcombe's hybrid score interval (Wilson intervals of the
    two marginal accuracies combined with the phi correlation of the pairs), which keeps close to
    nominal coverage for small n and near 0 or 1, unlike the Wald interval.
    Guarantee: under H0 (equal accuracies) the false-fail rate of p_value < alpha is <= alpha
    (exact test, conservative). The two-sided 1 - alpha interval covers acc_b - acc_a with
    probability about 1 - alpha, so `non_inferior` is a one-sided test of acc_b - acc_a <= -margin
    at level about alpha / 2. A non-significant McNemar alone is NOT evidence of no regression:
    only `non_inferior` (with a pre-registered margin) is.
    Scaling: the interval's half-width is about z sqrt((wins + losses) / n^2), so the detectable
    regression shrinks like 1 / sqrt(n) and grows with the discordance rate.
    """
    a = _as_flags("correct_a", correct_a)
    b = _as_flags("correct_b", correct_b)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"correct_a and correct_b must be non-empty and paired, got shapes {a.shape}, {b.shape}")
    alpha = checks.probability("alpha", alpha)
    if margin is not None:
        margin = checks.non_negative("margin", margin)
    both, wins, losses = int(np.sum(a & b)), int(np.sum(b & ~a)), int(np.sum(a & ~b))
    n = int(a.size)
    neither = n - both - wins - losses
    p_value = float(mcnemar([[both, losses], [wins, neither]], exact=True).pvalue)
    low, high = newcombe_paired_ci(both, wins, losses, neither, alpha)
    return McNemarResult(
        n=n,
        wins=wins,
        losses=losses,
        ties=both + neither,
        acc_a=(both + losses) / n,
        acc_b=(both + wins) / n,
        diff=(wins - losses) / n,
        p_value=p_value,
        ci_low=low,
        ci_high=high,
        alpha=alpha,
        margin=margin,
        non_inferior=None if margin is None else bool(low > -margin),
    )


def newcombe_paired_ci(both: int, wins: int, losses: int, neither: int, alpha: float) -> tuple[float, float]:
    """Newcombe (1998) method 10 interval for p_b - p_a from a paired 2 x 2 table.

    p_b = (both + wins) / n and p_a = (both + losses) / n, each with its Wilson interval
    (statsmodels proportion_confint, method="wilson"); phi is the correlation of the 2 x 2 table
    (0 when a margin is empty). Guarantee: the result lies in [-1, 1] and contains the estimate.
    """
    n = both + wins + losses + neither
    p_b, p_a = (both + wins) / n, (both + losses) / n
    low_b, high_b = proportion_confint(both + wins, n, alpha=alpha, method="wilson")
    low_a, high_a = proportion_confint(both + losses, n, alpha=alpha, method="wilson")
    margins = (both + wins) * (losses + neither) * (both + losses) * (wins + neither)
    phi = (both * neither - wins * losses) / math.sqrt(margins) if margins > 0 else 0.0
    diff = p_b - p_a
    down = (p_b - low_b) ** 2 - 2 * phi * (p_b - low_b) * (high_a - p_a) + (high_a - p_a) ** 2
    up = (high_b - p_b) ** 2 - 2 * phi * (high_b - p_b) * (p_a - low_a) + (p_a - low_a) ** 2
    low, high = diff - math.sqrt(max(down, 0.0)), diff + math.sqrt(max(up, 0.0))
    return max(-1.0, float(low)), min(1.0, float(high))


def _as_flags(name: str, values: object) -> np.ndarray:
    """A 1-D bool array (bool, or integer 0/1), or ValueError naming `name`."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.dtype != np.bool_:
        if not np.issubdtype(array.dtype, np.integer) or np.any((array != 0) & (array != 1)):
            raise ValueError(f"{name} must hold booleans (or 0/1), got dtype {array.dtype}")
        array = array.astype(bool)
    return array
