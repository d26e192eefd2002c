"""JUnit XML of a summary: one case per criterion with its figures as <properties>, the run's facts on
the suite. Deterministic: rendered from the kept t2_fp32 bundle's summary (reports/)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from specval.report.junit import write_junit

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
