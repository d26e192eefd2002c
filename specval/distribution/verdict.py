"""Verdict: the protocol's criteria evaluated on raw samples and stored references.

`evaluate` is a pure function of (protocol, samples, reference, quadrature results, seed ranges):
the run calls it once and `specval verify` calls it again on the bundle, so any hand edit of a
verdict, a statistic or a raw sample shows up as a difference (Monte Carlo draws are seeded by the
protocol hash, the criterion and its seed ranges, so they recompute bit for bit).

Criteria (docs/harness.md section 3 is the reference):
- `out_of_range.<g>`, `impossible_counts.<g>`, `out_of_support.<g>`: deterministic validity.
- `t<k>_gof.<group>`: stratified GOF of t_k given t_1..t_{k-1}; strata below `stratum_min` are
  tested jointly; exact-size Monte Carlo p-value under the reference (`specval.stats.strata`).
- `t<k>_homogeneity.<group>_vs_<baseline>`: stratified permutation test given the margins.
- `quadrature.<group>` and `quadrature.adversarial`: the swept output law of the SUT's accept
  kernel against the exact law of the same p and q (`specval.stats.quadrature`), within the grid's
  resolution plus the rounding allowance (the test's `tol` included); `quadrature.stop_point`: a
  draft with p = 0 at u_accept = 0 must be rejected. Bundles stored by the earlier cell
  quadrature (pairs without `grid_size`) are evaluated by the earlier rule.

p-valued criteria are corrected with Holm within their family (the test's role); the run PASSes
iff every control and primary criterion PASSes; it FAILs if any of them FAILs; else INCONCLUSIVE.
Each criterion's MDE is computed at the level it is actually decided at (`decision_levels`).

Two-stage confirmation (`confirm`): when stage 1 FAILs only on p-valued criteria, stage 2 runs on
fresh disjoint seeds and every stage-1 FAIL of a gating criterion is replaced by its stage-2
verdict; a deterministic failure in either stage FAILs the run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from specval.distribution import looks
from specval.distribution.collect import COUNT_COLUMNS
from specval.distribution.reference import Reference
from specval.protocol import GATING_ROLES, ROLES, Protocol, TestSpec
from specval.stats import montecarlo, multiplicity, power
from specval.stats.confirmation import two_stage
from specval.stats.montecarlo import DECISION_LEVEL_FACTOR
from specval.stats.quadrature import exact_law, rounding_allowance, stop_point_passed
from specval.stats.strata import StratifiedResult, stratified_gof, stratified_homogeneity
from specval.sut import SOURCES

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
STOP_POINT = "stop_point"  # quadrature.json key and criterion of the stop-point case
SCHEMA_VERSION = 2  # 2: Monte Carlo p-values, joint small strata, validity criteria, MDE at the Holm level
P_VALUED_KINDS = ("gof", "homogeneity")
DETERMINISTIC_KINDS = ("quadrature", "validity")
OUT_OF_RANGE, IMPOSSIBLE_COUNTS, OUT_OF_SUPPORT = "out_of_range", "impossible_counts", "out_of_support"
COVERAGE_FLOOR_KEY = "min_coverage"  # protocol key of a pre-registered coverage floor (optional)


# ---------------------------------------------------------------- strata


def strata(tokens: np.ndarray, position: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Split tokens[N, n] into strata of prefix t_1..t_{position-1}: [(prefix, t_position[n_s])]."""
    target = tokens[:, position - 1]
    if position == 1:
        return [((), target)]
    prefixes, rows = prefix_groups(tokens[:, : position - 1])
    return [(prefix, target[r]) for prefix, r in zip(prefixes, rows)]


