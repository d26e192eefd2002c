"""Results: to_dict() gives strict-JSON plain types for every result."""

import json
import math

import numpy as np
import pytest

from specval.stats import (
    aggregate_gof,
    goodness_of_fit,
    holm,
    homogeneity,
    paired_comparison,
    pool_cells,
    pvalue_uniformity,
    quadrature_check,
    simulate_power,
)
from specval.stats.results import to_plain


def test_to_plain_converts_numpy_and_non_finite_values():
    value = {
        "a": np.float32(0.5),
        "b": np.int64(3),
        "c": np.array([1, 2]),
        "d": (np.bool_(True),),
        "e": math.inf,
        "f": np.float64("nan"),
        7: None,
    }
    assert to_plain(value) == {"a": 0.5, "b": 3, "c": [1, 2], "d": [True], "e": None, "f": None, "7": None}
    assert type(to_plain(np.int32(2))) is int and type(to_plain(np.bool_(False))) is bool
    with pytest.raises(TypeError, match="object"):
        to_plain(object())


def test_every_result_serialises_to_strict_json():
    rng = np.random.default_rng(4)
    probs = np.array([0.5, 0.3, 0.2])
    gof = goodness_of_fit(np.array([50, 30, 20]), probs)

    def first_token(draft_tokens, draft_probs, target_probs, uniforms):
        return draft_tokens  # wrong on purpose: only the serialisation matters here

    results = [
        gof,
        aggregate_gof([gof]),
        homogeneity(np.array([5, 6, 7]), np.array([7, 6, 5])),
        holm({"x": 0.01}, 0.05),
        pool_cells(np.array([6.0, 1.0, 0.0]), 5.0),
        paired_comparison(rng.random(30) < 0.5, rng.random(30) < 0.5, alpha=0.05, margin=0.1),
        pvalue_uniformity(rng.random(20)),
        simulate_power(probs, probs, 50, 0.05, 10, rng),
        quadrature_check(probs, probs[::-1].copy(), first_token),
    ]
    for result in results:
        payload = json.loads(json.dumps(result.to_dict(), allow_nan=False))
        assert payload and all(isinstance(key, str) for key in payload)
    quadrature = results[-1].to_dict()
    assert "law" not in quadrature and quadrature["passed"] is False
