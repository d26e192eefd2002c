"""Verdict: the protocol's criteria evaluated on raw samples and stored references.

`evaluate` is a pure function of (protocol, samples, reference, quadrature results): the run
calls it once and `specval verify` calls it again on the bundle, so any hand edit of a verdict,
a statistic or a raw sample shows up as a difference.

Criteria (one per test and applicable group):
- `t<k>_gof.<group>`: Pearson GOF of t_k within each stratum of (t_1..t_{k-1}) that holds at least
  `stratum_min` samples, aggregated over strata (sum of chi-squares, summed df). Any sample on a
  token of reference probability 0, in any stratum, is an immediate FAIL.
- `t<k>_homogeneity.<group>_vs_<baseline>`: chi2_contingency (no continuity correction) per
  stratum reached by both groups, aggregated the same way.
- `quadrature.<group>` and `quadrature.adversarial`: the swept output law of the SUT's accept
  kernel against the exact law of the same p and q (`specval.stats.quadrature`), within the grid's
  resolution plus the rounding allowance (the test's `tol` included); `quadrature.stop_point`: a
  draft with p = 0 at u_accept = 0 must be rejected. Bundles stored by the earlier cell
  quadrature (pairs without `grid_size`) are evaluated by the earlier rule, so they still verify.

Each criterion is PASS, FAIL or INCONCLUSIVE (no stratum reached `stratum_min`). p-valued
criteria are corrected with Holm within their family (the test's role); the run PASSes iff every
control and primary criterion PASSes; it FAILs if any of them FAILs; else it is INCONCLUSIVE.

Two-stage confirmation (`confirmation.stages: 2`, see `confirm`): when stage 1 FAILs only on
p-valued criteria, the runner collects stage 2 on fresh disjoint seeds (same groups and sizes) and
every stage-1 FAIL of a gating criterion is replaced by the same criterion's stage-2 verdict
(evaluated at `alpha_stage2`). A failed quadrature check or a sample out of support is
deterministic: the run FAILs at once and no stage 2 is collected.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from specval.protocol import GATING_ROLES, ROLES, Protocol, TestSpec
from specval.reference import Reference
from specval.stats import multiplicity, power
from specval.stats.confirmation import two_stage
from specval.stats.gof import aggregate_gof, goodness_of_fit
from specval.stats.homogeneity import aggregate_homogeneity, homogeneity
from specval.stats.quadrature import exact_law, rounding_allowance, stop_point_passed
from specval.sut import SOURCES

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
STOP_POINT = "stop_point"  # quadrature.json key and criterion of the stop-point case
SCHEMA_VERSION = 1


# ---------------------------------------------------------------- strata


def strata(tokens: np.ndarray, position: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Split tokens[N, n] into strata of prefix t_1..t_{position-1}: [(prefix, t_position[n_s])]."""
    target = tokens[:, position - 1]
    if position == 1:
        return [((), target)]
    prefixes, inverse = np.unique(tokens[:, : position - 1], axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(prefixes)))[:-1]
    return [(tuple(int(t) for t in p), part) for p, part in zip(prefixes, np.split(target[order], bounds))]


def path_strata(tokens: np.ndarray, paths: np.ndarray, position: int) -> list[tuple[tuple[int, ...], tuple[int, ...],
                                                                                  np.ndarray]]:
    """Strata of (prefix, path): paths[N, n] holds each token's source code (index in SOURCES)."""
    keyed = np.concatenate([tokens[:, : position - 1], paths[:, : position - 1]], axis=1)
    with_key = np.concatenate([keyed, tokens[:, position - 1 : position]], axis=1)
    width = position - 1
    return [(key[:width], key[width:], target) for key, target in strata(with_key, 2 * width + 1)]


def _paths(samples: pd.DataFrame, group: str, positions: int) -> np.ndarray:
    rows = samples[samples["group"] == group]
    codes = {name: i for i, name in enumerate(SOURCES)}
    return np.stack([rows[f"src{k}"].map(codes).to_numpy(dtype=np.int64) for k in range(1, positions + 1)], axis=1)


def _tokens(samples: pd.DataFrame, group: str, positions: int) -> np.ndarray:
    rows = samples[samples["group"] == group]
    return rows[[f"t{k}" for k in range(1, positions + 1)]].to_numpy(dtype=np.int64)


def _coverage(num_strata: int, covered: list[int], total: int) -> dict[str, Any]:
    return {"strata_total": num_strata, "strata_covered": len(covered), "samples_total": total,
            "samples_covered": int(sum(covered)), "fraction": float(sum(covered) / total) if total else 0.0}


# ---------------------------------------------------------------- per-test evaluation