def prefix_groups(keys: np.ndarray) -> tuple[list[tuple[int, ...]], list[np.ndarray]]:
    """Distinct rows of keys[N, j] in ascending order, and the row indices holding each
    (np.lexsort: np.unique(axis=0) is ~20x slower). j = 0 gives one group of every row."""
    if len(keys) == 0:
        return [], []
    if keys.shape[1] == 0:
        return [()], [np.arange(len(keys))]
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], np.any(ordered[1:] != ordered[:-1], axis=1)]))
    return [tuple(int(t) for t in ordered[i]) for i in starts], np.split(order, starts[1:])


def path_strata(
    tokens: np.ndarray, paths: np.ndarray, position: int
) -> list[tuple[tuple[int, ...], tuple[int, ...], np.ndarray]]:
    """Strata of (prefix, path): paths[N, n] holds each token's source code (index in SOURCES)."""
    keyed = np.concatenate([tokens[:, : position - 1], paths[:, : position - 1]], axis=1)
    with_key = np.concatenate([keyed, tokens[:, position - 1 : position]], axis=1)
    width = position - 1
    return [(key[:width], key[width:], target) for key, target in strata(with_key, 2 * width + 1)]


@dataclass(frozen=True, eq=False)
class GroupData:
    """One group's samples as the statistics see them: rows with every token in [0, V) only."""

    tokens: np.ndarray  # int64[N, n] t_1..t_n
    paths: np.ndarray  # int64[N, n] index in SOURCES of each token's source
    num_out_of_range: int  # rows left out: some token < 0 or >= V
    num_impossible: int  # rows with a negative count or more accepted than drafted tokens


def source_codes(column: pd.Series) -> np.ndarray:
    """int64 index in SOURCES of each entry, -1 for anything else (missing values included):
    factorised once, then looked up (a per-row dict map costs ~10x more on 160k rows)."""
    codes, names = pd.factorize(column)  # code -1: a missing value
    lookup = np.array([SOURCES.index(n) if n in SOURCES else -1 for n in names] + [-1], dtype=np.int64)
    return lookup[codes]


def group_data(samples: pd.DataFrame, group: str, positions: int, vocab_size: int | None) -> GroupData:
    """Split a group's rows into in-range samples and the counts of invalid ones (never raises on
    any integer a SUT returned)."""
    rows = samples[samples["group"] == group]
    tokens = rows[[f"t{k}" for k in range(1, positions + 1)]].to_numpy(dtype=np.int64)
    paths = (
        np.stack([source_codes(rows[f"src{k}"]) for k in range(1, positions + 1)], axis=1)
        if len(rows)
        else tokens.copy()
    )
    in_range = np.all(tokens >= 0, axis=1) & (np.all(tokens < vocab_size, axis=1) if vocab_size else True)
    counts = rows[list(COUNT_COLUMNS)].to_numpy(dtype=np.int64)
    impossible = np.any(counts < 0, axis=1) | (
        rows["num_accepted_tokens"].to_numpy() > rows["num_draft_tokens"].to_numpy()
    )
    return GroupData(tokens[in_range], paths[in_range], int((~in_range).sum()), int(impossible.sum()))


def _coverage(strata_total: int, strata_covered: int, samples_total: int, samples_covered: int) -> dict[str, Any]:
    fraction = samples_covered / samples_total if samples_total else 0.0
    return {
        "strata_total": strata_total,
        "strata_covered": strata_covered,
        "samples_total": samples_total,
        "samples_covered": samples_covered,
        "fraction": float(fraction),
    }


def _coverage_floor(protocol: Protocol) -> float:
    """The pre-registered coverage floor (protocol key `min_coverage`; absent: 0, every criterion is
    then INCONCLUSIVE only when it tested nothing)."""
    return float(getattr(protocol, COVERAGE_FLOOR_KEY, None) or 0.0)


# ---------------------------------------------------------------- levels and MDE


def family_sizes(protocol: Protocol) -> dict[str, int]:
    """Number of p-valued criteria per family (role): Holm's m, fixed by the protocol before any data."""
    sizes = dict.fromkeys(ROLES, 0)
    for test in protocol.tests:
        if test.kind in P_VALUED_KINDS:
            sizes[test.role] += len(applicable_groups(protocol, test))
    return sizes


