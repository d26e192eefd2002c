"""The report's title shows EXPLORATORY for an exploratory run, in report.md and report.html, for every
kind; a frozen run's title is unchanged (kept bundles still verify); a patched system under test gets
its own line. Deterministic."""

from __future__ import annotations

import json
import re
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


IDENTITY = {
    "name": "myengine",
    "version": "2.1",
    "digest": "ab" * 32,
    "commit": "c0ffee",
    "dirty": False,
    "covers": "package myengine: 12 file(s)",
}
IDENTITY_LINE = f"system under test: myengine 2.1, sha256 {'ab' * 32} (package myengine: 12 file(s)), git c0ffee"


def test_the_first_screen_names_the_sut_and_labels_specvals_commit():
    """A bundle recording `sut_identity` shows it above the criteria in both files, and specval's
    commit reads "specval git" (in the provenance line and the sessions table)."""
    summary = json.loads((KEPT / "summary.json").read_text())
    manifest = {**json.loads((KEPT / "manifest.json").read_text()), "sut_identity": IDENTITY}
    md, html = render_markdown(summary, manifest, {}), render_html(summary, manifest, {})
    for text in (md, html):
        assert IDENTITY_LINE in text and text.index(IDENTITY_LINE) < text.index("Criteria")
        assert ", specval git " in text and not re.search(r"specval [^,]+, git ", text)
    unrecorded = render_markdown(summary, {**manifest, "sut_identity": {"unrecorded": "no adapter here"}}, {})
    assert "- system under test: not recorded (no adapter here)" in unrecorded


def test_a_bundle_made_before_identities_renders_unchanged():
    """No identity line and the unlabelled commit, byte for byte as sealed: kept bundles still verify."""
    summary = json.loads((KEPT / "summary.json").read_text())
    manifest = json.loads((KEPT / "manifest.json").read_text())
    md = render_markdown(summary, manifest, {})
    assert "system under test:" not in md and "specval git" not in md and re.search(r"specval [^,]+, git ", md)


def test_summary_reports_name_the_sut_first(tmp_path):
    for name in ("summary.json", "manifest.json"):
        (tmp_path / name).write_bytes((QUALITY / name).read_bytes())
    manifest = json.loads((QUALITY / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "sut_identity": IDENTITY}))
    files = summary_files(tmp_path, lambda s, m: ["a fact"], lambda s, m: [])
    md = files["report.md"].decode()
    assert md.index(f"- {IDENTITY_LINE}") < md.index("- protocol hash") < md.index("- a fact")
    assert IDENTITY_LINE in files["report.html"].decode() and "specval git" in md


SEQUENCE_KEPT = REPORTS / "seq_vllm-20261206T234936Z"  # its association criteria name "|Spearman rho|"
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def _sequence_report(tmp_path: Path, manifest_extra: dict) -> str:
    from specval.sequence.report import render_files

    for name in ("summary.json", "protocol.json"):
        (tmp_path / name).write_bytes((SEQUENCE_KEPT / name).read_bytes())
    manifest = json.loads((SEQUENCE_KEPT / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, **manifest_extra}))
    return render_files(tmp_path)["report.md"].decode()


def test_a_pipe_inside_a_table_cell_is_escaped_and_keeps_the_row_whole(tmp_path):
    """Deterministic: `|Spearman rho|` reads as written (`\\|` is a pipe to GitHub and GitLab), every row
    of the criteria table has as many cells as its header; a bundle made before identities keeps the
    `/` it was sealed with (so it still verifies byte for byte)."""
    md = _sequence_report(tmp_path, {"sut_identity": IDENTITY})
    assert "\\|Spearman rho\\| of paired PITs" in md and "/Spearman rho/" not in md
    table = md.split("## Criteria")[1].strip().split("\n\n")[0].splitlines()
    widths = {len(UNESCAPED_PIPE.findall(row)) for row in table}
    assert len(table) > 2 and widths == {len(UNESCAPED_PIPE.findall(table[0]))}
    sealed = _sequence_report(tmp_path, {})
    assert sealed.encode() == (SEQUENCE_KEPT / "report.md").read_bytes() and "/Spearman rho/" in sealed
