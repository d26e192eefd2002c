"""Decision: the verdict words, Holm within each family and the run verdict, and the two-stage
confirmation of a run's verdict.

p-valued criteria are corrected with Holm within their family (the test's role); the run PASSes
iff every control and primary criterion PASSes; it FAILs if any of them FAILs; else INCONCLUSIVE.

Two-stage confirmation (`confirm`): when stage 1 FAILs only on p-valued criteria, stage 2 runs on
fresh disjoint seeds and every stage-1 FAIL of a gating criterion is replaced by its stage-2
verdict; a deterministic failure in either stage FAILs the run.

Functions of the criteria rows alone (`specval.distribution.criteria` and `.checks` make them):
the sequence kind decides its own criteria with `decide` too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specval.protocol import GATING_ROLES, ROLES, Protocol
from specval.stats import multiplicity
from specval.stats.confirmation import two_stage

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
DETERMINISTIC_KINDS = ("quadrature", "validity")


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
