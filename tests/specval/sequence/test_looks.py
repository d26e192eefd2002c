"""Sequential looks of the sequence kind: the protocol key, the collection order, a run walked look
by look on ChainSUT (an exact speculative sampler over a Markov chain), verify and resume.

Deterministic but for the two runs' verdicts. The correct run PASSes with probability >= 1 - alpha
= 0.99 (Holm per look, alpha spent over the looks, `specval.stats.sequential`); its seeds are a
fresh ledger's first ranges, so the outcome is fixed and does not flake. The mutant run plants a
bonus drawn from the wrong row, a deviation far above look 1's MDEs (p at the Monte Carlo floor),
so it FAILs at look 1 on its fixed seeds. The family's false-FAIL rate with looks is measured in
tests/specval/sequence/test_verdict_family.py and by `benchmarks/sequence_calibration.py --looks`.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval.cli import main
from specval.protocol import ProtocolError
from specval.seeds import SeedRange
from specval.sequence import collect, looks, runner
from specval.sequence.protocol import load_sequence_protocol, parse_sequence_protocol
from tests.fixtures import chain_faults
from tests.fixtures.chain_faults import Fault, declare, heal, plant
from tests.fixtures.sequence_protocol import (
    ONE_GROUP,
    assert_timing_split,
    sequence_protocol_dict,
    write_sequence_protocol,
)

LOOKS = {"looks": [0.5, 1.0]}
# One speculative group, every test kind: 80 sequences of 16 tokens in 8 batches of 10 (two prompts),
# so look 1 sees 4 batches (2 per prompt, the least a look may hold) and look 2 all 8.
SMALL = {
    **ONE_GROUP,
    "sequence_length": 16,
    "sequences_per_group": 80,
    "batch_size": 10,
    "profiles": {},
    "sequential": LOOKS,
}
# The fault tests' protocol with looks: one prompt, 4 batches of 4 sequences, look 1 at 2 batches.
TINY = {**chain_faults.TINY, "sequential": LOOKS}


def _parsed(**overrides):
    return parse_sequence_protocol(sequence_protocol_dict(**overrides), "proto.yaml")


# ---------------------------------------------------------------- the protocol key


def test_looks_enter_the_hash_only_when_present_and_round_trip():
    """Deterministic: a protocol without looks has no `sequential` in its canonical form (it hashes
    as before the key existed; the shipped ones keep their frozen hashes, test_semantics.py); looks
    and spending each change the hash, and the plain form parses back to the same protocol."""
    plain = _parsed(batch_size=20)
    assert plain.sequential is None and "sequential" not in plain.to_dict()
    assert plain.look_batches == (plain.num_batches,) == (8,)
    pocock = _parsed(batch_size=20, sequential=LOOKS)
    assert pocock.hash != plain.hash and pocock.to_dict()["sequential"] == {"looks": [0.5, 1.0], "spending": "pocock"}
    assert _parsed(batch_size=20, sequential={**LOOKS, "spending": "pocock"}).hash == pocock.hash  # the default
    assert _parsed(batch_size=20, sequential={**LOOKS, "spending": "linear"}).hash != pocock.hash
    again = parse_sequence_protocol(pocock.to_dict(), "copy.yaml")
    assert again.hash == pocock.hash and again.sequential == pocock.sequential
    assert pocock.look_batches == (4, 8)


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        ({"sequential": {"looks": [1.0]}}, "sequential.looks", ["2 to 10 fractions", "[1.0]"]),
        ({"sequential": {"looks": [0.5, 0.9]}}, "sequential.looks", ["the last look must be at 1.0"]),
        ({"sequential": {"looks": [0.5, 1.0], "spending": "obrien"}}, "sequential.spending", ["'obrien'"]),
        ({"sequential": {"looks": [0.5, 1.0], "every": 2}}, "sequential.every", ["unknown key"]),
        # 160 sequences in batches of 40: look 1 at half holds 2 batches, fewer than 2 per prompt
        (
            {"sequential": LOOKS},
            "sequential.looks",
            ["the first look holds 2 of 4 batches", "2 batches per prompt (4)"],
        ),
        # the smoke profile's 4 batches of 20 cannot hold these looks
        (
            {"sequential": LOOKS, "batch_size": 20, "profiles": {"smoke": {"sequences_per_group": 80}}},
            "sequential.looks",
            ["profile smoke: the first look holds 2 of 4 batches"],
        ),
        # 10 batches: looks at 0.41 and 0.45 both hold 5
        (
            {"sequential": {"looks": [0.41, 0.45, 1.0]}, "batch_size": 16},
            "sequential.looks",
            ["10 batches per group are too few", "repeat a size"],
        ),
        # 80 batches of 2: linear spending gives look 1 a level of 5e-7 at alpha 1e-5
        (
            {"sequential": {"looks": [0.05, 1.0], "spending": "linear"}, "batch_size": 2, "alpha": 1e-5},
            "sequential.spending",
            ["alpha = 1e-05", "5e-07", "below 1e-06", "'linear'"],
        ),
    ],
)
def test_bad_looks_name_the_key_the_value_and_the_file(tmp_path, overrides, key, words):
    file = write_sequence_protocol(tmp_path, **overrides)
    with pytest.raises(ProtocolError) as err:
        load_sequence_protocol(file)
    for word in (str(file), key, *words):
        assert word in str(err.value), str(err.value)


# ---------------------------------------------------------------- collection order


def _order(protocol) -> list[tuple[str, int]]:
    ranges = [
        SeedRange(protocol.name, "run", g.name, 1000 * i, 1000 * i + protocol.sequences_per_group)
        for i, g in enumerate(protocol.groups)
    ]
    return [(b.group, b.index) for b in collect.plan_batches(protocol, ranges)]


def test_a_look_collects_every_group_before_any_batch_of_a_later_look():
    """Deterministic: with looks, the batches of look k of every group (and the re-runs, with look
    1) come before any batch of look k + 1; without looks, group after group as before."""
    groups = [{"name": "a", "mode": "sync"}, {"name": "b", "mode": "nospec"}]
    tests = [{"kind": "pit", "role": "primary"}]
    looked = _parsed(groups=groups, tests=tests, batch_size=20, sequential=LOOKS)
    first, second = [(g, b) for g in "ab" for b in (0, 1, 2, 3, -1)], [(g, b) for g in "ab" for b in (4, 5, 6, 7)]
    assert _order(looked) == first + second
    plain = _parsed(groups=groups, tests=tests, batch_size=20)
    assert _order(plain) == [(g, b) for g in "ab" for b in (0, 1, 2, 3, 4, 5, 6, 7, -1)]


# ---------------------------------------------------------------- runs walked look by look


@pytest.fixture(scope="module")
def correct_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("looks")
    file = write_sequence_protocol(root, **SMALL)
    path, summary = runner.run(file, None, root / "out", exploratory=True, progress=False)
    return file, path, summary


def test_a_correct_run_passes_at_the_last_look_and_records_every_look(correct_run):
    _, path, summary = correct_run
    assert summary["verdict"] == "PASS", summary["reason"]
    block = summary["sequential"]
    assert block["batches_per_group"] == [4, 8] and block["samples_per_group"] == [40, 80]
    assert block["levels"] == [0.005, 0.005] and block["stopped_at_look"] == 2 and not block["stopped_early"]
    assert [(r["look"], r["samples_per_group"], r["verdict"]) for r in block["records"]] == [
        (1, 40, "PASS"),
        (2, 80, "PASS"),
    ]
    assert "decided at look 2 of 2, 80 of 80 sequences per group" in summary["reason"]
    assert summary["protocol"]["alpha"] == 0.01 and summary["tests"]["pit_pooled.sync"]["alpha"] == 0.005
    assert summary["groups"]["sync"]["sequences"] == 80
    assert "## Sequential looks" in (path / "report.md").read_text()
    assert runner.verify(path) == []
    assert_timing_split(path)  # the looks' collection and replays are not counted as analysis


def test_the_plan_prints_the_looks_and_their_levels(correct_run):
    file, _, summary = correct_run
    result = CliRunner().invoke(main, ["plan", "--protocol", str(file)])
    assert result.exit_code == 0, result.output
    m = summary["protocol"]["family_sizes"]["primary"]
    assert "pocock looks spending alpha 0.01" in result.output
    assert (
        f"look 1 at 0.5: 4 of 8 batches (40 sequences) per group, level 0.005; Holm's first step primary "
        f"{0.005 / m:.3g} (m = {m})" in result.output
    )
    assert "look 2 at 1: 8 of 8 batches (80 sequences) per group" in result.output
    assert f"pit_pooled.sync (primary, m = {m}, level {0.005 / m:.3g}, n = 1280)" in result.output


def test_verify_recomputes_every_look_and_refuses_batches_past_the_stop(correct_run, tmp_path):
    _, path, _ = correct_run
    copy = tmp_path / path.name
    shutil.copytree(path, copy)
    summary = json.loads((copy / "summary.json").read_text())
    summary["sequential"]["records"][0]["verdict"] = "FAIL"
    (copy / "summary.json").write_text(json.dumps(summary))
    assert any("records" in p for p in runner.verify(copy))
    protocol, _ = runner.load_bundle_protocol(path)
    first = looks.schedule(protocol)[0]
    stopped = looks.Walked({}, first, ())  # a walk that stopped at look 1 must find 4 batches, not 8
    with pytest.raises(bundles.BundleError, match="holds 8 batches, but the looks stop at look 1 \\(4 batches\\)"):
        looks.check_collected(path, protocol, stopped)


def test_a_clear_bug_fails_at_the_first_look_and_collects_nothing_after_it(tmp_path):
    # alpha 0.05: an early rejection at look 1's criterion level 0.025 / m takes ~2 m / 0.025 draws
    file = write_sequence_protocol(
        tmp_path,
        **SMALL,
        alpha=0.05,
        sut={"adapter": "tests.fixtures.chain_sut:ChainSUT", "options": {"mutant": "wrong_bonus_row"}},
    )
    path, summary = runner.run(file, None, tmp_path / "out", exploratory=True, progress=False)
    assert summary["verdict"] == "FAIL" and summary["tests"]["pit_position.sync"]["verdict"] == "FAIL"
    block = summary["sequential"]
    assert block["stopped_at_look"] == 1 and block["stopped_early"] and len(block["records"]) == 1
    assert "stopped at look 1 of 2, 40 of 80 sequences per group" in summary["reason"]
    assert len(collect.batch_files(path, "sync")) == 4
    assert not (path / bundles.SAMPLES_DIR / "sync-reference-look2.parquet").exists()
    drawn = json.loads((path / "manifest.json").read_text())["samples_drawn"]  # tokens
    assert drawn == (40 + collect.RERUN_SEEDS) * 16
    assert runner.verify(path) == []


def test_a_run_stopped_between_looks_resumes_at_the_next_look_and_verifies(tmp_path, monkeypatch):
    """Interrupted at the first batch of look 2 (after the probe's call, look 1's 2 batches and its
    re-run): exit 130, the bundle keeps look 1's batches and parts; the resume samples only the
    probe and look 2's 2 batches, PASSes and verifies."""
    heal(monkeypatch)
    declare(monkeypatch)
    monkeypatch.setattr(bundles, "device_facts", lambda: {"device": "test"})
    file = write_sequence_protocol(tmp_path, **TINY)
    plant(monkeypatch, Fault("sample", "interrupt", 1 + 2 + 1))
    stopped = CliRunner().invoke(
        main, ["run", str(file), "--output", str(tmp_path / "out"), "--exploratory", "--quiet"]
    )
    assert stopped.exit_code == 130, stopped.output
    (path,) = (tmp_path / "out").glob("chain_seq-*")
    assert len(collect.batch_files(path, "sync")) == 2 and (path / "samples" / "sync-reference-look1.parquet").exists()
    heal(monkeypatch)
    resumed = CliRunner().invoke(main, ["run", "--resume", str(path), "--quiet"])
    assert resumed.exit_code == 0 and "EXPLORATORY PASS" in resumed.output, resumed.output
    assert chain_faults.CALLS["sample"] == 1 + 2  # the probe and look 2's batches: look 1 is not sampled again
    summary = json.loads((path / "summary.json").read_text())
    assert [r["look"] for r in summary["sequential"]["records"]] == [1, 2]
    verified = CliRunner().invoke(main, ["verify", str(path)])
    assert verified.exit_code == 0, verified.output