def decision_levels(protocol: Protocol, role: str) -> list[float]:
    """Per stage, the level a criterion of `role` is decided at in the worst case: Holm's first step
    alpha / m, times the Monte Carlo resolution factor; two entries for a two-stage protocol. With
    sequential looks, each stage's alpha is its last look's share (`looks.final_level`): the
    level a PASS is decided at."""
    m = max(family_sizes(protocol)[role], 1)
    alphas = [protocol.alpha] + ([protocol.alpha_stage2] if protocol.confirmation.is_two_stage else [])
    alphas = [looks.final_level(protocol, alpha) for alpha in alphas]
    return [a / m * DECISION_LEVEL_FACTOR for a in alphas]


def mde_power(target: float, levels: list[float]) -> float:
    """The power the exact p-value must reach at `levels` so that the Monte Carlo test, which rejects
    such a p-value with probability `decision_power` per stage, reaches `target`."""
    factor = float(np.prod([montecarlo.decision_power(level / DECISION_LEVEL_FACTOR) for level in levels]))
    return min(target / factor, 1.0 - 1e-12)


def mde_label(test: TestSpec, group: str) -> str:
    """What the MDE of a criterion is a TV of."""
    target = f"t{test.position}"
    given = "" if test.position == 1 else " given " + ", ".join(f"t{k}" for k in range(1, test.position))
    given += " and the path" if test.by_path else ""
    pair = f" between {group} and {test.baseline}" if test.kind == "homogeneity" else ""
    pooled = (
        ""
        if test.position == 1
        else ", mean over strata weighted by " + ("n_a n_b / (n_a + n_b)" if test.kind == "homogeneity" else "n_s")
    )
    return f"TV of {target}{given}{pair} between pooled cells{pooled}"


def _mde(protocol: Protocol, test: TestSpec, group: str, result: StratifiedResult | None, wanted: bool) -> dict:
    levels = decision_levels(protocol, test.role)
    mde = power.NOTHING_DETECTABLE
    if result is not None and wanted:
        mde = power.criterion_mde(result.n, result.df, levels, mde_power(protocol.power, levels))
    return {"mde_tv": _finite(mde), "mde_label": mde_label(test, group), "mde_levels": levels}


# ---------------------------------------------------------------- per-test evaluation


@dataclass(frozen=True)
class Support:
    """The tokens of positive reference probability after one prefix, and their probabilities."""

    tokens: np.ndarray  # int64[k] ascending
    probs: np.ndarray  # f64[k] > 0


def _support_counts(target: np.ndarray, support: Support) -> tuple[np.ndarray, int]:
    """(counts[k] of the target tokens on the support, number of targets outside it): O(n log k),
    never O(V), so a 152k vocabulary costs nothing per stratum."""
    index = np.minimum(np.searchsorted(support.tokens, target), support.tokens.size - 1)
    inside = support.tokens[index] == target
    return np.bincount(index[inside], minlength=support.tokens.size), int((~inside).sum())


def _stratum_counts(tokens: np.ndarray, position: int, paths: np.ndarray | None, supports) -> list:
    """(key, prefix, counts on the prefix's support, out-of-support count) per stratum; key = prefix,
    or (prefix, path) with `paths`; `supports(prefix)` gives the prefix's `Support`."""
    if paths is None:
        parts = [(prefix, prefix, target) for prefix, target in strata(tokens, position)]
    else:
        parts = [
            ((prefix, tuple(SOURCES[c] for c in path)), prefix, target)
            for prefix, path, target in path_strata(tokens, paths, position)
        ]
    return [(key, prefix, *_support_counts(target, supports(prefix))) for key, prefix, target in parts]


