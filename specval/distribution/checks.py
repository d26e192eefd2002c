"""Checks: the deterministic criteria, what no correct SUT can ever return, one summary row each.

- `out_of_range.<g>`, `impossible_counts.<g>`, `out_of_support.<g>`: deterministic validity.
- `quadrature.<group>` and `quadrature.adversarial`: the swept output law of the SUT's accept
  kernel against the exact law of the same p and q (`specval.stats.quadrature`), within the grid's
  resolution plus the rounding allowance (the test's `tol` included); `quadrature.stop_point`: a
  draft with p = 0 at u_accept = 0 must be rejected. Bundles stored by the earlier cell
  quadrature (pairs without `grid_size`) are evaluated by the earlier rule.

Each row has its verdict at once, PASS or FAIL: no Holm, and no second stage overturns a FAIL
(`specval.distribution.decision.deterministic_failures`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from specval.distribution.criteria import applicable_groups
from specval.distribution.decision import FAIL, PASS
from specval.distribution.effects import EFFECT_KEY
from specval.distribution.reference import Reference
from specval.distribution.strata import GroupData, prefix_groups
from specval.protocol import Protocol, TestSpec
from specval.stats.quadrature import exact_law, rounding_allowance, stop_point_passed

STOP_POINT = "stop_point"  # quadrature.json key and criterion of the stop-point case
OUT_OF_RANGE, IMPOSSIBLE_COUNTS, OUT_OF_SUPPORT = "out_of_range", "impossible_counts", "out_of_support"


# ---------------------------------------------------------------- quadrature


def quadrature_names(protocol: Protocol, test: TestSpec, stored: Mapping[str, object]) -> list[str]:
    """Quadrature criteria: one per applicable group, the adversarial pairs, and the stop point
    when `stored` (quadrature.json) holds it (bundles made before it existed do not)."""
    return applicable_groups(protocol, test) + ["adversarial"] + ([STOP_POINT] if STOP_POINT in stored else [])


def _legacy_pair_error(pair: Mapping, tol: float) -> tuple[float, bool]:
    """A pair stored by the cell quadrature (bundles without `grid_size`): (max |law - p|, passed)."""
    law, target = np.asarray(pair["law"], dtype=np.float64), np.asarray(pair["target"], dtype=np.float64)
    p, q = np.asarray(pair["p"], dtype=np.float64), np.asarray(pair["q"], dtype=np.float64)
    slack = abs(p.sum() - q.sum()) / q.sum()
    error = float(np.abs(law - target).max())
    return error, bool(error <= tol + slack and float(pair["error_mass"]) <= tol + slack)


def _legacy_quadrature(test: TestSpec, pairs: list) -> tuple[dict, str, str, float]:
    checked = [(pair["name"], *_legacy_pair_error(pair, test.tol)) for pair in pairs]
    worst = max(checked, key=lambda c: c[1])
    failed = [c[0] for c in checked if not c[2]]
    reason = (
        f"exact law differs from p beyond tol {test.tol:.3g} for: {', '.join(failed)}"
        if failed
        else f"{len(checked)} pair(s), max |law - p| = {worst[1]:.3g} <= tol {test.tol:.3g} (+ normalisation slack)"
    )
    return (
        {c[0]: {"max_abs_error": c[1], "passed": c[2]} for c in checked},
        FAIL if failed else PASS,
        reason,
        worst[1],
    )


def _pair_error(pair: Mapping, tol: float) -> dict:
    """Recompute one stored sweep against the exact law of its p and q: error, limit, passed."""
    p, q = np.asarray(pair["p"], dtype=np.float64), np.asarray(pair["q"], dtype=np.float64)
    law = np.asarray(pair["law"], dtype=np.float64)
    exact, exact_error = exact_law(p, q)
    error = float(np.abs(law - exact).max())
    mass_error = abs(float(pair["error_mass"]) - exact_error)
    resolution = 1.0 / int(pair["grid_size"])
    allowance = tol + rounding_allowance(np.dtype(pair["prob_dtype"]))
    return {
        "max_abs_error": error,
        "error_mass_error": mass_error,
        "resolution": resolution,
        "allowance": allowance,
        "law_deviation": float(np.abs(exact - p / p.sum()).max()),
        "passed": bool(max(error, mass_error) <= resolution + allowance),
    }


def _stop_point(pair: Mapping) -> dict:
    return {
        "first_token": int(pair["first_token"]),
        "passed": stop_point_passed(np.asarray(pair["p"], dtype=np.float64), int(pair["first_token"])),
    }


def _swept_quadrature(test: TestSpec, pairs: list) -> tuple[dict, str, str, float]:
    checked = {
        pair["name"]: _stop_point(pair) if pair.get("kind") == STOP_POINT else _pair_error(pair, test.tol)
        for pair in pairs
    }
    failed = [name for name, c in checked.items() if not c["passed"]]
    swept = [c for c in checked.values() if "max_abs_error" in c]
    if not swept:  # the stop point alone
        token = next(iter(checked.values()))["first_token"]
        return (
            checked,
            FAIL if failed else PASS,
            (
                f"a draft with p = 0 at u_accept = 0 emitted token {token}"
                + (" (it must be rejected)" if failed else ", a correction: rejected as it must be")
            ),
            0.0,
        )
    worst = max(swept, key=lambda c: c["max_abs_error"])
    bound = f"resolution {worst['resolution']:.3g} + allowance {worst['allowance']:.2g}"
    if failed:
        return (
            checked,
            FAIL,
            f"swept law differs from the exact law beyond {bound} for: {', '.join(failed)}",
            worst["max_abs_error"],
        )
    deviation = max(c["law_deviation"] for c in swept)
    return (
        checked,
        PASS,
        (
            f"{len(swept)} pair(s), max |swept law - exact law| = {worst['max_abs_error']:.3g} <= "
            f"{bound}; exact law vs p / T_p: max {deviation:.3g} (normalisation, reported only)"
        ),
        worst["max_abs_error"],
    )


def _quadrature_effect(checked: Mapping[str, dict], pairs: list) -> dict | None:
    """The worst case of a swept quadrature: a failing one first, then the largest error; with the
    token where its swept law is farthest from the exact law (`effects.describe` words it)."""
    by_name = {pair["name"]: pair for pair in pairs}
    order = sorted(checked, key=lambda n: (checked[n]["passed"], -checked[n].get("max_abs_error", np.inf)))
    if not order:
        return None
    case, worst = order[0], checked[order[0]]
    if "max_abs_error" not in worst:
        return {"case": case, "token": worst["first_token"]}
    pair = by_name[case]
    p, q = np.asarray(pair["p"], dtype=np.float64), np.asarray(pair["q"], dtype=np.float64)
    exact, _ = exact_law(p, q)
    token = int(np.argmax(np.abs(np.asarray(pair["law"], dtype=np.float64) - exact)))
    limit = worst["resolution"] + worst["allowance"]
    return {"case": case, "max_abs_error": worst["max_abs_error"], "limit": limit, "token": token}


def quadrature_criterion(test: TestSpec, name: str, pairs: list) -> dict:
    """The quadrature row of one case list (`name`): its verdict, the per-pair errors and, for the
    swept rule, its `effect` (the worst case and token; none for the earlier cell rule)."""
    is_legacy = all("grid_size" not in pair and pair.get("kind") != STOP_POINT for pair in pairs)
    checked, verdict, reason, statistic = (_legacy_quadrature if is_legacy else _swept_quadrature)(test, pairs)
    effect = None if is_legacy else _quadrature_effect(checked, pairs)
    return {
        "kind": test.kind,
        "role": test.role,
        "group": name,
        "baseline": None,
        "position": None,
        "statistic": statistic,
        "df": None,
        "p_value": None,
        "p_adjusted": None,
        "alpha": None,
        "tol": test.tol,
        "mde_tv": None,
        "planned_n": None,
        "effective_n": None,
        "pairs": checked,
        EFFECT_KEY: effect,
        "verdict": verdict,
        "reason": reason,
    }


# ---------------------------------------------------------------- validity


def _validity(kind: str, group: str, failures: int, what: str) -> dict:
    verdict = FAIL if failures else PASS
    return {
        "kind": "validity",
        "check": kind,
        "role": "control",
        "group": group,
        "baseline": None,
        "position": None,
        "statistic": failures,
        "df": None,
        "p_value": None,
        "p_adjusted": None,
        "alpha": None,
        "mde_tv": None,
        "planned_n": None,
        "effective_n": None,
        "out_of_support": 0,
        "verdict": verdict,
        "reason": f"{failures} sample(s) {what}",
    }


def _out_of_support(data: GroupData, ref: Reference) -> int:
    """Samples with some token of reference probability 0 given its prefix, at any position."""
    bad = np.zeros(len(data.tokens), dtype=bool)
    for position in range(1, data.tokens.shape[1] + 1):
        for prefix, rows in zip(*prefix_groups(data.tokens[:, : position - 1])):
            bad[rows] |= ref.probs(prefix)[data.tokens[rows, position - 1]] == 0.0
    return int(bad.sum())


def validity_tests(protocol: Protocol, data: Mapping[str, GroupData], ref: Reference | None) -> dict[str, dict]:
    """Deterministic validity criteria of every group: what no correct SUT can ever return."""
    tests = {}
    for group, rows in data.items():
        tests[f"{OUT_OF_RANGE}.{group}"] = _validity(
            OUT_OF_RANGE, group, rows.num_out_of_range, "with a token outside [0, vocab_size)"
        )
        tests[f"{IMPOSSIBLE_COUNTS}.{group}"] = _validity(
            IMPOSSIBLE_COUNTS, group, rows.num_impossible, "with a negative count or accepted > drafted tokens"
        )
        if ref is not None and len(rows.tokens):
            tests[f"{OUT_OF_SUPPORT}.{group}"] = _validity(
                OUT_OF_SUPPORT, group, _out_of_support(rows, ref), "with a token of reference probability 0"
            )
    return tests
