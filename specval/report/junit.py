"""JUnit XML of a summary: one test case per criterion, for CI systems."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET


def write_junit(summary: dict, path: Path) -> None:
    """FAIL -> <failure>, INCONCLUSIVE -> <skipped>; secondary criteria are reported, never gate."""
    tests = summary["tests"]
    suite = ET.Element("testsuite", name=f"specval.{summary['protocol']['name']}", tests=str(len(tests)),
                       failures=str(sum(t["verdict"] == "FAIL" for t in tests.values())),
                       skipped=str(sum(t["verdict"] == "INCONCLUSIVE" for t in tests.values())))
    for name, test in sorted(tests.items()):
        case = ET.SubElement(suite, "testcase", classname=test["role"], name=name)
        if test["verdict"] == "FAIL":
            ET.SubElement(case, "failure", message=test["reason"]).text = test["reason"]
        elif test["verdict"] == "INCONCLUSIVE":
            ET.SubElement(case, "skipped", message=test["reason"])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