def _gof(
    protocol: Protocol,
    test: TestSpec,
    group: str,
    parts: list,
    total: int,
    supports,
    level: float,
    rng: np.random.Generator,
    with_mde: bool,
) -> dict:
    out_of_support = sum(outside for *_, outside in parts)
    result = None
    if any(counts.sum() for _, _, counts, _ in parts):
        result = stratified_gof(
            [(key, counts, supports(prefix).probs) for key, prefix, counts, _ in parts],
            stratum_min=protocol.stratum_min,
            min_expected=protocol.min_expected,
            level=level,
            rng=rng,
        )
    covered = int(result.n) if result else 0
    coverage = _coverage(len(parts), result.num_strata if result else 0, total, covered)
    return _criterion(protocol, test, group, None, result, out_of_support, total, coverage, with_mde)


def _homogeneity(
    protocol: Protocol,
    test: TestSpec,
    group: str,
    parts_a: list,
    parts_b: list,
    totals: tuple,
    supports,
    level: float,
    rng: np.random.Generator,
    with_mde: bool,
) -> dict:
    by_key_b = {key: counts for key, _, counts, _ in parts_b}
    both = [
        (key, counts, by_key_b.get(key, np.zeros_like(counts)), supports(prefix).probs)
        for key, prefix, counts, _ in parts_a
    ]
    result = (
        stratified_homogeneity(
            both, stratum_min=protocol.stratum_min, min_expected=protocol.min_expected, level=level, rng=rng
        )
        if both
        else None
    )
    shared = [(a, b) for _, a, b, _ in both if a.sum() and b.sum()]
    covered = int(sum(a.sum() + b.sum() for a, b in shared))
    strata_total = len(set(by_key_b) | {key for key, *_ in parts_a})
    coverage = _coverage(strata_total, len(shared), sum(totals), covered)
    return _criterion(protocol, test, group, test.baseline, result, 0, totals[0], coverage, with_mde)


def _stratum_row(row: dict, by_path: bool) -> dict:
    """A component row of the summary: `prefix` (and `path`) of a lone stratum, or "joint" with the
    list of its strata (and the path they all share, else None); `p_value` is descriptive
    (asymptotic), never a verdict."""
    key, joint = row["key"], row["joint_keys"]
    out = {k: v for k, v in row.items() if k not in ("key", "joint_keys")}
    if joint is not None:
        members = [_key_dict(k, by_path) for k in joint]
        shared = {"path": _shared_path(members)} if by_path else {}
        return {"prefix": "joint", **shared, "joint": members, **out}
    return {**_key_dict(key, by_path), **out}


def _shared_path(members: list[dict]) -> list | None:
    """The path every stratum of a joint table shares, or None when they differ."""
    paths = {tuple(m["path"]) for m in members}
    return list(paths.pop()) if len(paths) == 1 else None


def _key_dict(key: tuple, by_path: bool) -> dict:
    return {"prefix": list(key[0]), "path": list(key[1])} if by_path else {"prefix": list(key)}


def _criterion(
    protocol: Protocol,
    test: TestSpec,
    group: str,
    baseline: str | None,
    result: StratifiedResult | None,
    out_of_support: int,
    planned: int,
    coverage: dict,
    with_mde: bool,
) -> dict:
    floor = _coverage_floor(protocol)
    if out_of_support:
        verdict, reason = FAIL, f"{out_of_support} sample(s) on tokens of reference probability 0"
    elif result is None or result.df == 0:
        verdict, reason = INCONCLUSIVE, "no sample could be tested (no table with two cells)"
    elif coverage["fraction"] < floor:
        verdict, reason = INCONCLUSIVE, f"coverage {coverage['fraction']:.3g} below the pre-registered {floor:.3g}"
    else:
        verdict, reason = None, ""
    stats_ = (
        {
            "statistic": result.statistic,
            "df": result.df,
            "p_value": result.p_value,
            "num_strata": result.num_strata,
            "num_joint_strata": result.num_joint_strata,
            "num_cells": result.num_cells,
            "monte_carlo": result.mc.to_dict(),
            "strata": [_stratum_row(row, test.by_path) for row in result.components],
        }
        if result
        else {
            "statistic": None,
            "df": None,
            "p_value": None,
            "num_strata": 0,
            "num_joint_strata": 0,
            "num_cells": 0,
            "monte_carlo": None,
            "strata": [],
        }
    )
    if out_of_support:
        stats_["p_value"] = 0.0
    return {
        "kind": test.kind,
        "role": test.role,
        "group": group,
        "baseline": baseline,
        "position": test.position,
        **stats_,
        "out_of_support": out_of_support,
        **_mde(protocol, test, group, result, with_mde),
        "p_adjusted": None,
        "alpha": None,
        "planned_n": planned,
        "effective_n": coverage["samples_covered"],
        "coverage": coverage,
        "verdict": verdict,
        "reason": reason,
    }


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


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


