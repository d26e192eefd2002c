"""Every evidence bundle kept in reports/ still verifies with this commit's code: its files match
SHA256SUMS and the statistics recompute the recorded verdicts. A change that would move a verdict
of recorded evidence (or a bundle edited by hand) fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval.cli import main
from specval.verdict import SCHEMA_VERSION

REPORTS = Path(__file__).resolve().parents[2] / "reports"
BUNDLES = sorted(path for path in REPORTS.iterdir() if (path / "SHA256SUMS").is_file())


def test_reports_hold_the_evidence_the_docs_cite():
    names = {path.name.rsplit("-", 1)[0] for path in BUNDLES}
    assert {"t2_fp32", "t2_smollm2", "quality_arith", "t2_cuda", "t2_smollm2_cuda"} <= names


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda path: path.name)
def test_kept_bundle_verifies(bundle):
    summary = json.loads((bundle / "summary.json").read_text())
    if summary.get("kind", "distribution") == "distribution" and summary.get("schema_version") != SCHEMA_VERSION:
        pytest.skip(f"summary schema {summary.get('schema_version')} predates schema {SCHEMA_VERSION} (Monte Carlo "
                    "p-values, joint small strata, validity criteria); the bundle is to be regenerated")
    result = CliRunner().invoke(main, ["verify", str(bundle)])
    assert result.exit_code == 0, result.output
    assert "verifies" in result.output
