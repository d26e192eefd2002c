"""Multiplicity: family-wise error control over the p-values of one family of criteria."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from statsmodels.stats.multitest import multipletests

from specval.stats import checks
from specval.stats.results import StatResult

METHODS = ("none", "bonferroni", "holm")


@dataclasses.dataclass(frozen=True)
class HolmResult(StatResult):
    """Adjusted p-values and decisions, keyed like the input; `rejected[k]` iff adjusted[k] <= alpha."""

    method: str
    alpha: float
    adjusted: dict[str, float]
    rejected: dict[str, bool]


MultiplicityResult = HolmResult


def adjust(p_values: Mapping[str, float], alpha: float, method: str = "holm") -> HolmResult:
    """Adjust one family's p-values with `method` in METHODS ("none", "bonferroni", "holm").

    Assumptions: "holm" and "bonferroni" hold under any dependence between the tests.
    Guarantee: with "holm" or "bonferroni" the probability of rejecting any true null in the
    family is <= alpha (strong family-wise error control); "none" controls each test at alpha
    separately. Holm is uniformly at least as powerful as Bonferroni.
    Scaling: Bonferroni's per-test level is alpha / m for m tests; Holm's smallest is the same.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    alpha = checks.probability("alpha", alpha)
    keys = list(p_values)
    values = np.array([float(p_values[k]) for k in keys], dtype=np.float64)
    bad = [k for k, v in zip(keys, values) if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"p_values[{bad[0]!r}] must be in [0, 1], got {p_values[bad[0]]!r}")
    if not keys:
        return HolmResult(method, alpha, {}, {})
    if method == "none":
        adjusted = values
    elif method == "holm":
        adjusted = _holm_adjusted(values)
    else:
        _, adjusted, _, _ = multipletests(values, alpha=alpha, method=method)
    return HolmResult(
        method=method,
        alpha=alpha,
        adjusted={k: float(a) for k, a in zip(keys, adjusted)},
        rejected={k: bool(a <= alpha) for k, a in zip(keys, adjusted)},
    )


def _holm_adjusted(values: np.ndarray) -> np.ndarray:
    """Holm's adjusted p-values: max over j <= i (in ascending order) of min(1, (m - j) p_(j)).

    The same numbers as statsmodels' multipletests(method="holm") (a test checks it), written out
    because multipletests runs gc.collect() on every call, ~0.7 s with a large heap: calibration
    calls it tens of thousands of times.
    """
    m = values.size
    order = np.argsort(values, kind="stable")
    steps = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * values[order]))
    adjusted = np.empty(m)
    adjusted[order] = steps
    return adjusted


def holm(p_values: Mapping[str, float], alpha: float) -> HolmResult:
    """Holm's step-down adjustment (statsmodels multipletests, method="holm"); see `adjust`."""
    return adjust(p_values, alpha, "holm")


def bonferroni(p_values: Mapping[str, float], alpha: float) -> HolmResult:
    """Bonferroni adjustment (min(1, m p)); see `adjust`."""
    return adjust(p_values, alpha, "bonferroni")
