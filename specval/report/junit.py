"""JUnit XML of a summary: one test case per criterion, for CI systems."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

from specval.protocol import GATING_ROLES


def write_junit(summary: dict, path: Path) -> None:
    """Gating FAIL -> <failure>; INCONCLUSIVE and secondary FAIL -> <skipped> (they never gate)."""
    tests = summary["tests"]
    suite = ET.Element("testsuite", name=f"specval.{summary['protocol']['name']}", tests=str(len(tests)),
                       failures=str(sum(t["verdict"] == "FAIL" and t["role"] in GATING_ROLES
                                        for t in tests.values())),
                       skipped=str(sum(t["verdict"] != "PASS" and not (t["verdict"] == "FAIL" and t["role"]
                                                                        in GATING_ROLES) for t in tests.values())))
    for name, test in sorted(tests.items()):
        case = ET.SubElement(suite, "testcase", classname=test["role"], name=name)
        if test["verdict"] == "FAIL" and test["role"] in GATING_ROLES:
            ET.SubElement(case, "failure", message=test["reason"]).text = test["reason"]
        elif test["verdict"] != "PASS":
            ET.SubElement(case, "skipped", message=f"{test['verdict']} ({test['role']}): {test['reason']}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
