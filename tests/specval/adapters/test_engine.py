"""End to end on the real engine: `specval run protocols/t2_fp32.yaml --profile ci` PASSes and its
bundle verifies; the same protocol with a planted sampler bug FAILs.

Error rates. Correct engine: the run fails only if a control or primary family rejects in both
stages of the protocol's two-stage confirmation, which Holm bounds by 0.01 * 0.01 per family (two
gating families, so <= 2e-4), plus the quadrature controls, which are deterministic. The seeds are
fixed (the ledger of a fresh output root starts at seed_base), so the outcome is reproducible and
this test does not flake from run to run.
Planted bug (the named mutant residual_from_p: correction drawn from p instead of max(p - q, 0)):
it fails the exact quadrature control (deterministic, no second stage), which the protocol's
sequential looks decide at the first look: the run stops after 300 of 3,000 samples per group,
with certainty. (Its exact TV from the target at t1 is 0.042 (draft_loops 2) and 0.060
(draft_loops 1) for the default model at the protocol's prompt: the t1 criteria alone would need
the full ci size, where t1_gof.sync_d1 detects it with power 0.99.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specval import bundle as bundles
from specval.cli import main
from specval.distribution import runner

REPO = Path(__file__).resolve().parents[3]
PROTOCOL = REPO / "protocols" / "t2_fp32.yaml"


def _run_cli(output: Path, protocol: Path = PROTOCOL) -> tuple[int, str, Path]:
    exploratory = [] if protocol == PROTOCOL else ["--exploratory"]  # a modified copy is not frozen
    result = CliRunner().invoke(
        main,
        ["run", str(protocol), "--profile", "ci", "--output", str(output), "--quiet", *exploratory],
        catch_exceptions=False,
    )
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    return result.exit_code, result.output, bundle


@pytest.fixture(scope="session")
def t2_ci_run(tmp_path_factory):
    """One real ci run of t2_fp32, shared by every test that needs it."""
    return _run_cli(tmp_path_factory.mktemp("t2_fp32_ci"))


def test_t2_fp32_ci_passes_and_verifies(t2_ci_run):
    exit_code, output, bundle = t2_ci_run
    assert exit_code == 0, output
    summary = bundles.read_json(bundle / "summary.json")
    assert summary["confirmation"]["stages"] == 2 and not summary["confirmation"]["triggered"]
    gating = [t for t in summary["tests"].values() if t["role"] in ("control", "primary")]
    assert f"PASS: all {len(gating)} control and primary criteria passed" in output
    assert {"t2_gof.async", "t2_homogeneity.async_d1_vs_nospec", "quadrature.async"} <= set(summary["tests"])
    assert bundle.name.startswith("t2_fp32-") and (bundle / "SHA256SUMS").exists()
    assert runner.verify(bundle) == []
    for name in ("t2_gof.sync", "t2_gof.sync_d1", "t2_homogeneity.sync_vs_nospec"):
        test = summary["tests"][name]
        # Every sample is tested (strata below stratum_min jointly). The honest MDE at 3,000 per group
        # (first Holm step of the family at the last look's alpha / 4, both stages of the
        # confirmation) is at most what `specval plan --protocol protocols/t2_fp32.yaml --profile ci`
        # gives for the largest possible table (df <= 399): 0.114 (gof) and 0.162 (homogeneity); the
        # run's own is smaller. gof tests every sample; homogeneity cannot compare a stratum only
        # one group reached (1 of 3,000 samples here), so its coverage is allowed 1% short of complete.
        floor = 1.0 if "_gof." in name else 0.99
        assert test["coverage"]["fraction"] >= floor and 0 < test["mde_tv"] <= 0.162, (name, test["coverage"])
    looks = summary["sequential"]
    assert looks["stopped_at_look"] == 4 and not looks["stopped_early"] and looks["samples_per_group_at_stop"] == 3000
    assert all(r["verdict"] == "PASS" for r in looks["records"]) and len(looks["records"]) == 4
    sources = summary["groups"]["sync"]["sources"]["t2"]
    assert {"accepted", "correction"} <= set(sources)  # t2 is drafted (draft_headroom), not only a bonus


def _mutant_protocol(directory: Path, mutant: str) -> Path:
    """A copy of the shipped protocol with one named planted bug switched on (`engine.mutants`)."""
    raw = yaml.safe_load(PROTOCOL.read_text())
    raw["sut"].setdefault("options", {})["mutant"] = mutant
    path = directory / "t2_fp32_mutant.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_planted_sampler_bug_fails_the_same_protocol(tmp_path):
    # The named mutant replaces the runners' accept rule and, through EngineSUT.accept_single, the
    # kernel the quadrature check integrates, so the exact control fails too: a deterministic FAIL
    # that the protocol's two-stage confirmation does not re-run.
    exit_code, output, bundle = _run_cli(tmp_path, _mutant_protocol(tmp_path, "residual_from_p"))
    assert exit_code == 1, output
    summary = bundles.read_json(bundle / "summary.json")
    failed = {n for n, t in summary["tests"].items() if t["verdict"] == "FAIL"}
    assert "quadrature.sync" in failed and "quadrature.sync" in summary["confirmation"]["deterministic"]
    looks = summary["sequential"]  # fail fast: the first look (10 %) decides
    assert looks["stopped_at_look"] == 1 and looks["stopped_early"] and looks["samples_per_group_at_stop"] == 300
    assert "stopped at look 1 of 4, 300 of 3000 samples per group" in output
    assert bundles.read_json(bundle / "manifest.json")["samples_drawn"] == 5 * 300
    assert not summary["confirmation"]["triggered"]
    assert summary["tests"]["t1_gof.nospec"]["verdict"] == "PASS"  # the bug leaves nospec alone
    assert runner.verify(bundle) == []  # a FAIL bundle verifies like any other


def test_group_the_engine_refuses_is_a_clear_input_error(tmp_path):
    text = PROTOCOL.read_text().replace(
        "  - {name: sync_d1, mode: sync, draft_loops: 1}",
        "  - {name: sync_d1, mode: sync, draft_loops: 1}\n  - {name: pipe, mode: pipeline, draft_loops: 2}",
    )
    file = tmp_path / "t2_pipe.yaml"
    file.write_text(text)
    result = CliRunner().invoke(
        main, ["run", str(file), "--profile", "ci", "--output", str(tmp_path), "--quiet", "--exploratory"]
    )
    assert result.exit_code == 2
    assert "group 'pipe'" in result.output and "mode='pipeline'" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["t2_pipe.yaml"]  # no bundle, no ledger entry


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_protocol_without_a_gpu_is_refused_before_any_seed_is_taken(tmp_path):
    protocol = REPO / "protocols" / "t2_cuda.yaml"
    result = CliRunner().invoke(main, ["run", str(protocol), "--profile", "ci", "--output", str(tmp_path), "--quiet"])
    assert result.exit_code == 2
    assert "t2_cuda.yaml: sut:" in result.output and "device='cuda'" in result.output
    assert "no CUDA device" in result.output
    assert list(tmp_path.iterdir()) == []  # no bundle, no ledger entry
