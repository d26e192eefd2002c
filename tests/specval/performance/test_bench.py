"""Performance protocols and `specval bench`: strict loading, the ABBA schedule, the verdict rule and its
error rates, and a tiny CPU bench end to end (bench -> verify -> tamper -> verify fails) with exit codes."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from scipy import stats

from specval import bundle as bundles
from specval.performance import bench as benching
from specval.performance.protocol import load_performance_protocol, parse_performance_protocol
from specval.performance.summary import COLUMNS, FAIL, INCONCLUSIVE, PASS, schedule, seed_start, summarise, verdict
from specval.protocol import ProtocolError, registration
from specval.stats.median import MedianInterval, median_interval
from tests.fixtures.forge import reseal
from tests.fixtures.perf_protocols import invoke as _bench
from tests.fixtures.perf_protocols import protocol_dict, write

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "protocols" / "performance"
REGISTRATION = {"state": "frozen", "exploratory": False}


# ---------------------------------------------------------------- protocol


ENGINE_SHIPPED = [
    "perf_async_vs_serial_graphs_c1",
    "perf_async_vs_serial_graphs_c4",
    "perf_async_vs_serial_graphs_c64",
    "perf_graphs_vs_eager_async_c4",
    "perf_random_vs_greedy_async",
    "perf_spec_vs_nospec_eager_c4",
]
ADAPTER_SHIPPED = ["perf_transformers_assisted_vs_plain"]
# the one factor an engine protocol's arms differ in -> what its name must say
FACTOR_WORDS = {
    "rounds_in_flight": "async_vs_serial",
    "graphs": "graphs_vs_eager",
    "sampling": "random_vs_greedy",
    "speculation": "spec_vs_nospec",
}


def test_shipped_protocols_load_frozen():
    files = sorted(SHIPPED.glob("*.yaml"))
    assert [f.stem for f in files] == sorted(ENGINE_SHIPPED + ADAPTER_SHIPPED)
    for file in files:
        protocol = load_performance_protocol(file)
        assert registration(protocol, file) == "frozen"
        assert protocol.on_engine == (file.stem in ENGINE_SHIPPED)
    for name in ENGINE_SHIPPED:
        protocol = load_performance_protocol(SHIPPED / f"{name}.yaml")
        assert protocol.device == "cuda" and protocol.warmup_rounds >= 1 and protocol.pairs >= 30
    greedy = load_performance_protocol(SHIPPED / "perf_random_vs_greedy_async.yaml")
    assert greedy.arm_sampling("a").temperature == 0.0 and greedy.arm_sampling("b").temperature == 1.0
    ci = benching.resolve(greedy, "ci")
    assert ci.device == "cpu" and ci.pairs >= 6 and ci.max_tokens <= 4 and ci.hash == greedy.hash


def _factors(protocol, key: str) -> dict:
    """What an engine arm runs, each factor once: speculation (nospec or not, with its mode and
    draft depth), overlapped rounds, CUDA Graphs (async only: sync and nospec always run eager), sampling."""
    arm = protocol.arm(key)
    speculative = arm.mode != "nospec"
    return {
        "speculation": (arm.mode, arm.draft_loops if speculative else None),
        "rounds_in_flight": arm.rounds_in_flight if arm.mode == "async" else None,
        "graphs": arm.mode == "async" and not arm.enforce_eager,
        "sampling": protocol.arm_sampling(key),
    }


@pytest.mark.parametrize("name", ENGINE_SHIPPED)
def test_each_shipped_engine_protocol_varies_one_factor_and_its_name_says_which(name):
    protocol = load_performance_protocol(SHIPPED / f"{name}.yaml")
    a, b = _factors(protocol, "a"), _factors(protocol, "b")
    differing = [factor for factor in a if a[factor] != b[factor]]
    assert len(differing) == 1, (name, differing)
    assert FACTOR_WORDS[differing[0]] in name, (name, differing)


def test_the_transformers_protocol_has_a_small_cpu_ci_profile():
    protocol = load_performance_protocol(SHIPPED / "perf_transformers_assisted_vs_plain.yaml")
    assert protocol.sut.adapter == "transformers" and protocol.device == "cpu"
    assert (protocol.a.mode, protocol.b.mode) == ("nospec", "sync") and protocol.threshold == pytest.approx(1.3)
    ci = benching.resolve(protocol, "ci")
    assert ci.pairs == 6 and ci.concurrency == 1 and ci.max_tokens <= 16 and ci.hash == protocol.hash


@pytest.mark.parametrize(
    "changes, key, value",
    [
        ({"a": {"name": "sync", "mode": "asynk"}}, "a.mode", "'asynk'"),
        ({"pairs": 5}, "pairs", "5"),
        ({"device": "cuda", "warmup_rounds": 0}, "warmup_rounds", "0"),
        ({"profiles": {"ci": {"pairs": 3}}}, "profiles.ci.pairs", "3"),
        ({"profiles": {"ci": {"pears": 8}}}, "profiles.ci.pears", "'pears'"),
        ({"sut": {"device": "cpu"}}, "sut.device", "'cpu'"),
        ({"a": {"name": "sync", "mode": "sync", "enforce_eager": "no"}}, "a.enforce_eager", "'no'"),
        ({"margin": 0.0}, "margin", "0.0"),
        ({"statistic": "speed"}, "statistic", "'speed'"),
        ({"b": {"name": "sync", "mode": "async"}}, "b.name", "'sync'"),
        ({"a": {"name": "sync", "mode": "sync", "rounds_in_flight": 1}}, "a.rounds_in_flight", "1"),
        ({"b": {"name": "async", "mode": "async", "sampling": {"temperature": -1}}}, "b.sampling.temperature", "-1"),
        ({"prompts": []}, "prompts", "[]"),
        ({"sampling": {"temperature": 1.0, "semantics": {"order": "x"}}}, "sampling.semantics", "{'order': 'x'}"),
    ],
)
def test_bad_input_names_file_line_key_and_value(tmp_path, changes, key, value):
    path = write(tmp_path, protocol_dict(**changes), frozen=False)
    with pytest.raises(ProtocolError) as err:
        load_performance_protocol(path)
    text = str(err.value)
    assert text.startswith(f"{path}: line ") and f": {key}: " in text and f"(got {value})" in text, text
    line = int(text.split("line ")[1].split(":")[0])
    assert path.read_text().splitlines()[line - 1].lstrip().startswith(key.split(".")[-1] + ":")


def test_unknown_key_gets_a_suggestion(tmp_path):
    raw = protocol_dict()
    raw["margn"] = raw.pop("margin")
    with pytest.raises(ProtocolError, match=r"margn: unknown key; did you mean 'margin'"):
        load_performance_protocol(write(tmp_path, raw, frozen=False))


def test_hash_ignores_layout_but_not_values(tmp_path):
    first = load_performance_protocol(write(tmp_path, protocol_dict(), frozen=False))
    assert parse_performance_protocol(yaml.safe_load(yaml.safe_dump(protocol_dict()))).hash == first.hash
    assert parse_performance_protocol(protocol_dict(margin=0.06)).hash != first.hash


@pytest.mark.parametrize(
    "statistic, hypothesis, margin, threshold, higher",
    [
        ("throughput", "noninferiority", 0.05, 0.95, True),
        ("throughput", "superiority", 0.05, 1.05, True),
        ("latency", "noninferiority", 0.05, 1.05, False),
        ("latency", "superiority", 0.0, 1.0, False),
    ],
)
def test_threshold_table(statistic, hypothesis, margin, threshold, higher):
    protocol = parse_performance_protocol(protocol_dict(statistic=statistic, hypothesis=hypothesis, margin=margin))
    assert protocol.threshold == pytest.approx(threshold, abs=1e-15) and protocol.higher_is_better is higher


# ---------------------------------------------------------------- schedule and verdict


def test_schedule_is_abba_after_the_warmup():
    protocol = parse_performance_protocol(protocol_dict(warmup_rounds=2, pairs=6, concurrency=3, seed_base=10))
    runs = schedule(protocol)
    assert "".join(r.arm for r in runs) == "abba" + "abbaabbaabba"
    assert [r.phase for r in runs] == ["warmup"] * 4 + ["pair"] * 12
    assert [seed_start(protocol, r) for r in runs if r.arm == "a"] == [10, 10, 10, 13, 16, 19, 22, 25]


def _interval(low: float, high: float) -> MedianInterval:
    return MedianInterval(
        n=20, median=(low + high) / 2, low=low, high=high, rank=6, confidence=0.95, coverage=0.9586, tail=0.0207
    )


@pytest.mark.parametrize(
    "statistic, hypothesis, low, high, expected",
    [
        ("throughput", "noninferiority", 0.96, 1.20, PASS),
        ("throughput", "noninferiority", 0.80, 0.94, FAIL),
        ("throughput", "noninferiority", 0.90, 1.00, INCONCLUSIVE),
        ("throughput", "noninferiority", 0.95, 1.20, INCONCLUSIVE),  # touching the threshold is not clearing it
        ("throughput", "superiority", 1.02, 1.20, INCONCLUSIVE),  # threshold 1.05
        ("throughput", "superiority", 1.06, 1.20, PASS),
        ("latency", "noninferiority", 0.90, 1.04, PASS),  # threshold 1.05, lower is better
        ("latency", "noninferiority", 1.06, 1.30, FAIL),
        ("latency", "superiority", 0.80, 0.94, PASS),  # threshold 0.95
        ("latency", "superiority", 0.96, 1.10, FAIL),
    ],
)
def test_verdict_rule_on_constructed_intervals(statistic, hypothesis, low, high, expected):
    protocol = parse_performance_protocol(protocol_dict(statistic=statistic, hypothesis=hypothesis, margin=0.05))
    assert verdict(_interval(low, high), protocol)[0] == expected


def test_false_pass_and_false_fail_rates_at_the_threshold():
    # The worst case of both error rates: pair ratios whose true median IS the threshold (0.95),
    # lognormal around it, 20 pairs. PASS (and FAIL) counts are then Binomial(2000, tail) with
    # tail = P(Bin(20, 1/2) <= 5) = 0.0207, the bound the summary reports; the band below holds a
    # correct rule except with probability <= 2e-6. A rule using the median itself instead of the
    # interval would PASS about half the time (~1000 of 2000).
    protocol = parse_performance_protocol(protocol_dict(pairs=20))
    rng = np.random.default_rng(11)
    outcomes = [
        verdict(median_interval(protocol.threshold * rng.lognormal(0, 0.1, 20), 0.95), protocol)[0] for _ in range(2000)
    ]
    tail = stats.binom.cdf(5, 20, 0.5)
    low, high = stats.binom.ppf(5e-7, 2000, tail), stats.binom.isf(5e-7, 2000, tail)
    assert low <= outcomes.count(PASS) <= high and low <= outcomes.count(FAIL) <= high


def _table(protocol, seconds: dict[tuple[str, int], float]) -> pd.DataFrame:
    rows = []
    for index, run in enumerate(schedule(protocol)):
        elapsed = round(seconds.get((run.arm, run.pair), 1.0) * 1e9) if run.phase == "pair" else 5 * 10**9
        rows.append(
            {
                "run": index,
                "phase": run.phase,
                "pair": run.pair,
                "arm": run.arm,
                "seed_start": seed_start(protocol, run),
                "num_requests": protocol.concurrency,
                "num_tokens": protocol.concurrency * protocol.max_tokens,
                "num_rounds": 1,
                "num_draft_tokens": 3,
                "num_accepted_tokens": 2,
                "elapsed_ns": elapsed,
                "graphs_before": 0,
                "graphs_after": 0,
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_summary_arithmetic_on_a_constructed_table():
    protocol = parse_performance_protocol(protocol_dict())
    # arm b takes 0.5 s in every pair, arm a 0.5 s x (1, 1.1, ..., 1.5): throughput ratios 1.0 .. 1.5
    table = _table(protocol, {**{("a", i): 0.5 * (1 + 0.1 * i) for i in range(6)}, **{("b", i): 0.5 for i in range(6)}})
    summary = summarise(protocol, table, REGISTRATION)
    # nanosecond counts are exact integers (< 2^53); each ratio takes four float64 divisions of them,
    # so it is within a few ulps (~1e-15 relative) of the decimal value: 1e-12 leaves a wide margin
    assert [p["ratio"] for p in summary["pairs"]] == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4, 1.5], rel=1e-12)
    assert [p["order"] for p in summary["pairs"]] == ["ab", "ba"] * 3
    ratio = summary["ratio"]
    assert (ratio["low"], ratio["high"], ratio["median"]) == pytest.approx((1.0, 1.5, 1.25), rel=1e-12)
    assert summary["verdict"] == PASS and summary["false_pass_bound"] == pytest.approx(1 / 64)
    assert summary["arms"]["b"]["median"] == pytest.approx(2 / 0.5)  # 2 tokens in 0.5 s; warm-ups excluded
    assert summary["arms"]["a"]["acceptance_rate"] == pytest.approx(2 / 3)


def test_a_timed_graph_capture_voids_the_verdict():
    protocol = parse_performance_protocol(protocol_dict())
    table = _table(protocol, {("a", i): 1.0 for i in range(6)} | {("b", i): 0.5 for i in range(6)})
    assert summarise(protocol, table, REGISTRATION)["verdict"] == PASS
    table.loc[table["run"] == 5, "graphs_after"] = 1
    summary = summarise(protocol, table, REGISTRATION)
    assert summary["verdict"] == INCONCLUSIVE and "captured CUDA Graphs" in summary["reason"]


def test_a_table_off_the_schedule_is_refused():
    protocol = parse_performance_protocol(protocol_dict())
    table = _table(protocol, {})
    swapped = table.copy()
    swapped.loc[[2, 3], "arm"] = ["b", "a"]
    with pytest.raises(bundles.BundleError, match="timings row 2"):
        summarise(protocol, swapped, REGISTRATION)
    with pytest.raises(bundles.BundleError, match="rows"):
        summarise(protocol, table.iloc[:-1], REGISTRATION)


# ---------------------------------------------------------------- end to end on the CPU


@pytest.fixture
def one_thread():
    """One torch thread: on a shared 2-core machine two threads per small matmul oversubscribe."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _bundle(output: Path) -> Path:
    (path,) = [p for p in output.iterdir() if p.is_dir()]
    return path


