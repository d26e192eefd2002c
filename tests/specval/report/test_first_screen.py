"""The first screen of every kind's report (distribution, sequence, quality, performance; a suite
has no report): the verdict, frozen or exploratory, the system under test's digest, what was
tested, what a PASS does not cover and the signer, above the first table of report.html and at the
top of report.md, and, in headless Chromium, within the first 1280 x 900 px
(`python -m benchmarks.report_screens` writes the screenshots).

The four bundles (tests/fixtures/report_bundles.py) are made once, by the commands a user runs:
about 5 s on one core. Deterministic: the fixed seeds of fresh output roots; no statistic is
asserted, only what the reports show of their bundles.
"""

from __future__ import annotations

import pytest

from specval.report import signer
from tests.fixtures import chromium
from tests.fixtures.report_bundles import (
    KINDS,
    before_first_table,
    first_screen_items,
    html_text,
    missing_items,
    report_bundles,
)

BROWSER = chromium.find_chromium()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return {bundle.kind: bundle for bundle in report_bundles(tmp_path_factory.mktemp("first_screen"))}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kinds_report_says_on_its_first_screen_what_was_tested_and_who_signed(made, kind):
    bundle = made[kind]
    items = first_screen_items(bundle.path)
    expected = signer.UNSIGNED_TEXT if bundle.signer is None else signer.signed_text(bundle.signer)
    assert items["signer"] == (expected,)  # the envelope names the key that signed, and nothing else
    markup = (bundle.path / "report.html").read_text()
    assert missing_items(items, html_text(before_first_table(markup))) == []
    markdown = (bundle.path / "report.md").read_text()
    assert missing_items(items, markdown[: markdown.index("\n## ")]) == []


def test_the_first_screen_check_fails_a_report_that_lost_an_item(made):
    """The check can fail: a report without its signer line, or with its scope below the first
    table, misses exactly those items."""
    markup = (made["distribution"].path / "report.html").read_text()
    items = first_screen_items(made["distribution"].path)
    line = items["signer"][0]
    assert missing_items(items, html_text(before_first_table(markup)).replace(line, "")) == ["signer"]
    moved = before_first_table(markup).replace("a PASS does not cover", "a PASS covers")
    assert missing_items(items, html_text(moved)) == ["not covered"]


@pytest.mark.skipif(BROWSER is None, reason="no Chromium binary (chromium, google-chrome or $SPECVAL_CHROMIUM)")
@pytest.mark.parametrize("kind", KINDS)
def test_each_kinds_first_screen_in_a_real_browser(made, kind, tmp_path):
    bundle = made[kind]
    page = bundle.path / "report.html"
    shown = chromium.first_screen_texts(BROWSER, page)
    assert missing_items(first_screen_items(bundle.path), "\n".join(shown)) == [], shown
    assert chromium.screenshot(BROWSER, page, tmp_path / f"{kind}.png").stat().st_size > 0
