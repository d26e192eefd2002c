"""JUnit XML of a summary: one test case per criterion, for CI systems (FAIL -> failure,
INCONCLUSIVE -> error, so that a CI report tells "wrong" from "could not test")."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from specval.protocol import GATING_ROLES

INCONCLUSIVE = "INCONCLUSIVE"  # a criterion's verdict when it could not test


def failing(summary: Mapping[str, Any]) -> set[str]:
    """Gating criteria that fail the run: after confirmation, only the stage-1 FAILs stage 2 confirmed."""
    if "confirmation" in summary:
        return set(summary["confirmation"]["failing"])
    return {n for n, t in summary["tests"].items() if t["verdict"] == "FAIL" and t["role"] in GATING_ROLES}


def reason(summary: Mapping[str, Any], name: str) -> str:
    """The criterion's reason, with its stage-2 reason appended when a second stage ran."""
    second = (summary.get("confirmation") or {}).get("stage2")
    first = summary["tests"][name]["reason"]
    return f"{first}; stage 2: {second['tests'][name]['reason']}" if second else first


CASE_PROPERTIES = (  # property name -> the criterion's summary keys, first present wins
    ("statistic", ("statistic",)),
    ("p_value", ("p_value",)),
    ("p_adjusted", ("p_adjusted",)),
    ("mde", ("mde_tv",)),
    ("mde_label", ("mde_label",)),
    ("sample_size", ("effective_n", "n")),
    ("planned_n", ("planned_n",)),
)


def _properties(parent: ET.Element, pairs: list[tuple[str, object]]) -> None:
    """<properties> with one <property name value> per pair whose value is not None."""
    kept = [(name, value) for name, value in pairs if value is not None]
    if kept:
        block = ET.SubElement(parent, "properties")
        for name, value in kept:
            ET.SubElement(block, "property", name=name, value=str(value))


def _case_properties(test: dict, bundle: Path | None) -> list[tuple[str, object]]:
    values = [(name, next((test[k] for k in keys if test.get(k) is not None), None)) for name, keys in CASE_PROPERTIES]
    return values + [("bundle", bundle)]


def _suite_properties(summary: dict, bundle: Path | None) -> list[tuple[str, object]]:
    proto, registration = summary["protocol"], summary.get("registration") or {}
    looked = summary.get("sequential") or {}
    return [
        ("protocol", proto["name"]),
        ("protocol_hash", proto.get("hash")),
        ("profile", proto.get("profile")),
        ("verdict", summary["verdict"]),
        ("exploratory", registration.get("exploratory")),
        ("stopped_at_look", looked.get("stopped_at_look")),
        ("looks", looked.get("num_looks")),
        ("samples_per_group", looked.get("samples_per_group_at_stop")),
        ("bundle", bundle),
    ]


def inconclusive(summary: dict) -> set[str]:
    """Gating criteria that could not decide: they keep the run from a PASS (exit 4)."""
    return {n for n, t in summary["tests"].items() if t["verdict"] == INCONCLUSIVE and t["role"] in GATING_ROLES}


def write_junit(summary: dict, path: Path, bundle: Path | None = None) -> None:
    """Gating FAIL that fails the run -> <failure>; gating INCONCLUSIVE (the criterion could not
    test, so the run is not a PASS) -> <error type="INCONCLUSIVE"> with its reason; any other
    non-PASS (a secondary criterion, a stage-1 FAIL that stage 2 did not confirm) -> <skipped>, as it
    does not gate. The suite carries
    the protocol, its hash, profile, verdict, exploratory flag and `bundle` as <properties>; each case
    its statistic, p-value, Holm p, MDE (TV) and its label, sample size (samples tested), planned n and
    `bundle` (those the criterion has). A run with sequential looks adds to the suite the look it
    stopped at, the number of looks and the samples per group it had collected then."""
    tests, failed, errors = summary["tests"], failing(summary), inconclusive(summary)
    suite = ET.Element(
        "testsuite",
        name=f"specval.{summary['protocol']['name']}",
        tests=str(len(tests)),
        failures=str(len(failed)),
        errors=str(len(errors)),
        skipped=str(sum(t["verdict"] != "PASS" and n not in failed | errors for n, t in tests.items())),
    )
    _properties(suite, _suite_properties(summary, bundle))
    for name, test in sorted(tests.items()):
        case = ET.SubElement(suite, "testcase", classname=test["role"], name=name)
        _properties(case, _case_properties(test, bundle))
        if name in failed:
            ET.SubElement(case, "failure", message=reason(summary, name)).text = reason(summary, name)
        elif name in errors:
            message = f"{INCONCLUSIVE} ({test['role']}): {reason(summary, name)}"
            ET.SubElement(case, "error", message=message, type=INCONCLUSIVE).text = message
        elif test["verdict"] != "PASS":
            ET.SubElement(case, "skipped", message=f"{test['verdict']} ({test['role']}): {test['reason']}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
