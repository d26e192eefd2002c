"""A/A calibration: the rate and KS arithmetic on known inputs, and a small run on the exact fake SUT.

False-fail rate of the run test: the fake SUT is exact, so each p-valued criterion FAILs a replicate
with probability <= alpha = 0.01 (Holm). With 20 replicates, the assertion "at most 3 FAILs of one
criterion" fails with probability <= 1 - P(Binom(20, 0.01) <= 3) ~ 4e-5 per criterion. Seeds are
fixed (fresh ledger), so the outcome is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from specval.distribution import calibrate as calibration
from specval.cli import main
from specval.distribution.verdict import FAIL, PASS

REPLICATES, SAMPLES = 20, 300


def _summary(verdicts: dict[str, tuple[str, float]], run: str) -> dict:
    return {"verdict": run, "tests": {n: {"role": "primary", "verdict": v, "p_value": p} for n, (v, p) in verdicts.items()}}


def test_summarise_counts_rates_intervals_and_uniformity():
    rng = np.random.default_rng(0)
    p = rng.random(100)
    summaries = [_summary({"a": (FAIL if i < 5 else PASS, p[i])}, FAIL if i < 5 else PASS) for i in range(100)]
    result = calibration.summarise(summaries, 0.01)
    row = result["criteria"]["a"]
    assert (row["failures"], row["rate"]) == (5, 0.05)
    low, high = row["rate_ci95"]
    assert low == pytest.approx(0.01643, abs=1e-4) and high == pytest.approx(0.11283, abs=1e-4)  # exact binomial
    assert row["ks_uniformity"]["p_value"] > 0.05  # uniform p-values
    skewed = calibration.summarise([_summary({"a": (PASS, v ** 4)}, PASS) for v in p], 0.01)
    assert skewed["criteria"]["a"]["ks_uniformity"]["p_value"] < 1e-6
    assert result["run"]["failures"] == 5 and result["run"]["bound"] == 0.01


def test_calibrate_runs_disjoint_replicates_on_the_exact_fake_sut(tmp_path, monkeypatch):
    raw = fake_protocol_dict()
    raw["tests"] = raw["tests"][:3]  # quadrature, t1 gof, t2 gof
    file = write_protocol(tmp_path, raw)
    result = CliRunner().invoke(main, ["calibrate", str(file), "--replicates", str(REPLICATES), "--samples",
                                       str(SAMPLES), "--output", str(tmp_path / "out"), "--quiet"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    path = tmp_path / "out"
    data = __import__("json").loads(next(path.glob("*/calibration.json")).read_text())
    assert data["replicates"] == REPLICATES
    for name, row in data["criteria"].items():
        assert row["failures"] <= 3, (name, row)
    assert data["criteria"]["t1_gof.sync"]["replicates"] == REPLICATES
    ledger = __import__("json").loads((path / "ledger.json").read_text())
    sizes = {r["stop"] - r["start"] for r in (ledger if isinstance(ledger, list) else ledger["ranges"])}
    assert sizes == {REPLICATES * SAMPLES}


def test_calibrate_resume_keeps_the_bundle_and_refuses_other_sizes(tmp_path, monkeypatch):
    """A resumed calibration reuses its bundle's seed ranges and samples (same result, no new ledger
    range); a resume with another replicates x samples is an input error (exit 2)."""
    raw = fake_protocol_dict()
    raw["tests"] = raw["tests"][:2]  # quadrature, t1 gof
    file = write_protocol(tmp_path, raw)
    out = tmp_path / "out"
    args = ["calibrate", str(file), "--replicates", "4", "--samples", str(SAMPLES), "--output", str(out), "--quiet"]
    first = CliRunner().invoke(main, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    bundle = next(out.glob("*/calibration.json")).parent
    stored = (bundle / "calibration.json").read_text()
    ledger = (out / "ledger.json").read_text()
    again = CliRunner().invoke(main, args + ["--resume", str(bundle)], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert (bundle / "calibration.json").read_text() == stored
    assert (out / "ledger.json").read_text() == ledger
    shared = CliRunner().invoke(main, args + ["--resume", str(bundle), "--workers", "2"], catch_exceptions=False)
    assert shared.exit_code == 0, shared.output  # the evaluation shared by two processes: the same numbers
    assert _without_workers(bundle / "calibration.json") == _without_workers_text(stored)
    other = CliRunner().invoke(main, args[:3] + ["5"] + args[4:] + ["--resume", str(bundle)])
    assert other.exit_code == 2 and "not a calibration" in other.output


def _without_workers_text(text: str) -> dict:
    data = __import__("json").loads(text)
    data.pop("workers")
    return data


def _without_workers(path) -> dict:
    return _without_workers_text(path.read_text())


def test_exact_sampler_calibration_reports_families_and_can_see_an_inflated_test(tmp_path, monkeypatch):
    """--exact draws every group from the float64 reference (count trees): per-family FAIL counts
    are Binomial(replicates, <= alpha). 40 replicates: "at most 3 FAILs of a family" fails with
    probability <= 1 - P(Binom(40, 0.01) <= 3) ~ 8e-4 per family (three families)."""
    file = write_protocol(tmp_path, fake_protocol_dict(tests=fake_protocol_dict()["tests"][1:]))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["calibrate", str(file), "--exact", "--replicates", "40", "--samples", "300",
                                       "--output", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = __import__("json").loads(next(out.glob("calibration-exact-*.json")).read_text())
    assert data["mode"] == "exact" and data["replicates"] == 40
    assert set(data["families"]) == {"control", "primary", "secondary"}
    assert all(f["failures"] <= 3 for f in data["families"].values()), data["families"]
    assert "family primary:" in result.output and "run:" in result.output


def test_summarise_family_rate_is_any_criterion_of_the_role():
    both = {"a": (FAIL, 0.001), "b": (FAIL, 0.002)}
    one = {"a": (PASS, 0.5), "b": (FAIL, 0.002)}
    none = {"a": (PASS, 0.5), "b": (PASS, 0.7)}
    result = calibration.summarise([_summary(both, FAIL), _summary(one, FAIL), _summary(none, PASS)], 0.01)
    assert result["families"]["primary"]["failures"] == 2 and result["families"]["primary"]["nominal"] == 0.01
