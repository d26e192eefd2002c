"""The sequence report's first screen names the system under test above its criteria table, and a
sequence bundle made before identities renders as it was sealed. Deterministic."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from specval.report.scope import FROZEN_TEXT
from specval.sequence import report

KEPT = Path(__file__).resolve().parents[3] / "reports" / "seq_cuda-20261205T162252Z"
IDENTITY = {
    "name": "engine",
    "version": "0.1.0",
    "digest": "cd" * 32,
    "commit": None,
    "dirty": None,
    "covers": "package engine: 64 file(s)",
}


def _copy(directory: Path, identity: dict | None) -> Path:
    manifest = json.loads((KEPT / "manifest.json").read_text())
    if identity is not None:
        manifest["sut_identity"] = identity
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / "summary.json").write_bytes((KEPT / "summary.json").read_bytes())
    return directory


def test_the_sequence_report_names_the_sut_before_its_criteria(tmp_path):
    files = report.render_files(_copy(tmp_path, IDENTITY))
    line = f"system under test: engine 0.1.0, sha256 {'cd' * 32} (package engine: 64 file(s)), not in a git checkout"
    for name in ("report.md", "report.html"):
        text = files[name].decode()
        assert line in text and text.index(line) < text.index("Criteria"), name
        assert "specval git" in text, name
        shown = (lambda value: value) if name == "report.md" else escape
        assert text.index(line) < text.index(shown(FROZEN_TEXT)) < text.index(shown(report.NOT_COVERED)), name
        assert text.index(shown(report.NOT_COVERED)) < text.index("Criteria"), name


def test_a_sequence_bundle_made_before_identities_renders_as_sealed(tmp_path):
    files = report.render_files(_copy(tmp_path, None))
    assert files["report.md"] == (KEPT / "report.md").read_bytes()
    assert files["report.html"] == (KEPT / "report.html").read_bytes()
