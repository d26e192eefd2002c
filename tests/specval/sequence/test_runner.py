"""The sequence kind end to end on ChainSUT (an exact speculative sampler over a Markov chain).

False-fail rate: the correct-sampler run FAILs with probability <= alpha = 0.01 (Holm over every
p-valued criterion; each is an exact-size test). The mutant runs are fixed-seed runs of bugs whose
deviations lie far above the MDEs of the criteria named (p-values at the Monte Carlo floor).
"""

from __future__ import annotations

import json

import pytest

from specval.protocol import ProtocolError
from specval.sequence import runner, verdict
from specval.stats import montecarlo
from tests.fixtures.sequence_protocol import ONE_GROUP, assert_timing_split, write_sequence_protocol

SMALL = ONE_GROUP


@pytest.fixture(scope="module")
def correct_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequence")
    path, summary = runner.run(write_sequence_protocol(root), None, root / "out", exploratory=True, progress=False)
    return path, summary


def test_correct_sampler_passes_every_criterion_and_verifies(correct_run):
    path, summary = correct_run
    assert summary["verdict"] == "PASS", summary["reason"]
    names = set(summary["tests"])
    for group in ("nospec", "sync", "adversarial", "mixed"):
        assert {
            f"pit_pooled.{group}",
            f"pit_position.{group}",
            f"pit_path.{group}",
            f"serial.{group}",
            f"support.{group}",
            f"reproducible.{group}",
        } <= names
    assert {"equal_t1_adjacent.sync", "association_cross.sync", "identical.sync"} <= names
    # the white-box source test: every speculative group, none for nospec
    assert {"pit_source.sync", "accepts.adversarial", "pit_source.mixed"} <= names
    assert "pit_source.nospec" not in names and summary["tests"]["pit_source.sync"]["impossible_tokens"] == 0
    assert summary["groups"]["sync"]["round_positions"]["4"] > 0  # the bonus position is tested
    assert summary["tests"]["companions.mixed"]["verdict"] == "PASS"
    assert summary["tests"]["companions.mixed"]["effective_n"] == 160 * 32  # one companion per tested request
    assert runner.verify(path) == []


def test_the_manifest_times_collection_replays_and_criteria_apart(correct_run):
    assert_timing_split(correct_run[0])


def test_the_plan_prints_the_mdes_the_run_reaches(correct_run):
    """Planned MDEs use the layout alone: equal to the run's where the sizes are fixed (pooled PIT,
    serial, association), an upper bound where the run observes fewer buckets."""
    from specval.sequence.plan import protocol_plan
    from specval.sequence.runner import load_bundle_protocol

    path, summary = correct_run
    planned = {row.criterion: row for row in protocol_plan(load_bundle_protocol(path)[0])}
    for name in ("pit_pooled.sync", "serial.sync", "association_adjacent.sync", "association_cross.sync"):
        assert planned[name].mde == pytest.approx(summary["tests"][name]["mde_tv"], rel=1e-9), name
        assert planned[name].n == summary["tests"][name]["effective_n"] or name.startswith("serial")
    assert planned["pit_position.sync"].mde >= summary["tests"]["pit_position.sync"]["mde_tv"]
    assert planned["identical.sync"].mde is None  # needs the target's laws: printed by the run


def test_verify_recomputes_the_verdict_from_the_stored_samples(correct_run, tmp_path):
    path, _ = correct_run
    summary = json.loads((path / "summary.json").read_text())
    summary["tests"]["pit_pooled.sync"]["p_value"] = 0.5
    copy = tmp_path / path.name
    import shutil

    shutil.copytree(path, copy)
    (copy / "summary.json").write_text(json.dumps(summary))
    problems = runner.verify(copy)
    assert any("pit_pooled.sync" in p for p in problems) and any("summary.json" in p for p in problems)


def test_a_draft_override_needs_the_adapter_capability(tmp_path):
    file = write_sequence_protocol(
        tmp_path,
        sut={"adapter": "tests.fixtures.fake_sut:FakeSUT"},
        groups=[{"name": "sync", "mode": "sync", "draft": "noisy"}],
    )
    with pytest.raises(ProtocolError, match="draft_overrides"):
        runner.run(file, None, tmp_path / "out", exploratory=True, progress=False)
    assert not (tmp_path / "out" / "ledger.json").exists()  # refused before any seed is claimed


