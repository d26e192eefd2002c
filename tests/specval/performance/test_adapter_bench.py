"""Performance protocols of any adapter: arms are groups of one `specval.sut.SUT`, timed through
`SUT.sample` in ABBA order with the same request seeds in both arms of a pair. The adapter is
`tests.fixtures.clocked_sut`, whose "time" is a planted clock, so every ratio and verdict here is
deterministic and no test depends on the speed of the machine it runs on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specval import bundle as bundles
from specval.performance import bench as benching
from specval.performance.protocol import load_performance_protocol, parse_performance_protocol
from specval.performance.summary import FAIL, PASS, schedule, seed_start
from specval.protocol import ProtocolError
from tests.fixtures import clocked_sut
from tests.fixtures.perf_protocols import invoke as _invoke
from tests.fixtures.perf_protocols import write

ADAPTER = "tests.fixtures.clocked_sut:ClockedSUT"


def adapter_dict(**changes) -> dict:
    """Two prompts and three requests per run: request j gets prompt j mod 2 and seed first + j."""
    raw = {
        "kind": "performance",
        "name": "perf_clocked",
        "device": "cpu",
        "sut": {"adapter": ADAPTER, "model": "fake", "options": {"speedup": 1.5}},
        "prompts": ["first prompt", "second"],
        "concurrency": 3,
        "max_tokens": 8,
        "sampling": {"temperature": 1.0, "top_k": 20},
        "num_speculative_tokens": 3,
        "a": {"name": "plain", "mode": "nospec"},
        "b": {"name": "spec", "mode": "sync", "draft_loops": 2},
        "statistic": "throughput",
        "hypothesis": "superiority",
        "margin": 0.3,
        "confidence": 0.95,
        "pairs": 6,
        "warmup_rounds": 1,
        "seed_base": 100,
    }
    raw.update(changes)
    return raw


@pytest.fixture
def clocked(monkeypatch):
    """The fixture adapter's planted clock as the bench's clock, and its call record emptied."""
    clocked_sut.reset()
    monkeypatch.setattr(benching, "clock_ns", clocked_sut.now)
    yield clocked_sut
    clocked_sut.reset()


def _bench(tmp_path: Path, raw: dict):
    result = _invoke(["bench", str(write(tmp_path, raw)), "--output", str(tmp_path / "out"), "--quiet"])
    bundles_made = [p for p in (tmp_path / "out").iterdir() if p.is_dir()] if (tmp_path / "out").exists() else []
    return result, (bundles_made[0] if bundles_made else None)


def _summary(path: Path) -> dict:
    return json.loads((path / bundles.SUMMARY_FILE).read_text())


# ---------------------------------------------------------------- protocol


def test_an_adapter_protocol_parses_with_groups_for_arms():
    protocol = parse_performance_protocol(adapter_dict())
    assert not protocol.on_engine and protocol.sut.adapter == ADAPTER
    assert protocol.arm("b").group.mode == "sync" and protocol.arm("b").group.draft_loops == 2
    assert parse_performance_protocol(adapter_dict(margin=0.31)).hash != protocol.hash


@pytest.mark.parametrize(
    "changes, key, value",
    [
        ({"a": {"name": "plain", "mode": "nospec", "enforce_eager": True}}, "a.enforce_eager", "True"),
        ({"b": {"name": "spec", "mode": "sync", "rounds_in_flight": 2}}, "b.rounds_in_flight", "2"),
        ({"b": {"name": "spec", "mode": "sync", "sampling": {"temperature": 0.0}}}, "b.sampling.temperature", "0.0"),
        ({"sampling": {"temperature": 0.0}}, "sampling.temperature", "0.0"),
        ({"statistic": "tokens_per_second"}, "statistic", "'tokens_per_second'"),
        ({"sut": {"adapter": " "}}, "sut.adapter", "' '"),
    ],
)
def test_engine_options_and_greedy_are_refused_for_other_adapters(tmp_path, changes, key, value):
    path = write(tmp_path, adapter_dict(**changes), frozen=False)
    with pytest.raises(ProtocolError) as err:
        load_performance_protocol(path)
    text = str(err.value)
    assert text.startswith(f"{path}: line ") and f": {key}: " in text and f"(got {value})" in text, text


def test_time_per_token_passes_below_its_threshold():
    protocol = parse_performance_protocol(adapter_dict(statistic="time_per_token"))
    assert protocol.threshold == pytest.approx(0.7) and not protocol.higher_is_better


# ---------------------------------------------------------------- end to end through SUT.sample


def test_an_adapter_bench_runs_groups_in_abba_order_on_shared_seeds_and_verifies(tmp_path, clocked):
    result, path = _bench(tmp_path, adapter_dict())
    summary = _summary(path)
    assert result.exit_code == 0 and summary["verdict"] == PASS, result.output
    protocol = parse_performance_protocol(adapter_dict())
    # one sample call per prompt, in prompt order: request j (seed first + j) has prompt j mod 2
    expected = []
    for run in schedule(protocol):
        first = seed_start(protocol, run)
        name = protocol.arm(run.arm).name
        expected += [
            (name, tuple(ord(c) % 16 for c in "first prompt"), (first, first + 2)),
            (name, tuple(ord(c) % 16 for c in "second"), (first + 1,)),
        ]
    assert [call[:3] for call in clocked.CALLS] == expected
    assert {call[3].top_k for call in clocked.CALLS} == {20}
    # the planted speed-up (1.5, each request jittered by at most 2%) is what the pairs measure
    assert all(1.5 / 1.02 <= p["ratio"] <= 1.5 * 1.02 for p in summary["pairs"]), summary["pairs"]
    assert summary["protocol"]["adapter"] == ADAPTER and summary["arms"]["a"]["enforce_eager"] is None
    assert summary["arms"]["b"]["acceptance_rate"] == pytest.approx(4 / 6)  # 2 rounds x 3 drafts, 4 accepted
    manifest = json.loads((path / bundles.MANIFEST_FILE).read_text())
    assert manifest["device"]["sut"] == {"adapter": "ClockedSUT", "speedup": 1.5, "device": "cpu"}
    assert manifest["device"]["engines"]["b"]["graphs"].startswith("not counted")
    assert "adapter tests.fixtures.clocked_sut:ClockedSUT: fake float32 on cpu" in (path / "report.md").read_text()
    assert _invoke(["verify", str(path)]).exit_code == 0


def test_a_speculation_slower_than_claimed_fails(tmp_path, clocked):
    # planted speed-up 1.1 against the claim "at least 1.3x": every pair ratio is below 1.13
    result, path = _bench(tmp_path, adapter_dict(sut={"adapter": ADAPTER, "options": {"speedup": 1.1}}))
    summary = _summary(path)
    assert result.exit_code == 1 and summary["verdict"] == FAIL and "refuted" in summary["reason"], result.output
    assert summary["ratio"]["high"] < 1.3


def test_time_per_token_is_the_reciprocal_of_throughput(tmp_path, clocked):
    result, path = _bench(tmp_path, adapter_dict(statistic="time_per_token"))
    summary = _summary(path)
    assert result.exit_code == 0 and summary["verdict"] == PASS, result.output
    assert all(1 / (1.5 * 1.02) <= p["ratio"] <= 1.02 / 1.5 for p in summary["pairs"])
    # the planted 1 ms per token of plain decoding, jittered by at most 2%
    assert 1e-3 <= summary["arms"]["a"]["median"] <= 1.02e-3


@pytest.mark.parametrize(
    "changes, words",
    [
        (
            {"b": {"name": "spec", "mode": "async"}},
            "b.mode: adapter 'tests.fixtures.clocked_sut:ClockedSUT' does not support 'async'",
        ),
        ({"sut": {"adapter": "tests.fixtures.clocked_sut:TemperatureOnlySUT"}}, "sampling.top_k: adapter"),
        ({"sut": {"adapter": ADAPTER, "options": {"sped": 2}}}, "sut.options: unknown key(s) ['sped']"),
        ({"sut": {"adapter": "tests.fixtures.no_such_module:X"}}, "cannot import"),
    ],
)
def test_what_the_adapter_refuses_exits_2_before_any_bundle(tmp_path, clocked, changes, words):
    result, path = _bench(tmp_path, adapter_dict(**changes))
    assert result.exit_code == 2 and words in result.output, result.output
    assert path is None and clocked.CALLS == []


@pytest.mark.parametrize(
    "options, words",
    [
        ({"raise_at_call": 5}, "planted failure"),  # the first call of the first timed run (warm-up: 4 calls)
        ({"short_by": 1}, "broke the contract of SUT.sample"),
    ],
)
def test_an_adapter_that_raises_or_breaks_the_contract_exits_3_unsealed(tmp_path, clocked, options, words):
    result, path = _bench(tmp_path, adapter_dict(sut={"adapter": ADAPTER, "options": options}))
    assert result.exit_code == 3 and words in result.output, result.output
    assert not (path / bundles.SUMS_FILE).exists() and (path / bundles.ERROR_LOG).exists()
