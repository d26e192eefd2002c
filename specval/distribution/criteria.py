"""Criteria: the p-valued criteria of a distribution protocol, one summary row each.

- `t<k>_gof.<group>`: stratified GOF of t_k given t_1..t_{k-1}; strata below `stratum_min` are
  tested jointly; exact-size Monte Carlo p-value under the reference (`specval.stats.strata`).
- `t<k>_homogeneity.<group>_vs_<baseline>`: stratified permutation test given the margins.

Here too: the groups a test applies to and its criteria's names, Holm's family sizes, the level
each criterion is actually decided at and its MDE at that level (`decision_levels`), the coverage
of its strata. A row's verdict is left to Holm (`specval.distribution.decision`) unless it tested
nothing, covered less than the pre-registered floor, or met a sample out of support. The
deterministic criteria are in `specval.distribution.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specval.distribution import looks
from specval.distribution.decision import FAIL, INCONCLUSIVE
from specval.distribution.effects import EFFECT_KEY, gof_effect, homogeneity_effect
from specval.distribution.strata import StrataSource
from specval.protocol import ROLES, Protocol, TestSpec
from specval.stats import montecarlo, power
from specval.stats.montecarlo import DECISION_LEVEL_FACTOR
from specval.stats.strata import StratifiedResult, stratified_gof, stratified_homogeneity

P_VALUED_KINDS = ("gof", "homogeneity")
COVERAGE_FLOOR_KEY = "min_coverage"  # protocol key of a pre-registered coverage floor (optional)


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
    strata = [(key, counts, supports(prefix).probs) for key, prefix, counts, _ in parts]
    if any(counts.sum() for _, _, counts, _ in parts):
        result = stratified_gof(
            strata,
            stratum_min=protocol.stratum_min,
            min_expected=protocol.min_expected,
            level=level,
            rng=rng,
        )
    covered = int(result.n) if result else 0
    coverage = _coverage(len(parts), result.num_strata if result else 0, total, covered)
    row = _criterion(protocol, test, group, None, result, out_of_support, total, coverage, with_mde)
    effect = gof_effect(strata, result, protocol.stratum_min, protocol.min_expected, test.by_path) if with_mde else None
    return {**row, EFFECT_KEY: effect}


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
    row = _criterion(protocol, test, group, test.baseline, result, 0, totals[0], coverage, with_mde)
    effect = homogeneity_effect(both, result, protocol.stratum_min, protocol.min_expected) if with_mde else None
    return {**row, EFFECT_KEY: effect}


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
    `with_mde=False` leaves the MDEs and the observed effects (`effects`) out (calibration, where
    only verdicts count). `stream`: the
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
