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


# ---------------------------------------------------------------- early rejection


def _exact_early_size(level: float) -> float:
    """The early rule's exact size for a continuous statistic: P(E) + P(not E, p_BC + spent <= level),
    summed over the uniform law of the exact p-value P (40,000-point midpoint quadrature of the
    binomial probabilities given P; the integrand is smooth, so the rule is accurate to ~1e-9)."""
    spent, look = montecarlo.early_look(level)
    cap = num_draws(level - spent)
    grid = (np.arange(40_000) + 0.5) / 40_000
    early = (1 - grid) ** look  # no exceedance in the first n_E draws
    # Besag-Clifford's rejection given not E: fewer than h exceedances in B' draws (the h-th stop
    # gives p >= h / B' > level - spent) and (k + 1) / (B' + 1) <= level - spent
    k_max = int(np.floor((level - spent) * (cap + 1))) - 1
    late = stats.binom.cdf(min(k_max, EXCEEDANCES - 1), cap, grid) - early  # k <= k_max, and >= 1 hit
    return float(np.mean(early + np.clip(late, 0, None)))


def test_early_rule_size_is_at_most_the_level_exactly():
    # Exact arithmetic (quadrature over the uniform p-value): the rule spends at most its level.
    # Overlapping events are counted once, so the sum is the size; a rule that spent more fails.
    for level in (0.05, 0.01, 2.6e-4):
        assert _exact_early_size(level) <= level * (1 + 1e-6)


def test_early_rule_is_valid_under_the_null_by_simulation():
    # 4,000 replicates of a U(0,1) statistic against U(0,1) nulls at level 0.05: every a in
    # (0.025, 0.05, 0.2) has P(p <= a) <= a, bound a + 4 sd, exceeded w.p. < 1e-4 per level.
    rng = np.random.default_rng(11)
    rule = montecarlo.EARLY_REJECTION
    p = np.array([sequential_pvalue(rng.random(), _uniform_draw, 0.05, rng, rule).p_value for _ in range(REPS)])
    for a in (0.025, 0.05, 0.2):
        assert (p <= a).mean() <= a + 4 * np.sqrt(a * (1 - a) / REPS)


def test_early_rule_rejects_a_clear_deviation_after_n_e_draws():
    level = 2.6e-4
    spent, look = montecarlo.early_look(level)
    assert look == int(np.ceil(1 / spent)) - 1 and 1 / (look + 1) <= spent
    rule = montecarlo.EARLY_REJECTION
    result = sequential_pvalue(2.0, _uniform_draw, level, np.random.default_rng(0), rule)
    assert result.stopped_early and result.exceedances == 0 and result.draws == look
    assert result.p_value == spent <= level
    # 15x fewer draws than Besag-Clifford alone, whose rejection runs to its cap
    assert num_draws(level) / result.draws > 14


def test_early_rule_under_the_null_adds_the_spent_share_and_costs_little():
    level, rule = 0.001, montecarlo.EARLY_REJECTION
    result = sequential_pvalue(0.5, _uniform_draw, level, np.random.default_rng(3), rule)
    assert result.stopped_early and result.exceedances == EXCEEDANCES
    assert result.p_value == EXCEEDANCES / result.draws + montecarlo.early_look(level)[0]
    assert result.draws < 200  # as Besag-Clifford alone: ~60 expected, 200 fails w.p. < 1e-12


def test_early_rule_decides_borderline_statistics_at_the_remaining_level():
    # A statistic that exceeds some nulls but few: no early rejection, Besag-Clifford at level - spent.
    level, rule = 0.01, montecarlo.EARLY_REJECTION
    assert montecarlo.decision_level(level, rule) == pytest.approx(level / 2)
    assert montecarlo.decision_level(level) == level
    calls = []

    def one_exceedance(rng, size):  # the very first null draw exceeds, no other does
        calls.append(size)
        return np.where(np.arange(size) == 0, 3.0, 0.0) if len(calls) == 1 else np.zeros(size)

    result = sequential_pvalue(2.0, one_exceedance, level, np.random.default_rng(5), rule)
    assert not result.stopped_early and result.exceedances == 1 and result.draws == num_draws(level / 2)
    assert result.p_value == pytest.approx(2 / (result.draws + 1) + level / 2)
    assert sum(calls) == result.draws and montecarlo.early_look(level)[1] in np.cumsum(calls)  # looked there


def test_besag_clifford_rule_is_unchanged_by_the_early_one():
    # The default rule draws and returns what it did before the early rule existed (bundles that
    # record it recompute bit for bit): the same p-values as an explicit BESAG_CLIFFORD call.
    for observed in (0.3, 0.999, 2.0):
        a = sequential_pvalue(observed, _uniform_draw, 0.002, np.random.default_rng(9))
        b = sequential_pvalue(observed, _uniform_draw, 0.002, np.random.default_rng(9), montecarlo.BESAG_CLIFFORD)
        assert a == b
    with pytest.raises(ValueError, match="rule"):
        sequential_pvalue(0.5, _uniform_draw, 0.01, np.random.default_rng(0), "no-such-rule")
