"""McNemar: exact p on a hand-computed table, Newcombe's published example, interval coverage."""

import numpy as np
import pytest

from specval.stats.mcnemar import newcombe_paired_ci, paired_comparison


def _vectors(both, wins, losses, neither):
    a = np.array([True] * both + [False] * wins + [True] * losses + [False] * neither)
    b = np.array([True] * both + [True] * wins + [False] * losses + [False] * neither)
    return a, b


def test_exact_p_value_on_a_known_table():
    # 2 wins vs 8 losses: two-sided exact binomial p = 2 * (1 + 10 + 45) / 2^10.
    a, b = _vectors(both=20, wins=2, losses=8, neither=10)
    result = paired_comparison(a, b, alpha=0.05)
    assert result.p_value == pytest.approx(112 / 1024, rel=1e-12)
    assert (result.wins, result.losses, result.ties, result.n) == (2, 8, 30, 40)
    assert result.diff == pytest.approx(-6 / 40)
    assert result.acc_a == pytest.approx(28 / 40) and result.acc_b == pytest.approx(22 / 40)
    assert result.ci_low < result.diff < result.ci_high
    assert result.non_inferior is None


def test_newcombe_published_example():
    # Newcombe (1998), Stat. Med. 17:2635, paired example (36, 12, 2, 0), method 10: 0.0569 to 0.3404.
    low, high = newcombe_paired_ci(both=36, wins=12, losses=2, neither=0, alpha=0.05)
    assert (round(low, 4), round(high, 4)) == (0.0569, 0.3404)


def test_non_inferiority_uses_the_lower_end():
    a, b = _vectors(both=60, wins=5, losses=7, neither=28)
    result = paired_comparison(a, b, alpha=0.05, margin=0.1)
    assert result.non_inferior == (result.ci_low > -0.1)
    tight = paired_comparison(a, b, alpha=0.05, margin=0.01)
    assert tight.non_inferior is False and result.non_inferior is True


def test_interval_coverage_near_nominal():
    # 2,000 fixed-seed paired samples of n = 60 with correlated correctness; the true difference
    # is 0.65 - 0.60 = 0.05. Newcombe's interval should cover it at about 95%; we accept
    # [0.93, 0.975] (the Monte Carlo standard error is 0.005, so a correct interval with coverage
    # in [0.94, 0.965] falsely fails with probability < 1e-3).
    rng = np.random.default_rng(77)
    probs = np.array([0.55, 0.10, 0.05, 0.30])  # both, wins (b only), losses (a only), neither
    hits = 0
    for cells in rng.multinomial(60, probs, size=2000):
        low, high = newcombe_paired_ci(*(int(c) for c in cells), alpha=0.05)
        hits += low <= 0.05 <= high
    assert 0.93 <= hits / 2000 <= 0.975


@pytest.mark.parametrize(
    "a, b, kwargs, field",
    [
        (np.array([True, False]), np.array([True]), {"alpha": 0.05}, "paired"),
        (np.array([1, 2]), np.array([1, 0]), {"alpha": 0.05}, "correct_a"),
        (np.array([True]), np.array([True]), {"alpha": 1.0}, "alpha"),
        (np.array([True]), np.array([True]), {"alpha": 0.05, "margin": -0.1}, "margin"),
    ],
)
def test_bad_input_names_the_field(a, b, kwargs, field):
    with pytest.raises(ValueError, match=field):
        paired_comparison(a, b, **kwargs)