# Sizes per bug: the position and path bugs are killed at half the default 160 sequences (a tenth of
# the tokens the default takes); the cross-request bug needs the default's 80 adjacent pairs.
@pytest.mark.parametrize(
    "mutant, killer, sequences",
    [
        ("wrong_bonus_row", "pit_position.sync", 80),
        ("reuse_accept", "pit_path.sync", 80),
        ("correlated_streams", "association_adjacent.sync", 160),
        ("residual_from_p_late", "pit_source.sync", 80),
    ],
)
def test_each_bug_class_is_killed_by_its_criterion(tmp_path, mutant, killer, sequences):
    file = write_sequence_protocol(
        tmp_path,
        name=f"chain_{mutant}",
        **SMALL,
        sequences_per_group=sequences,
        batch_size=sequences // 4,
        sut={"adapter": "tests.fixtures.chain_sut:ChainSUT", "options": {"mutant": mutant}},
    )
    _, summary = runner.run(file, None, tmp_path / "out", exploratory=True, progress=False)
    assert summary["verdict"] == "FAIL" and summary["tests"][killer]["verdict"] == "FAIL", summary["reason"]
    # Fail fast: a PIT killer (its deviation far above the MDE) stops at the early look after ~2 /
    # level draws, not at the cap of 60 / level. The association killer at 80 pairs lies near its
    # MDE: a borderline rejection runs to the cap, as the rule says.
    level = 0.01 / summary["protocol"]["family_sizes"]["primary"]
    if killer.startswith("pit_"):
        assert summary["tests"][killer]["mc_draws"] == montecarlo.early_look(level)[1] < 60 / level


def test_the_run_records_its_criteria_rules_and_each_bucket(correct_run):
    """The second rules: recorded in summary.json, max-type buckets with every bucket's MDE, the
    worst bucket named; the first rules (bundles without `criteria_version`) give another summary,
    so a bundle relabelled to the other rules fails `verify`."""
    path, summary = correct_run
    assert summary[runner.RULES_KEY] == verdict.CURRENT_RULES
    row = summary["tests"]["pit_position.sync"]
    assert row["mde_label"] == verdict.BUCKET_LABEL and len(row["bucket_mde"]) == len(row["bucket_keys"])
    assert row["worst_bucket"] in row["bucket_keys"] and row["statistic"] == max(row["bucket_statistics"])
    sizes = row["bucket_sizes"]  # a larger bucket sees a smaller deviation
    assert row["bucket_mde"][sizes.index(max(sizes))] < row["bucket_mde"][sizes.index(min(sizes))]
    protocol, ranges = runner.load_bundle_protocol(path)
    first = runner.summarise(path, protocol, ranges, rules=verdict.FIRST_RULES)
    assert runner.RULES_KEY not in first and "bucket_mde" not in first["tests"]["pit_position.sync"]
    assert first["tests"]["pit_position.sync"]["statistic"] > row["statistic"]  # the sum over buckets


MIXED = {
    "groups": [{"name": "mixed", "mode": "sync", "companions": [{"temperature": 0}, {"temperature": 0.5}]}],
    "tests": [{"kind": "pit", "role": "primary"}, {"kind": "reproducibility", "role": "control"}],
    "sequences_per_group": 80,
    "batch_size": 20,
}


@pytest.mark.parametrize(
    "mutant, killer",
    [
        ("mixed_leak", "pit_pooled.mixed"),  # the tested rows take a companion's temperature
        ("greedy_ignored", "companions.mixed"),  # greedy companions are sampled
    ],
)
def test_a_law_that_depends_on_the_batch_mix_fails(tmp_path, mutant, killer):
    """mixed_leak: tested rows at temperature 0.5 instead of 1 (TV far above the pooled MDE at 2,560
    tokens; p at the Monte Carlo floor); its re-run, a batch without companions, differs too.
    greedy_ignored: a companion that should take the argmax samples: deterministic."""
    file = write_sequence_protocol(
        tmp_path,
        name=f"chain_{mutant}",
        **MIXED,
        sut={"adapter": "tests.fixtures.chain_sut:ChainSUT", "options": {"mutant": mutant}},
    )
    _, summary = runner.run(file, None, tmp_path / "out", exploratory=True, progress=False)
    assert summary["verdict"] == "FAIL" and summary["tests"][killer]["verdict"] == "FAIL", summary["reason"]
    if mutant == "mixed_leak":
        assert summary["tests"]["reproducible.mixed"]["verdict"] == "FAIL"


def test_companions_need_the_adapter_capability(tmp_path):
    file = write_sequence_protocol(tmp_path, sut={"adapter": "tests.fixtures.fake_sut:FakeSUT"}, **MIXED)
    with pytest.raises(ProtocolError, match="mixed_sampling"):
        runner.run(file, None, tmp_path / "out", exploratory=True, progress=False)
    assert not (tmp_path / "out" / "ledger.json").exists()  # refused before any seed is claimed
