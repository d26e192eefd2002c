"""The sequence kind over several ranks (specval.distribution.sharding with
`specval.sequence.collect.sample_batch`): 2 processes started by torch's launcher with the gloo
backend on the CPU, and the serving rank's loop on a scripted channel.

ChainSUT draws every request from its own `numpy.random.default_rng(seed)`, so a batch's tokens do
not depend on which process samples it: the bundles' batch files equal a one-process run's
byte for byte (their records in chunks.json, hashes included), not statistically.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval.bundle.chain import read_chunk_records
from specval.cli import main
from specval.distribution import sharding
from specval.seeds import SeedRange
from specval.sequence import collect, runner
from specval.sequence.protocol import parse_sequence_protocol
from tests.fixtures import rank_chain_sut
from tests.fixtures.chain_sut import ChainSUT
from tests.fixtures.sequence_protocol import sequence_protocol_dict, write_sequence_protocol
from tests.fixtures.sharded_runs import bundle_of

torch_distributed = pytest.importorskip("torch.distributed")
if not (torch_distributed.is_available() and torch_distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

REPO = Path(__file__).resolve().parents[3]
RANKS = 2
LAUNCH_TIMEOUT_S = 300  # a hang (a rank waiting for a collective) fails the test instead of blocking CI
EXIT_SUT, EXIT_INTERRUPTED = 3, 130
# torch's launcher itself (a second or three less than `specval run --devices`, which imports specval
# to launch it); `--devices` where the test reads the run's exit code (torchrun's own is 1 for any
# failed rank, `sharding.exit_code` maps it).
TORCHRUN = ("-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", "-m", "specval")
BATCH_FILE = re.compile(rf"{collect.SAMPLES_DIR}/\w+-(b\d+|{collect.RERUN})\.parquet")
BATCH_FILES = 10
# Two groups (one with companions: `sample_mixed`), two prompts: 4 batches of 4 sequences and a
# re-run per group, 10 batch files, 5 rounds of 2 with 2 ranks.
SMALL = {
    "groups": [
        {"name": "sync", "mode": "sync"},
        {"name": "mixed", "mode": "sync", "companions": [{"temperature": 0}, {"temperature": 0.5}]},
    ],
    "tests": [{"kind": "pit", "role": "primary"}, {"kind": "reproducibility", "role": "control"}],
    "sequences_per_group": 16,
    "batch_size": 4,
    "sequence_length": 16,
    "profiles": {},
    "sut": {"adapter": rank_chain_sut.ADAPTER},
}
# With two looks, each collected by its own `Collect`: look 1 holds 4 of 8 batches a group (2 per
# prompt) and the re-runs, 10 batch files in 5 rounds; look 2 the other 8 in 4 rounds.
LOOKED = {**SMALL, "sequences_per_group": 32, "sequential": {"looks": [0.5, 1.0]}}
# Rank 1's calls: 2 in its probe (one per group), then one per batch it samples: its 3rd batch is
# round 2 of look 1, so rounds 0 and 1 (4 batch files) are written when it dies.
KILL_AT_CALL = 5
WRITTEN_BEFORE_KILL = 4
GROUP_SEEDS = 16  # the scripted tests' seed range of each group
PROMPT_IDS = ([1, 2], [3])  # every prompt's ids, as rank 0 sends them


def _launch(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    child_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=child_env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )


def _run_sharded(where: Path, protocol: Path, devices: bool, **env: str) -> subprocess.CompletedProcess:
    """A run of RANKS processes: `specval run --devices` (`devices`), else torchrun itself."""
    argv = ["run", str(protocol), "--exploratory", "--quiet", "--output", str(where / "results")]
    if devices:
        return _launch(where, "-m", "specval.cli", *argv, "--devices", str(RANKS), **env)
    return _launch(where, *TORCHRUN, *argv, **env)


def _run_here(where: Path, *argv: str) -> Path:
    """A run in this process; AssertionError with the output unless it PASSes."""
    result = CliRunner().invoke(main, ["run", *argv, "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return bundle_of(result.output)


def _one_process(where: Path, protocol: Path) -> Path:
    return _run_here(where, str(protocol), "--exploratory", "--output", str(where / "one"))


def _batch_records(bundle: Path) -> list[tuple[str, str]]:
    """The bundle's chunk files (batch files, reference parts) in the order they were written, with
    their SHA-256 (chunks.json)."""
    return [(r["file"], r["sha256"]) for r in read_chunk_records(bundle)]


def _batch_files(bundle: Path) -> int:
    """How many batch files (re-runs included; reference parts not) the bundle's records list."""
    return sum(BATCH_FILE.fullmatch(file) is not None for file, _ in _batch_records(bundle))


# ---------------------------------------------------------------- 2 processes, gloo