def _gof(protocol: Protocol, test: TestSpec, group: str, samples: pd.DataFrame, ref: Reference) -> dict:
    tokens = _tokens(samples, group, protocol.positions)
    if test.by_path:
        all_strata = path_strata(tokens, _paths(samples, group, protocol.positions), test.position)
    else:
        all_strata = [(prefix, None, target) for prefix, target in strata(tokens, test.position)]
    results, rows, out_of_support = [], [], 0
    for prefix, path, target in all_strata:
        probs = ref.probs(prefix)
        counts = np.bincount(target, minlength=ref.vocab_size)
        if len(target) >= protocol.stratum_min:
            result = goodness_of_fit(counts, probs, min_expected=protocol.min_expected)
            results.append(result)
            where = {"prefix": list(prefix)} | ({"path": [SOURCES[c] for c in path]} if path is not None else {})
            rows.append({**where, **result.to_dict()})
        else:
            out_of_support += int(counts[probs == 0.0].sum())
    agg = aggregate_gof(results)
    out_of_support += agg.out_of_support
    mde = power.mde_tv(agg.n, agg.df + 1, protocol.alpha, protocol.power)
    return _criterion(test, group, None, agg.to_dict(), out_of_support, mde, len(tokens), rows,
                      _coverage(len(all_strata), [r["n"] for r in rows], len(tokens)))


def _homogeneity(protocol: Protocol, test: TestSpec, group: str, samples: pd.DataFrame, ref: Reference) -> dict:
    tokens_a = _tokens(samples, group, protocol.positions)
    by_prefix_b = dict(strata(_tokens(samples, test.baseline, protocol.positions), test.position))
    all_a = strata(tokens_a, test.position)
    results, rows = [], []
    for prefix, target_a in all_a:
        target_b = by_prefix_b.get(prefix, np.zeros(0, dtype=np.int64))
        if min(len(target_a), len(target_b)) < protocol.stratum_min:
            continue
        counts = [np.bincount(t, minlength=ref.vocab_size) for t in (target_a, target_b)]
        result = homogeneity(counts[0], counts[1], ref.probs(prefix), min_expected=protocol.min_expected)
        results.append(result)
        rows.append({"prefix": list(prefix), **result.to_dict()})
    agg = aggregate_homogeneity(results)
    n_a, n_b = sum(r["n_a"] for r in rows), sum(r["n_b"] for r in rows)
    mde = power.mde_tv_two_sample(n_a, n_b, agg.df + 1, protocol.alpha, protocol.power)
    return _criterion(test, group, test.baseline, agg.to_dict(), 0, mde, len(tokens_a), rows,
                      _coverage(len(all_a), [r["n_a"] for r in rows], len(tokens_a)))


def _criterion(test: TestSpec, group: str, baseline: str | None, agg: dict, out_of_support: int,
               mde: float, planned: int, rows: list, coverage: dict) -> dict:
    if out_of_support:
        verdict, reason = FAIL, f"{out_of_support} sample(s) on tokens of reference probability 0"
    elif not rows:
        verdict, reason = INCONCLUSIVE, "no stratum reached the stratum minimum"
    else:
        verdict, reason = None, ""
    return {"kind": test.kind, "role": test.role, "group": group, "baseline": baseline,
            "position": test.position, "statistic": agg["statistic"], "df": agg["df"],
            "p_value": 0.0 if out_of_support else agg["p_value"], "num_strata": agg["num_strata"],
            "out_of_support": out_of_support, "mde_tv": _finite(mde), "p_adjusted": None, "alpha": None,
            "planned_n": planned,
            "effective_n": coverage["samples_covered"], "coverage": coverage, "strata": rows,
            "verdict": verdict, "reason": reason}


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
    reason = (f"exact law differs from p beyond tol {test.tol:.3g} for: {', '.join(failed)}" if failed else
              f"{len(checked)} pair(s), max |law - p| = {worst[1]:.3g} <= tol {test.tol:.3g} (+ normalisation slack)")
    return ({c[0]: {"max_abs_error": c[1], "passed": c[2]} for c in checked}, FAIL if failed else PASS, reason,
            worst[1])


def _pair_error(pair: Mapping, tol: float) -> dict:
    """Recompute one stored sweep against the exact law of its p and q: error, limit, passed."""
    p, q = np.asarray(pair["p"], dtype=np.float64), np.asarray(pair["q"], dtype=np.float64)
    law = np.asarray(pair["law"], dtype=np.float64)
    exact, exact_error = exact_law(p, q)
    error = float(np.abs(law - exact).max())
    mass_error = abs(float(pair["error_mass"]) - exact_error)
    resolution = 1.0 / int(pair["grid_size"])
    allowance = tol + rounding_allowance(np.dtype(pair["prob_dtype"]))
    return {"max_abs_error": error, "error_mass_error": mass_error, "resolution": resolution,
            "allowance": allowance, "law_deviation": float(np.abs(exact - p / p.sum()).max()),
            "passed": bool(max(error, mass_error) <= resolution + allowance)}


