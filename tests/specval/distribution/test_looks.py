"""Sequential looks on the exact fake SUT (tests/fixtures/fake_sut.py): the schedule, where a run
stops, what its bundle holds and says, verify, and resume between looks.

Protocol: the fake t2 protocol at its ci size (800 per group) with looks at 10/25/50/100 %
(80, 200, 400, 800 samples per group), Pocock spending of alpha = 0.01; fixed seeds (a fresh
output root starts at seed_base 0), so every outcome below is reproducible. Rates for a fresh
seed range: a correct SUT FAILs with probability <= 2 families * 0.01 = 0.02 (specval.stats.sequential);
the planted accept-kernel bug (BuggyFakeSUT) FAILs the quadrature check, a deterministic criterion,
at the first look with certainty.
"""

from __future__ import annotations

import pytest

from specval import bundle as bundles
from specval.distribution import collect, looks, runner
from specval.distribution.criteria import decision_levels
from specval.distribution.decision import FAIL, PASS
from specval.execution import RunInterrupted
from specval.protocol import load_protocol, resolve
from specval.report.junit import write_junit
from specval.seeds import SeedRange
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import BuggyFakeSUT, FakeSUT, KilledFakeSUT

LOOKS = [0.1, 0.25, 0.5, 1.0]
SIZES = [80, 200, 400, 800]  # ceil(t * 800)


def _protocol(tmp_path, name="protocol.yaml", **overrides):
    raw = fake_protocol_dict(sequential={"looks": LOOKS}, **overrides)
    return write_protocol(tmp_path, raw, name)


def _run(tmp_path, sut, output="results", **overrides):
    return runner.run(_protocol(tmp_path, **overrides), "ci", tmp_path / output, sut_factory=sut, progress=False)


def test_schedule_and_segments(tmp_path):
    """Deterministic: sizes, levels and chunk boundaries of the ci profile."""
    protocol = resolve(load_protocol(_protocol(tmp_path)), "ci")
    schedule = looks.schedule(protocol, protocol.alpha)
    assert [look.samples_per_group for look in schedule] == SIZES
    assert [look.level for look in schedule] == [0.0025] * 4 and [look.is_final for look in schedule] == [0, 0, 0, 1]
    ranges = [SeedRange("p", "r", "nospec", 1000, 1800)]
    cut = looks.segments(ranges, schedule[:2])
    assert [(r.start, r.stop) for r in cut] == [(1000, 1080), (1080, 1200)]
    assert [(c.start, c.stop) for c in collect.plan_chunks(cut, protocol.chunk_size)] == [(1000, 1080), (1080, 1200)]


def test_mde_is_printed_at_the_last_looks_level(tmp_path):
    """Deterministic: a PASS is decided at the last look's level (alpha / 4 under Pocock), so the
    plan and the criteria print their MDE there, not at alpha."""
    protocol = load_protocol(_protocol(tmp_path))
    fixed = load_protocol(write_protocol(tmp_path, fake_protocol_dict(), "fixed.yaml"))
    assert decision_levels(protocol, "primary") == [level / 4 for level in decision_levels(fixed, "primary")]


def test_correct_sut_passes_at_the_last_look_and_verifies(tmp_path):
    path, summary = _run(tmp_path, FakeSUT)
    block = summary["sequential"]
    assert summary["verdict"] == PASS and not block["stopped_early"] and block["stopped_at_look"] == 4
    assert [r["samples_per_group"] for r in block["records"]] == SIZES
    assert all(r["verdict"] == PASS for r in block["records"])
    assert summary["protocol"]["alpha"] == 0.01 and summary["protocol"]["samples_per_group"] == 800
    assert {t["alpha"] for t in summary["tests"].values() if t["p_value"] is not None} == {0.0025}
    assert "decided at look 4 of 4, 800 of 800 samples per group" in summary["reason"]
    assert collect.collected_size(path, runner.load_bundle_protocol(path)[1]) == 800
    assert runner.verify(path, figure_workers=0) == []


def test_planted_bug_stops_at_the_first_look_with_a_complete_bundle(tmp_path):
    path, summary = _run(tmp_path, BuggyFakeSUT)
    block = summary["sequential"]
    assert summary["verdict"] == FAIL and block["stopped_early"] and block["stopped_at_look"] == 1
    assert block["samples_per_group_at_stop"] == SIZES[0] and len(block["records"]) == 1
    assert set(block["records"][0]["failing"]) >= {"quadrature.adversarial"}
    assert collect.collected_size(path, runner.load_bundle_protocol(path)[1]) == SIZES[0]
    assert {g["effective_n"] for g in summary["groups"].values()} == {SIZES[0]}
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    assert manifest["samples_drawn"] == 2 * SIZES[0]
    assert "stopped at look 1 of 4, 80 of 800 samples per group" in summary["reason"]
    report = (path / "report.md").read_text()
    assert "## Sequential looks" in report and "stopped with FAIL at look 1 of 4, after 80 of 800" in report
    assert "Sequential looks" in (path / "report.html").read_text()
    write_junit(summary, tmp_path / "junit.xml")
    junit = (tmp_path / "junit.xml").read_text()
    assert '<property name="stopped_at_look" value="1" />' in junit
    assert '<property name="samples_per_group" value="80" />' in junit
    assert runner.verify(path, figure_workers=0) == []


def test_verify_refuses_samples_beyond_the_stopping_look(tmp_path):
    """A chunk of the next look added (and listed in SHA256SUMS, as a forger would) to a bundle
    that stopped at look 1: the recomputation names it."""
    path, _ = _run(tmp_path, BuggyFakeSUT)
    chunk = next((path / "samples").glob("nospec-*.parquet"))
    frame = collect.pd.read_parquet(chunk)
    frame["seed"] += SIZES[0]
    extra = collect.Chunk("nospec", SIZES[0], 2 * SIZES[0])
    bundles.write_chunk(path, path / "samples" / extra.file_name, lambda tmp: frame.to_parquet(tmp, index=False))
    problems = " ".join(runner.verify(path, figure_workers=0))
    assert "different sizes" in problems or "stop at look 1" in problems, problems


class KilledAtLookTwo(KilledFakeSUT):
    """Dies inside look 2: 2 probe calls, look 1 (one batch per group), then nospec's look-2 batch."""

    kill_after = 2 + 2 + 1


def test_a_run_killed_between_looks_resumes_to_the_uninterrupted_verdict(tmp_path):
    with pytest.raises(RunInterrupted) as err:
        _run(tmp_path, KilledAtLookTwo)
    path = err.value.path
    assert not (path / bundles.SUMMARY_FILE).exists()
    assert sorted(c.name.split("-")[0] for c in (path / "samples").glob("*.parquet")) == ["nospec", "nospec", "sync"]
    resumed, summary = runner.run(None, None, tmp_path / "results", resume=path, sut_factory=FakeSUT, progress=False)
    fresh_path, fresh = _run(tmp_path, FakeSUT, output="fresh")
    assert summary["verdict"] == fresh["verdict"] == PASS
    assert summary["tests"] == fresh["tests"] and summary["sequential"] == fresh["sequential"]
    assert runner.verify(resumed, figure_workers=0) == []
