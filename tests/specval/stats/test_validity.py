"""Validity criteria and the paths to a false PASS: out-of-range tokens, impossible counts and
out-of-support tokens FAIL named criteria (never a crash), in any group and any stage.

Deterministic: no statistical assertion here (the samples are fixed by seed 0; only the
deterministic criteria are asserted on)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specval.distribution.decision import FAIL, PASS, confirm
from specval.distribution.reference import build_reference, needed_prefixes
from specval.distribution.verdict import evaluate
from specval.protocol import parse_protocol
from tests.fixtures.fake_protocol import fake_protocol_dict
from tests.fixtures.fake_sut import VOCAB, FakeSUT

N = 300
NO_QUADRATURE = [t for t in fake_protocol_dict()["tests"] if t["kind"] != "quadrature"]


def _protocol(**overrides):
    return parse_protocol(fake_protocol_dict(tests=NO_QUADRATURE, **overrides))


def _samples(protocol, rng) -> tuple[pd.DataFrame, FakeSUT]:
    sut = FakeSUT(protocol.sut, protocol.num_speculative_tokens)
    rows = []
    for g, group in enumerate(protocol.groups):
        batch = sut.sample(
            group,
            sut.encode(protocol.prompt),
            protocol.sampling,
            list(range(g * N, (g + 1) * N)),
            protocol.positions,
            protocol.max_tokens(group),
        )
        frame = pd.DataFrame({"seed": np.arange(g * N, (g + 1) * N), "group": group.name})
        for k in range(protocol.positions):
            frame[f"t{k + 1}"] = batch.tokens[:, k]
            frame[f"src{k + 1}"] = batch.sources[:, k]
        frame["num_rounds"], frame["num_draft_tokens"] = batch.num_rounds, batch.num_draft_tokens
        frame["num_accepted_tokens"] = batch.num_accepted_tokens
        rows.append(frame)
    return pd.concat(rows, ignore_index=True), sut


def _evaluate(protocol, samples, sut):
    tokens = samples[["t1", "t2"]].to_numpy()
    ref = build_reference(
        sut.target_logits, sut.encode(protocol.prompt), needed_prefixes(tokens, VOCAB), protocol.sampling, VOCAB
    )
    ranges = {g.name: (i * N, (i + 1) * N) for i, g in enumerate(protocol.groups)}
    return evaluate(protocol, samples, ref, {}, ranges), ref


def test_correct_samples_pass_every_validity_criterion():
    protocol = _protocol()
    summary, _ = _evaluate(protocol, *_samples(protocol, np.random.default_rng(0)))
    validity = {n: t for n, t in summary["tests"].items() if t["kind"] == "validity"}
    assert len(validity) == 3 * len(protocol.groups) and all(t["verdict"] == PASS for t in validity.values())


def test_out_of_range_tokens_and_impossible_counts_fail_named_criteria_without_a_crash():
    protocol = _protocol()
    samples, sut = _samples(protocol, np.random.default_rng(0))
    sync = samples.index[samples["group"] == "sync"]
    samples.loc[sync[0], "t2"] = -1
    samples.loc[sync[1], "t1"] = VOCAB
    samples.loc[sync[2], ["num_draft_tokens", "num_accepted_tokens"]] = [3, 5]
    samples.loc[sync[3], "num_rounds"] = -2
    summary, _ = _evaluate(protocol, samples, sut)
    tests = summary["tests"]
    assert summary["verdict"] == FAIL
    assert tests["out_of_range.sync"]["verdict"] == FAIL and tests["out_of_range.sync"]["statistic"] == 2
    assert tests["impossible_counts.sync"]["verdict"] == FAIL and tests["impossible_counts.sync"]["statistic"] == 2
    assert tests["out_of_range.nospec"]["verdict"] == PASS
    assert tests["t2_gof.sync"]["planned_n"] == N - 2  # the out-of-range rows are not tested


def test_out_of_support_token_fails_its_criterion():
    protocol = _protocol()
    samples, sut = _samples(protocol, np.random.default_rng(0))
    _, ref = _evaluate(protocol, samples, sut)
    row = samples.index[samples["group"] == "nospec"][0]
    prefix = (int(samples.loc[row, "t1"]),)
    samples.loc[row, "t2"] = int(np.flatnonzero(ref.probs(prefix) == 0.0)[0])
    summary, _ = _evaluate(protocol, samples, sut)
    assert summary["tests"]["out_of_support.nospec"]["verdict"] == FAIL
    assert summary["verdict"] == FAIL


def _stage(verdicts: dict) -> dict:
    tests = {
        name: {
            "kind": kind,
            "role": "primary" if kind == "gof" else "control",
            "verdict": v,
            "p_value": 0.5 if kind == "gof" else None,
            "out_of_support": 0,
        }
        for name, (kind, v) in verdicts.items()
    }
    failed = any(t["verdict"] == FAIL for t in tests.values())
    return {"verdict": FAIL if failed else PASS, "reason": "", "groups": {}, "families": {}, "tests": tests}


def test_a_stage_two_out_of_support_token_fails_the_run_even_on_a_criterion_that_passed_stage_one():
    protocol = _protocol(confirmation={"stages": 2, "alpha_stage2": 0.01})
    first = _stage({"t2_gof.sync": ("gof", FAIL), "out_of_support.nospec": ("validity", PASS)})
    second = _stage({"t2_gof.sync": ("gof", PASS), "out_of_support.nospec": ("validity", FAIL)})
    summary = confirm(protocol, first, second)
    assert summary["verdict"] == FAIL and "out_of_support.nospec" in summary["confirmation"]["failing"]
    assert "deterministic stage-2 failure" in summary["reason"]
    clean = _stage({"t2_gof.sync": ("gof", PASS), "out_of_support.nospec": ("validity", PASS)})
    assert confirm(protocol, first, clean)["verdict"] == PASS  # a chance stage-1 FAIL is overturned


def test_reference_prefixes_skip_out_of_range_rows_and_the_replay_never_sees_them():
    tokens = np.array([[1, 2, 3], [-1, 2, 3], [4, VOCAB, 0], [1, 5, -1]])
    assert needed_prefixes(tokens, VOCAB) == [(), (1,), (1, 2)]
    assert (4,) in needed_prefixes(tokens)  # without the vocabulary only negative tokens are known bad
    seen = []
    ref = build_reference(
        lambda ids: seen.append(ids) or np.zeros(VOCAB), [0], [(), (3,), (VOCAB,), (2, -1)], _protocol().sampling, VOCAB
    )
    assert sorted(ref.dists) == [(), (3,)] and len(seen) == 2


def test_an_edit_inside_a_small_stratum_changes_the_recomputed_statistic():
    # Strata below stratum_min used to be skipped, so an edited t2 there still verified; now they
    # form the joint table and any edit moves the criterion's statistic.
    protocol = _protocol()
    samples, sut = _samples(protocol, np.random.default_rng(0))
    before, ref = _evaluate(protocol, samples, sut)
    test = before["tests"]["t2_gof.sync"]
    assert test["num_joint_strata"] > 0 and test["coverage"]["fraction"] == 1.0
    joint = next(row for row in test["strata"] if row["prefix"] == "joint")
    prefix = tuple(joint["joint"][0]["prefix"])
    row = samples.index[(samples["group"] == "sync") & (samples["t1"] == prefix[0])][0]
    support = np.flatnonzero(ref.probs(prefix) > 0)
    samples.loc[row, "t2"] = int(support[support != samples.loc[row, "t2"]][0])
    after, _ = _evaluate(protocol, samples, sut)
    assert after["tests"]["t2_gof.sync"]["statistic"] != test["statistic"]