def _reseal(path: Path) -> None:
    """Re-hash a tampered timings table everywhere a hash of it is kept (chunks.json and its chain
    head in manifest.json, SHA256SUMS)."""
    reseal(path)


def test_bench_verify_tamper_end_to_end(tmp_path, one_thread):
    protocol_file = write(tmp_path, protocol_dict())
    result = _bench(["run", str(protocol_file), "--output", str(tmp_path / "out"), "--quiet"])
    path = _bundle(tmp_path / "out")
    summary = json.loads((path / bundles.SUMMARY_FILE).read_text())
    assert result.exit_code == {PASS: 0, FAIL: 1, INCONCLUSIVE: 4}[summary["verdict"]], result.output
    assert "median ratio" in result.output and result.output.count("  pair ") == 6
    assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()) == sorted(
        [
            "SHA256SUMS",
            "chunks.json",
            "manifest.json",
            "protocol.json",
            "protocol.yaml",
            "report.html",
            "report.md",
            "run.json",
            benching.TIMINGS_FILE,
            "sessions.json",
            "summary.json",
        ]
    )
    table = benching.read_timings(path)
    assert "".join(table["arm"]) == "ab" + "abbaabbaabba" and (table["num_tokens"] == 2).all()
    assert _bench(["verify", str(path)]).exit_code == 0

    pristine = copy.deepcopy(table)
    table.loc[table["run"] == 3, "elapsed_ns"] *= 7  # b of pair 0 seven times slower, every hash re-made
    table.to_csv(path / benching.TIMINGS_FILE, index=False)
    _reseal(path)
    tampered = _bench(["verify", str(path)])
    assert tampered.exit_code == 1 and "summary.json: pairs[0].ratio" in tampered.output, tampered.output

    pristine.to_csv(path / benching.TIMINGS_FILE, index=False)
    _reseal(path)
    assert _bench(["verify", str(path)]).exit_code == 0
    summary["verdict"] = FAIL if summary["verdict"] != FAIL else PASS
    (path / bundles.SUMMARY_FILE).write_text(bundles.json_text(summary))
    edited = _bench(["verify", str(path)])
    assert edited.exit_code == 1 and "summary.json: sha256 differs" in edited.output


