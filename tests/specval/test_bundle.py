"""Bundle: verify catches a changed byte in any file and a hand-edited verdict; report re-renders;
the harness FAILs a planted sampler bug (fake SUT, exact TV of the bug ~0.1 >> the run's MDE)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specval import bundle as bundles
from specval.distribution import runner
from tests.fixtures.fake_sut import BuggyFakeSUT, FakeSUT


@pytest.fixture(scope="module")
def fake_bundle(tmp_path_factory) -> Path:
    from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

    root = tmp_path_factory.mktemp("bundle")
    path, summary = runner.run(
        write_protocol(root, fake_protocol_dict()), "ci", root / "results", sut_factory=FakeSUT, progress=False
    )
    assert summary["verdict"] == "PASS", summary["reason"]
    return path


@pytest.fixture
def bundle_copy(fake_bundle, tmp_path) -> Path:
    return Path(shutil.copytree(fake_bundle, tmp_path / fake_bundle.name))


def test_fresh_bundle_verifies_and_holds_every_documented_file(fake_bundle):
    assert runner.verify(fake_bundle) == []
    for name in (
        "protocol.yaml",
        "protocol.json",
        "run.json",
        "reference.json",
        "quadrature.json",
        "summary.json",
        "report.md",
        "report.html",
        "manifest.json",
        "SHA256SUMS",
        "chunks.json",
        "sessions.json",
    ):
        assert (fake_bundle / name).is_file(), name
    manifest = json.loads((fake_bundle / "manifest.json").read_text())
    assert {"protocol", "code", "sessions", "command", "packages", "device", "seeds", "started", "finished"} <= set(
        manifest
    )
    assert "data:image/png;base64," in (fake_bundle / "report.html").read_text()
    summary = json.loads((fake_bundle / "summary.json").read_text())
    by_path = summary["tests"]["t2_gof_by_path.sync"]
    plain = summary["tests"]["t2_gof.sync"]
    # the fake SUT samples t1 at prefill, so every path is ("plain",) and the strata coincide
    assert [(s["prefix"], s["path"], s["n"]) for s in by_path["strata"]] == [
        (s["prefix"], ["plain"], s["n"]) for s in plain["strata"]
    ]


def test_manifest_splits_the_run_wall_into_its_phases(fake_bundle):
    manifest = json.loads((fake_bundle / "manifest.json").read_text())
    phases = [manifest[k] for k in ("setup_s", "collect_s", "analysis_s", "report_s")]
    assert all(p >= 0 for p in phases)
    # consecutive parts of the run: their sum misses only the few statements between them
    assert sum(phases) <= manifest["wall_s"] < sum(phases) + 0.5
    assert manifest["analysis_share"] == pytest.approx(
        (manifest["analysis_s"] + manifest["report_s"]) / manifest["wall_s"], rel=1e-12
    )


class CompilingFakeSUT(FakeSUT):
    """FakeSUT that reports kernel compiles, as the engine adapter does on CUDA."""

    COMPILED = {"compiled": 3, "compile_s": 1.5, "loaded": 2, "load_s": 0.25}

    def kernel_compile_time(self):
        return dict(self.COMPILED)


def test_manifest_records_the_kernel_compile_time_an_adapter_reports(fake_bundle, tmp_path):
    from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

    assert "kernel_compile" not in json.loads((fake_bundle / "manifest.json").read_text())  # FakeSUT: unknown
    path, _ = runner.run(
        write_protocol(tmp_path, fake_protocol_dict()),
        "ci",
        tmp_path / "results",
        sut_factory=CompilingFakeSUT,
        progress=False,
    )
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["kernel_compile"] == CompilingFakeSUT.COMPILED
    assert runner.verify(path) == []


def _all_files(bundle: Path) -> list[str]:
    return sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())


def test_a_changed_byte_in_any_file_is_detected(fake_bundle, tmp_path):
    for name in _all_files(fake_bundle):
        copy = Path(shutil.copytree(fake_bundle, tmp_path / name.replace("/", "_")))
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(data))
        problems = runner.verify(copy)
        assert problems, f"flipping a byte of {name} went unnoticed"
        expected = name if name != "SHA256SUMS" else ""
        assert any(expected in p for p in problems), problems


def test_added_and_removed_files_are_detected(bundle_copy):
    (bundle_copy / "extra.txt").write_text("x")
    (bundle_copy / "report.md").unlink()
    problems = runner.verify(bundle_copy)
    assert any("extra.txt: present but not listed" in p for p in problems)
    assert any("report.md: listed" in p for p in problems)


def _edit_summary(bundle: Path, edit) -> None:
    summary = json.loads((bundle / "summary.json").read_text())
    edit(summary)
    bundles.write_json(bundle / "summary.json", summary)
    bundles.write_sums(bundle)  # the forger also fixes the checksums


def test_a_hand_edited_verdict_is_detected_even_with_fixed_checksums(bundle_copy):
    def edit(summary):
        summary["tests"]["t2_gof.sync"]["verdict"] = "FAIL"
        summary["tests"]["t2_gof.sync"]["p_value"] = 0.001

    _edit_summary(bundle_copy, edit)
    problems = runner.verify(bundle_copy)
    assert 'summary.json: tests.t2_gof.sync.verdict: stored "FAIL", recomputed "PASS"' in problems
    assert any("tests.t2_gof.sync.p_value" in p for p in problems)


def test_a_forged_raw_sample_is_detected_by_recomputation(bundle_copy):
    import pandas as pd

    chunk = sorted((bundle_copy / "samples").glob("sync-*.parquet"))[0]
    frame = pd.read_parquet(chunk)
    frame.loc[0:50, "t2"] = frame.loc[0:50, "t2"].iloc[0]
    frame.to_parquet(chunk, index=False)
    bundles.write_sums(bundle_copy)
    problems = runner.verify(bundle_copy)
    assert any(p.startswith("summary.json: tests.t2_gof.sync") for p in problems), problems


def test_report_rerenders_and_the_bundle_still_verifies(bundle_copy):
    (bundle_copy / "report.md").write_text("stale")
    runner.finish(bundle_copy)
    assert "# fake_t2: PASS" in (bundle_copy / "report.md").read_text()
    assert runner.verify(bundle_copy) == []


def test_planted_bug_in_the_fake_sut_fails(tmp_path, fake_protocol_file):
    # BuggyFakeSUT draws the correction from p instead of max(p - q, 0); the quadrature control
    # sees it exactly and the t2 GOF / homogeneity criteria see it statistically.
    _, summary = runner.run(fake_protocol_file, "ci", tmp_path, sut_factory=BuggyFakeSUT, progress=False)
    assert summary["verdict"] == "FAIL"
    assert summary["tests"]["quadrature.adversarial"]["verdict"] == "FAIL"
    assert summary["tests"]["quadrature.sync"]["verdict"] == "FAIL"
    assert summary["tests"]["t1_gof.nospec"]["verdict"] == "PASS"


def test_diff_tolerates_last_bit_rounding_of_floats_only():
    """A bundle recomputed on another machine differs in the last bits of its chi-squares; those
    agree, while an edited statistic, verdict or count is reported."""
    from specval.bundle import diff

    stored = {
        "p_value": 0.41703924798735953,
        "statistic": 26.853637770992588,
        "verdict": "PASS",
        "n": 20000,
        "tiny": 1e-300,
    }
    rounded = dict(stored, p_value=0.4170392479873596, statistic=26.85363777099259, tiny=3e-300)
    assert diff(stored, rounded) == []
    assert diff(stored, dict(stored, statistic=26.8537)) == ["statistic: stored 26.853637770992588, recomputed 26.8537"]
    assert len(diff(stored, dict(stored, verdict="FAIL"))) == 1
    assert len(diff(stored, dict(stored, n=20000.0))) == 1  # a count must stay an int
    assert diff({"x": float("nan")}, {"x": float("nan")}) == []


def test_manifest_command_names_the_program_not_its_install_path(monkeypatch):
    from specval.bundle import invocation

    monkeypatch.setattr("sys.argv", ["/some/venv/bin/specval", "run", "p.yaml", "--profile", "ci"])
    assert invocation() == ["specval", "run", "p.yaml", "--profile", "ci"]
