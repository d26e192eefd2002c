"""Every evidence bundle kept in reports/ still verifies with this commit's code: its files match
SHA256SUMS and the statistics recompute the recorded verdicts. A change that would move a verdict
of recorded evidence (or a bundle edited by hand) fails here.

Bundles of format 1 (run.json records no `bundle_format`) cannot verify: they lack the records
format 2 requires (chunks.json, sessions.json). They are named here one by one, skipped until
they are re-run, and each must really be of a format verify refuses. Format 2 (reference.json as
JSON lists) verifies as format 3 does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval.cli import main
from specval.distribution.verdict import SCHEMA_VERSION

REPORTS = Path(__file__).resolve().parents[2] / "reports"
BUNDLES = sorted(path for path in REPORTS.iterdir() if (path / "SHA256SUMS").is_file())
OLD_FORMAT = {  # to be re-run with the current code; remove each name when its bundle is replaced
    "t2_smollm2_cuda-20261129T204419Z"
}


def _format(bundle: Path) -> int:
    return bundles.RunPlan.from_dict(json.loads((bundle / bundles.RUN_FILE).read_text())).bundle_format


def test_reports_hold_the_evidence_the_docs_cite():
    names = {path.name.rsplit("-", 1)[0] for path in BUNDLES}
    assert {
        "t2_fp32",
        "t2_smollm2",
        "quality_arith",
        "t2_cuda",
        "t2_cuda_batched",
        "t2_smollm2_cuda",
        "t2_cuda_tv010",
        "t2_smollm2_cuda_batched",
        "seq_cuda",
        "seq_cuda_k8",
        "seq_vllm",
    } <= names


def test_a_kept_bundle_draws_from_the_portable_stream():
    """At least one kept bundle records a version of the project's Monte Carlo stream (version 1,
    sealed before version 2 existed), so the verification below checks draws that must be
    bit-identical under any supported numpy and scipy (never skipped), redrawn by that version."""
    from specval.stats.montecarlo import FIRST_STREAM, STREAMS
    from specval.stats.stream import VERSIONS

    streams = {json.loads((path / "summary.json").read_text()).get("monte_carlo_stream") for path in BUNDLES}
    assert FIRST_STREAM in streams and FIRST_STREAM in STREAMS and set(VERSIONS) <= set(STREAMS)


RANDOM_PACKAGES = ("numpy", "scipy")  # their random distributions are not stream-stable across versions


def _draws_reproducible(bundle: Path) -> str | None:
    """None if this interpreter has the numpy and scipy versions the bundle was made with (the
    Monte Carlo null draws are then redrawn bit for bit), else the reason they may not be."""
    from importlib import metadata

    if "monte_carlo_stream" in json.loads((bundle / bundles.SUMMARY_FILE).read_text()):
        return None  # the project's own stream: redrawn bit for bit under every supported version
    made = json.loads((bundle / bundles.MANIFEST_FILE).read_text()).get("packages", {})
    differ = [
        f"{name} {made.get(name)} (here {metadata.version(name)})"
        for name in RANDOM_PACKAGES
        if made.get(name) != metadata.version(name)
    ]
    return (
        f"made with {', '.join(differ)}: Monte Carlo draws are reproducible under the same versions only"
        if differ
        else None
    )


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda path: path.name)
def test_kept_bundle_verifies(bundle):
    if bundle.name in OLD_FORMAT:
        assert _format(bundle) not in bundles.VERIFIABLE_FORMATS, f"{bundle.name} verifies: take it off OLD_FORMAT"
        pytest.skip(f"bundle format {_format(bundle)}: re-run it with this code")
    summary = json.loads((bundle / "summary.json").read_text())
    if summary.get("kind", "distribution") == "distribution":
        assert summary.get("schema_version") == SCHEMA_VERSION, f"{bundle.name}: summary schema is not current"
    result = CliRunner().invoke(main, ["verify", str(bundle)])
    reason = _draws_reproducible(bundle)
    if (
        result.exit_code != 0
        and reason
        and all(
            "monte_carlo" in line or "p_adjusted" in line or "p_value" in line or ".reason:" in line
            for line in result.output.splitlines()
            if line.startswith("DIFFERS")
        )
    ):
        pytest.skip(reason)  # only Monte Carlo p-values moved, and the random packages differ
    assert result.exit_code == 0, result.output
    assert "verifies" in result.output
    assert "unsigned: internal consistency only" in result.output  # no kept bundle is signed (reports/README.md)
    if _format(bundle) < bundles.CHAINED_FORMAT:
        assert f"note: bundle format {_format(bundle)}: made before chunk records were chained" in result.output


@pytest.mark.parametrize(
    "bundle", sorted(path for path in BUNDLES if path.name in OLD_FORMAT), ids=lambda path: path.name
)
def test_old_format_bundle_is_refused_by_verify_with_its_format_named(bundle):
    result = CliRunner().invoke(main, ["verify", str(bundle)])
    assert result.exit_code == 1, result.output
    assert f"bundle format {_format(bundle)}, this specval verifies formats 2, 3, 4" in result.output
