"""Power: MDE against statsmodels, monotonicity, inverse, w >= 2 TV, and Monte Carlo power runs."""

import math

import numpy as np
import pytest
from statsmodels.stats.power import GofChisquarePower

from specval.stats.gof import aggregate_gof, goodness_of_fit
from specval.stats.homogeneity import homogeneity
from specval.stats.power import (
    NOTHING_DETECTABLE,
    effective_n,
    mde_tv,
    mde_tv_two_sample,
    samples_for_tv,
    samples_for_tv_two_sample,
    simulate_power,
)


def _balanced_deviation(num_bins: int, tv: float) -> tuple[np.ndarray, np.ndarray]:
    """Uniform p0 and p1 = p0 (1 +- 2 tv): |p1 - p0| / p0 is constant, so w = 2 TV exactly."""
    p0 = np.full(num_bins, 1.0 / num_bins)
    sign = np.r_[np.ones(num_bins // 2), -np.ones(num_bins // 2)]
    return p0, p0 * (1 + 2 * tv * sign)


def test_mde_is_half_of_cohens_w():
    w = GofChisquarePower().solve_power(effect_size=None, nobs=5000, alpha=0.01, power=0.9, n_bins=20)
    assert mde_tv(5000, 20, 0.01, 0.9) == pytest.approx(w / 2, rel=1e-12)


def test_mde_decreases_with_n_and_grows_with_bins():
    values = [mde_tv(n, 12, 0.01) for n in (100, 400, 1600, 6400)]
    assert all(a > b for a, b in zip(values, values[1:]))
    # ~1 / sqrt(n): quadrupling n halves the MDE (up to the noncentrality solve).
    assert values[2] / values[3] == pytest.approx(2.0, rel=1e-3)
    assert mde_tv(1000, 50, 0.01) > mde_tv(1000, 5, 0.01)


def test_samples_for_tv_inverts_mde():
    n = samples_for_tv(0.05, 10, 0.01, 0.8)
    assert mde_tv(n, 10, 0.01, 0.8) <= 0.05 < mde_tv(n - 1, 10, 0.01, 0.8)


def test_nothing_detectable_without_data_or_bins():
    assert mde_tv(0, 10, 0.01) == NOTHING_DETECTABLE
    assert mde_tv(100, 1, 0.01) == NOTHING_DETECTABLE
    assert mde_tv_two_sample(100, 0, 10, 0.01) == NOTHING_DETECTABLE


def test_w_bounds_twice_tv_on_random_laws():
    rng = np.random.default_rng(9)
    for _ in range(200):
        p0, p1 = rng.dirichlet(np.full(15, 0.7)), rng.dirichlet(np.full(15, 0.7))
        w = math.sqrt(np.sum((p1 - p0) ** 2 / p0))
        assert w >= np.abs(p1 - p0).sum() - 1e-12


def test_two_sample_uses_the_effective_n():
    assert effective_n(300, 600) == pytest.approx(200.0)
    assert mde_tv_two_sample(300, 600, 8, 0.01) == pytest.approx(mde_tv(200, 8, 0.01), rel=1e-12)


def test_power_at_the_mde_matches_monte_carlo():
    # Deviation exactly at the MDE (w = 2 TV): 2,000 fixed-seed replicates must reject at
    # 0.80 +- 0.05 (Monte Carlo SE 0.009, so a correct power formula fails with probability < 1e-6;
    # the margin also absorbs the noncentral chi-square approximation, ~0.01 here).
    n, bins, alpha = 2000, 10, 0.05
    p0, p1 = _balanced_deviation(bins, mde_tv(n, bins, alpha, 0.8))
    result = simulate_power(p0, p1, n, alpha, 2000, np.random.default_rng(1))
    assert abs(result.power - 0.8) <= 0.05
    assert result.ci_low <= result.power <= result.ci_high


def test_two_sample_power_at_the_mde_matches_monte_carlo():
    # Same for the homogeneity test with n_a = n_b = 2000 over 1,000 fixed-seed replicates; the
    # pooled law makes the true w2 slightly above 2 TV, so the power is >= 0.8 in theory. Accepted:
    # [0.75, 0.88] (Monte Carlo SE 0.013; false-fail rate < 1e-4).
    n, bins, alpha = 2000, 10, 0.05
    p0, p1 = _balanced_deviation(bins, mde_tv_two_sample(n, n, bins, alpha, 0.8))
    rng = np.random.default_rng(2)
    a, b = rng.multinomial(n, p0, size=1000), rng.multinomial(n, p1, size=1000)
    power = np.mean([homogeneity(x, y).p_value < alpha for x, y in zip(a, b)])
    assert 0.75 <= power <= 0.88


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: mde_tv(-1, 10, 0.01), "n"),
        (lambda: mde_tv(100, 10, 0.0), "alpha"),
        (lambda: mde_tv(100, 10, 0.01, 1.0), "power"),
        (lambda: mde_tv(100, 2.5, 0.01), "n_bins"),
        (lambda: samples_for_tv(0.0, 10, 0.01), "tv"),
        (lambda: samples_for_tv(0.1, 1, 0.01), "n_bins"),
        (lambda: simulate_power(np.ones(3), np.ones(4), 10, 0.05, 5, np.random.default_rng(0)), "same shape"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_two_sample_size_inverts_the_two_sample_mde():
    n = samples_for_tv_two_sample(0.05, 10, 0.01, 0.8)
    assert mde_tv_two_sample(n, n, 10, 0.01, 0.8) <= 0.05 < mde_tv_two_sample(n - 4, n - 4, 10, 0.01, 0.8)


def test_aggregate_mde_is_the_rms_tv_over_strata():
    # Five strata of 400 samples and 6 bins, each deviating by exactly the aggregate MDE
    # (mde_tv(sum n, sum df + 1)) with w = 2 TV: 1,000 fixed-seed replicates of the aggregated
    # test must reject at 0.80 +- 0.06 (Monte Carlo SE 0.013: false-fail rate < 1e-4).
    strata, n, bins, alpha = 5, 400, 6, 0.05
    d = mde_tv(strata * n, strata * (bins - 1) + 1, alpha, 0.8)
    p0, p1 = _balanced_deviation(bins, d)
    rng = np.random.default_rng(12)
    samples = rng.multinomial(n, p1, size=(1000, strata))
    power = np.mean([aggregate_gof([goodness_of_fit(s, p0) for s in rep]).p_value < alpha for rep in samples])
    assert abs(power - 0.8) <= 0.06
