"""JUnit XML of a summary: one case per criterion with its figures as <properties>, the run's facts on
the suite. Deterministic: rendered from the kept t2_fp32 bundle's summary (reports/). Its folders are created; a
suite's file holds one <testsuite> per member."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specval.protocol import ProtocolError
from specval.report.junit import check_target, grouped_element, no_verdict_element, run_element, write_junit

KEPT = Path(__file__).resolve().parents[3] / "reports" / "t2_fp32-20261201T013950Z"


def _properties(element: ET.Element) -> dict[str, str]:
    return {p.get("name"): p.get("value") for p in element.findall("properties/property")}


def test_cases_carry_statistic_p_value_mde_sample_size_and_the_bundle(tmp_path):
    summary = json.loads((KEPT / "summary.json").read_text())
    write_junit(summary, tmp_path / "j.xml", KEPT)
    suite = ET.parse(tmp_path / "j.xml").getroot()
    facts = _properties(suite)
    assert facts == {
        "protocol": "t2_fp32",
        "protocol_hash": summary["protocol"]["hash"],
        "profile": "ci",
        "verdict": "PASS",
        "exploratory": "False",
        "bundle": str(KEPT),
    }
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) == set(summary["tests"])
    t2 = summary["tests"]["t2_gof.sync"]
    recorded = _properties(cases["t2_gof.sync"])
    assert recorded == {
        "statistic": str(t2["statistic"]),
        "p_value": str(t2["p_value"]),
        "p_adjusted": str(t2["p_adjusted"]),
        "mde": str(t2["mde_tv"]),
        "mde_label": t2["mde_label"],
        "sample_size": str(t2["effective_n"]),
        "planned_n": str(t2["planned_n"]),
        "bundle": str(KEPT),
    }
    assert _properties(cases["out_of_range.sync"]).keys() == {"statistic", "bundle"}  # a count, no p-value or MDE
    assert cases["t2_gof.sync"][0].tag == "properties"  # before any <failure> / <skipped>, as the schema orders


def test_without_a_bundle_no_bundle_property_is_written(tmp_path):
    write_junit(json.loads((KEPT / "summary.json").read_text()), tmp_path / "j.xml")
    assert "bundle=" not in (tmp_path / "j.xml").read_text() and 'name="bundle"' not in (tmp_path / "j.xml").read_text()


def test_the_file_is_written_into_folders_that_do_not_exist_yet(tmp_path):
    target = tmp_path / "new" / "deeper" / "j.xml"
    check_target(target, "--junit")  # nothing refused, nothing created
    assert not (tmp_path / "new").exists()
    write_junit(json.loads((KEPT / "summary.json").read_text()), target, KEPT)
    assert ET.parse(target).getroot().tag == "testsuite"


@pytest.mark.parametrize("case", ["directory", "under_a_file"])
def test_a_path_that_cannot_hold_the_file_is_refused_naming_it(tmp_path, case):
    (tmp_path / "file").write_text("")
    target = tmp_path if case == "directory" else tmp_path / "file" / "j.xml"
    with pytest.raises(ProtocolError, match=f"--junit {re.escape(str(target))}: "):
        check_target(target, "--junit")


def test_a_suite_report_sums_its_members_and_keeps_one_without_a_verdict_as_an_error():
    summary = json.loads((KEPT / "summary.json").read_text())
    root = grouped_element(
        "specval.team", [run_element(summary, KEPT, [("exit", 0)]), no_verdict_element("seq", 3, "why")]
    )
    members = root.findall("testsuite")
    assert [m.get("name") for m in members] == ["specval.t2_fp32", "specval.seq"]
    assert root.get("tests") == str(len(summary["tests"]) + 1) and root.get("errors") == "1"
    assert _properties(members[0])["exit"] == "0" and _properties(members[1])["exit"] == "3"
    (error,) = members[1].iter("error")
    assert error.get("type") == "NO_VERDICT" and error.get("message") == "no verdict: exit 3; why"
