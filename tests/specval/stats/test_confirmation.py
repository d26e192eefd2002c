"""Two-stage confirmation: combined error rates and input checks."""

import pytest

from specval.stats.confirmation import two_stage


def test_combined_rates_multiply():
    rates = two_stage(0.01, 0.02, 0.9, 0.95)
    assert rates.false_fail == pytest.approx(0.01 * 0.02)
    assert rates.power == pytest.approx(0.9 * 0.95)
    assert rates.expected_stages == pytest.approx(1.01)
    assert rates.to_dict()["alpha2"] == 0.02


@pytest.mark.parametrize(
    "args, field",
    [
        ((0.0, 0.01, 0.9, 0.9), "alpha1"),
        ((0.01, 1.0, 0.9, 0.9), "alpha2"),
        ((0.01, 0.01, 1.5, 0.9), "power1"),
        ((0.01, 0.01, 0.9, float("nan")), "power2"),
    ],
)
def test_bad_input_names_the_field(args, field):
    with pytest.raises(ValueError, match=field):
        two_stage(*args)
