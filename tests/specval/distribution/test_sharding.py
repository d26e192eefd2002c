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
from specval import identity
from specval.cli import main
from specval.distribution import collect, runner, sharding
from specval.identity import SHORT_DIGEST, brief_record, harness_identity
from specval.protocol import load_protocol
from specval.seeds import SeedRange
from tests.fixtures.sharded_runs import bundle_of, samples, small_protocol

torch_distributed = pytest.importorskip("torch.distributed")
if not (torch_distributed.is_available() and torch_distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RANKS = 2
LAUNCH_TIMEOUT_S = 300  # a hang (a rank waiting for a collective) fails the test instead of blocking CI


def _launch(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=child_env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )


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


# ---------------------------------------------------------------- one process, no launch


def test_environment_without_torchrun_is_one_process():
    assert sharding.from_environment({}) is None
    assert sharding.from_environment({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert sharding.from_environment({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}) == sharding.ShardGroup(
        1, 2, 1
    )


def test_place_moves_a_cuda_protocol_to_its_rank_and_keeps_the_hash(tmp_path):
    protocol = load_protocol(small_protocol(tmp_path))
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
    protocol = small_protocol(tmp_path)
    launched = []
    monkeypatch.setattr(sharding, "launch", lambda devices, argv: launched.append((devices, argv)) or 3)
    result = CliRunner().invoke(main, ["run", str(protocol), "--devices", "2", "--quiet", "--output", "out"])
    assert result.exit_code == 3  # the launch's (rank 0's) exit code
    assert launched == [(2, ["run", str(protocol), "--output", "out", "--quiet"])]


@dataclasses.dataclass
class _Group:
    """What a rank did with its group, the collectives scripted (`_Channel`): joined, dismissed with."""

    channel: _Channel
    joined: list = dataclasses.field(default_factory=list)
    dismissed: list = dataclasses.field(default_factory=list)


def _in_group(monkeypatch, rank: int, channel: _Channel) -> _Group:
    """This process as rank `rank` of 2 under torchrun, its group scripted: `join` records, the
    collectives go through `channel`, `dismiss` records its code, `serve` runs on the channel."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    group = _Group(channel)
    monkeypatch.setattr(sharding, "join", group.joined.append)
    monkeypatch.setattr(sharding, "dismiss", group.dismissed.append)
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)
    return group


def test_devices_inside_torchrun_is_a_usage_error_that_dismisses_every_rank(tmp_path, monkeypatch):
    group = _in_group(monkeypatch, 0, _Channel(gathered=[[None, None]]))  # the greeting: the same specval
    result = CliRunner().invoke(main, ["run", str(small_protocol(tmp_path)), "--devices", "2"])
    assert result.exit_code == 2 and "--devices launches torchrun" in result.output
    assert group.joined == [sharding.ShardGroup(0, 2, 0)] and group.dismissed == [2]


@pytest.mark.parametrize("shipped", ["quality_arith.yaml", "performance/perf_async_vs_serial_graphs_c1.yaml"])
def test_other_protocol_kinds_are_refused_by_rank_0_after_joining(monkeypatch, shipped):
    group = _in_group(monkeypatch, 0, _Channel(gathered=[[None, None]]))
    result = CliRunner().invoke(main, ["run", str(REPO / "protocols" / shipped), "--quiet"])
    assert result.exit_code == 2 and "multi-process runs take distribution and sequence protocols only" in result.output
    assert group.dismissed == [2]  # the other ranks joined first: rank 0 tells them its exit code


# ---------------------------------------------------------------- 2 processes, gloo


def test_a_rank_that_raises_ends_every_rank_with_3_and_two_ranks_resume(tmp_path, one_process):
    protocol = small_protocol(tmp_path, adapter="tests.fixtures.fault_suts:RankRaisingSUT")
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
    bundle = tmp_path / bundle_of(failed.stdout)
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
    pd.testing.assert_frame_equal(samples(bundle), one_process)
    assert runner.verify(bundle) == []
    manifest = bundles.read_json(bundle / bundles.MANIFEST_FILE)
    assert manifest["ranks"] == RANKS and [s["outcome"] for s in manifest["sessions"]] == ["error", "PASS"]


# ---------------------------------------------------------------- the rounds, on a scripted channel


def _fake_protocol(tmp_path):
    return load_protocol(small_protocol(tmp_path))


# The adapter's identity as every rank of these scripted tests computes it: fixed, since the fake
# SUT's covers the whole tests/ tree, which may change between two readings while files are edited.
ADAPTER_IDENTITY = identity.SutIdentity("tests", None, "a" * 64).to_dict()


@pytest.fixture
def fixed_identity(monkeypatch):
    monkeypatch.setattr(sharding, "sut_identity", lambda adapter: ADAPTER_IDENTITY)


def _opening(protocol, leaders=None):
    """Rank 0's `Open` of `protocol`: its adapter's identity is ADAPTER_IDENTITY, else `leaders`."""
    return sharding.Open(protocol, leaders or ADAPTER_IDENTITY)


def test_a_serving_rank_probes_collects_its_share_and_exits_with_rank_0s_code(tmp_path, monkeypatch, fixed_identity):
    protocol = _fake_protocol(tmp_path)
    chunks = tuple(collect.plan_chunks([SeedRange(protocol.name, "r", "nospec", 0, 300)], protocol.chunk_size))
    stage2 = (collect.Chunk("nospec", 900, 1000), collect.Chunk("nospec", 1000, 1100))  # as stage 2 sends
    channel = _Channel(
        [
            _opening(protocol),
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


def test_a_serving_rank_whose_adapter_cannot_be_built_sends_its_failure(tmp_path, monkeypatch, fixed_identity):
    protocol = _fake_protocol(tmp_path)
    channel = _Channel([_opening(protocol), sharding.Dismiss(3)])
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


# ---------------------------------------------------------------- the same code on every rank, no file read twice


def _other(record: dict) -> dict:
    """`record` with another digest: the same name and version built from other files."""
    return {**record, "digest": "f" * 64}


def test_rank_0_sends_its_specval_and_refuses_the_lowest_rank_that_differs(monkeypatch):
    channel = _Channel(gathered=[[None, None, "rank 2: specval differs", "rank 3: specval differs"]])
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)
    with pytest.raises(sharding.RankRefused, match="^rank 2: specval differs$"):
        sharding.greet(sharding.ShardGroup(0, 4, 0))
    assert channel.broadcast_values == [harness_identity().to_dict()]  # plain strings: any specval reads them


def test_a_rank_answers_whether_its_specval_differs_from_rank_0s(monkeypatch):
    mine = harness_identity().to_dict()
    for leaders, expected in (
        (mine, None),
        (
            _other(mine),
            f"rank 1: specval {mine['version']} (digest {mine['digest'][:SHORT_DIGEST]}) differs from rank 0's "
            f"specval {mine['version']} (digest {'f' * SHORT_DIGEST})",
        ),
    ):
        channel = _Channel([leaders])
        monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
        monkeypatch.setattr(sharding, "_gather", channel.gather)
        assert sharding.greet(sharding.ShardGroup(1, 2, 1)) == expected
        assert channel.sent == [expected]


def test_a_rank_whose_adapter_differs_refuses_without_building_it(tmp_path, monkeypatch, fixed_identity):
    protocol = _fake_protocol(tmp_path)
    leaders = _other(ADAPTER_IDENTITY)
    channel = _Channel([_opening(protocol, leaders), sharding.Dismiss(2)])
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)
    built = []
    assert sharding.serve(sharding.ShardGroup(1, 2, 1), lambda spec, k: built.append(spec)) == 2
    (refusal,) = channel.sent
    assert built == [] and isinstance(refusal, sharding.Refusal) and refusal.rank == 1
    assert refusal.line.startswith(f"rank 1: adapter {protocol.sut.adapter}: ")
    assert refusal.line.endswith(f"differs from rank 0's {brief_record(leaders)}")


def test_rank_0_raises_a_refusal_before_any_failure(tmp_path, monkeypatch, fixed_identity):
    protocol = _fake_protocol(tmp_path)
    failure = sharding.Failure(1, "sample", "RuntimeError: planted", "Traceback ...")
    channel = _Channel(gathered=[[None, failure, sharding.Refusal(2, "rank 2: adapter differs")]])
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)
    with pytest.raises(sharding.RankRefused, match="^rank 2: adapter differs$"):
        sharding.open_ranks(sharding.ShardGroup(0, 3, 0), protocol)
    (opening,) = channel.broadcast_values
    assert opening.identity == ADAPTER_IDENTITY  # rank 0's adapter, as `sut_identity` gives it


def test_a_rank_whose_host_lacks_the_protocols_gpu_refuses():
    import torch

    missing = torch.cuda.device_count()  # one past the last GPU of this host (0 without CUDA)
    with pytest.raises(sharding.RankRefused, match=f"^rank 1: the protocol runs on cuda and this host has {missing}"):
        sharding.use_device("cuda", sharding.ShardGroup(1, 2, missing))
    sharding.use_device("cpu", sharding.ShardGroup(1, 2, missing))  # the CPU needs nothing


@pytest.mark.parametrize(
    "args",
    [
        ["run", "absent.yaml", "--output", "absent", "--sign", "absent.pem", "--junit", "absent.xml"],
        ["run", "--resume", "absent_bundle"],
    ],
)
def test_a_serving_rank_reads_no_file_of_the_run(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    group = _in_group(monkeypatch, 1, _Channel([harness_identity().to_dict(), sharding.Dismiss(4)]))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 4, result.output  # rank 0's code, though no file named exists here
    assert group.joined == [sharding.ShardGroup(1, 2, 1)] and list(tmp_path.iterdir()) == []


def test_rank_0_refuses_a_rank_that_differs_with_2_before_reading_anything(tmp_path, monkeypatch):
    line = "rank 1: specval 0.1.0 (digest ffffffffffff) differs from rank 0's specval 0.1.0 (digest 000000000000)"
    group = _in_group(monkeypatch, 0, _Channel(gathered=[[None, line]]))
    output = tmp_path / "results"
    result = CliRunner().invoke(main, ["run", str(small_protocol(tmp_path)), "--quiet", "--output", str(output)])
    assert result.exit_code == 2 and result.output == f"error: {line}; no seed was claimed\n"
    assert group.dismissed == [2] and not output.exists()


@pytest.mark.parametrize(
    "args, missing",
    [
        (["--resume", "absent_bundle"], "absent_bundle"),  # click's check, put off until every rank has joined
        (["absent.yaml", "--output", "out"], "absent.yaml"),  # rank 0 on a host without the protocol
    ],
)
def test_rank_0_reads_its_files_once_joined_and_dismisses_every_rank_if_one_is_missing(
    tmp_path, monkeypatch, args, missing
):
    monkeypatch.chdir(tmp_path)
    group = _in_group(monkeypatch, 0, _Channel(gathered=[[None, None]]))
    result = CliRunner().invoke(main, ["run", *args])
    assert result.exit_code == 2 and missing in result.output, result.output
    assert group.joined == [sharding.ShardGroup(0, 2, 0)] and group.dismissed == [2]
    assert list(tmp_path.iterdir()) == []
