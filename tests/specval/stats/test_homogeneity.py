"""Two-sample homogeneity: equals chi2_contingency on the hand-pooled table; margins-only pooling."""

import numpy as np
import pytest
from scipy import stats

from specval.stats.homogeneity import aggregate_homogeneity, homogeneity


def test_unpooled_matches_chi2_contingency():
    a, b = np.array([30, 40, 30]), np.array([20, 50, 30])
    result = homogeneity(a, b)
    hand = stats.chi2_contingency(np.stack([a, b]), correction=False)
    assert result.statistic == pytest.approx(hand.statistic, rel=1e-12)
    assert result.p_value == pytest.approx(hand.pvalue, rel=1e-12)
    assert (result.df, result.n_a, result.n_b, result.num_cells) == (2, 100, 100, 3)


def test_pooled_matches_hand_pooled_table():
    # n_a = n_b = 100; column minima 100 * total / 200 = [40, 40, 9.5, 4, 3.5, 2, 1]: the small
    # ones 1, 2, 3.5 close a group at 6.5, and the remainder 4 joins it (smaller than 9.5).
    a = np.array([40, 42, 10, 4, 3, 1, 0])
    b = np.array([40, 38, 9, 4, 4, 3, 2])
    result = homogeneity(a, b)
    table = np.array([[40, 42, 10, 4 + 3 + 1 + 0], [40, 38, 9, 4 + 4 + 3 + 2]])
    hand = stats.chi2_contingency(table, correction=False)
    assert result.statistic == pytest.approx(hand.statistic, rel=1e-12)
    assert result.p_value == pytest.approx(hand.pvalue, rel=1e-12)
    assert (result.df, result.num_cells) == (3, 4)


def test_hint_decides_pooling():
    # Hint [0.5, 0.45, 0.03, 0.02] with min(n_a, n_b) = 100: minima 50, 45, 3, 2 -> last two pooled
    a, b = np.array([50, 44, 6, 0]), np.array([48, 46, 1, 5])
    result = homogeneity(a, b, np.array([0.5, 0.45, 0.03, 0.02]))
    hand = stats.chi2_contingency(np.array([[50, 44, 6], [48, 46, 6]]), correction=False)
    assert result.statistic == pytest.approx(hand.statistic, rel=1e-12)
    assert result.num_cells == 3


def test_tokens_outside_the_hint_form_their_own_column():
    a, b = np.array([50, 50, 0]), np.array([45, 45, 10])
    result = homogeneity(a, b, np.array([0.5, 0.5, 0.0]))
    hand = stats.chi2_contingency(np.array([[50, 50, 0], [45, 45, 10]]), correction=False)
    assert result.out_of_hint == 10
    assert result.statistic == pytest.approx(hand.statistic, rel=1e-12)


def test_pooling_uses_the_margins_only():
    # Moving one sample a->b in column 0 and b->a in column 1 keeps every margin, so the cells and
    # their minimum expected count must not change, while the statistic does.
    a = np.array([30, 20, 3, 2, 1, 4])
    b = np.array([25, 25, 2, 3, 4, 1])
    moved_a, moved_b = a + [-1, 1, 0, 0, 0, 0], b + [1, -1, 0, 0, 0, 0]
    first, second = homogeneity(a, b), homogeneity(moved_a, moved_b)
    assert (first.num_cells, first.expected_min) == (second.num_cells, second.expected_min)
    assert first.statistic != second.statistic


def test_degenerate_cases():
    assert homogeneity(np.array([5, 0]), np.array([0, 0])).is_degenerate
    one = homogeneity(np.array([5, 0]), np.array([7, 0]))
    assert (one.df, one.p_value, one.is_degenerate) == (0, 1.0, True)


def test_aggregate_sums_statistics_and_df():
    rng = np.random.default_rng(8)
    results = [
        homogeneity(rng.multinomial(150, [0.5, 0.3, 0.2]), rng.multinomial(120, [0.5, 0.3, 0.2])) for _ in range(3)
    ]
    total = aggregate_homogeneity(results)
    assert total.statistic == pytest.approx(sum(r.statistic for r in results))
    assert total.df == 6 and total.n == 3 * 270
    assert total.p_value == pytest.approx(stats.chi2.sf(total.statistic, 6))


@pytest.mark.parametrize(
    "a, b, hint, field",
    [
        (np.array([1, 2]), np.array([1, 2, 3]), None, "same shape"),
        (np.array([1, -2]), np.array([1, 2]), None, "counts_a"),
        (np.array([1, 2]), np.array([1, 2]), np.array([1.0, -1.0]), "probs_hint"),
    ],
)
def test_bad_input_names_the_field(a, b, hint, field):
    with pytest.raises(ValueError, match=field):
        homogeneity(a, b, hint)