def _quadrature(test: TestSpec, name: str, pairs: list) -> dict:
    is_legacy = all("grid_size" not in pair and pair.get("kind") != STOP_POINT for pair in pairs)
    checked, verdict, reason, statistic = (_legacy_quadrature if is_legacy else _swept_quadrature)(test, pairs)
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
        "verdict": verdict,
        "reason": reason,
    }


# ---------------------------------------------------------------- applicability


def applicable_groups(protocol: Protocol, test: TestSpec) -> list[str]:
    """Groups a test applies to: listed ones, else all (gof) or speculative ones (others)."""
    if test.groups:
        return list(test.groups)
    if test.kind == "gof":
        return [g.name for g in protocol.groups]
    return [g.name for g in protocol.groups if g.is_speculative and g.name != test.baseline]


def criterion_name(test: TestSpec, group: str) -> str:
    suffix = f"{group}_vs_{test.baseline}" if test.kind == "homogeneity" else group
    return f"{test.name}.{suffix}"


def quadrature_names(protocol: Protocol, test: TestSpec, stored: Mapping[str, object]) -> list[str]:
    """Quadrature criteria: one per applicable group, the adversarial pairs, and the stop point
    when `stored` (quadrature.json) holds it (bundles made before it existed do not)."""
    return applicable_groups(protocol, test) + ["adversarial"] + ([STOP_POINT] if STOP_POINT in stored else [])


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


def _validity_tests(protocol: Protocol, data: Mapping[str, GroupData], ref: Reference | None) -> dict[str, dict]:
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


StrataSource = Callable[[str, int, bool], list]  # (group, position, by_path) -> _stratum_counts rows


def supports_of(ref: Reference) -> Callable[[tuple], Support]:
    """prefix -> its `Support`, computed once per prefix."""
    cache: dict[tuple, Support] = {}

    def support(prefix: tuple) -> Support:
        if prefix not in cache:
            probs = ref.probs(prefix)
            tokens = np.flatnonzero(probs > 0.0)
            cache[prefix] = Support(tokens, probs[tokens] / probs[tokens].sum())
        return cache[prefix]

    return support


def statistical_tests(
    protocol: Protocol,
    source: StrataSource,
    totals: Mapping[str, int],
    supports,
    seed_keys: Mapping[str, str],
    with_mde: bool = True,
    stream: str = montecarlo.CURRENT_STREAM,
) -> dict[str, dict]:
    """Every gof and homogeneity criterion from per-stratum token counts (verdicts left to Holm).

    `source` gives a group's strata at a position; `totals[g]` its tested rows; `seed_keys[g]` a
    string naming its seed range, which seeds the criterion's Monte Carlo draws together with the
    protocol hash and the criterion's name (so two stages, or two replicates, draw independently).
    `with_mde=False` leaves the MDEs out (calibration, where only verdicts count). `stream`: the
    Monte Carlo stream of the draws (`montecarlo.STREAMS`; a bundle's own when it is recomputed).
    """
    tests, sizes, digest = {}, family_sizes(protocol), protocol.hash
    for test in protocol.tests:
        if test.kind not in P_VALUED_KINDS:
            continue
        level = protocol.alpha / max(sizes[test.role], 1)
        for group in applicable_groups(protocol, test):
            name = criterion_name(test, group)
            parts = source(group, test.position, test.by_path)
            if test.kind == "gof":
                rng = montecarlo.criterion_rng(digest, name, seed_keys[group], stream=stream)
                tests[name] = _gof(protocol, test, group, parts, totals[group], supports, level, rng, with_mde)
            else:
                rng = montecarlo.criterion_rng(digest, name, seed_keys[group], seed_keys[test.baseline], stream=stream)
                base = source(test.baseline, test.position, False)
                tests[name] = _homogeneity(
                    protocol,
                    test,
                    group,
                    parts,
                    base,
                    (totals[group], totals[test.baseline]),
                    supports,
                    level,
                    rng,
                    with_mde,
                )
    return tests


