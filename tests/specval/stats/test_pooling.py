"""Cell pooling: the hand-worked rule, determinism, and blindness to observed counts."""

import numpy as np
import pytest

from specval.stats.gof import goodness_of_fit
from specval.stats.pooling import OUT_OF_SUPPORT, pool_cells


def test_hand_worked_greedy_group():
    # Big cells 0 (10) and 1 (6); small 0.5, 1, 2, 3 merge in ascending order into one group of
    # 6.5 that closes on reaching 5; the zero token is out of support.
    pooling = pool_cells(np.array([10.0, 6.0, 1.0, 2.0, 3.0, 0.5, 0.0]), 5.0)
    assert pooling.cell_of_token.tolist() == [0, 1, 2, 2, 2, 2, OUT_OF_SUPPORT]
    assert pooling.cell_expected.tolist() == [10.0, 6.0, 6.5]
    assert pooling.num_pooled_tokens == 4


def test_remainder_joins_smallest_cell():
    # Small tokens 1 + 3 = 4 < 5 never close a group: they join the smallest cell (7, token 1).
    pooling = pool_cells(np.array([10.0, 7.0, 3.0, 1.0]), 5.0)
    assert pooling.cell_of_token.tolist() == [0, 1, 1, 1]
    assert pooling.cell_expected.tolist() == [10.0, 11.0]


def test_remainder_joins_smallest_formed_group():
    # Small 1, 2, 2.5 close a group of 5.5 (cell 1), smaller than the big cell 20; the remainder 4
    # joins that group.
    pooling = pool_cells(np.array([20.0, 2.0, 1.0, 4.0, 2.5]), 5.0)
    assert pooling.cell_of_token.tolist() == [0, 1, 1, 1, 1]
    assert pooling.cell_expected.tolist() == [20.0, 9.5]


def test_ties_in_expected_break_by_token_index():
    pooling = pool_cells(np.array([3.0, 3.0, 3.0, 3.0]), 5.0)
    # Sorted by (expected, index): tokens 0, 1 close cell 0; tokens 2, 3 close cell 1.
    assert pooling.cell_of_token.tolist() == [0, 0, 1, 1]


def test_everything_small_is_one_cell():
    pooling = pool_cells(np.array([1.0, 0.0, 2.0]), 5.0)
    assert pooling.cell_of_token.tolist() == [0, OUT_OF_SUPPORT, 0]
    assert pooling.num_cells == 1


def test_zero_minimum_keeps_every_positive_token():
    pooling = pool_cells(np.array([0.1, 0.0, 0.2, 3.0]), 0.0)
    assert pooling.cell_of_token.tolist() == [0, OUT_OF_SUPPORT, 1, 2]


def test_every_cell_reaches_the_minimum_on_random_inputs():
    rng = np.random.default_rng(11)
    for _ in range(50):
        expected = rng.gamma(0.3, size=int(rng.integers(2, 60))) * rng.uniform(1, 200)
        expected[rng.random(expected.size) < 0.1] = 0.0
        pooling = pool_cells(expected, 5.0)
        assert np.isclose(pooling.cell_expected.sum(), expected.sum())
        assert (pooling.cell_of_token == OUT_OF_SUPPORT).tolist() == (expected == 0).tolist()
        if pooling.num_cells > 1:
            assert pooling.cell_expected.min() >= 5.0


def test_observed_counts_cannot_change_the_pooling():
    # Any observed vector with the same n (here: permutations and fresh draws) must see the same
    # cells: the pooling is a function of n * p alone.
    rng = np.random.default_rng(5)
    probs = rng.gamma(0.4, size=40)
    base = rng.multinomial(300, probs / probs.sum())
    reference = goodness_of_fit(base, probs)
    for _ in range(20):
        for observed in (rng.permutation(base), rng.multinomial(300, rng.dirichlet(np.ones(40)))):
            result = goodness_of_fit(observed, probs)
            assert (result.num_cells, result.num_pooled_tokens, result.expected_min) == (
                reference.num_cells,
                reference.num_pooled_tokens,
                reference.expected_min,
            )


@pytest.mark.parametrize(
    "expected, minimum, field",
    [
        (np.array([1.0, -1.0]), 5.0, "expected"),
        (np.array([1.0, np.nan]), 5.0, "expected"),
        (np.array([1.0, 2.0]), -1.0, "min_expected"),
        (np.array([1.0, 2.0]), float("inf"), "min_expected"),
    ],
)
def test_bad_input_names_the_field(expected, minimum, field):
    with pytest.raises(ValueError, match=field):
        pool_cells(expected, minimum)


def _sequential_pooling(expected, minimum):
    """The rule of the module docstring written as a plain token-by-token loop."""
    cells = [[int(t)] for t in np.flatnonzero(expected >= minimum) if expected[t] > 0]
    sums = [float(expected[c[0]]) for c in cells]
    small = sorted((float(expected[t]), int(t)) for t in np.flatnonzero((expected > 0) & (expected < minimum)))
    group, total = [], 0.0
    for value, token in small:
        group.append(token)
        total += value
        if total >= minimum:
            cells.append(group)
            sums.append(total)
            group, total = [], 0.0
    if group and cells:
        target = int(np.argmin(sums))
        cells[target] += group
        sums[target] += total
    elif group:
        cells, sums = [group], [total]
    out = np.full(expected.shape, -1)
    for index, members in enumerate(cells):
        out[members] = index
    return out.tolist(), sums


def test_matches_a_sequential_reference_on_random_inputs():
    # Values on a 1/4 grid keep every partial sum exact, so both implementations must agree exactly.
    rng = np.random.default_rng(21)
    for _ in range(200):
        expected = rng.integers(0, 40, size=int(rng.integers(1, 80))) / 4.0
        pooling = pool_cells(expected, 5.0)
        assert (pooling.cell_of_token.tolist(), pooling.cell_expected.tolist()) == _sequential_pooling(expected, 5.0)
