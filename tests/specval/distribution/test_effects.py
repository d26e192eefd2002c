"""The size of a criterion's deviation: observed TV, worst stratum and token, and the sized rows of
summary.json (present in new summaries only, so that older bundles recompute as they were).

Deterministic tests: the planted tables are fixed counts; the Monte Carlo p-value only decides
which component is worst, and with one planted deviation of X^2 in the hundreds that is certain."""

from __future__ import annotations

import numpy as np

from specval.distribution import effects
from specval.stats.strata import stratified_gof, stratified_homogeneity

PROBS = np.array([0.4, 0.3, 0.2, 0.1])
LEVEL = 0.01


def _gof(strata, stratum_min=50, min_expected=5.0):
    result = stratified_gof(
        strata, stratum_min=stratum_min, min_expected=min_expected, level=LEVEL, rng=np.random.default_rng(0)
    )
    return effects.gof_effect(strata, result, stratum_min, min_expected, by_path=False)


def test_gof_effect_is_zero_on_the_expected_table_and_the_planted_tv_otherwise():
    exact = [((1,), np.array([400, 300, 200, 100]), PROBS)]
    # float64 sums of four products: rounding of order 1e-16, far below the planted 0.05
    assert abs(_gof(exact)["observed_tv"]) < 1e-12
    # 100 samples moved from token 0 to token 3 in the second stratum: TV 100 / 1000 = 0.1 there,
    # 0 in the first, so the n_s-weighted mean is 100 / 2000
    planted = exact + [((2,), np.array([300, 300, 200, 200]), PROBS)]
    effect = _gof(planted)
    assert np.isclose(effect["observed_tv"], 0.05)
    assert effect["worst_stratum"] == {"prefix": [2]} and not effect["worst_stratum_joint"]
    assert effect["worst_token"]["token"] in (0, 3)  # both are 100 away from expectation
    assert effect["worst_token"]["observed"] in (300, 200)
    assert effect["worst_stratum_p_value"] < 1e-10


def test_gof_effect_names_a_small_stratum_inside_the_joint_table():
    big = ((1,), np.array([400, 300, 200, 100]), PROBS)
    small = ((7,), np.array([0, 0, 0, 40]), PROBS)  # 40 samples where 4 are expected on token 3
    other = ((8,), np.array([4, 3, 2, 1]), PROBS)  # exactly as expected: joins the joint table
    effect = _gof([big, small, other], stratum_min=100, min_expected=1.0)
    assert effect["worst_stratum"] == {"prefix": [7]} and effect["worst_stratum_joint"]
    token = effect["worst_token"]
    assert (token["token"], token["observed"]) == (3, 40) and np.isclose(token["expected"], 4.0)


def test_homogeneity_effect_is_the_tv_between_the_groups():
    a, b = np.array([500, 300, 200, 0]), np.array([300, 300, 200, 200])
    strata = [((), a, b, PROBS)]
    result = stratified_homogeneity(strata, stratum_min=50, min_expected=5.0, level=LEVEL, rng=np.random.default_rng(0))
    effect = effects.homogeneity_effect(strata, result, 50, 5.0)
    assert np.isclose(effect["observed_tv"], 0.2)  # (200 + 200) / 2 / 1000
    assert effect["worst_token"]["token"] in (0, 3)


def _row(verdict: str, effect) -> dict:
    return {"verdict": verdict, "reason": "Holm-adjusted p = 0.001 < alpha = 0.01", "mde_tv": 0.02, "effect": effect}


SIZED = {
    "observed_tv": 0.05,
    "worst_stratum_p_value": 1e-12,
    "worst_stratum_joint": False,
    "worst_stratum": {"prefix": [2]},
    "worst_token": {"token": 3, "observed": 200, "expected": 100.0},
}


def test_finish_appends_the_size_to_failures_of_a_sized_summary_only():
    summary = {"tests": {"a": _row("FAIL", SIZED), "b": _row("PASS", SIZED)}}
    effects.finish(summary, sized=True)
    failed = summary["tests"]["a"]["reason"]
    assert "observed TV 0.05 (MDE 0.02)" in failed and "prefix [2]" in failed and "token 3 observed 200" in failed
    assert summary["tests"]["b"]["reason"] == "Holm-adjusted p = 0.001 < alpha = 0.01"
    assert summary[effects.SIZES_KEY] == effects.SIZES_VERSION


def test_finish_leaves_an_older_summary_as_it_was():
    """A summary made before sizes were recorded recomputes without them: no key, no effect, same reasons."""
    summary = {"tests": {"a": _row("FAIL", SIZED)}, "confirmation": {"stage2": {"tests": {"a": _row("FAIL", SIZED)}}}}
    effects.finish(summary, sized=False)
    assert effects.SIZES_KEY not in summary
    for row in (summary["tests"]["a"], summary["confirmation"]["stage2"]["tests"]["a"]):
        assert "effect" not in row and row["reason"] == "Holm-adjusted p = 0.001 < alpha = 0.01"


def test_describe_words_a_quadrature_case():
    row = {"effect": {"case": "adversarial_3", "max_abs_error": 0.03, "limit": 1.5e-5, "token": 5}}
    assert (
        effects.describe(row) == "worst case adversarial_3: |swept law - exact law| = 0.03 at token 5 (limit 1.5e-05)"
    )
    assert effects.describe({"effect": {"case": "stop_point", "token": 4}}) == "stop_point: token 4 emitted"
    assert effects.describe({"effect": None}) == ""
