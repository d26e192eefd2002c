"""Goodness of fit: known answers against scipy, out-of-support FAIL, df bookkeeping, aggregation."""

import json

import numpy as np
import pytest
from scipy import stats

from specval.stats.gof import aggregate_gof, goodness_of_fit
from specval.stats.power import simulate_power


def test_unpooled_matches_scipy_chisquare():
    observed = np.array([30, 25, 20, 25])
    probs = np.array([0.25, 0.25, 0.25, 0.25])
    result = goodness_of_fit(observed, probs)
    expected = stats.chisquare(observed, np.full(4, 25.0))
    assert result.statistic == pytest.approx(expected.statistic, rel=1e-12)
    assert result.p_value == pytest.approx(expected.pvalue, rel=1e-12)
    assert (result.df, result.num_cells, result.n, result.out_of_support) == (3, 4, 100, 0)


def test_pooled_matches_hand_pooled_table():
    # n = 100, expected [50, 30, 12, 4, 3, 1]: small 1, 3, 4 -> 1 + 3 + 4 = 8 closes one group.
    probs = np.array([0.5, 0.3, 0.12, 0.04, 0.03, 0.01])
    observed = np.array([45, 33, 10, 7, 2, 3])
    result = goodness_of_fit(observed, probs)
    hand = stats.chisquare([45, 33, 10, 7 + 2 + 3], [50.0, 30.0, 12.0, 8.0])
    assert result.statistic == pytest.approx(hand.statistic, rel=1e-12)
    assert result.p_value == pytest.approx(hand.pvalue, rel=1e-12)
    assert (result.df, result.num_cells, result.num_pooled_tokens) == (3, 4, 3)
    assert result.expected_min == pytest.approx(8.0)


def test_unnormalised_weights_are_normalised():
    observed = np.array([40, 60])
    assert goodness_of_fit(observed, np.array([2.0, 3.0])).p_value == pytest.approx(
        goodness_of_fit(observed, np.array([0.4, 0.6])).p_value, rel=1e-12
    )


def test_out_of_support_token_is_an_immediate_fail():
    probs = np.array([0.5, 0.5, 0.0])
    result = goodness_of_fit(np.array([50, 49, 1]), probs)
    assert result.p_value == 0.0
    assert result.out_of_support == 1
    assert np.isfinite(result.statistic)
    assert goodness_of_fit(np.array([50, 50, 0]), probs).p_value == pytest.approx(1.0)


def test_single_cell_is_degenerate():
    result = goodness_of_fit(np.array([10, 0]), np.array([1.0, 0.0]))
    assert (result.df, result.p_value, result.is_degenerate) == (0, 1.0, True)
    empty = goodness_of_fit(np.array([0, 0]), np.array([0.5, 0.5]))
    assert (empty.df, empty.p_value, empty.is_degenerate, empty.n) == (0, 1.0, True, 0)


def test_aggregate_sums_statistics_and_df():
    rng = np.random.default_rng(3)
    results = [goodness_of_fit(rng.multinomial(200, [0.2, 0.3, 0.5]), [0.2, 0.3, 0.5]) for _ in range(4)]
    results.append(goodness_of_fit(np.array([7, 0]), np.array([1.0, 0.0])))  # degenerate
    total = aggregate_gof(results)
    assert total.statistic == pytest.approx(sum(r.statistic for r in results[:4]))
    assert total.df == 8
    assert total.p_value == pytest.approx(stats.chi2.sf(total.statistic, 8))
    assert (total.num_strata, total.num_informative, total.n) == (5, 4, 807)


def test_aggregate_fails_on_any_out_of_support_stratum():
    good = goodness_of_fit(np.array([50, 50, 0]), np.array([0.5, 0.5, 0.0]))
    bad = goodness_of_fit(np.array([50, 49, 1]), np.array([0.5, 0.5, 0.0]))
    assert aggregate_gof([good, good]).p_value > 0.5
    assert aggregate_gof([good, bad]).p_value == 0.0


def test_false_fail_rate_is_alpha_under_h0():
    # 2,000 fixed-seed A/A replicates at alpha = 0.05 with pooling active: the rejection rate must
    # be within 0.05 +- 0.02 (4 Monte Carlo standard errors; false-fail rate of this check < 1e-4
    # if the chi-square approximation holds).
    probs = np.array([0.3, 0.25, 0.2, 0.1, 0.08, 0.04, 0.02, 0.01])
    result = simulate_power(probs, probs, 300, 0.05, 2000, np.random.default_rng(2024))
    assert 0.03 <= result.power <= 0.07


def test_to_dict_is_json_safe():
    result = goodness_of_fit(np.array([5, 6, 7]), np.array([0.3, 0.3, 0.4]), min_expected=1.0)
    payload = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert payload["df"] == 2 and isinstance(payload["is_degenerate"], bool)


@pytest.mark.parametrize(
    "observed, probs, field",
    [
        (np.array([1, 2]), np.array([0.5, 0.25, 0.25]), "same shape"),
        (np.array([1, -2]), np.array([0.5, 0.5]), "observed"),
        (np.array([1.5, 2]), np.array([0.5, 0.5]), "observed"),
        (np.array([1, 2]), np.array([0.5, np.nan]), "probs"),
        (np.array([1, 2]), np.array([0.0, 0.0]), "probs"),
        (np.array([[1, 2]]), np.array([0.5, 0.5]), "observed"),
    ],
)
def test_bad_input_names_the_field(observed, probs, field):
    with pytest.raises(ValueError, match=field):
        goodness_of_fit(observed, probs)
