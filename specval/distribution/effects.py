"""Effects: how big a criterion's deviation is, beside its verdict (a failure line's size).

Every p-valued criterion row gets an `effect`: the observed TV between pooled cells (the quantity
its MDE is a TV of: per component, a large stratum or the joint table of the small ones, weighted
by n_s for gof and by n_a n_b / (n_a + n_b) for homogeneity), the worst component (the smallest
descriptive p-value) and, in it, the token whose count is farthest from its expectation. A
quadrature row gets the worst case and token of its swept law. A FAIL row's reason then ends with
that size (`describe`).

Sized rows are a later addition to summary.json: a summary records `SIZES_KEY` when its rows carry
them, and a bundle whose summary predates the key is recomputed without them (`finish`), so that
`specval verify` of an older bundle still compares equal. The observed TV is descriptive: it is
biased upwards by sampling noise (about sqrt(cells / n)), so it is read beside the MDE, never
instead of the p-value.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np

from specval.stats.strata import Component, StratifiedResult, gof_components, homogeneity_components

SIZES_KEY = "failure_sizes"  # summary.json: the version of the sized rows (absent: none)
SIZES_VERSION = 1
EFFECT_KEY = "effect"  # a criterion row's size
FAIL = "FAIL"


# ---------------------------------------------------------------- p-valued criteria


def _gof_tv(component: Component) -> tuple[float, float]:
    """(sum over cells of |O - E| / 2, n) of a gof component."""
    expected = np.zeros(component.num_cells)
    for cells, probs, n in zip(component.cells, component.weights, component.sizes):
        expected[cells] += n * probs
    return 0.5 * float(np.abs(component.observed - expected).sum()), float(component.sizes.sum())


def _homogeneity_tv(component: Component) -> tuple[float, float]:
    """(TV between the groups' cell frequencies times the weight, weight n_a n_b / (n_a + n_b))."""
    totals = np.zeros(component.num_cells)
    for cells, cell_totals in zip(component.cells, component.weights):
        totals[cells] += cell_totals
    n_a, n = float(component.sizes.sum()), float(totals.sum())
    n_b = n - n_a
    if n_a <= 0 or n_b <= 0:
        return 0.0, 0.0
    a = component.observed.astype(np.float64)
    tv = 0.5 * float(np.abs(a / n_a - (totals - a) / n_b).sum())
    weight = n_a * n_b / n
    return tv * weight, weight


def _worst_token(keys: list[Hashable], deviations: Mapping[Hashable, tuple[np.ndarray, np.ndarray]]) -> dict | None:
    """Among the strata `keys`, the token whose observed count is farthest from its expected one."""
    best: dict | None = None
    for key in keys:
        observed, expected = deviations[key]
        if not observed.size:
            continue
        token = int(np.argmax(np.abs(observed - expected)))
        gap = abs(float(observed[token]) - float(expected[token]))
        if best is None or gap > best["gap"]:
            best = {"key": key, "token": token, "observed": int(observed[token]), "expected": float(expected[token])}
            best["gap"] = gap
    if best is not None:
        best.pop("gap")
    return best


def _stratum(key: Hashable, by_path: bool) -> dict:
    if by_path:
        prefix, path = key  # type: ignore[misc]
        return {"prefix": list(prefix), "path": list(path)}
    return {"prefix": list(key)}  # type: ignore[call-overload]


def _effect(
    components: list[Component],
    tvs: list[tuple[float, float]],
    result: StratifiedResult,
    deviations: Mapping[Hashable, tuple[np.ndarray, np.ndarray]],
    by_path: bool,
) -> dict[str, Any]:
    weight = sum(w for _, w in tvs)
    rows = result.components
    worst = min(range(len(rows)), key=lambda i: (rows[i]["p_value"], -rows[i]["statistic"]))
    token = _worst_token(list(components[worst].keys), deviations)
    effect: dict[str, Any] = {
        "observed_tv": sum(t for t, _ in tvs) / weight if weight else None,
        "worst_stratum_p_value": rows[worst]["p_value"],
        "worst_stratum_joint": components[worst].is_joint,
        "worst_stratum": None,
        "worst_token": None,
    }
    if token is not None:
        effect["worst_stratum"] = _stratum(token["key"], by_path)
        effect["worst_token"] = {k: token[k] for k in ("token", "observed", "expected")}
    return effect


def gof_effect(
    strata: list[tuple[Hashable, np.ndarray, np.ndarray]],
    result: StratifiedResult | None,
    stratum_min: int,
    min_expected: float,
    by_path: bool,
) -> dict[str, Any] | None:
    """The observed size of a gof criterion from its (key, counts, probs) strata (None: nothing tested).

    Guarantee: the components are those the test used (`gof_components` of the same inputs, in the
    order of `result.components`); expected counts are n_s p(token | s) over the in-support tokens."""
    if result is None or not result.components:
        return None
    components = gof_components(strata, stratum_min, min_expected)
    deviations = {}
    for key, counts, probs in strata:
        support = np.flatnonzero(np.asarray(probs) > 0)
        observed = np.zeros(len(probs))
        observed[support] = np.asarray(counts)[support]
        p = np.asarray(probs, dtype=np.float64)
        deviations[key] = (observed, observed.sum() * p / p.sum())
    return _effect(components, [_gof_tv(c) for c in components], result, deviations, by_path)


def homogeneity_effect(
    strata: list[tuple[Hashable, np.ndarray, np.ndarray, np.ndarray]],
    result: StratifiedResult | None,
    stratum_min: int,
    min_expected: float,
) -> dict[str, Any] | None:
    """The observed size of a homogeneity criterion from its (key, counts_a, counts_b, probs) strata
    (None: nothing tested): group a's counts against n_a (a + b) / (n_a + n_b) per token."""
    if result is None or not result.components:
        return None
    components = homogeneity_components(strata, stratum_min, min_expected)
    deviations = {}
    for key, counts_a, counts_b, _ in strata:
        a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
        total = a.sum() + b.sum()
        deviations[key] = (a, a.sum() * (a + b) / total if total else np.zeros_like(a))
    return _effect(components, [_homogeneity_tv(c) for c in components], result, deviations, False)


# ---------------------------------------------------------------- summary rows and text


def _stratum_text(effect: Mapping[str, Any]) -> str:
    where = effect["worst_stratum"]
    given = f"prefix {where['prefix']}" + (f", path {where['path']}" if "path" in where else "")
    joint = " in the joint table" if effect["worst_stratum_joint"] else ""
    token = effect["worst_token"]
    return (
        f"worst stratum {given}{joint} (descriptive p {effect['worst_stratum_p_value']:.2g}): token "
        f"{token['token']} observed {token['observed']} times, expected {token['expected']:.4g}"
    )


def describe(row: Mapping[str, Any]) -> str:
    """The size of a row's deviation in words ("" when the row has no effect)."""
    effect = row.get(EFFECT_KEY)
    if not effect:
        return ""
    if "max_abs_error" in effect:
        return (
            f"worst case {effect['case']}: |swept law - exact law| = {effect['max_abs_error']:.3g} "
            f"at token {effect['token']} (limit {effect['limit']:.3g})"
        )
    if "case" in effect:
        return f"{effect['case']}: token {effect['token']} emitted"
    parts = []
    if effect["observed_tv"] is not None:
        mde = row.get("mde_tv")
        parts.append(f"observed TV {effect['observed_tv']:.3g}" + (f" (MDE {mde:.3g})" if mde is not None else ""))
    if effect["worst_token"] is not None:
        parts.append(_stratum_text(effect))
    return "; ".join(parts)


def _rows(summary: Mapping[str, Any]) -> list[dict]:
    stage2 = (summary.get("confirmation") or {}).get("stage2") or {}
    return [*summary.get("tests", {}).values(), *stage2.get("tests", {}).values()]


def finish(summary: dict, sized: bool) -> dict:
    """The summary's rows as its version has them: `sized` (a new summary, or one recording
    `SIZES_KEY`): every FAIL row's reason ends with its size and the summary records the key;
    else every row's effect is dropped (a summary made before sizes existed, recomputed as it was)."""
    for row in _rows(summary):
        if not sized:
            row.pop(EFFECT_KEY, None)
        elif row["verdict"] == FAIL and describe(row):
            row["reason"] += f"; {describe(row)}"
    if sized:
        summary[SIZES_KEY] = SIZES_VERSION
    return summary
