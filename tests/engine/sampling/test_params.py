"""SamplingParams validation: every bad value names its field and value."""

import math

import pytest

from engine.params import SamplingParams


def test_defaults_are_random_untruncated():
    params = SamplingParams()
    assert not params.is_greedy
    assert (params.temperature, params.top_k, params.top_p) == (1.0, -1, 1.0)


def test_greedy_is_temperature_zero():
    assert SamplingParams(temperature=0).is_greedy
    assert not SamplingParams(temperature=1e-6).is_greedy


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "1"),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.2),
        ("top_p", math.nan),
        ("top_k", -2),
        ("top_k", 2.5),
        ("top_k", True),
        ("seed", -1),
        ("seed", 2**63),
        ("seed", 1.0),
        ("max_tokens", 0),
        ("max_tokens", 3.0),
        ("stop_token_ids", [1, 2]),
        ("stop_token_ids", (1, -3)),
        ("ignore_eos", 1),
    ],
)
def test_bad_value_names_field_and_value(field, value):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    assert field in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("top_k", [-1, 0, 1, 50])
def test_valid_top_k_accepted(top_k):
    assert SamplingParams(top_k=top_k).top_k == top_k


def test_frozen():
    params = SamplingParams()
    with pytest.raises(AttributeError):
        params.temperature = 2.0  # type: ignore[misc]
