"""Multiplicity: Holm and Bonferroni against hand-worked examples."""

import numpy as np
import pytest

from specval.stats.multiplicity import adjust, bonferroni, holm


def test_holm_hand_example():
    # Sorted: 0.01 * 3 = 0.03, 0.03 * 2 = 0.06, 0.04 * 1 = 0.04 -> running max 0.03, 0.06, 0.06.
    result = holm({"a": 0.01, "b": 0.04, "c": 0.03}, 0.05)
    assert result.adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert result.rejected == {"a": True, "b": False, "c": False}


def test_holm_rejects_more_than_bonferroni_when_it_can():
    p_values = {"t1": 0.012, "t2": 0.02, "t3": 0.3}
    assert bonferroni(p_values, 0.05).rejected == {"t1": True, "t2": False, "t3": False}
    assert holm(p_values, 0.05).rejected == {"t1": True, "t2": True, "t3": False}
    assert bonferroni(p_values, 0.05).adjusted["t3"] == pytest.approx(0.9)


def test_none_keeps_p_values():
    result = adjust({"x": 0.04, "y": 0.2}, 0.05, "none")
    assert result.adjusted == {"x": 0.04, "y": 0.2}
    assert result.rejected == {"x": True, "y": False}


def test_empty_family():
    assert holm({}, 0.01).to_dict() == {"method": "holm", "alpha": 0.01, "adjusted": {}, "rejected": {}}


@pytest.mark.parametrize(
    "p_values, alpha, method, field",
    [
        ({"a": 1.5}, 0.05, "holm", "p_values"),
        ({"a": float("nan")}, 0.05, "holm", "p_values"),
        ({"a": 0.1}, 0.0, "holm", "alpha"),
        ({"a": 0.1}, 0.05, "sidak", "method"),
    ],
)
def test_bad_input_names_the_field(p_values, alpha, method, field):
    with pytest.raises(ValueError, match=field):
        adjust(p_values, alpha, method)


def test_holm_matches_statsmodels_on_random_families():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(5)
    for m in (1, 2, 7, 30):
        values = rng.random(m) ** 3
        values[: m // 3] = values[0]  # ties
        ours = holm({str(i): v for i, v in enumerate(values)}, 0.05)
        _, theirs, _, _ = multipletests(values, alpha=0.05, method="holm")
        assert [ours.adjusted[str(i)] for i in range(m)] == pytest.approx(theirs.tolist(), abs=1e-15)