def _evaluate_tests(
    protocol: Protocol,
    samples: pd.DataFrame,
    ref: Reference | None,
    quadrature: Mapping[str, Mapping],
    ranges: Mapping[str, tuple[int, int]],
    stream: str,
) -> dict[str, dict]:
    vocab = ref.vocab_size if ref is not None else None
    data = {g.name: group_data(samples, g.name, protocol.positions, vocab) for g in protocol.groups}
    tests = _validity_tests(protocol, data, ref)
    for test in protocol.tests:
        if test.kind == "quadrature":
            for name in quadrature_names(protocol, test, quadrature):
                tests[f"quadrature.{name}"] = _quadrature(test, name, quadrature[name])

    if ref is None:
        return tests
    supports, memo = supports_of(ref), {}

    def source(group: str, position: int, by_path: bool) -> list:
        if (group, position, by_path) not in memo:
            rows = data[group]
            memo[group, position, by_path] = _stratum_counts(
                rows.tokens, position, rows.paths if by_path else None, supports
            )
        return memo[group, position, by_path]

    seed_keys = {g: f"{g}:{ranges[g][0]}-{ranges[g][1]}" for g in data}
    tests.update(
        statistical_tests(
            protocol, source, {g: len(d.tokens) for g, d in data.items()}, supports, seed_keys, stream=stream
        )
    )
    return tests


# ---------------------------------------------------------------- families and run verdict


def _apply_holm(tests: dict[str, dict], alpha: float, target_power: float) -> dict[str, dict]:
    families = {}
    for role in ROLES:
        pending = {n: t["p_value"] for n, t in tests.items() if t["role"] == role and t["verdict"] is None}
        adjusted = multiplicity.holm(pending, alpha) if pending else None
        for test in tests.values():
            if test["role"] == role and test["p_value"] is not None:
                test["alpha"] = alpha
        for name in pending:
            test = tests[name]
            test["p_adjusted"] = float(adjusted.adjusted[name])
            rejected = bool(adjusted.rejected[name])
            test["verdict"] = FAIL if rejected else PASS
            test["reason"] = _pvalue_reason(test, rejected, alpha, target_power)
        families[role] = {
            "method": "holm",
            "alpha": alpha,
            "criteria": sorted(n for n, t in tests.items() if t["role"] == role),
        }
    return families


def _pvalue_reason(test: dict, rejected: bool, alpha: float, target_power: float) -> str:
    p = test["p_adjusted"]
    if rejected:
        return f"Holm-adjusted p = {p:.3g} < alpha = {alpha}"
    mde = test["mde_tv"]
    detect = (
        f"; {test['mde_label']} >= {mde:.3g} would have been detected with power >= {target_power}"
        if mde is not None
        else ""
    )
    return f"Holm-adjusted p = {p:.3g} >= alpha = {alpha}{detect}"


def decide(tests: dict[str, dict], protocol: Protocol) -> tuple[dict, str, str]:
    """Holm within each family (fills every p-valued criterion's verdict), then the run verdict:
    (families, verdict, reason)."""
    families = _apply_holm(tests, protocol.alpha, protocol.power)
    return (families, *run_verdict(tests))


