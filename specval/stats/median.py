"""Median: the exact distribution-free confidence interval for a median from order statistics.

For n independent draws of a continuous distribution with median m, the number of draws below m is
Binomial(n, 1/2) whatever the distribution. So the interval [x_(k), x_(n-k+1)] between the k-th
smallest and the k-th largest draw misses m with probability exactly 2 P(Bin(n, 1/2) <= k - 1)
(the sign-test interval). `median_interval` takes the largest k whose exact coverage is still >=
the confidence asked for, computed with scipy.stats.binom, and reports that exact coverage.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from specval.stats.results import StatResult

HALF = 0.5  # the probability that one draw lies below the median


@dataclasses.dataclass(frozen=True)
class MedianInterval(StatResult):
    """Sample median with the order-statistic interval [low, high] = [x_(k), x_(n-k+1)].

    `coverage` is the exact probability that the interval covers the true median (continuous
    distributions; >= it with ties), `confidence` the level asked for (coverage >= confidence);
    `tail` = P(Bin(n, 1/2) <= k - 1) is the exact probability that low lies above the median (and,
    by symmetry, that high lies below it): coverage = 1 - 2 tail.
    """

    n: int
    median: float
    low: float
    high: float
    rank: int  # k: low is the k-th smallest value, high the k-th largest
    confidence: float
    coverage: float
    tail: float


def rank_for(n: int, confidence: float) -> tuple[int, float]:
    """(k, exact coverage) of the narrowest order-statistic interval whose coverage is >= confidence.

    Assumptions: n >= 1, 0 < confidence < 1.
    Guarantee: k is the largest integer in [1, n/2] with 1 - 2 binom.cdf(k - 1, n, 1/2) >= confidence;
    ValueError naming n and the best coverage n can give when even k = 1 (min and max) falls short.
    Scaling: O(n) evaluations of the binomial CDF.
    """
    if n < 1:
        raise ValueError(f"n={n} is invalid: a median interval needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} is invalid: must lie in (0, 1)")
    ranks = np.arange(1, n // 2 + 1)
    coverages = 1.0 - 2.0 * stats.binom.cdf(ranks - 1, n, HALF)
    ok = ranks[coverages >= confidence]
    if ok.size == 0:
        raise ValueError(
            f"n={n} values cannot give a {confidence:g} median interval: the widest one "
            f"(min, max) covers with probability {1.0 - 2.0 * HALF**n:.4g}; "
            f"at least {min_count(confidence)} are needed"
        )
    k = int(ok.max())
    return k, float(1.0 - 2.0 * stats.binom.cdf(k - 1, n, HALF))


def min_count(confidence: float) -> int:
    """The fewest values whose (min, max) interval reaches `confidence`: 1 - 2 / 2^n >= confidence."""
    n = 2
    while 1.0 - 2.0 * HALF**n < confidence:
        n += 1
    return n


def median_interval(values: np.ndarray, confidence: float) -> MedianInterval:
    """Sample median of `values` [n] and its exact distribution-free interval at `confidence`.

    Assumptions: the values are independent draws of one distribution (continuous for exact
    coverage; with ties the closed interval covers at least as often). Nothing about its shape.
    Guarantee: P(low <= true median <= high) = coverage >= confidence; P(low > median) =
    P(high < median) = tail <= (1 - confidence) / 2. ValueError for non-finite values or an n
    too small for the confidence (see `rank_for`).
    Scaling: the interval's width shrinks like 1 / sqrt(n) (k ~ n/2 - z sqrt(n)/2).
    """
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or not np.all(np.isfinite(array)):
        raise ValueError(f"values must be a 1-D array of finite numbers, got {array[:5]!r}")
    n = int(array.size)
    k, coverage = rank_for(n, confidence)
    ordered = np.sort(array)
    return MedianInterval(
        n=n,
        median=float(np.median(ordered)),
        low=float(ordered[k - 1]),
        high=float(ordered[n - k]),
        rank=k,
        confidence=float(confidence),
        coverage=coverage,
        tail=float(stats.binom.cdf(k - 1, n, HALF)),
    )