def test_two_ranks_collect_the_batches_of_one_process_and_the_bundle_verifies(tmp_path):
    protocol = write_sequence_protocol(tmp_path, **SMALL)
    launched = _run_sharded(tmp_path, protocol, devices=False)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    bundle = tmp_path / bundle_of(launched.stdout)
    alone = _one_process(tmp_path, protocol)
    records = _batch_records(bundle)
    assert _batch_files(bundle) == BATCH_FILES
    assert records == _batch_records(alone)  # the batch files and the reference parts, byte for byte
    assert runner.verify(bundle) == []
    manifest = bundles.read_json(bundle / bundles.MANIFEST_FILE)
    assert manifest["ranks"] == RANKS and "ranks" not in bundles.read_json(alone / bundles.MANIFEST_FILE)
    summary, summary_alone = (bundles.read_json(b / bundles.SUMMARY_FILE) for b in (bundle, alone))
    assert summary["tests"] == summary_alone["tests"]  # rank 0 replays and decides as one process does


def test_a_killed_rank_ends_the_run_as_interrupted_and_one_rank_resumes_it_equal(tmp_path):
    protocol = write_sequence_protocol(tmp_path, **LOOKED)
    killed = _run_sharded(
        tmp_path, protocol, devices=True, FAULT_ON_RANK="1", FAULT_AT_CALL=str(KILL_AT_CALL), FAULT_KIND="kill"
    )
    output = killed.stdout + killed.stderr
    assert killed.returncode == EXIT_INTERRUPTED, output
    assert "Traceback" not in killed.stdout
    bundle = tmp_path / bundle_of(killed.stdout)
    assert not (bundle / bundles.SUMS_FILE).exists()
    assert _batch_files(bundle) == WRITTEN_BEFORE_KILL, output

    _run_here(tmp_path, "--resume", str(bundle))  # one rank: the same adapter, no fault outside rank 1
    assert _batch_records(bundle) == _batch_records(_one_process(tmp_path, protocol))
    assert runner.verify(bundle) == []


# ---------------------------------------------------------------- the serving rank, scripted


class _Channel:
    """Stands in for the collectives of one rank: `broadcast` returns rank 0's scripted values,
    `gather` records what this rank sends."""

    def __init__(self, script):
        self.script, self.sent = list(script), []

    def broadcast(self, value=None):
        return self.script.pop(0)

    def gather(self, value, group):
        self.sent.append(value)


def _serve(monkeypatch, script) -> tuple[int, list]:
    channel = _Channel(script)
    monkeypatch.setattr(sharding, "_broadcast", channel.broadcast)
    monkeypatch.setattr(sharding, "_gather", channel.gather)
    monkeypatch.setattr(sharding, "sut_identity", lambda adapter: {"fixed": adapter})
    return sharding.serve(sharding.ShardGroup(1, RANKS, 1)), channel.sent


def _commands(**raw):
    """The small protocol (as rank 0 parsed it), its batches, and rank 0's Open and Collect of them."""
    protocol = parse_sequence_protocol(sequence_protocol_dict(**{**SMALL, **raw}), "proto.yaml")
    ranges = [
        SeedRange(protocol.name, "r", g.name, i * GROUP_SEEDS, (i + 1) * GROUP_SEEDS)
        for i, g in enumerate(protocol.groups)
    ]
    batches = tuple(collect.plan_batches(protocol, ranges))
    opening = sharding.Open(
        protocol, {"fixed": protocol.sut.adapter}, functools.partial(runner.probe, protocol_file=Path("proto.yaml"))
    )
    return protocol, batches, opening, sharding.Collect(protocol, PROMPT_IDS, batches, collect.sample_batch)


def test_a_serving_rank_probes_and_samples_its_share_of_the_batches(monkeypatch):
    protocol, batches, opening, collecting = _commands()
    rounds = (len(batches) + RANKS - 1) // RANKS
    code, sent = _serve(monkeypatch, [opening, collecting, *[True] * rounds, sharding.Dismiss(4)])
    assert code == 4 and sent[0] is None  # built and probed; exits with rank 0's code
    mine = batches[1::RANKS]  # rank 1 of 2: batch i with i mod 2 == 1
    assert [batch for batch, _ in sent[1:]] == list(mine)
    reference = ChainSUT(protocol.sut, protocol.num_speculative_tokens)
    for batch, table in sent[1:]:
        pd.testing.assert_frame_equal(table, collect.sample_batch(reference, protocol, list(PROMPT_IDS), batch))


def test_a_serving_rank_that_raises_sends_its_failure_naming_the_rank_and_the_batch(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("FAULT_ON_RANK", "1")
    monkeypatch.setenv("FAULT_AT_CALL", "3")  # its first batch, after the probe's 2 calls
    _, batches, opening, collecting = _commands()
    code, sent = _serve(monkeypatch, [opening, collecting, False, sharding.Dismiss(EXIT_SUT)])
    assert code == EXIT_SUT and len(sent) == 2
    raised = sent[1].raised()
    assert "on rank 1" in raised.call and "planted failure" in raised.message