def run_verdict(tests: Mapping[str, dict]) -> tuple[str, str]:
    """PASS iff every control and primary criterion passes; FAIL if any fails; else INCONCLUSIVE."""
    gating = {n: t for n, t in tests.items() if t["role"] in GATING_ROLES}
    failed = sorted(n for n, t in gating.items() if t["verdict"] == FAIL)
    if failed:
        return FAIL, "failed: " + ", ".join(failed)
    open_ = sorted(n for n, t in gating.items() if t["verdict"] == INCONCLUSIVE)
    if open_:
        return INCONCLUSIVE, "inconclusive: " + ", ".join(open_)
    if not gating:
        return INCONCLUSIVE, "the protocol has no control or primary criterion"
    return PASS, f"all {len(gating)} control and primary criteria passed"


def group_facts(protocol: Protocol, samples: pd.DataFrame, ranges: Mapping[str, tuple[int, int]]) -> dict:
    """Per group: seed range, planned and effective n, acceptance, token sources by position."""
    facts = {}
    for group in protocol.groups:
        rows = samples[samples["group"] == group.name]
        drafts, accepted = int(rows["num_draft_tokens"].sum()), int(rows["num_accepted_tokens"].sum())
        sources = {
            f"t{k}": {str(s): int(c) for s, c in sorted(rows[f"src{k}"].value_counts().items())}
            for k in range(1, protocol.positions + 1)
        }
        facts[group.name] = {
            "mode": group.mode,
            "draft_loops": group.draft_loops,
            "seed_start": ranges[group.name][0],
            "seed_stop": ranges[group.name][1],
            "planned_n": protocol.samples_per_group,
            "effective_n": int(len(rows)),
            "num_draft_tokens": drafts,
            "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / drafts if drafts else None,
            "num_rounds": int(rows["num_rounds"].sum()),
            "sources": sources,
        }
    return facts


def evaluate(
    protocol: Protocol,
    samples: pd.DataFrame,
    reference: Reference | None,
    quadrature: Mapping[str, Mapping],
    ranges: Mapping[str, tuple[int, int]],
    stream: str = montecarlo.CURRENT_STREAM,
) -> dict:
    """The full summary (see docs/harness.md, "summary.json"): deterministic in its inputs, the
    Monte Carlo `stream` included."""
    tests = _evaluate_tests(protocol, samples, reference, quadrature, ranges, stream)
    families, verdict, reason = decide(tests, protocol)
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": verdict,
        "reason": reason,
        "protocol": {
            "name": protocol.name,
            "hash": protocol.hash,
            "profile": protocol.profile,
            "alpha": protocol.alpha,
            "power": protocol.power,
            "stratum_min": protocol.stratum_min,
            "min_expected": protocol.min_expected,
            "multiplicity": protocol.multiplicity,
            "positions": protocol.positions,
            "samples_per_group": protocol.samples_per_group,
        },
        "groups": group_facts(protocol, samples, ranges),
        "families": families,
        "tests": tests,
    }


# ---------------------------------------------------------------- two-stage confirmation


CONFIRMATION_RULE = (
    "per criterion: a gating criterion that FAILs stage 1 takes its stage-2 verdict (fresh disjoint "
    "seeds, same groups and sizes, alpha_stage2); a failed quadrature check or an out-of-support "
    "sample FAILs at once, without a second stage"
)


def deterministic_failures(tests: Mapping[str, dict]) -> list[str]:
    """Gating FAILs that no second stage may overturn: quadrature checks and out-of-support samples."""
    return sorted(
        n
        for n, t in tests.items()
        if t["role"] in GATING_ROLES
        and t["verdict"] == FAIL
        and (t["kind"] in DETERMINISTIC_KINDS or t.get("out_of_support"))
    )


