"""The drafts test (`kind: drafts`): the drafted tokens an adapter reports, rejected ones included,
against the q the acceptance used (`pit_draft.<group>`): the protocol key, the contract of
`SampleBatch.drafts`, the reference's PIT parts, the criterion's size and power on an exact
speculative sampler, the plan, and the bundled engine end to end on the CPU.

Statistical tests here have fixed seeds. False-fail rates: the null-rate test's is stated in it
(a binomial tail of 1e-3 at a true size of exactly alpha); the engine's correct run FAILs with
probability <= alpha = 0.01 (one criterion), and its outcome is fixed by a fresh ledger's seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from specval import budget
from specval.cli import main
from specval.distribution.reference import transform
from specval.preflight import SUTRaised
from specval.protocol import ProtocolError
from specval.semantics import DEFAULT_SEMANTICS
from specval.sequence import collect, plan, reference, runner, verdict
from specval.sequence.contract import check_batch
from specval.sequence.protocol import parse_sequence_protocol
from specval.stats.sequence import pit_parts
from specval.sut import NO_DRAFT, SampleBatch
from tests.fixtures import sequence_null

K = 3
SIMULATED = {  # the criterion alone on one speculative group (the statistics' tests below)
    "kind": "sequence",
    "name": "drafts_null",
    "prompts": ["p"],
    "sampling": {"temperature": 1.0},
    "num_speculative_tokens": K,
    "sequence_length": 32,
    "groups": [{"name": "sync", "mode": "sync"}],
    "sequences_per_group": 80,
    "batch_size": 40,
    "alpha": 0.05,
    "tests": [{"kind": "drafts", "role": "primary"}],
}
ENGINE = {  # the bundled engine's looped model on the CPU, through the batched collection
    **SIMULATED,
    "name": "drafts_cpu",
    "sut": {"adapter": "engine", "model": "looped", "dtype": "float32", "device": "cpu"},
    "prompts": ["The drafts must follow q."],
    "sampling": {"temperature": 0.7, "top_k": 10},  # T != 1 and top-k: raw and processed q differ
    "sequence_length": 24,
    "groups": [{"name": "sync", "mode": "sync", "draft_loops": 2}],
    "sequences_per_group": 40,
    "batch_size": 20,
    "alpha": 0.01,
}


def _protocol(**overrides):
    return parse_sequence_protocol({**SIMULATED, **overrides}, "drafts.yaml")


def _engine_file(tmp_path, **options):
    raw = {**ENGINE, "sut": {**ENGINE["sut"], "options": options}}
    path = tmp_path / f"drafts_{options.get('mutant', 'correct')}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# ---------------------------------------------------------------- protocol


def test_a_drafts_test_applies_to_speculative_groups_and_is_counted_in_the_family():
    groups = [{"name": "nospec", "mode": "nospec"}, {"name": "sync", "mode": "sync"}]
    protocol = _protocol(
        groups=groups, tests=[{"kind": "pit", "role": "primary"}, {"kind": "drafts", "role": "primary"}]
    )
    assert protocol.groups_of(protocol.tests[1]) == ("sync",)
    names = [name for name, _, _ in verdict.planned_criteria(protocol)]
    assert "pit_draft.sync" in names and "pit_draft.nospec" not in names
    assert verdict.family_sizes(protocol) == {"primary": 2 * 3 + 1}  # pit's three per group, one pit_draft
    with pytest.raises(ProtocolError, match=r"drafts.yaml: tests\[0\].groups: a drafts test needs speculative"):
        _protocol(groups=groups, tests=[{"kind": "drafts", "role": "primary", "groups": ["nospec"]}])


# ---------------------------------------------------------------- contract


def _batch(drafts) -> SampleBatch:
    tokens = np.array([[4, 5, 6, 7]])
    sources = np.array([["accepted", "correction", "bonus", "accepted"]], dtype=object)
    zeros = np.zeros(1, dtype=np.int64)
    return SampleBatch(tokens, sources, zeros, zeros, zeros, drafts=None if drafts is None else np.array(drafts))


@pytest.mark.parametrize(
    ("drafts", "message"),
    [
        ([[4, 9, -1]], r"drafts has int64\[1, 3\], expected int\[1, 4\]"),
        ([[4.0, 9.0, -1.0, 7.0]], r"drafts has float64\[1, 4\]"),
        ([[3, 9, -1, 7]], r"1 draft\(s\) that differ from the accepted token there, first at row 0, position 0: 3"),
        ([[4, 8, -1, 7]], r"outside \[0, 8\) at a correction, first at row 0, position 1: 8"),
        ([[4, -1, -1, 7]], r"outside \[0, 8\) at a correction, first at row 0, position 1: -1"),
        ([[4, 2, 6, 7]], r"are not -1 at a bonus or plain token, first at row 0, position 2: 6"),
    ],
)
def test_the_contract_refuses_drafts_that_do_not_stand_at_their_tokens(drafts, message):
    check_batch("sample (batch 0, group 'sync')", _batch([[4, 2, NO_DRAFT, 7]]), 1, 4, 8)  # the valid report
    with pytest.raises(SUTRaised, match=message) as raised:
        check_batch("sample (batch 0, group 'sync')", _batch(drafts), 1, 4, 8)
    assert raised.value.call == "sample (batch 0, group 'sync')"


class _Reporting:
    """An adapter stand-in whose `sample` returns `_batch(drafts)` for every call."""

    vocab_size = 8

    def __init__(self, drafts):
        self.drafts = drafts

    def sample(self, group, prompt_ids, sampling, seeds, num_tokens, max_tokens):
        return _batch(self.drafts)


def test_drafts_are_stored_for_groups_under_a_drafts_test_and_required_there():
    groups = [{"name": "a", "mode": "sync"}, {"name": "b", "mode": "sync"}]
    protocol = _protocol(
        groups=groups,
        sequence_length=4,
        batch_size=2,
        sequences_per_group=4,
        tests=[{"kind": "pit", "role": "primary"}, {"kind": "drafts", "role": "primary", "groups": ["a"]}],
    )
    one = collect.Batch("a", 0, (10,), 0)
    reported = _Reporting([[4, 2, NO_DRAFT, 7]])
    assert collect.sample_batch(reported, protocol, [[1]], one)["draft"].tolist() == [4, 2, NO_DRAFT, 7]
    assert "draft" not in collect.sample_batch(reported, protocol, [[1]], collect.Batch("b", 0, (10,), 0))
    unchecked = _Reporting([[0, 0, 0, 0]])  # not a drafts group: neither checked nor stored
    assert "draft" not in collect.sample_batch(unchecked, protocol, [[1]], collect.Batch("b", 0, (10,), 0))
    silent = _Reporting(None)
    with pytest.raises(ProtocolError, match=r"tests\[1\].kind: 'drafts' needs the drafted tokens .* group 'a'"):
        collect.sample_batch(silent, protocol, [[1]], collect.Batch("a", 0, (10,), 0, probe=True))
    with pytest.raises(SUTRaised, match="returned no drafts"):
        collect.sample_batch(silent, protocol, [[1]], one)


# ---------------------------------------------------------------- reference


def test_the_draft_parts_are_the_drafts_rank_order_pit_under_q():
    rng = np.random.default_rng(5)
    q = rng.dirichlet(np.ones(6), size=4)
    q[2, 3] = 0.0  # a draft q cannot emit (position 2 drafted token 3)
    q /= q.sum(axis=1, keepdims=True)
    drafts = np.array([1, NO_DRAFT, 3, 5])
    parts = reference.draft_parts(q, drafts)
    lower, mass = pit_parts(q[[0, 3]], drafts[[0, 3]], "rank")
    np.testing.assert_array_equal(parts["draft_lower"][[0, 3]], lower)
    np.testing.assert_array_equal(parts["draft_mass"][[0, 3]], mass)
    assert (parts["draft_lower"][1], parts["draft_mass"][1]) == (0.0, 0.0)  # no draft stood there
    assert parts["draft_lower"][2] == pytest.approx(1.0) and parts["draft_mass"][2] == 0.0  # top of the unit
    logits = np.log(np.where(q > 0, q, 1e-30)).astype(np.float32)  # sequence_parts filters q as p
    protocol, sources = _protocol(), np.array(["accepted", "bonus", "correction", "accepted"])
    full = reference.sequence_parts(logits, drafts.clip(0), protocol, DEFAULT_SEMANTICS, (logits, sources, drafts))
    alone = reference.draft_parts(transform(logits, protocol.sampling), drafts)
    for name in reference.DRAFT_COLUMNS:
        np.testing.assert_array_equal(full[name], alone[name])
    assert set(reference.SOURCE_COLUMNS) <= set(full)  # the source test's parts of the same q


# ---------------------------------------------------------------- the criterion on an exact sampler


def _simulate(chain, num: int, length: int, rng: np.random.Generator, drawn=None):
    """(tokens, sources, drafts, states) [num, length] of exact K-draft speculative sampling over the
    null model's chain (`sequence_null`): drafts drawn from `drawn` rows (default q, the rows the
    accept test and the residual use), accepted iff u q(x) < p(x), a correction from (p - q)+, a
    bonus from p after K accepts. The drafts a correct sampler reports, -1 at a bonus."""
    drawn = chain.draft if drawn is None else drawn
    rows, position = np.arange(num), np.ones(num, dtype=np.int64)
    state = np.full(num, sequence_null.VOCAB)  # the first prompt's start state
    out = [np.zeros((num, length), dtype=np.int64) for _ in range(3)]
    sources = np.empty((num, length), dtype=object)
    for i in range(length):
        p, q = chain.target[state], chain.draft[state]
        x = sequence_null._inverse_cdf(drawn[state], rng.random(num))
        bonus = position == K + 1
        accept = ~bonus & (rng.random(num) * q[rows, x] < p[rows, x])
        residual = np.maximum(p - q, 0.0)
        residual = np.where(residual.sum(axis=1, keepdims=True) > 0, residual, p)
        correction, extra = (sequence_null._inverse_cdf(law, rng.random(num)) for law in (residual, p))
        token = np.where(bonus, extra, np.where(accept, x, correction))
        sources[:, i] = np.where(bonus, "bonus", np.where(accept, "accepted", "correction"))
        out[0][:, i], out[1][:, i], out[2][:, i] = token, np.where(bonus, NO_DRAFT, x), state
        position, state = np.where(accept, position + 1, 1), token
    return out[0], sources, out[1], out[2]


def _replicate(protocol, chain, index: int, drawn=None) -> dict:
    """`verdict.evaluate` of one simulated group (fresh stream keys per replicate)."""
    rng = np.random.default_rng([2026, index])
    num, length = protocol.sequences_per_group, protocol.sequence_length
    tokens, sources, drafts, states = _simulate(chain, num, length, rng, drawn)
    laws, flat = chain.target[states.reshape(-1)], tokens.reshape(-1)
    lower_rank, mass = pit_parts(laws, flat, "rank")
    lower_index, _ = pit_parts(laws, flat, "index")
    parts = {"mass": mass, "lower_rank": lower_rank, "lower_index": lower_index}
    parts |= {"status": np.zeros(flat.size, dtype=np.int8)}
    parts |= reference.draft_parts(chain.draft[states.reshape(-1)], drafts.reshape(-1))
    rows = np.arange(num)
    data = verdict.GroupSequences(
        tokens=tokens,
        sources=sources,
        batch=rows // protocol.batch_size,
        slot=rows % protocol.batch_size,
        parts={name: values.reshape(tokens.shape) for name, values in parts.items()},
        rerun_tokens=tokens[:2],
        rerun_expected=tokens[:2],
    )
    start = sequence_null.SEED_BASE + index * num
    return verdict.evaluate(protocol, {"sync": data}, {"sync": (start, start + num)})


NULL_REPLICATES = 300
NULL_BOUND = 29  # binomial(300, 0.05) exceeds 28 with probability < 1e-3


def test_pit_draft_keeps_its_size_on_an_exact_speculative_sampler():
    # 300 null replicates (80 sequences of 32 tokens, K = 3, acceptance 0.8: about 1,900 drafts in 3
    # buckets whose sizes depend on earlier accepts, which depend on earlier drafts), the criterion
    # at alpha = 0.05. At a true size of exactly 0.05 the count reaches NULL_BOUND with probability
    # < 1e-3, this test's false-fail rate. It can fail: PITs taken under another law than the
    # drafts' (the test below) FAIL nearly every replicate.
    protocol, chain = _protocol(), sequence_null.make_chain(1, seed=11)
    rows = [_replicate(protocol, chain, index)["tests"]["pit_draft.sync"] for index in range(NULL_REPLICATES)]
    fails = sum(row["verdict"] == verdict.FAIL for row in rows)
    assert fails < NULL_BOUND, fails
    assert sum(row["impossible_drafts"] for row in rows) == 0 and min(row["effective_n"] for row in rows) > 1500


def test_drafts_drawn_from_another_q_than_the_accept_uses_fail_pit_draft():
    """Drafts from q^0.8 renormalised (a draft at 1.25 x the temperature the accept assumes) while
    the accept test and the residual use q: every one of 10 replicates FAILs (deterministic seeds),
    at a binned-PIT TV well above the printed MDE."""
    protocol, chain = _protocol(), sequence_null.make_chain(1, seed=11)
    flat = chain.draft**0.8
    drawn = flat / flat.sum(axis=1, keepdims=True)
    rows = [_replicate(protocol, chain, index, drawn)["tests"]["pit_draft.sync"] for index in range(10)]
    assert [row["verdict"] for row in rows] == [verdict.FAIL] * 10
    assert all(row["impossible_drafts"] == 0 for row in rows)  # q^0.8 keeps q's support: the PIT's shape fails
    assert rows[0]["mde_label"] == verdict.BUCKET_LABEL and len(rows[0]["bucket_keys"]) == K


def test_the_plan_prints_pit_drafts_mde_per_draft_position():
    rows = {row.criterion: row for row in plan.protocol_plan(_protocol())}
    per_position = [rows[f"pit_draft.sync @ draft {j}"] for j in range(1, K + 1)]
    assert [row.n for row in per_position] == plan.planned_drafts(_protocol())
    assert per_position[0].n > per_position[-1].n and per_position[0].mde < per_position[-1].mde
    assert rows["pit_draft.sync"].n == sum(plan.planned_drafts(_protocol())) // K
    assert "pit_draft.sync" in [row.criterion for row in budget.planned_cost(_protocol()).rows]  # its draws


# ---------------------------------------------------------------- the bundled engine, end to end


def test_the_engine_passes_and_fails_drafts_drawn_from_its_raw_logits(tmp_path):
    """The correct engine (batched collection, CPU) PASSes, its bundle stores the drafts and
    verifies; `draft_raw_ratio_filtered` (drafts from the raw softmax, the accept against the
    processed q) FAILs pit_draft at the early look, with drafts q cannot emit."""
    path, summary = runner.run(
        _engine_file(tmp_path, collection="batched"), None, tmp_path / "out", exploratory=True, progress=False
    )
    assert summary["verdict"] == "PASS", summary["reason"]
    assert summary["tests"]["pit_draft.sync"]["impossible_drafts"] == 0
    assert runner.verify(path) == []
    samples = collect.load_group(path, runner.load_bundle_protocol(path)[0], "sync")[0]
    drafted = samples["source"].isin(["accepted", "correction"])
    assert (samples["draft"][~drafted] == NO_DRAFT).all() and (samples["draft"][drafted] >= 0).all()
    mutant = _engine_file(tmp_path, collection="batched", mutant="draft_raw_ratio_filtered")
    _, summary = runner.run(mutant, None, tmp_path / "out", exploratory=True, progress=False)
    row = summary["tests"]["pit_draft.sync"]
    assert summary["verdict"] == "FAIL" and row["verdict"] == "FAIL" and row["impossible_drafts"] > 0


def test_an_adapter_that_reports_no_drafts_is_refused_before_any_seed(tmp_path):
    """The engine's default collection (`LLM.generate`) reports no drafts: exit 2, one line naming the
    test's key, and nothing claimed."""
    result = CliRunner().invoke(
        main, ["run", str(_engine_file(tmp_path)), "--exploratory", "--output", str(tmp_path / "out"), "--quiet"]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "tests[0].kind: 'drafts' needs the drafted tokens" in lines[0], result.output
    assert str(_engine_file(tmp_path)) in lines[0]  # the file, beside the key and the value
    assert "collection: batched" in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "out" / "ledger.json").exists()
