"""Multi-rank runs (specval.distribution.sharding): 2 processes started by torch's launcher with the gloo backend
on the CPU. An exception in one rank ends every rank with exit 3 and a resumable bundle; 2 ranks
resume it, and its sample table then equals a one-process run of the same seed ranges (every chunk
of it was collected by one of the 2 ranks of either launch, so this is also the equality test of a
multi-rank run: one launch fewer keeps the test fast).

The fake SUT draws every request from its own `numpy.random.default_rng(seed)`, so its samples of
a seed do not depend on which process draws them: equality is exact, not statistical.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval.cli import main
from specval.distribution import collect, runner, sharding
from specval.protocol import load_protocol
from specval.seeds import SeedRange
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

torch_distributed = pytest.importorskip("torch.distributed")
if not (torch_distributed.is_available() and torch_distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
# 2 groups x 4 chunks of 100 seeds, one batch per chunk: 4 rounds of 2 chunks with 2 ranks. One
# criterion only: the analysis is not under test here, the sample tables are.
SMALL = {
    "samples_per_group": 400,
    "chunk_size": 100,
    "batch_size": 100,
    "tests": [{"kind": "gof", "position": 2, "role": "primary"}],
}
RANKS = 2
LAUNCH_TIMEOUT_S = 300  # a hang (a rank waiting for a collective) fails the test instead of blocking CI


def _protocol(directory: Path, adapter: str = "tests.fixtures.fake_sut:FakeSUT") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return write_protocol(directory, fake_protocol_dict(sut={"adapter": adapter}, **SMALL))


def _bundle_of(output: str) -> Path:
    line = next(line for line in output.splitlines() if line.startswith("bundle: "))
    return Path(line.removeprefix("bundle: ").split(" (resume with")[0])


def _samples(bundle: Path) -> pd.DataFrame:
    _, ranges = runner.load_bundle_protocol(bundle)
    return collect.load_samples(bundle, ranges)


def _launch(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=child_env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> pd.DataFrame:
    """The sample table of a one-process run of the protocol on a fresh output root (seeds 0..800)."""
    where = tmp_path_factory.mktemp("one")
    protocol = _protocol(where)
    result = CliRunner().invoke(
        main, ["run", str(protocol), "--quiet", "--output", str(where / "results")], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return _samples(_bundle_of(result.output))


# ---------------------------------------------------------------- one process, no launch


def test_environment_without_torchrun_is_one_process():
    assert sharding.from_environment({}) is None
    assert sharding.from_environment({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert sharding.from_environment({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}) == sharding.ShardGroup(
        1, 2, 1
    )


def test_place_moves_a_cuda_protocol_to_its_rank_and_keeps_the_hash(tmp_path):
    protocol = load_protocol(_protocol(tmp_path))
    cuda = dataclasses.replace(protocol, sut=dataclasses.replace(protocol.sut, device="cuda"))
    placed = sharding.place(cuda, sharding.ShardGroup(1, 2, 1))
    assert placed.sut.device == "cuda:1" and placed.hash == cuda.hash
    assert sharding.place(protocol, sharding.ShardGroup(1, 2, 1)) is protocol  # the CPU stays the CPU


@pytest.mark.parametrize(
    "codes, expected",
    [
        ({0: 3, 1: -15}, 3),  # rank 0 exited 3, the other rank was ended by the launcher
        ({0: -15, 1: 1}, 1),  # rank 0 ended by the launcher as it exited; the other rank exited with its code
        ({1: 2}, 2),
        ({0: -2, 1: -15}, 130),  # every rank killed by a signal
    ],
)
def test_exit_code_of_the_launch_is_rank_0s(codes, expected):
    assert sharding.exit_code(codes) == expected


def _failed_launch(codes: dict[int, int]):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {rank: ProcessFailure(rank, 1000 + rank, code, "") for rank, code in codes.items()}
    raise ChildFailedError("specval", failures)


def _interrupted_launch():
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException("got signal: 2", sigval=signal.SIGINT)


@pytest.mark.parametrize(
    "outcome, expected",
    [
        (lambda: None, 0),
        (lambda: _failed_launch({0: 3, 1: -15}), 3),
        (_interrupted_launch, 130),
    ],
)
def test_launch_runs_torchrun_and_returns_rank_0s_exit_code(monkeypatch, outcome, expected):
    from torch.distributed import run as torchrun

    seen = []
    monkeypatch.setattr(torchrun, "run", lambda args: seen.append(args) or outcome())
    assert sharding.launch(2, ["run", "p.yaml", "--quiet"]) == expected
    (args,) = seen
    assert args.standalone and args.nproc_per_node == "2" and args.module
    assert [args.training_script, *args.training_script_args] == ["specval", "run", "p.yaml", "--quiet"]


def test_devices_launches_torchrun_with_the_same_arguments(tmp_path, monkeypatch):
    protocol = _protocol(tmp_path)
    launched = []
    monkeypatch.setattr(sharding, "launch", lambda devices, argv: launched.append((devices, argv)) or 3)
    result = CliRunner().invoke(main, ["run", str(protocol), "--devices", "2", "--quiet", "--output", "out"])
    assert result.exit_code == 3  # the launch's (rank 0's) exit code
    assert launched == [(2, ["run", str(protocol), "--output", "out", "--quiet"])]


def test_devices_inside_torchrun_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    result = CliRunner().invoke(main, ["run", str(_protocol(tmp_path)), "--devices", "2"])
    assert result.exit_code == 2 and "--devices launches torchrun" in result.output


@pytest.mark.parametrize("shipped", ["quality_arith.yaml", "performance/perf_async_vs_serial_graphs_c1.yaml"])
def test_other_protocol_kinds_are_refused_across_processes(monkeypatch, shipped):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    result = CliRunner().invoke(main, ["run", str(REPO / "protocols" / shipped), "--quiet"])
    assert result.exit_code == 2 and "multi-process runs take distribution protocols only" in result.output


# ---------------------------------------------------------------- 2 processes, gloo


def test_a_rank_that_raises_ends_every_rank_with_3_and_two_ranks_resume(tmp_path, one_process):
    protocol = _protocol(tmp_path, adapter="tests.fixtures.fault_suts:RankRaisingSUT")
    # rank 1's probe makes one sample call per group (2), its chunk of round 0 the 3rd; it raises at
    # the 4th: round 0 (chunks 0 and 1) is written, round 1 fails
    failed = _launch(
        tmp_path,
        "-m",
        "specval.cli",
        "run",
        str(protocol),
        "--quiet",
        "--devices",
        str(RANKS),
        FAULT_RAISE_ON_RANK="1",
        FAULT_RAISE_AT_CALL="4",
    )
    output = failed.stdout + failed.stderr
    assert failed.returncode == 3, output
    assert "Traceback" not in output and "in sample on rank 1" in output
    bundle = tmp_path / _bundle_of(failed.stdout)
    assert not (bundle / bundles.SUMS_FILE).exists() and (bundle / bundles.ERROR_LOG).is_file()
    assert "planted failure" in (bundle / bundles.ERROR_LOG).read_text()
    assert len(list((bundle / collect.SAMPLES_DIR).glob("*.parquet"))) == RANKS

    resumed = _launch(
        tmp_path,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={RANKS}",
        "-m",
        "specval",
        "run",
        "--resume",
        str(bundle),
        "--quiet",
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    pd.testing.assert_frame_equal(_samples(bundle), one_process)
    assert runner.verify(bundle) == []
    manifest = bundles.read_json(bundle / bundles.MANIFEST_FILE)
    assert manifest["ranks"] == RANKS and [s["outcome"] for s in manifest["sessions"]] == ["error", "PASS"]


# ---------------------------------------------------------------- the rounds, on a scripted channel


class _Channel:
    """Stands in for the collectives of one rank: `broadcast` returns rank 0's scripted values (or
    records what rank 0 sends), `gather` records what this rank sends and returns `gathered`."""

    def __init__(self, script=(), gathered=None):
        self.script, self.gathered, self.sent, self.broadcast_values = list(script), gathered, [], []

    def broadcast(self, value=None):
        self.broadcast_values.append(value)
        return self.script.pop(0) if self.script else value

    def gather(self, value, group):
        self.sent.append(value)
        return self.gathered.pop(0) if self.gathered else None


def _fake_protocol(tmp_path):
    return load_protocol(_protocol(tmp_path))


def test_a_serving_rank_probes_collects_its_share_and_exits_with_rank_0s_code(tmp_path, monkeypatch):
    protocol = _fake_protocol(tmp_path)
    chunks = tuple(collect.plan_chunks([SeedRange(protocol.name, "r", "nospec", 0, 300)], protocol.chunk_size))
    stage2 = (collect.Chunk("nospec", 900, 1000), collect.Chunk("nospec", 1000, 1100))  # as stage 2 sends
    channel = _Channel(
        [
            sharding.Open(protocol),
            sharding.Collect(protocol, (1, 2), chunks),
            True,
            True,
            sharding.Collect(protocol, (1, 2), stage2),
            True,
            sharding.Dismiss(1),
        ]
    )
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)
    assert sharding.serve(sharding.ShardGroup(1, 2, 1)) == 1
    opened, first, second, third = channel.sent
    assert opened is None  # built and probed
    assert first[0] == chunks[1] and second is None  # rank 1 of 2: chunk 1 of round 0, nothing in round 1
    assert first[1]["seed"].tolist() == list(range(chunks[1].start, chunks[1].stop))
    assert third[0] == stage2[1]  # the same adapter serves the second Collect


def test_a_serving_rank_whose_adapter_cannot_be_built_sends_its_failure(tmp_path, monkeypatch):
    protocol = _fake_protocol(tmp_path)
    channel = _Channel([sharding.Open(protocol), sharding.Dismiss(3)])
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)

    def broken(spec, k):
        raise OSError("no such device")

    assert sharding.serve(sharding.ShardGroup(1, 2, 1), broken) == 3
    (failure,) = channel.sent
    assert isinstance(failure, sharding.Failure) and "no such device" in failure.message and failure.rank == 1


def test_rank_0_stops_every_rank_and_raises_the_failure_of_another_rank(tmp_path, monkeypatch):
    from specval.preflight import GuardedSUT, SUTRaised
    from tests.fixtures.fake_sut import FakeSUT

    protocol = _fake_protocol(tmp_path)
    chunks = collect.plan_chunks([SeedRange(protocol.name, "r", "nospec", 0, 800)], protocol.chunk_size)
    failure = sharding.Failure(1, "sample", "RuntimeError: planted", "Traceback ...")
    channel = _Channel(gathered=[["mine", failure]])
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)
    kept = []
    sample = sharding.sampler(sharding.ShardGroup(0, 2, 0))
    with pytest.raises(SUTRaised, match="sample on rank 1: RuntimeError: planted"):
        sample(
            GuardedSUT(FakeSUT(protocol.sut, protocol.num_speculative_tokens)),
            protocol,
            [1, 2],
            chunks,
            lambda chunk, frame: kept.append(chunk),
        )
    assert kept == []  # nothing of the failed round is written
    assert channel.broadcast_values[-1] is False  # every rank was told to stop
    assert channel.sent[0][0] == chunks[0]  # rank 0 collected its own chunk of the round


def test_a_failed_write_stops_every_rank_at_the_next_round(tmp_path, monkeypatch):
    from specval.preflight import GuardedSUT
    from tests.fixtures.fake_sut import FakeSUT

    protocol = _fake_protocol(tmp_path)
    chunks = collect.plan_chunks([SeedRange(protocol.name, "r", "nospec", 0, 800)], protocol.chunk_size)
    channel = _Channel(gathered=[[("c0", "f0"), ("c1", "f1")], [("c2", "f2"), ("c3", "f3")]])
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)

    def full_disk(chunk, frame):
        raise OSError("no space left on device")

    sample = sharding.sampler(sharding.ShardGroup(0, 2, 0))
    with pytest.raises(OSError, match="no space left"):
        sample(GuardedSUT(FakeSUT(protocol.sut, protocol.num_speculative_tokens)), protocol, [1, 2], chunks, full_disk)
    # round 0 went on (its chunks are written while round 1 runs); round 1 told every rank to stop
    assert channel.broadcast_values[1:] == [True, False]
