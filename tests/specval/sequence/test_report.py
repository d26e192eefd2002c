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

# the kept bundle's tested line, read off its protocol.json (prompts cut at 40 characters,
# sampling, K) and summary.json (groups by name, 600 sequences each, batches of 50)
TESTED = (
    "tested: whole sequences of 64 tokens from 2 prompt(s) ('The speculative sampler must be lossless...', "
    "'Every token of a long sequence, in every...'); sampling temperature 1.0, top_k 20, top_p 1.0; K = 3; "
    "groups async (async, draft loops 2), async_adversarial (async, draft loops 2, draft adversarial), "
    "async_mixed (async, draft loops 2, in batches with companions temperature 0.0, top_k -1, top_p 1.0; "
    "temperature 0.6, top_k 5, top_p 1.0), async_noisy (async, draft loops 2, draft noisy), async_temperature "
    "(async, draft loops 2, draft temperature), nospec (nospec), sync (sync, draft loops 2); 600 sequences "
    "per group, in batches of 50"
)


def _protocol() -> dict:
    return json.loads((KEPT / "protocol.json").read_text())


def _copy(directory: Path, identity: dict | None) -> Path:
    manifest = json.loads((KEPT / "manifest.json").read_text())
    if identity is not None:
        manifest["sut_identity"] = identity
    (directory / "manifest.json").write_text(json.dumps(manifest))
    for name in ("summary.json", "protocol.json"):
        (directory / name).write_bytes((KEPT / name).read_bytes())
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
        assert text.index(shown(TESTED)) < text.index(shown(report.NOT_COVERED)), name


def test_the_sequence_report_says_what_was_tested_from_the_bundle(tmp_path):
    """The tested line reads the protocol (prompts, sampling with its profile applied) and the
    summary (groups, sizes), so it changes with them."""
    assert report.tested_text(json.loads((KEPT / "summary.json").read_text()), _protocol()) == TESTED
    summary = json.loads((KEPT / "summary.json").read_text())
    summary["groups"]["sync"]["companions"] = [{"temperature": 0.0}]
    summary["groups"]["sync"]["draft"] = "adversarial"
    protocol = _protocol()
    protocol["profiles"] = {summary["protocol"]["profile"]: {"sampling": {"temperature": 0.5}}}
    changed = report.tested_text(summary, protocol)
    assert "sync (sync, draft loops 2, draft adversarial, in batches with companions temperature 0.0)" in changed
    assert "; sampling temperature 0.5; " in changed


def test_a_sequence_bundle_made_before_identities_renders_as_sealed(tmp_path):
    files = report.render_files(_copy(tmp_path, None))
    assert files["report.md"] == (KEPT / "report.md").read_bytes()
    assert files["report.html"] == (KEPT / "report.html").read_bytes()