def _stop_point(pair: Mapping) -> dict:
    return {"first_token": int(pair["first_token"]),
            "passed": stop_point_passed(np.asarray(pair["p"], dtype=np.float64), int(pair["first_token"]))}


def _swept_quadrature(test: TestSpec, pairs: list) -> tuple[dict, str, str, float]:
    checked = {pair["name"]: _stop_point(pair) if pair.get("kind") == STOP_POINT else _pair_error(pair, test.tol)
               for pair in pairs}
    failed = [name for name, c in checked.items() if not c["passed"]]
    swept = [c for c in checked.values() if "max_abs_error" in c]
    if not swept:  # the stop point alone
        token = next(iter(checked.values()))["first_token"]
        return checked, FAIL if failed else PASS, (
            f"a draft with p = 0 at u_accept = 0 emitted token {token}" + (
                " (it must be rejected)" if failed else ", a correction: rejected as it must be")), 0.0
    worst = max(swept, key=lambda c: c["max_abs_error"])
    bound = f"resolution {worst['resolution']:.3g} + allowance {worst['allowance']:.2g}"
    if failed:
        return checked, FAIL, f"swept law differs from the exact law beyond {bound} for: {', '.join(failed)}", \
            worst["max_abs_error"]
    deviation = max(c["law_deviation"] for c in swept)
    return checked, PASS, (f"{len(swept)} pair(s), max |swept law - exact law| = {worst['max_abs_error']:.3g} <= "
                           f"{bound}; exact law vs p / T_p: max {deviation:.3g} (normalisation, reported only)"), \
        worst["max_abs_error"]


def _quadrature(test: TestSpec, name: str, pairs: list) -> dict:
    is_legacy = all("grid_size" not in pair and pair.get("kind") != STOP_POINT for pair in pairs)
    checked, verdict, reason, statistic = (_legacy_quadrature if is_legacy else _swept_quadrature)(test, pairs)
    return {"kind": test.kind, "role": test.role, "group": name, "baseline": None, "position": None,
            "statistic": statistic, "df": None, "p_value": None, "p_adjusted": None, "alpha": None,
            "tol": test.tol, "mde_tv": None, "planned_n": None, "effective_n": None,
            "pairs": checked, "verdict": verdict, "reason": reason}


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


def _evaluate_tests(protocol: Protocol, samples: pd.DataFrame, ref: Reference | None,
                    quadrature: Mapping[str, Mapping]) -> dict[str, dict]:
    tests = {}
    for test in protocol.tests:
        if test.kind == "quadrature":
            for name in quadrature_names(protocol, test, quadrature):
                tests[f"quadrature.{name}"] = _quadrature(test, name, quadrature[name])
            continue
        for group in applicable_groups(protocol, test):
            evaluate_one = _gof if test.kind == "gof" else _homogeneity
            tests[criterion_name(test, group)] = evaluate_one(protocol, test, group, samples, ref)
    return tests


# ---------------------------------------------------------------- families and run verdict


def _apply_holm(tests: dict[str, dict], alpha: float, target_power: float) -> dict[str, dict]:
    families = {}
    for role in ROLES:
        pending = {n: t["p_value"] for n, t in tests.items() if t["role"] == role and t["verdict"] is None}
        adjusted = multiplicity.holm(pending, alpha) if pending else None
        for name, test in tests.items():
            if test["role"] == role and test["p_value"] is not None:
                test["alpha"] = alpha
        for name in pending:
            test = tests[name]
            test["p_adjusted"] = float(adjusted.adjusted[name])
            rejected = bool(adjusted.rejected[name])
            test["verdict"] = FAIL if rejected else PASS
            test["reason"] = _pvalue_reason(test, rejected, alpha, target_power)
        families[role] = {"method": "holm", "alpha": alpha, "criteria": sorted(n for n, t in tests.items()
                                                                             if t["role"] == role)}
    return families


