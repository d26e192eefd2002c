"""JUnit XML of a summary: one test case per criterion, for CI systems."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

from specval.protocol import GATING_ROLES


def failing(summary: dict) -> set[str]:
    """Gating criteria that fail the run: after confirmation, only the stage-1 FAILs stage 2 confirmed."""
    if "confirmation" in summary:
        return set(summary["confirmation"]["failing"])
    return {n for n, t in summary["tests"].items() if t["verdict"] == "FAIL" and t["role"] in GATING_ROLES}


def reason(summary: dict, name: str) -> str:
    """The criterion's reason, with its stage-2 reason appended when a second stage ran."""
    second = (summary.get("confirmation") or {}).get("stage2")
    first = summary["tests"][name]["reason"]
    return f"{first}; stage 2: {second['tests'][name]['reason']}" if second else first


def write_junit(summary: dict, path: Path) -> None:
    """Gating FAIL that fails the run -> <failure>; any other non-PASS (INCONCLUSIVE, secondary FAIL,
    a stage-1 FAIL that stage 2 did not confirm) -> <skipped>, as it does not gate."""
    tests, failed = summary["tests"], failing(summary)
    suite = ET.Element("testsuite", name=f"specval.{summary['protocol']['name']}", tests=str(len(tests)),
                       failures=str(len(failed)),
                       skipped=str(sum(t["verdict"] != "PASS" and n not in failed for n, t in tests.items())))
    for name, test in sorted(tests.items()):
        case = ET.SubElement(suite, "testcase", classname=test["role"], name=name)
        if name in failed:
            ET.SubElement(case, "failure", message=reason(summary, name)).text = reason(summary, name)
        elif test["verdict"] != "PASS":
            ET.SubElement(case, "skipped", message=f"{test['verdict']} ({test['role']}): {test['reason']}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
