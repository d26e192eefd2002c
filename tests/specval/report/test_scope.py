"""The first screen's scope block (specval/report/scope.py): frozen or exploratory, what the run
tested and what its PASS does not cover, above the criteria, only for bundles that record the
system under test's identity (kept bundles render as sealed). Deterministic."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

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