def needs_second_stage(protocol: Protocol, first: Mapping) -> bool:
    """True iff the protocol has two stages and stage 1 FAILed on p-valued gating criteria only."""
    return (
        protocol.confirmation.is_two_stage and first["verdict"] == FAIL and not deterministic_failures(first["tests"])
    )


def confirms(first: Mapping, second: Mapping) -> bool:
    """True iff stage 2's summary `second` FAILs the run that stage 1's `first` FAILed (the rule of
    `confirm`): the stop rule of a second stage with sequential looks."""
    return _two_stage_verdict(first["tests"], second["tests"])[0] == FAIL


def gating_failures(summary: Mapping) -> list[str]:
    """The gating criteria that FAIL in one stage's summary."""
    return _gating_failures(summary["tests"])


def _gating_failures(tests: Mapping[str, dict]) -> list[str]:
    return sorted(n for n, t in tests.items() if t["role"] in GATING_ROLES and t["verdict"] == FAIL)


def _num_gating_families(tests: Mapping[str, dict]) -> int:
    return len(
        {
            t["role"]
            for t in tests.values()
            if t["role"] in GATING_ROLES and t["p_value"] is not None and t["kind"] != "quadrature"
        }
    )


def _two_stage_verdict(first: Mapping[str, dict], second: Mapping[str, dict]) -> tuple[str, str, list[str]]:
    """(verdict, reason, failing criteria): each stage-1 gating FAIL replaced by its stage-2 verdict;
    a deterministic failure of stage 2 (a token out of range or out of support, an impossible count)
    FAILs its criterion whatever stage 1 said: it is proof of a bug, not a chance deviation."""
    retried = _gating_failures(first)
    proven = deterministic_failures(second)
    merged = {
        n: ({**t, "verdict": second[n]["verdict"]} if n in retried or n in proven else t) for n, t in first.items()
    }
    verdict, reason = run_verdict(merged)
    outcome = ", ".join(f"{n} {second[n]['verdict']}" for n in retried)
    outcome += "".join(f"; deterministic stage-2 failure: {n}" for n in proven if n not in retried)
    return (
        verdict,
        f"{reason} (two stages; stage 1 failed {', '.join(retried)}; stage 2: {outcome})",
        _gating_failures(merged),
    )


def _rates(protocol: Protocol, families: int) -> dict[str, Any]:
    if not protocol.confirmation.is_two_stage:
        return {"rates": None, "run_false_fail_bound": families * protocol.alpha}
    rates = two_stage(protocol.alpha, protocol.alpha_stage2, protocol.power, protocol.power)
    return {"rates": rates.to_dict(), "run_false_fail_bound": families * rates.false_fail}


def confirm(protocol: Protocol, first: dict, second: dict | None = None) -> dict:
    """The run's summary: stage 1's summary with the `confirmation` entry and the combined verdict.

    Guarantee (two stages, stages independent given the SUT): a correct SUT FAILs the run with
    probability <= (number of p-valued gating families) * alpha * alpha_stage2; a deviation of TV at
    least both stages' MDE of a criterion FAILs it in both with probability >= power ** 2.
    """
    tests = first["tests"]
    block = {
        "stages": protocol.confirmation.stages,
        "rule": CONFIRMATION_RULE,
        "alpha_stage1": protocol.alpha,
        "alpha_stage2": protocol.alpha_stage2 if protocol.confirmation.is_two_stage else None,
        "gating_families": _num_gating_families(tests),
        "deterministic": deterministic_failures(tests),
        "triggered": second is not None,
        "failing": _gating_failures(tests),
        "stage2": None,
    }
    block.update(_rates(protocol, block["gating_families"]))
    summary = {**first, "confirmation": block}
    if second is not None:
        summary["verdict"], summary["reason"], block["failing"] = _two_stage_verdict(tests, second["tests"])
        block["stage2"] = {key: second[key] for key in ("verdict", "reason", "groups", "families", "tests")}
    elif block["deterministic"] and protocol.confirmation.is_two_stage:
        summary["reason"] += " (deterministic failure: no second stage)"
    return summary
