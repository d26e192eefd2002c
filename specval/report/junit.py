"""JUnit XML of a summary: one test case per criterion, for CI systems."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

from specval.protocol import GATING_ROLES


def _failing(summary: dict) -> set[str]:
    """Gating criteria that fail the run: after confirmation, only the stage-1 FAILs stage 2 confirmed."""
    if "confirmation" in summary:
        return set(summary["confirmation"]["failing"])
    return {n for n, t in summary["tests"].items() if t["verdict"] == "FAIL" and t["role"] in GATING_ROLES}


def _reason(summary: dict, name: str) -> str:
    second = (summary.get("confirmation") or {}).get("stage2")
    reason = summary["tests"][name]["reason"]
    return f"{reason}; stage 2: {second['tests'][name]['reason']}" if second else reason


def write_junit(summary: dict, path: Path) -> None:
    """Gating FAIL that fails the run -> <failure>; any other non-PASS (INCONCLUSIVE, secondary FAIL,
    a stage-1 FAIL that stage 2 did not confirm) -> <skipped>, as it does not gate."""
    tests, failing = summary["tests"], _failing(summary)
    suite = ET.Element("testsuite", name=f"specval.{summary['protocol']['name']}", tests=str(len(tests)),
                       failures=str(len(failing)),
                       skipped=str(sum(t["verdict"] != "PASS" and n not in failing for n, t in tests.items())))
    for name, test in sorted(tests.items()):
        case = ET.SubElement(suite, "testcase", classname=test["role"], name=name)
        if name in failing:
            ET.SubElement(case, "failure", message=_reason(summary, name)).text = _reason(summary, name)
        elif test["verdict"] != "PASS":
            ET.SubElement(case, "skipped", message=f"{test['verdict']} ({test['role']}): {test['reason']}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
