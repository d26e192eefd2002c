"""Rates: confidence intervals of observed failure rates and the uniformity of p-values (A/A runs)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from specval.stats import checks
from specval.stats.results import StatResult


def rate_ci(failures: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Clopper-Pearson (exact binomial) 1 - alpha interval of a failure rate failures / n.

    Assumptions: the n replicates are independent with a common failure probability.
    Guarantee: the interval covers the true rate with probability >= 1 - alpha (conservative).
    Scaling: width ~ 2 z sqrt(r (1 - r) / n); with 0 failures the upper end is about 3 / n at 95%.
    """
    n = checks.count("n", n, minimum=1)
    failures = checks.count("failures", failures)
    if failures > n:
        raise ValueError(f"failures must be <= n = {n}, got {failures}")
    alpha = checks.probability("alpha", alpha)
    low, high = proportion_confint(failures, n, alpha=alpha, method="beta")
    return float(low), float(high)


@dataclasses.dataclass(frozen=True)
class UniformityResult(StatResult):
    """Kolmogorov-Smirnov test of p-values against Uniform(0, 1)."""

    statistic: float
    p_value: float
    n: int


def pvalue_uniformity(p_values: Sequence[float]) -> UniformityResult:
    """KS test (scipy.stats.kstest, two-sided, exact for small n) that p-values are Uniform(0, 1).

    Assumptions: independent p-values of a continuous test statistic; a chi-square p-value is
    discrete for small samples, which makes the KS test slightly conservative or anti-conservative
    depending on the lattice, so use it on replicates with reasonably large n per replicate.
    Guarantee: for uniform p-values the false-fail rate at level alpha is alpha.
    Scaling: detects a sup-distance between CDFs of about 1.36 / sqrt(n) at 5%.
    """
    values = np.asarray(p_values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"p_values must be a non-empty 1-D sequence, got shape {values.shape}")
    if np.any(~((values >= 0) & (values <= 1))):
        raise ValueError(f"p_values must lie in [0, 1], got {values[~((values >= 0) & (values <= 1))][:3]}")
    test = stats.kstest(values, "uniform")
    return UniformityResult(float(test.statistic), float(test.pvalue), int(values.size))