def _pvalue_reason(test: dict, rejected: bool, alpha: float, target_power: float) -> str:
    p = test["p_adjusted"]
    if rejected:
        return f"Holm-adjusted p = {p:.3g} < alpha = {alpha}"
    mde = test["mde_tv"]
    detect = f"; TV >= {mde:.3g} would have been detected with power >= {target_power}" if mde is not None else ""
    return f"Holm-adjusted p = {p:.3g} >= alpha = {alpha}{detect}"


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
        sources = {f"t{k}": {str(s): int(c) for s, c in sorted(rows[f"src{k}"].value_counts().items())}
                   for k in range(1, protocol.positions + 1)}
        facts[group.name] = {"mode": group.mode, "draft_loops": group.draft_loops,
                             "seed_start": ranges[group.name][0], "seed_stop": ranges[group.name][1],
                             "planned_n": protocol.samples_per_group, "effective_n": int(len(rows)),
                             "num_draft_tokens": drafts, "num_accepted_tokens": accepted,
                             "acceptance_rate": accepted / drafts if drafts else None,
                             "num_rounds": int(rows["num_rounds"].sum()), "sources": sources}
    return facts


def evaluate(protocol: Protocol, samples: pd.DataFrame, reference: Reference | None,
             quadrature: Mapping[str, Mapping], ranges: Mapping[str, tuple[int, int]]) -> dict:
    """The full summary (see docs/harness.md, "summary.json"): deterministic in its inputs."""
    tests = _evaluate_tests(protocol, samples, reference, quadrature)
    families = _apply_holm(tests, protocol.alpha, protocol.power)
    verdict, reason = run_verdict(tests)
    return {"schema_version": SCHEMA_VERSION, "verdict": verdict, "reason": reason,
            "protocol": {"name": protocol.name, "hash": protocol.hash, "profile": protocol.profile,
                         "alpha": protocol.alpha, "power": protocol.power, "stratum_min": protocol.stratum_min,
                         "min_expected": protocol.min_expected, "multiplicity": protocol.multiplicity,
                         "positions": protocol.positions, "samples_per_group": protocol.samples_per_group},
            "groups": group_facts(protocol, samples, ranges), "families": families, "tests": tests}


# ---------------------------------------------------------------- two-stage confirmation


CONFIRMATION_RULE = ("per criterion: a gating criterion that FAILs stage 1 takes its stage-2 verdict (fresh disjoint "
                     "seeds, same groups and sizes, alpha_stage2); a failed quadrature check or an out-of-support "
                     "sample FAILs at once, without a second stage")


def deterministic_failures(tests: Mapping[str, dict]) -> list[str]:
    """Gating FAILs that no second stage may overturn: quadrature checks and out-of-support samples."""
    return sorted(n for n, t in tests.items() if t["role"] in GATING_ROLES and t["verdict"] == FAIL
                  and (t["kind"] == "quadrature" or t.get("out_of_support")))


def needs_second_stage(protocol: Protocol, first: Mapping) -> bool:
    """True iff the protocol has two stages and stage 1 FAILed on p-valued gating criteria only."""
    return (protocol.confirmation.is_two_stage and first["verdict"] == FAIL
            and not deterministic_failures(first["tests"]))


def _gating_failures(tests: Mapping[str, dict]) -> list[str]:
    return sorted(n for n, t in tests.items() if t["role"] in GATING_ROLES and t["verdict"] == FAIL)


def _num_gating_families(tests: Mapping[str, dict]) -> int:
    return len({t["role"] for t in tests.values() if t["role"] in GATING_ROLES and t["p_value"] is not None
                and t["kind"] != "quadrature"})


def _two_stage_verdict(first: Mapping[str, dict], second: Mapping[str, dict]) -> tuple[str, str, list[str]]:
    """(verdict, reason, failing criteria): each stage-1 gating FAIL replaced by its stage-2 verdict."""
    retried = _gating_failures(first)
    merged = {n: ({**t, "verdict": second[n]["verdict"]} if n in retried else t) for n, t in first.items()}
    verdict, reason = run_verdict(merged)
    outcome = ", ".join(f"{n} {second[n]['verdict']}" for n in retried)
    return verdict, f"{reason} (two stages; stage 1 failed {', '.join(retried)}; stage 2: {outcome})", \
        _gating_failures(merged)


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
    block = {"stages": protocol.confirmation.stages, "rule": CONFIRMATION_RULE, "alpha_stage1": protocol.alpha,
             "alpha_stage2": protocol.alpha_stage2 if protocol.confirmation.is_two_stage else None,
             "gating_families": _num_gating_families(tests), "deterministic": deterministic_failures(tests),
             "triggered": second is not None, "failing": _gating_failures(tests), "stage2": None}
    block.update(_rates(protocol, block["gating_families"]))
    summary = {**first, "confirmation": block}
    if second is not None:
        summary["verdict"], summary["reason"], block["failing"] = _two_stage_verdict(tests, second["tests"])
        block["stage2"] = {key: second[key] for key in ("verdict", "reason", "groups", "families", "tests")}
    elif block["deterministic"] and protocol.confirmation.is_two_stage:
        summary["reason"] += " (deterministic failure: no second stage)"
    return summary
