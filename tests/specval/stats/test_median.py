"""Median interval: exact ranks and coverages from the binomial, and Monte Carlo coverage on skewed,
heavy-tailed and discrete distributions."""

import math

import numpy as np
import pytest
from scipy import stats

from specval.stats.median import median_interval, min_count, rank_for

REPLICATES = 2000
BAND = 1e-6  # two-sided probability mass outside the accepted band of a binomial count


def _band(replicates: int, rate: float) -> tuple[int, int]:
    """Counts a correct implementation stays within except with probability <= BAND."""
    return (int(stats.binom.ppf(BAND / 2, replicates, rate)), int(stats.binom.isf(BAND / 2, replicates, rate)))


@pytest.mark.parametrize(
    "n, confidence, k, misses_over",
    [
        (6, 0.95, 1, 2),  # min and max: miss 2 / 2^6
        (10, 0.95, 2, 2 * (1 + 10)),  # 2 P(Bin <= 1) = 22 / 1024
        (20, 0.95, 6, 2 * (1 + 20 + 190 + 1140 + 4845 + 15504)),  # 2 P(Bin(20) <= 5)
        (8, 0.99, 1, 2),
    ],
)
def test_rank_and_exact_coverage_by_hand(n, confidence, k, misses_over):
    rank, coverage = rank_for(n, confidence)
    assert rank == k
    assert coverage == pytest.approx(1.0 - misses_over / 2**n, rel=1e-12)
    # k + 1 would fall short of the confidence: k is the narrowest rank allowed
    assert 1.0 - 2.0 * stats.binom.cdf(k, n, 0.5) < confidence


def test_too_few_values_is_an_error_naming_the_minimum():
    assert min_count(0.95) == 6 and min_count(0.99) == 8 and min_count(0.5) == 2
    with pytest.raises(ValueError, match=r"n=5 .* at least 6"):
        rank_for(5, 0.95)
    with pytest.raises(ValueError, match="confidence"):
        rank_for(10, 1.0)
    with pytest.raises(ValueError, match="finite"):
        median_interval(np.array([1.0, np.nan, 2, 3, 4, 5]), 0.95)


def test_interval_is_the_kth_order_statistics():
    values = np.array([5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 10.0])
    result = median_interval(values, 0.95)
    assert (result.rank, result.low, result.high, result.median) == (2, 2.0, 9.0, 5.5)
    assert result.tail == pytest.approx(11 / 1024, rel=1e-12)
    assert result.coverage == pytest.approx(1 - 2 * result.tail, rel=1e-12)


@pytest.mark.parametrize(
    "n, draw, median",
    [
        (10, lambda rng, size: rng.lognormal(0.0, 1.0, size), 1.0),  # skewed: median exp(0)
        (20, lambda rng, size: 1.0 + rng.standard_cauchy(size), 1.0),  # no mean at all
        (31, lambda rng, size: rng.exponential(2.0, size), 2.0 * math.log(2.0)),
    ],
)
def test_monte_carlo_coverage_matches_the_binomial(n, draw, median):
    # REPLICATES fixed-seed intervals. Each tail count is Binomial(REPLICATES, tail) for a correct
    # interval (exact for continuous draws), so the assertions falsely fail with probability <= 2e-6
    # per case. Power: one rank off (k + 1) at n = 10 raises each tail from 0.0107 to 0.0547, i.e.
    # from ~21 to ~109 of 2,000, far outside the band [3, 47].
    rng = np.random.default_rng(20261201 + n)
    below = above = 0
    result = None
    for _ in range(REPLICATES):
        result = median_interval(draw(rng, n), 0.95)
        below += result.high < median
        above += result.low > median
    low, high = _band(REPLICATES, result.tail)
    assert low <= above <= high and low <= below <= high, (above, below, (low, high), result.tail)
    assert result.coverage >= 0.95


def test_ties_only_make_the_interval_conservative():
    # Discrete values (many ties at the median 2): the closed interval covers at least as often as
    # the continuous coverage. Miss counts are Binomial(REPLICATES, <= tail): the upper end of the
    # band is exceeded with probability <= 5e-7.
    rng = np.random.default_rng(7)
    misses = 0
    for _ in range(REPLICATES):
        result = median_interval(rng.integers(0, 5, 12).astype(float), 0.95)
        misses += not result.low <= 2.0 <= result.high
    assert misses <= _band(REPLICATES, 1 - result.coverage)[1]


def test_an_order_effect_only_makes_the_interval_conservative():
    # ABBA pairs alternate a-first and b-first; with an order effect the ratios alternate between two
    # distributions (here lognormal with log-medians +0.05 and -0.05, sd 0.1). The parameter is the
    # median of their balanced mixture, exp(0) = 1 by symmetry. The count of ratios below it is a sum
    # of Bernoullis with mean n/2 and less spread than Bin(n, 1/2), so misses may only be rarer than
    # 1 - coverage (Hoeffding 1956); a count above the band's upper end has probability <= 5e-7 if so.
    rng = np.random.default_rng(3)
    shift = np.where(np.arange(20) % 2 == 0, 0.05, -0.05)
    misses = 0
    for _ in range(REPLICATES):
        result = median_interval(np.exp(shift + rng.normal(0.0, 0.1, 20)), 0.95)
        misses += not result.low <= 1.0 <= result.high
    assert misses <= _band(REPLICATES, 1 - result.coverage)[1]
