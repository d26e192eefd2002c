"""Two-stage confirmation on the exact fake SUT (tests/fixtures/fake_sut.py).

Protocol: the fake t2 protocol with `confirmation: {stages: 2, alpha_stage2: 0.001}`, ci size (800
per group), fixed seeds (a fresh output root starts at seed_base 0), so every outcome below is
reproducible; the stated rates are those of a fresh seed range.

Error rates. Correct SUT: a gating family rejects stage 1 with probability <= alpha = 0.01 (Holm),
two p-valued gating families: stage 1 FAILs with probability <= 0.02. Planted bug (correction drawn
from p instead of max(p - q, 0)): the fake SUT's other bug tests FAIL it at this size; its t2 TV is
far above the t2 MDE at n = 800 (power > 0.999 per stage), so "both stages fail" is missed with
probability < 0.002. Transient bug (the same bug on stage-1 seeds only): stage 1 FAILs as above,
and stage 2 runs the correct sampler, which it FAILs with probability <= 2 * 0.001.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specval import bundle as bundles
from specval import seeds
from specval.distribution import runner
from specval.distribution.decision import FAIL, PASS, confirm
from specval.protocol import ProtocolError, load_protocol, parse_protocol
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import BuggyFakeSUT, FakeSUT

CI_N = 800  # the fake protocol's ci samples per group
ALPHA2 = 0.001
TWO_STAGE = {"stages": 2, "alpha_stage2": ALPHA2}
NO_QUADRATURE = [t for t in fake_protocol_dict()["tests"] if t["kind"] != "quadrature"]
STAGE1_SEED_STOP = 2 * CI_N  # stage 1 holds seeds [0, 2 * CI_N) of its two groups


class SamplingBugSUT(FakeSUT):
    """The residual_from_p bug in the sampler only; its accept kernel (seen by quadrature) is correct."""

    def _one(self, group, prompt_ids, sampling, seed, n):
        self.bug = "residual_from_p"
        try:
            return super()._one(group, prompt_ids, sampling, seed, n)
        finally:
            self.bug = None


class TransientBugSUT(FakeSUT):
    """The residual_from_p bug on stage-1 seeds only: a stage-1 FAIL that a correct stage 2 overturns."""

    def _one(self, group, prompt_ids, sampling, seed, n):
        self.bug = "residual_from_p" if seed < STAGE1_SEED_STOP else None
        try:
            return super()._one(group, prompt_ids, sampling, seed, n)
        finally:
            self.bug = None


def _run(tmp_path, sut, **overrides):
    raw = fake_protocol_dict(confirmation=TWO_STAGE, **overrides)
    file = write_protocol(tmp_path, raw)
    path, summary = runner.run(file, "ci", tmp_path / "results", sut_factory=sut, progress=False)
    return path, summary


def _ranges(summary_groups: dict) -> list[tuple[int, int]]:
    return [(g["seed_start"], g["seed_stop"]) for g in summary_groups.values()]


def test_correct_sut_passes_without_a_second_stage(tmp_path):
    path, summary = _run(tmp_path, FakeSUT, power=0.9)
    block = summary["confirmation"]
    assert summary["verdict"] == PASS and not block["triggered"] and block["stage2"] is None
    assert not (path / bundles.STAGE2_DIR).exists()
    assert "stage2_ranges" not in bundles.read_json(path / bundles.RUN_FILE)
    assert {t.run for t in seeds.read_ledger(tmp_path / "results")} == {path.name}
    passed = [t for t in summary["tests"].values() if t["p_value"] is not None and t["mde_tv"] is not None]
    assert passed and all("power >= 0.9" in t["reason"] for t in passed)  # the protocol's power, not 0.8
    assert "Two-stage confirmation" in (path / "report.md").read_text()
    assert runner.verify(path) == []


def test_bug_in_both_stages_fails_with_both_stages_recorded_and_verified(tmp_path):
    path, summary = _run(tmp_path, SamplingBugSUT, tests=NO_QUADRATURE)
    block = summary["confirmation"]
    assert summary["verdict"] == FAIL and block["triggered"] and block["failing"]
    second = block["stage2"]
    for name in block["failing"]:
        assert summary["tests"][name]["verdict"] == FAIL and second["tests"][name]["verdict"] == FAIL
        assert second["tests"][name]["alpha"] == ALPHA2
    first_ranges, second_ranges = _ranges(summary["groups"]), _ranges(second["groups"])
    assert all(a >= b2 or a2 >= b for a, b in first_ranges for a2, b2 in second_ranges)  # disjoint
    assert [len(range(a, b)) for a, b in second_ranges] == [CI_N, CI_N]  # same sizes
    ledger = seeds.read_ledger(tmp_path / "results")
    assert sorted((r.start, r.stop) for r in ledger) == sorted(first_ranges + second_ranges)
    seeds.check_disjoint([], ledger)  # every claimed range is disjoint from every other
    assert bundles.read_json(path / "manifest.json")["seeds_stage2"]
    report = (path / "report.md").read_text()
    assert "### Stage 2 criteria" in report and f"{0.01 * ALPHA2:.3g}" in report
    assert runner.verify(path) == []


def test_verify_recomputes_stage_two_from_its_raw_samples(tmp_path):
    path, summary = _run(tmp_path, SamplingBugSUT, tests=NO_QUADRATURE)
    stored = bundles.read_json(path / bundles.SUMMARY_FILE)
    name = summary["confirmation"]["failing"][0]
    stored["confirmation"]["stage2"]["tests"][name]["p_value"] = 0.5  # a hand edit of a stage-2 p-value
    bundles.write_json(path / bundles.SUMMARY_FILE, stored)
    bundles.write_sums(path)  # even re-sealed, the recomputation sees it
    problems = runner.verify(path)
    assert any(f"confirmation.stage2.tests.{name}.p_value" in p for p in problems), problems


def test_stage_one_fail_not_confirmed_by_stage_two_passes(tmp_path):
    path, summary = _run(tmp_path, TransientBugSUT, tests=NO_QUADRATURE)
    block = summary["confirmation"]
    retried = [n for n, t in summary["tests"].items() if t["verdict"] == FAIL and t["role"] != "secondary"]
    assert retried and block["triggered"] and block["failing"] == []
    assert all(block["stage2"]["tests"][n]["verdict"] == PASS for n in retried)
    assert summary["verdict"] == PASS and "stage 1 failed" in summary["reason"]
    assert all(g["seed_start"] >= STAGE1_SEED_STOP for g in block["stage2"]["groups"].values())
    assert runner.verify(path) == []


def test_deterministic_failure_fails_at_once_without_a_second_stage(tmp_path):
    # BuggyFakeSUT's accept kernel is wrong too, so the exact quadrature control fails
    path, summary = _run(tmp_path, BuggyFakeSUT)
    block = summary["confirmation"]
    assert summary["verdict"] == FAIL and not block["triggered"]
    assert block["deterministic"] and all(n.startswith("quadrature.") for n in block["deterministic"])
    assert not (path / bundles.STAGE2_DIR).exists() and "no second stage" in summary["reason"]


def test_one_stage_protocol_records_confirmation_and_keeps_its_hash(tmp_path):
    implicit = parse_protocol(fake_protocol_dict())
    explicit = parse_protocol(fake_protocol_dict(confirmation={"stages": 1}))
    two = parse_protocol(fake_protocol_dict(confirmation=TWO_STAGE))
    assert implicit.hash == explicit.hash != two.hash
    assert "confirmation" not in implicit.to_dict() and two.to_dict()["confirmation"]["stages"] == 2
    assert parse_protocol(json.loads(json.dumps(two.to_dict()))).hash == two.hash  # bundle round trip
    shipped = load_protocol(Path(__file__).resolve().parents[3] / "protocols" / "t2_fp32.yaml")
    assert shipped.confirmation.is_two_stage and shipped.alpha_stage2 == pytest.approx(0.01)


@pytest.mark.parametrize(
    "block, key",
    [
        ({"stages": 3}, "confirmation.stages"),
        ({"stages": 0}, "confirmation.stages"),
        ({"stages": 2, "alpha_stage2": 1.5}, "confirmation.alpha_stage2"),
        ({"stages": 1, "alpha_stage2": 0.01}, "confirmation.alpha_stage2"),
        ({"stages": 2, "alpha2": 0.01}, "confirmation.alpha2"),
    ],
)
def test_bad_confirmation_block_names_the_key(block, key):
    with pytest.raises(ProtocolError, match=key.replace(".", r"\.")):
        parse_protocol(fake_protocol_dict(confirmation=block), "p.yaml")


def _stage(verdicts: dict[str, str]) -> dict:
    tests = {
        n: {"kind": "gof", "role": "primary", "p_value": 0.5, "verdict": v, "reason": v, "out_of_support": 0}
        for n, v in verdicts.items()
    }
    tests["t1_gof.a"] = {
        "kind": "gof",
        "role": "control",
        "p_value": 0.5,
        "verdict": PASS,
        "reason": "",
        "out_of_support": 0,
    }
    failed = [n for n, v in verdicts.items() if v == FAIL]
    return {"verdict": FAIL if failed else PASS, "reason": "", "groups": {}, "families": {}, "tests": tests}


@pytest.mark.parametrize("alpha, alpha2, power", [(0.01, 0.001, 0.8), (0.05, 0.05, 0.9)])
def test_combined_rates_and_per_criterion_rule(alpha, alpha2, power):
    protocol = parse_protocol(
        fake_protocol_dict(alpha=alpha, power=power, confirmation={"stages": 2, "alpha_stage2": alpha2})
    )
    first = _stage({"t2_gof.a": FAIL, "t2_gof.b": FAIL})
    summary = confirm(protocol, first, _stage({"t2_gof.a": PASS, "t2_gof.b": FAIL}))
    block = summary["confirmation"]
    assert (summary["verdict"], block["failing"]) == (FAIL, ["t2_gof.b"])  # only b failed both stages
    assert confirm(protocol, first, _stage({"t2_gof.a": PASS, "t2_gof.b": PASS}))["verdict"] == PASS
    # a criterion that passed stage 1 cannot fail the run through stage 2
    assert (
        confirm(protocol, _stage({"t2_gof.a": FAIL, "t2_gof.b": PASS}), _stage({"t2_gof.a": PASS, "t2_gof.b": FAIL}))[
            "verdict"
        ]
        == PASS
    )
    rates = block["rates"]
    assert np.isclose(rates["false_fail"], alpha * alpha2) and np.isclose(rates["power"], power * power)
    assert np.isclose(rates["expected_stages"], 1 + alpha)
    assert block["gating_families"] == 2 and np.isclose(block["run_false_fail_bound"], 2 * alpha * alpha2)