@pytest.mark.parametrize("name", ENGINE_SHIPPED)
def test_each_shipped_engine_protocol_runs_on_the_cpu_at_a_tiny_size(tmp_path, one_thread, name):
    # The GPU protocols' arms through the whole bench on the CPU (no CUDA Graphs there, so the
    # timings mean nothing): every arm configuration is one the engine accepts and runs to a
    # verifiable bundle. A copy with tiny sizes, frozen under another name.
    raw = yaml.safe_load((SHIPPED / f"{name}.yaml").read_text())
    raw.update(
        name=f"{name}_cpu",
        device="cpu",
        pairs=6,
        warmup_rounds=1,
        max_tokens=2,
        concurrency=min(raw["concurrency"], 2),
        profiles={},
    )
    result = _bench(["bench", str(write(tmp_path, raw)), "--output", str(tmp_path / "out"), "--quiet"])
    path = _bundle(tmp_path / "out")
    summary = json.loads((path / bundles.SUMMARY_FILE).read_text())
    assert result.exit_code == {PASS: 0, FAIL: 1, INCONCLUSIVE: 4}[summary["verdict"]], result.output
    assert [summary["arms"][key]["mode"] for key in "ab"] == [raw["a"]["mode"], raw["b"]["mode"]]
    assert _bench(["verify", str(path)]).exit_code == 0


