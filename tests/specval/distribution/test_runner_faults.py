"""Fault suite of `specval run`: every error is told apart from a verdict by its exit code, is
refused before any seed is claimed where it can be checked, prints one line (no traceback), and
leaves a bundle that resumes where one was started.

Exit codes: 0 PASS, 1 FAIL, 2 input or usage error, 3 the system under test raised, 130 interrupted.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specval import seeds
from specval.cli import main
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SMALL = {"samples_per_group": 400, "chunk_size": 100, "batch_size": 100}


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return CliRunner()


def _run(cli, *args):
    return cli.invoke(main, list(args), catch_exceptions=False)


def _protocol(tmp_path, adapter="tests.fixtures.fake_sut:FakeSUT", name="protocol.yaml", **overrides):
    raw = fake_protocol_dict(**{"sut": {"adapter": adapter}, **SMALL, **overrides})
    return write_protocol(tmp_path, raw, name)


def _nothing_claimed(output: Path) -> bool:
    return not output.exists() or (not seeds.read_ledger(output) and not list(output.glob("fake_t2-*")))


def _rows(listing: str) -> list[list[str]]:
    """The rows of `specval ls` as their words (state, sealed or not, path): its column widths may change."""
    return [line.split() for line in listing.splitlines()]


def _bundle_of(output: str) -> Path:
    line = next(line for line in output.splitlines() if line.startswith("bundle: "))
    return Path(line.removeprefix("bundle: ").split(" (resume with")[0])


# ---------------------------------------------------------------- input errors: exit 2, nothing claimed


def test_output_under_a_file_is_refused_before_any_seed(cli, tmp_path):
    (tmp_path / "plain_file").write_text("x")
    result = _run(cli, "run", str(_protocol(tmp_path)), "--quiet", "--output", "plain_file/results")
    assert (
        result.exit_code == 2 and "--output plain_file/results" in result.output and "not a directory" in result.output
    )
    assert "Traceback" not in result.output


@pytest.mark.parametrize("junit", ["plain_file/j.xml", "."])
def test_unwritable_junit_is_refused_before_any_seed(cli, tmp_path, junit):
    (tmp_path / "plain_file").write_text("x")
    result = _run(cli, "run", str(_protocol(tmp_path)), "--quiet", "--junit", junit)
    assert result.exit_code == 2 and "--junit" in result.output
    assert _nothing_claimed(tmp_path / "results")


def test_junit_into_folders_that_do_not_exist_yet_creates_them(cli, tmp_path):
    result = _run(cli, "run", str(_protocol(tmp_path)), "--quiet", "--junit", "results/new/j.xml")
    assert result.exit_code == 0, result.output
    assert "<testsuite" in (tmp_path / "results" / "new" / "j.xml").read_text()


def test_zero_samples_is_refused_before_any_seed(cli, tmp_path):
    result = _run(cli, "run", str(_protocol(tmp_path, samples_per_group=0)), "--quiet")
    assert result.exit_code == 2 and "samples_per_group: must be >= 1" in result.output
    assert _nothing_claimed(tmp_path / "results")


@pytest.mark.parametrize(
    "overrides,words",
    [
        ({"alpha": 1e-300}, "alpha: must lie in [1e-06, 0.2]"),
        ({"sampling": {"temperature": 1e-300, "top_k": 8}}, "sampling.temperature: must be >= 1e-05"),
        ({"min_expected": 1e308}, "min_expected: 2 cells of this expected count need more samples"),
    ],
)
def test_a_protocol_that_can_test_nothing_is_refused_before_any_seed(cli, tmp_path, overrides, words):
    result = _run(cli, "run", str(_protocol(tmp_path, **overrides)), "--quiet", "--exploratory")
    assert result.exit_code == 2 and words in result.output and len(result.output.strip().splitlines()) == 1
    assert _nothing_claimed(tmp_path / "results")


def test_infinite_number_is_refused(cli, tmp_path):
    file = _protocol(tmp_path)
    file.write_text(file.read_text() + "alpha: .inf\n")
    result = _run(cli, "run", str(file), "--quiet", "--exploratory")
    assert result.exit_code == 2 and "alpha: expected a finite number" in result.output


def test_duplicate_key_is_refused_naming_both_lines(cli, tmp_path):
    file = _protocol(tmp_path)
    file.write_text(file.read_text() + "stratum_min: 100\n")  # stratum_min is already in the file
    lines = [i + 1 for i, line in enumerate(file.read_text().splitlines()) if line.startswith("stratum_min:")]
    result = _run(cli, "run", str(file), "--quiet", "--exploratory")
    assert result.exit_code == 2 and f"lines {lines[0]} and {lines[1]}" in result.output
    assert _nothing_claimed(tmp_path / "results")


def test_unimportable_adapter_is_an_input_error(cli, tmp_path):
    result = _run(cli, "run", str(_protocol(tmp_path, adapter="no_such_module:Nothing")), "--quiet")
    assert result.exit_code == 2 and "cannot import 'no_such_module:Nothing'" in result.output


def test_missing_capability_names_it_and_the_protocol_line(cli, tmp_path):
    file = _protocol(tmp_path, adapter="tests.fixtures.fault_suts:NoQuadratureSUT")
    line = next(i + 1 for i, text in enumerate(file.read_text().splitlines()) if "kind: quadrature" in text)
    result = _run(cli, "run", str(file), "--quiet")
    assert result.exit_code == 2 and "accept_single" in result.output and f"{file}:{line}" in result.output
    assert _nothing_claimed(tmp_path / "results")
    result = _run(
        cli, "run", str(_protocol(tmp_path, adapter="tests.fixtures.fault_suts:NoTopPSUT", name="p2.yaml")), "--quiet"
    )
    assert result.exit_code == 2 and "sampling='top_p'" in result.output


def test_a_mutant_the_adapter_does_not_declare_is_refused(cli, tmp_path):
    file = _protocol(
        tmp_path, sut={"adapter": "tests.fixtures.fake_sut:FakeSUT", "options": {"mutant": "residual_from_p"}}
    )
    line = next(i + 1 for i, text in enumerate(file.read_text().splitlines()) if "mutant:" in text)
    result = _run(cli, "run", str(file), "--quiet")
    assert result.exit_code == 2 and "mutants='residual_from_p'" in result.output and f"{file}:{line}" in result.output
    assert _nothing_claimed(tmp_path / "results")


def test_a_protocol_without_quadrature_runs_on_an_adapter_without_accept_single(cli, tmp_path):
    tests = [t for t in fake_protocol_dict()["tests"] if t["kind"] != "quadrature"]
    file = _protocol(tmp_path, adapter="tests.fixtures.fault_suts:NoQuadratureSUT", tests=tests)
    result = _run(cli, "run", str(file), "--quiet")
    assert result.exit_code == 0 and "PASS" in result.output


@pytest.mark.parametrize(
    "flags",
    [["--profile", "ci"], ["--seed-offset", "5"], ["--output", "elsewhere"], ["--exploratory"], ["--confirmatory"]],
)
def test_resume_with_conflicting_flags_is_refused(cli, tmp_path, flags):
    bundle = tmp_path / "results" / "b"
    bundle.mkdir(parents=True)
    result = _run(cli, "run", "--resume", str(bundle), *flags)
    assert result.exit_code == 2 and flags[0] in result.output and "--resume" in result.output


# ---------------------------------------------------------------- the system under test raised: exit 3


@pytest.mark.parametrize(
    "adapter,words",
    [
        ("tests.fixtures.fault_suts:WrongShapeSUT", "shape"),
        ("tests.fixtures.fault_suts:FloatTokensSUT", "dtype float64"),
        ("tests.fixtures.fault_suts:BrokenConstructorSUT", "the model file cannot be opened"),
    ],
)
def test_broken_adapter_fails_the_probe_with_exit_3_before_any_seed(cli, tmp_path, adapter, words):
    result = _run(cli, "run", str(_protocol(tmp_path, adapter=adapter)), "--quiet")
    assert result.exit_code == 3 and words in result.output and "no seed was claimed" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not seeds.read_ledger(tmp_path / "results") and not list((tmp_path / "results").glob("fake_t2-*"))
    log = next((tmp_path / "results").glob("probe-error-*.log"))
    assert "Traceback" in log.read_text() or "shape" in log.read_text() or "dtype" in log.read_text()


def test_adapter_raising_mid_run_exits_3_keeps_an_error_bundle_that_resumes(cli, tmp_path, monkeypatch):
    file = _protocol(tmp_path, adapter="tests.fixtures.fault_suts:RaisingSUT")
    monkeypatch.setenv("FAULT_RAISE_AT_CALL", "5")  # 2 probe calls, then the 3rd chunk of collection
    result = _run(cli, "run", str(file), "--quiet")
    assert result.exit_code == 3 and "planted failure inside the adapter" in result.output
    assert "Traceback" not in result.output
    bundle = _bundle_of(result.output)
    assert "resume with: specval run --resume" in result.output
    assert "RuntimeError: planted failure" in (bundle / "error.log").read_text()
    assert len(list((bundle / "samples").glob("*.parquet"))) == 2
    listing = _run(cli, "ls")
    assert listing.exit_code == 0 and ["ERROR", "unsealed", str(bundle)] in _rows(listing.output)
    monkeypatch.delenv("FAULT_RAISE_AT_CALL")
    resumed = _run(cli, "run", "--resume", str(bundle), "--quiet")
    assert resumed.exit_code == 0 and "PASS" in resumed.output
    assert _run(cli, "verify", str(bundle)).exit_code == 0


def test_corrupt_summary_does_not_break_ls(cli, tmp_path):
    assert _run(cli, "run", str(_protocol(tmp_path)), "--quiet").exit_code == 0
    bundle = next((tmp_path / "results").glob("fake_t2-*"))
    (bundle / "summary.json").write_text("{ not json")
    result = _run(cli, "ls")
    assert result.exit_code == 0 and ["CORRUPT", "sealed", f"results/{bundle.name}"] in _rows(result.output)


# ---------------------------------------------------------------- interrupts: exit 130, resumable


def _child_env(**extra) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]), **extra}
    env.pop("FAULT_RAISE_AT_CALL", None)
    return env


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_exits_130_with_the_resume_command_and_the_bundle_resumes(cli, tmp_path, signum):
    file = _protocol(tmp_path, adapter="tests.fixtures.fault_suts:SlowSUT")
    # The child gets SIGINT's default disposition back: a test runner started in the background by a
    # non-interactive shell ignores SIGINT, an ignored SIGINT is inherited, and Python then installs
    # no KeyboardInterrupt handler (the run would finish instead of stopping).
    child = subprocess.Popen(
        [sys.executable, "-m", "specval.cli", "run", str(file), "--quiet"],
        cwd=tmp_path,
        env=_child_env(FAULT_SLEEP_S="0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    first = child.stdout.readline()  # the bundle is announced before any sample is drawn
    assert first.startswith("bundle: "), first + child.stderr.read()
    bundle = tmp_path / _bundle_of(first)
    deadline = time.monotonic() + 120
    while not list((bundle / "samples").glob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signum)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, out + err
    assert f"resume with: specval run --resume {_bundle_of(first)}" in err and "Traceback" not in err + out
    assert not (bundle / "SHA256SUMS").exists() and not list((bundle / "samples").glob(".*"))
    resumed = _run(cli, "run", "--resume", str(bundle), "--quiet")
    assert resumed.exit_code == 0 and "PASS" in resumed.output
    assert _run(cli, "verify", str(bundle)).exit_code == 0


# ---------------------------------------------------------------- concurrent claims


def _claim(output: str, index: int, barrier) -> None:
    def name_run() -> str:
        time.sleep(0.2)  # widen the window between reading the ledger and writing it
        return f"run{index}"

    barrier.wait()
    seeds.claim_next(output, "p", ["a", "b"], 100, 0, None, name_run)


def test_concurrent_claims_on_one_output_get_disjoint_ranges(tmp_path):
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    workers = [context.Process(target=_claim, args=(str(tmp_path), i, barrier)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    ranges = seeds.read_ledger(tmp_path)
    assert sorted({r.run for r in ranges}) == [f"run{i}" for i in range(4)] and len(ranges) == 8
    spans = sorted((r.start, r.stop) for r in ranges)
    assert all(a_stop <= b_start for (_, a_stop), (b_start, _) in zip(spans, spans[1:]))


def test_probe_seeds_are_outside_every_range(tmp_path):
    with pytest.raises(seeds.SeedOverlapError, match="reserved for the adapter probe"):
        seeds.claim_next(tmp_path, "p", ["a"], 100, seeds.PROBE_SEED_START - 50, None, lambda: "r")
    assert seeds.read_ledger(tmp_path) == []


def test_the_probe_tells_the_adapter_the_batch_size_before_its_first_sample(tmp_path):
    """`plan_batches` comes first, with the protocol's batch_size, so an adapter can size its
    batches (the probe's included) and compile ahead for them."""
    from specval.preflight import GuardedSUT, probe
    from specval.protocol import load_protocol
    from tests.fixtures.fake_sut import FakeSUT

    calls = []

    class Recording(FakeSUT):
        def plan_batches(self, largest):
            calls.append(("plan_batches", largest))

        def sample(self, *args, **kwargs):
            calls.append(("sample", len(args[3])))
            return super().sample(*args, **kwargs)

    protocol = load_protocol(_protocol(tmp_path, batch_size=150))
    probe(GuardedSUT(Recording(protocol.sut, protocol.num_speculative_tokens)), protocol)
    assert calls[0] == ("plan_batches", 150)
    assert calls[1:] == [("sample", 2)] * len(protocol.groups)


def test_a_batch_with_an_unknown_token_source_is_refused_naming_it():
    from specval.sut import SOURCES, SampleBatch, SUTError

    tokens = np.zeros((3, 2), dtype=np.int64)
    counts = np.zeros(3, dtype=np.int64)
    sources = np.full((3, 2), SOURCES[0], dtype=object)
    SampleBatch(tokens, sources, counts, counts, counts).validate(3, 2)
    sources[2, 1], sources[0, 0] = "drafted", None  # not a source; not even a string
    with pytest.raises(SUTError, match=r"unknown token sources \['drafted', None\]"):
        SampleBatch(tokens, sources, counts, counts, counts).validate(3, 2)
