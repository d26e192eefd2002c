"""Sequential Monte Carlo p-values: validity (P(p <= a) <= a), the decision rule, determinism.

Statistical tests here use fixed seeds. False-fail rates are stated per assertion.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specval.stats import montecarlo
from specval.stats.montecarlo import EXCEEDANCES, criterion_rng, decision_power, num_draws, sequential_pvalue

REPS = 4000


def _uniform_draw(rng, size):
    return rng.random(size)


def test_pvalue_is_valid_under_the_null():
    # Observed ~ U(0,1), null draws ~ U(0,1): the p-value must satisfy P(p <= a) <= a. With 4,000
    # replicates the rejection count at a is Binomial(4000, <= a); the bound a + 4 sd is exceeded
    # with probability < 1e-4 per level (3 levels).
    rng = np.random.default_rng(7)
    p = np.array([sequential_pvalue(rng.random(), _uniform_draw, 0.02, rng).p_value for _ in range(REPS)])
    for a in (0.02, 0.05, 0.2):
        assert (p <= a).mean() <= a + 4 * np.sqrt(a * (1 - a) / REPS)
    # and not grossly conservative: the KS distance to the uniform law is small (fails w.p. << 1e-4)
    assert stats.kstest(p, "uniform").statistic < 0.06


def test_decision_rule_resolves_the_level():
    level = 0.01 / 6
    assert num_draws(level) == int(np.ceil(EXCEEDANCES / level))
    assert decision_power(level) > 0.9995  # exact binomial arithmetic, no sampling
    # A statistic above every null draw is rejected at level with the smallest p-value 1 / (B + 1).
    result = sequential_pvalue(2.0, _uniform_draw, level, np.random.default_rng(0))
    assert not result.stopped_early and result.draws == num_draws(level)
    assert result.p_value == pytest.approx(1 / (num_draws(level) + 1)) and result.p_value <= level


def test_early_stop_gives_h_over_draws_and_costs_little_under_the_null():
    result = sequential_pvalue(0.5, _uniform_draw, 0.001, np.random.default_rng(3))
    assert result.stopped_early and result.exceedances == EXCEEDANCES
    assert result.p_value == EXCEEDANCES / result.draws
    assert result.draws < 200  # ~ h / 0.5 = 60 expected; 200 fails w.p. < 1e-12


def test_ties_count_as_exceedances():
    # A discrete null equal to the observed value: every draw is a tie, so p = h / h = 1.
    result = sequential_pvalue(3.0, lambda rng, size: np.full(size, 3.0), 0.01, np.random.default_rng(0))
    assert result.p_value == 1.0


def test_criterion_rng_is_deterministic_and_keyed():
    a = criterion_rng("hash", "t2_gof.sync", "sync:0-3000").random(4)
    assert np.array_equal(a, criterion_rng("hash", "t2_gof.sync", "sync:0-3000").random(4))
    assert not np.array_equal(a, criterion_rng("hash", "t2_gof.sync", "sync:3000-6000").random(4))


def test_level_is_checked():
    with pytest.raises(ValueError, match="level"):
        montecarlo.num_draws(0.0)
