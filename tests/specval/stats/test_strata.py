"""Stratified criteria: exact size, joint testing of small strata, and the printed MDE verified by
Monte Carlo (GOF, homogeneity, aggregated over strata; one and two stages).

Seeds are fixed. False-fail rates: a size check "rate <= a + 3 sd" fails with probability
< 0.0015 for a correct test; a power check "rate >= 0.8 - 3 sd" (sd = sqrt(0.16 / reps)) fails with
probability < 0.0015 when the true power is >= 0.8.
"""

from __future__ import annotations

import numpy as np
import pytest

from specval.stats import power
from specval.stats.montecarlo import DECISION_LEVEL_FACTOR, decision_power
from specval.stats.strata import JOINT, gof_components, stratified_gof, stratified_homogeneity

SIZE_REPS, POWER_REPS = 400, 200
LEVEL = 0.05
TARGET = 0.8
BIG = (600, 400, 300)  # strata above stratum_min
SMALL = (60, 50, 40, 30)  # strata below it: tested jointly
STRATUM_MIN = 200


def _law(cells: int, seed: int) -> np.ndarray:
    """A law whose cells come in equal pairs, so a +/- deviation inside each pair is balanced."""
    half = np.random.default_rng(seed).dirichlet(np.full(cells // 2, 5.0))
    return np.repeat(half, 2) / 2


def _signs(cells: int) -> np.ndarray:
    return np.tile([1.0, -1.0], cells // 2)


def _tilted(p0: np.ndarray, tv: float) -> np.ndarray:
    """The least favourable alternative at TV `tv`: |p1 - p0| / p0 = 2 tv on every cell."""
    return p0 * (1 + 2 * tv * _signs(p0.size))


def _strata(sizes, laws, rng, alternative=None):
    out = []
    for i, (n, p0) in enumerate(zip(sizes, laws)):
        p1 = p0 if alternative is None else alternative(p0)
        out.append(((i,), rng.multinomial(n, p1), p0))
    return out


def _gof_rejects(strata, level, seed) -> bool:
    result = stratified_gof(
        strata, stratum_min=STRATUM_MIN, min_expected=5.0, level=level, rng=np.random.default_rng(seed)
    )
    return result.p_value <= level


def _mde(n, df, stages, m=1):
    levels = [LEVEL / m * DECISION_LEVEL_FACTOR] * stages
    target = TARGET / np.prod([decision_power(LEVEL / m)] * stages)
    return power.criterion_mde(n, df, levels, target)


def test_small_strata_are_tested_jointly_and_every_sample_is_covered():
    laws = [_law(8, s) for s in range(len(BIG) + len(SMALL))]
    strata = _strata(BIG + SMALL, laws, np.random.default_rng(0))
    components = gof_components(strata, STRATUM_MIN, 5.0)
    assert [len(c.keys) for c in components] == [1, 1, 1, len(SMALL)]
    assert sum(int(c.sizes.sum()) for c in components) == sum(BIG + SMALL)
    result = stratified_gof(
        strata, stratum_min=STRATUM_MIN, min_expected=5.0, level=LEVEL, rng=np.random.default_rng(1)
    )
    assert result.num_joint_strata == len(SMALL) and result.components[-1]["key"] == JOINT
    assert result.n == sum(BIG + SMALL)


def test_bug_confined_to_small_strata_is_caught():
    # The old rule never tested strata below stratum_min; here they are a joint table. A sampler
    # that puts all mass of the small strata on their first token fails with p ~ 1 / (B + 1).
    laws = [_law(8, s) for s in range(len(BIG) + len(SMALL))]
    rng = np.random.default_rng(2)
    strata = _strata(BIG, laws, rng) + [
        ((9, i), np.eye(8, dtype=np.int64)[0] * n, laws[3 + i]) for i, n in enumerate(SMALL)
    ]
    assert _gof_rejects(strata, 1e-3, 0)


@pytest.mark.parametrize("sizes", [(300,), BIG + SMALL], ids=["one stratum", "aggregated with joint"])
def test_gof_size_is_at_most_nominal(sizes):
    rng = np.random.default_rng(11)
    laws = [_law(10, s) for s in range(len(sizes))]
    rejections = sum(_gof_rejects(_strata(sizes, laws, rng), LEVEL, 1000 + r) for r in range(SIZE_REPS))
    assert rejections / SIZE_REPS <= LEVEL + 3 * np.sqrt(LEVEL * (1 - LEVEL) / SIZE_REPS)


def _homogeneity_rejects(sizes, laws, rng, seed, tv=0.0) -> bool:
    strata = []
    for i, (n, p0) in enumerate(zip(sizes, laws)):
        pa, pb = p0 * (1 + tv * _signs(p0.size)), p0 * (1 - tv * _signs(p0.size))  # TV(pa, pb) = tv, w = 2 tv
        strata.append(((i,), rng.multinomial(n, pa), rng.multinomial(n, pb), p0))
    result = stratified_homogeneity(
        strata, stratum_min=STRATUM_MIN, min_expected=5.0, level=LEVEL, rng=np.random.default_rng(seed)
    )
    return result.p_value <= LEVEL


@pytest.mark.parametrize("sizes", [(300,), BIG + SMALL], ids=["one stratum", "aggregated with joint"])
def test_homogeneity_size_is_at_most_nominal(sizes):
    rng = np.random.default_rng(12)
    laws = [_law(10, s) for s in range(len(sizes))]
    rejections = sum(_homogeneity_rejects(sizes, laws, rng, 2000 + r) for r in range(SIZE_REPS))
    assert rejections / SIZE_REPS <= LEVEL + 3 * np.sqrt(LEVEL * (1 - LEVEL) / SIZE_REPS)


def _power_floor() -> float:
    return TARGET - 3 * np.sqrt(TARGET * (1 - TARGET) / POWER_REPS)


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("sizes", [(800,), BIG + SMALL], ids=["one stratum", "aggregated with joint"])
def test_gof_rejects_at_the_printed_mde(sizes, stages):
    cells = 10
    laws = [_law(cells, s) for s in range(len(sizes))]
    components = gof_components(_strata(sizes, laws, np.random.default_rng(0)), STRATUM_MIN, 5.0)
    df = sum(c.num_cells - 1 for c in components)
    tv = _mde(sum(sizes), df, stages)
    rng = np.random.default_rng(21)
    hits = sum(
        all(
            _gof_rejects(_strata(sizes, laws, rng, lambda p0: _tilted(p0, tv)), LEVEL, 5000 + 2 * r + s)
            for s in range(stages)
        )
        for r in range(POWER_REPS)
    )
    assert hits / POWER_REPS >= _power_floor()


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("sizes", [(800,), BIG + SMALL], ids=["one stratum", "aggregated with joint"])
def test_homogeneity_rejects_at_the_printed_mde(sizes, stages):
    cells = 10
    laws = [_law(cells, s) for s in range(len(sizes))]
    df = len(BIG) * (cells - 1) + (len(SMALL) * cells - 1) if len(sizes) > 1 else cells - 1
    n_eff = sum(n / 2 for n in sizes)  # equal groups: n_a n_b / (n_a + n_b) = n / 2 per stratum
    tv = _mde(n_eff, df, stages)
    rng = np.random.default_rng(22)
    hits = sum(
        all(_homogeneity_rejects(sizes, laws, rng, 7000 + 2 * r + s, tv) for s in range(stages))
        for r in range(POWER_REPS)
    )
    assert hits / POWER_REPS >= _power_floor()


def test_bad_stratum_input_names_the_problem():
    with pytest.raises(ValueError, match="counts"):
        stratified_gof(
            [((), np.array([-1, 2]), np.array([0.5, 0.5]))],
            stratum_min=1,
            min_expected=5.0,
            level=0.01,
            rng=np.random.default_rng(0),
        )
