"""The first screen's scope block (specval/report/scope.py): frozen or exploratory, what the run
tested and what its PASS does not cover, above the criteria, only for bundles that record the
system under test's identity (kept bundles render as sealed), for every kind with a report.
Deterministic."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

import pytest

from specval.performance import report as performance_report
from specval.quality import report as quality_report
from specval.report import signer
from specval.report.html import render_html
from specval.report.markdown import render_markdown
from specval.report.scope import EXPLORATORY_TEXT, FROZEN_TEXT, distribution_scope, registration_text

KEPT = Path(__file__).resolve().parents[3] / "reports" / "t2_fp32-20261201T013950Z"
IDENTITY = {"name": "engine", "version": "0.1.0", "digest": "ef" * 32, "commit": None, "dirty": None, "covers": "x"}


def _bundle(identity: bool = True) -> tuple[dict, dict, dict]:
    summary, manifest, protocol = (
        json.loads((KEPT / name).read_text()) for name in ("summary.json", "manifest.json", "protocol.json")
    )
    return summary, {**manifest, "sut_identity": IDENTITY} if identity else manifest, protocol


def test_the_scope_says_frozen_or_exploratory():
    summary, _, _ = _bundle()
    assert registration_text(summary) == FROZEN_TEXT
    exploratory = {**summary, "registration": {"state": "unregistered", "exploratory": True}}
    assert registration_text(exploratory) == EXPLORATORY_TEXT


def test_the_distribution_scope_names_what_was_tested_and_what_a_pass_does_not_cover():
    summary, manifest, protocol = _bundle()
    frozen, tested, not_covered = distribution_scope(summary, manifest, protocol)
    assert frozen == FROZEN_TEXT
    assert tested.startswith(
        f"tested: prompt {protocol['prompt']!r}; sampling temperature 1.0, top_k 20, top_p 1.0; K = "
    )
    assert f"token positions 1..{summary['protocol']['positions']} of each request" in tested
    assert "sync (sync, draft loops 2)" in tested and "nospec (nospec)" in tested
    assert f"{summary['protocol']['samples_per_group']} requests per group" in tested
    assert not_covered.startswith(f"a PASS does not cover: tokens after position {summary['protocol']['positions']}")
    scope = [frozen, tested, not_covered]
    md, html = render_markdown(summary, manifest, {}, scope), render_html(summary, manifest, {}, scope)
    for text, frozen_shown in ((md, FROZEN_TEXT), (html, escape(FROZEN_TEXT))):
        assert text.index("system under test:") < text.index(frozen_shown) < text.index("a PASS does not cover")
        assert text.index("a PASS does not cover") < text.index("Criteria")


def test_a_bundle_made_before_identities_gets_no_scope_block():
    summary, manifest, protocol = _bundle(identity=False)
    assert distribution_scope(summary, manifest, protocol) == []
    assert distribution_scope(summary, {**manifest, "sut_identity": IDENTITY}, None) == []


QUALITY_KEPT = KEPT.parent / "quality_arith-20261201T014331Z"
PERFORMANCE_KEPT = KEPT.parent / "perf_transformers_assisted_vs_plain-20261205T164611Z"
# the kept bundles' tested lines, read off their protocol.json (sampling, K, the adapter) and
# summary.json (the profile's sizes, groups or arms by name)
QUALITY_TESTED = (
    "tested: task arith (plain prompt, metric exact), 10 items x 3 seeds = 30 paired requests per group; "
    "sampling temperature 0.7, top_k -1, top_p 0.95; K = 4; at most 5 tokens per answer; groups async "
    "(async, draft loops 12), nospec (nospec), sync (sync, draft loops 12), compared with the baseline "
    "nospec at non-inferiority margin 0.05"
)
PERFORMANCE_TESTED = (
    "tested: arm b = assisted (sync, draft loops 24) against arm a = plain (nospec) (sampling and counts in "
    "the Arms table), through adapter transformers, model smollm2 float32 on cpu, K = 4; workload 1 "
    "concurrent request(s) x 16 tokens over 1 prompt(s); 6 ABBA pairs after 1 warm-up round(s) per arm"
)


def _copy(kept: Path, directory: Path, identity: bool) -> Path:
    """The files a summary report renders from, the manifest with or without an identity."""
    for name in ("summary.json", "protocol.json"):
        (directory / name).write_bytes((kept / name).read_bytes())
    manifest = json.loads((kept / "manifest.json").read_text())
    (directory / "manifest.json").write_text(
        json.dumps({**manifest, "sut_identity": IDENTITY} if identity else manifest)
    )
    return directory


def _read(kept: Path) -> tuple[dict, dict]:
    return tuple(json.loads((kept / name).read_text()) for name in ("summary.json", "protocol.json"))


def test_the_quality_and_performance_scope_name_what_was_tested():
    assert quality_report.tested_text(*_read(QUALITY_KEPT)) == QUALITY_TESTED
    assert performance_report.tested_text(*_read(PERFORMANCE_KEPT)) == PERFORMANCE_TESTED
    summary, protocol = _read(PERFORMANCE_KEPT)
    summary["arms"]["b"].update(enforce_eager=True, rounds_in_flight=2)
    assert "arm b = assisted (sync, draft loops 24, eager, 2 rounds in flight) against" in (
        performance_report.tested_text(summary, protocol)
    )


@pytest.mark.parametrize("kept, module", [(QUALITY_KEPT, "quality"), (PERFORMANCE_KEPT, "performance")])
def test_quality_and_performance_reports_show_their_scope_and_signer_above_the_facts(tmp_path, kept, module):
    """Identity, frozen, tested, not covered and the signer (unsigned here), in that order, above the
    protocol hash and the first table, in both files; a bundle made before identities renders as sealed."""
    report = {"quality": quality_report, "performance": performance_report}[module]
    files = report.render_files(_copy(kept, tmp_path, identity=True))
    tested = QUALITY_TESTED if module == "quality" else PERFORMANCE_TESTED
    lines = ("system under test:", FROZEN_TEXT, tested, report.NOT_COVERED, signer.UNSIGNED_TEXT, "protocol hash")
    for name, shown in (("report.md", str), ("report.html", escape)):
        text = files[name].decode()
        places = [text.index(shown(line)) for line in lines]
        assert places == sorted(places) and places[-1] < text.index("<h2>" if name == "report.html" else "\n## ")
    files = report.render_files(_copy(kept, tmp_path, identity=False))
    assert files == {name: (kept / name).read_bytes() for name in ("report.md", "report.html")}
