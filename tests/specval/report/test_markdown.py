"""The report's title shows EXPLORATORY for an exploratory run, in report.md and report.html, for every
kind; a frozen run's title is unchanged (kept bundles still verify); a patched system under test gets
its own line. Deterministic."""

from __future__ import annotations

import json
from pathlib import Path

from specval.report import summary_files
from specval.report.html import render_html
from specval.report.markdown import patch_lines, patch_text, render_markdown, verdict_text

REPORTS = Path(__file__).resolve().parents[3] / "reports"
KEPT = REPORTS / "t2_fp32-20261201T013950Z"
QUALITY = REPORTS / "quality_arith-20261201T014331Z"


def _exploratory(summary: dict) -> dict:
    return {**summary, "registration": {"state": "unregistered", "exploratory": True}}


def test_the_title_says_exploratory_only_for_an_exploratory_run():
    summary = json.loads((KEPT / "summary.json").read_text())
    manifest = json.loads((KEPT / "manifest.json").read_text())
    assert verdict_text(summary) == "PASS" and verdict_text(_exploratory(summary)) == "EXPLORATORY PASS"
    assert render_markdown(summary, manifest, {}).startswith("# t2_fp32: PASS\n")
    assert render_markdown(_exploratory(summary), manifest, {}).startswith("# t2_fp32: EXPLORATORY PASS\n")
    assert "<h1>t2_fp32: <span class='PASS'>EXPLORATORY PASS</span></h1>" in render_html(
        _exploratory(summary), manifest, {}
    )
    assert "<h1>t2_fp32: <span class='PASS'>PASS</span></h1>" in render_html(summary, manifest, {})


def test_quality_and_performance_titles_say_exploratory_too(tmp_path):
    for name in ("summary.json", "manifest.json"):
        (tmp_path / name).write_bytes((QUALITY / name).read_bytes())
    facts, sections = (lambda s, m: []), (lambda s, m: [])
    assert summary_files(tmp_path, facts, sections)["report.md"].startswith(b"# quality_arith: INCONCLUSIVE\n")
    summary = json.loads((QUALITY / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps(_exploratory(summary)))
    files = summary_files(tmp_path, facts, sections)
    assert files["report.md"].startswith(b"# quality_arith: EXPLORATORY INCONCLUSIVE\n")
    assert b"EXPLORATORY INCONCLUSIVE</span></h1>" in files["report.html"]


def test_a_patched_sut_is_named_with_the_adapters_sentence():
    manifest = {"device": {"sut": {"adapter": "VllmSUT", "patched": "f replaced by g"}}}
    assert patch_text(manifest) == "system under test patched: f replaced by g"
    assert patch_lines(manifest) == ["- system under test patched: f replaced by g"]


def test_no_line_for_an_unpatched_sut_or_an_older_bundle():
    for manifest in ({}, {"device": {}}, {"device": {"sut": {"patched": False}}}, {"device": {"sut": {}}}):
        assert patch_text(manifest) is None and patch_lines(manifest) == []
