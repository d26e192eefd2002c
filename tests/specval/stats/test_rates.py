"""Rates: Clopper-Pearson intervals and the KS uniformity test on known inputs."""

import numpy as np
import pytest
from scipy import stats

from specval.stats.rates import pvalue_uniformity, rate_ci


def test_clopper_pearson_matches_beta_quantiles():
    low, high = rate_ci(7, 200, alpha=0.05)
    assert low == pytest.approx(stats.beta.ppf(0.025, 7, 194), rel=1e-9)
    assert high == pytest.approx(stats.beta.ppf(0.975, 8, 193), rel=1e-9)


def test_zero_failures_upper_end_is_closed_form():
    # P(0 failures) = (1 - r)^n = alpha / 2 at the upper end.
    low, high = rate_ci(0, 200, alpha=0.05)
    assert low == 0.0
    assert high == pytest.approx(1 - 0.025 ** (1 / 200), rel=1e-9)


def test_uniform_grid_passes_and_skewed_values_fail():
    grid = (np.arange(200) + 0.5) / 200
    assert pvalue_uniformity(grid).p_value > 0.99
    result = pvalue_uniformity(grid**2)
    expected = stats.kstest(grid**2, "uniform")
    assert result.statistic == pytest.approx(expected.statistic)
    assert result.p_value == pytest.approx(expected.pvalue) and result.p_value < 1e-6


@pytest.mark.parametrize("failures, n, field", [(3, 0, "n"), (5, 4, "failures"), (-1, 4, "failures")])
def test_bad_rate_input_names_the_field(failures, n, field):
    with pytest.raises(ValueError, match=field):
        rate_ci(failures, n)


def test_bad_p_values_are_refused():
    with pytest.raises(ValueError, match="p_values"):
        pvalue_uniformity([0.5, 1.2])
    with pytest.raises(ValueError, match="p_values"):
        pvalue_uniformity([])