def test_run_sign_signs_a_performance_bundle_through_the_same_path(tmp_path, one_thread):
    from specval import signing

    assert _bench(["keygen", str(tmp_path / "key")]).exit_code == 0
    protocol_file = write(tmp_path, protocol_dict())
    result = _bench(
        ["run", str(protocol_file), "--output", str(tmp_path / "out"), "--quiet", "--sign", str(tmp_path / "key")]
    )
    path = _bundle(tmp_path / "out")
    assert f"signed: {path / signing.SIGNATURE_FILE}" in result.output, result.output
    key = signing.load_public_key(tmp_path / "key.pub")
    assert signing.check_signature(path, key).problems == ()
    statement = json.loads(base64.b64decode(json.loads((path / signing.SIGNATURE_FILE).read_text())["payload"]))
    assert statement["predicate"]["code"]["adapter"]["module"] == "specval.adapters.engine"
    assert statement["predicate"]["chunk_heads"] == {"chunks.json": bundles.chain_head(path)}


def test_an_undecided_bench_exits_4(tmp_path, monkeypatch):
    # Planted timings (no engine is built): ratios 1.11 and 0.83 alternate around the threshold
    # 0.95, so the interval [0.83, 1.11] contains it. Deterministic.
    monkeypatch.setattr(benching, "build_engines", lambda protocol: {"a": None, "b": None})
    monkeypatch.setattr(benching, "close_engines", lambda llms: None)
    monkeypatch.setattr(benching, "graph_status", lambda llm: "none (planted timings)")
    monkeypatch.setattr(
        benching,
        "time_schedule",
        lambda protocol, llms, progress: _table(
            protocol, {("b", i): 0.9 if i % 2 else 1.2 for i in range(protocol.pairs)}
        ),
    )
    result = _bench(["bench", str(write(tmp_path, protocol_dict())), "--output", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 4 and "INCONCLUSIVE: the interval [0.8333, 1.1111]" in result.output, result.output


def test_refusals_exit_2_before_any_bundle(tmp_path):
    output = tmp_path / "out"
    unfrozen = write(tmp_path, protocol_dict(name="perf_unfrozen"), frozen=False)
    result = _bench(["bench", str(unfrozen), "--output", str(output)])
    assert result.exit_code == 2 and "not frozen" in result.output
    deep = write(tmp_path, protocol_dict(name="perf_deep", b={"name": "async", "mode": "async", "draft_loops": 9}))
    result = _bench(["bench", str(deep), "--output", str(output)])
    assert result.exit_code == 2 and "draft_loops=9" in result.output
    result = _bench(["run", str(deep), "--seed-offset", "5", "--output", str(output)])
    assert result.exit_code == 2 and "--seed-offset does not apply" in result.output
    result = _bench(["bench", str(REPO / "protocols" / "t2_fp32.yaml"), "--output", str(output)])
    assert result.exit_code == 2 and "not a performance protocol" in result.output
    assert not output.exists()


def _failing_generate(error: BaseException):
    calls = []

    def generate(self, prompts, params=None, *, progress=None):
        calls.append(1)
        if len(calls) == 3:  # the first timed run: the bundle exists by then
            raise error
        return real_generate(self, prompts, params, progress=progress)

    from engine import LLM

    real_generate = LLM.generate
    return generate


@pytest.mark.parametrize(
    "error, code, words",
    [
        (RuntimeError("device lost"), 3, "device lost"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
)
def test_engine_failure_and_interrupt_keep_the_bundle_unsealed(tmp_path, monkeypatch, one_thread, error, code, words):
    from engine import LLM

    monkeypatch.setattr(LLM, "generate", _failing_generate(error))
    result = _bench(["bench", str(write(tmp_path, protocol_dict())), "--output", str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == code and words in result.output and "not resumed" in result.output, result.output
    path = _bundle(tmp_path / "out")
    assert not (path / bundles.SUMS_FILE).exists()
    assert (path / bundles.ERROR_LOG).exists() == (code == 3)
    resumed = _bench(["run", "--resume", str(path)])
    assert resumed.exit_code == 2 and "not resumable" in resumed.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_warmup_captures_every_graph_before_timing(tmp_path):
    # The shipped c4 protocol at a small size on CUDA: the warm-up round must capture every round
    # shape the timed runs replay (no timed run captures one), and both arms must replay graphs.
    raw = yaml.safe_load((SHIPPED / "perf_async_vs_serial_graphs_c4.yaml").read_text())
    raw.update(name="perf_cuda_small", pairs=6, warmup_rounds=1, max_tokens=16, profiles={})
    result = _bench(["bench", str(write(tmp_path, raw)), "--output", str(tmp_path / "out"), "--quiet"])
    path = _bundle(tmp_path / "out")
    summary = json.loads((path / bundles.SUMMARY_FILE).read_text())
    assert result.exit_code == {PASS: 0, FAIL: 1, INCONCLUSIVE: 4}[summary["verdict"]], result.output
    assert summary["timed_runs_capturing_graphs"] == 0
    engines = json.loads((path / bundles.MANIFEST_FILE).read_text())["device"]["engines"]
    assert engines["a"]["graphs"].endswith("captured") and engines["b"]["graphs"].endswith("captured"), engines
    assert _bench(["verify", str(path)]).exit_code == 0
