"""A run over two hosts (specval.distribution.sharding), played on one host: two torchrun launches
with `--nnodes 2 --nproc-per-node 1 --node-rank 0/1`, each in its own working directory, the
protocol file present only in node 0's. Node 1 reads no file of the run: it gets the protocol and
the chunks from rank 0 and writes nothing.

Two rendezvous, as a user may launch them:
- c10d (the PASS and the refusal): torchrun ignores --node-rank there and numbers the hosts by
  their address (then by process id), so each node names its own loopback address
  (`--local-addr`, 127.0.0.1 and 127.0.0.2) and node 0 hosts the rendezvous store (`is_host`, as
  the host of the endpoint does on two machines): node 0 is rank 0 however the processes start.
- static (the host that vanishes): --node-rank is the host's rank, and node 0 hosts the store.

The fake SUT draws every request from its own `numpy.random.default_rng(seed)`, so its samples of
a seed do not depend on which process draws them: equality with one process is exact, not
statistical. The launches start 2 launchers and 3 Python workers each (rank 0 is supervised);
`-m "not nodes"` leaves them out.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval.cli import main
from specval.distribution import collect, runner
from specval.identity import SHORT_DIGEST, harness_identity, tree_digest
from tests.fixtures.sharded_runs import FAKE_ADAPTER, bundle_of, samples, small_protocol

torch_distributed = pytest.importorskip("torch.distributed")
if not (torch_distributed.is_available() and torch_distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

pytestmark = pytest.mark.nodes

REPO = Path(__file__).resolve().parents[3]
LOOPBACK = ("127.0.0.1", "127.0.0.2")  # node r's address: c10d gives rank 0 to the lowest
C10D, STATIC = "c10d", "static"  # torchrun's --rdzv-backend
LAUNCH_TIMEOUT_S = 300  # a hang (a rank waiting for a collective) fails the test instead of blocking CI
STALL_AT_CALL = 4  # rank 1's probe makes 2 sample calls, round 0 the 3rd: round 0 is written, round 1 stalls
POLL_S = 0.1
STOP_GRACE_S = 30
EXIT_INPUT, EXIT_INTERRUPTED = 2, 130
RANK_LOGS = ("stdout.log", "stderr.log")  # torchrun's files of a rank's output (--redirects 3)
LAUNCHER_LOG = "launcher.log"


@dataclass(frozen=True)
class Node:
    """One torchrun launch: its working directory, its process (the launcher, a session leader) and
    the folder of its rank's output (torchrun's --log-dir, outside the working directory)."""

    where: Path
    process: subprocess.Popen
    logs: Path

    def finish(self) -> tuple[int, str]:
        """The launcher's exit status and what its rank printed (stdout, then stderr)."""
        self.process.wait(timeout=LAUNCH_TIMEOUT_S)
        return self.process.returncode, self.rank_output()

    def rank_output(self) -> str:
        return "".join(log.read_text() for name in RANK_LOGS for log in sorted(self.logs.rglob(name)))

    def launcher_output(self) -> str:
        return (self.logs / LAUNCHER_LOG).read_text()

    def vanish(self, worker_pid: int) -> None:
        """Kill this host's processes at once: the launcher's session and its rank's worker (which
        torchrun starts in a session of its own)."""
        os.killpg(self.process.pid, signal.SIGKILL)
        os.kill(worker_pid, signal.SIGKILL)
        self.process.wait(timeout=LAUNCH_TIMEOUT_S)

    def stop(self) -> None:
        """After the test, whatever it left running: SIGTERM to the launcher (which passes it to its
        rank), SIGKILL if it is still there STOP_GRACE_S later."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK[0], 0))
        return probe.getsockname()[1]


def _rendezvous(backend: str, rank: int, port: int) -> list[str]:
    """torchrun's rendezvous options of node `rank` of 2 (module docstring)."""
    options = ["--node-rank", str(rank), "--rdzv-backend", backend, "--rdzv-endpoint", f"{LOOPBACK[0]}:{port}"]
    if backend == C10D:
        options += ["--local-addr", LOOPBACK[rank], "--rdzv-conf", f"is_host={int(rank == 0)}"]
    return options


def _start(rank: int, where: Path, rendezvous: list[str], argv: list[str], pythonpath: list[Path], **env: str) -> Node:
    """torchrun on node `rank` of 2 in the directory `where`, running `specval ARGV`."""
    where.mkdir(parents=True, exist_ok=True)
    logs = where.parent / f"logs{rank}"
    logs.mkdir()
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", *rendezvous),
        *("--log-dir", str(logs), "--redirects", "3", "-m", "specval", *argv),
    ]
    child_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, pythonpath)),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    with open(logs / LAUNCHER_LOG, "w") as log:
        process = subprocess.Popen(
            command, cwd=where, env=child_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Node(where, process, logs)


@pytest.fixture
def started():
    """The nodes a test starts (`_two_nodes`), stopped after it whatever it left running."""
    nodes: list[Node] = []
    yield nodes
    for node in nodes:
        node.stop()


def _two_nodes(
    started: list[Node],
    tmp_path: Path,
    adapter: str,
    backend: str = C10D,
    node1_path: list[Path] | None = None,
    **env: str,
) -> tuple[Node, Node]:
    """Both nodes of a run of the small protocol of `adapter`, written in node 0's directory only
    (added to `started`)."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    small_protocol(node0, adapter)
    argv, port = ["run", "protocol.yaml", "--quiet", "--output", "results"], _free_port()
    started.append(_start(0, node0, _rendezvous(backend, 0, port), argv, [REPO], **env))
    started.append(_start(1, node1, _rendezvous(backend, 1, port), argv, node1_path or [REPO], **env))
    return started[0], started[1]


def test_two_nodes_pass_with_the_protocol_on_node_0_only_and_equal_one_process(tmp_path, started, one_process):
    node0, node1 = _two_nodes(started, tmp_path, FAKE_ADAPTER)
    (code0, out0), (code1, out1) = node0.finish(), node1.finish()
    assert (code0, code1) == (0, 0), out0 + out1
    assert "PASS: " in out0 and out1 == ""
    bundle = node0.where / bundle_of(out0)
    pd.testing.assert_frame_equal(samples(bundle), one_process)
    assert runner.verify(bundle) == []
    assert bundles.read_json(bundle / bundles.MANIFEST_FILE)["ranks"] == 2
    assert list(node1.where.iterdir()) == []  # node 1 read no file of the run and wrote none


def _edited_copy(where: Path) -> Path:
    """A copy of this checkout's specval package under `where` with one file edited: the code a
    host with another build of specval imports. Returns the copy's package directory."""
    package = where / "specval"
    shutil.copytree(REPO / "specval", package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(package / "identity.py", "a") as edited:
        edited.write("# a build of specval that differs from rank 0's by this line\n")
    return package


def test_a_node_with_another_specval_is_refused_with_2_naming_the_rank(tmp_path, started):
    copy = _edited_copy(tmp_path / "other_build")
    node0, node1 = _two_nodes(started, tmp_path, FAKE_ADAPTER, node1_path=[copy.parent, REPO])
    (code0, out0), (code1, out1) = node0.finish(), node1.finish()
    version = harness_identity().version
    leader, other = harness_identity().digest[:SHORT_DIGEST], tree_digest(copy)[0][:SHORT_DIGEST]
    line = f"rank 1: specval {version} (digest {other}) differs from rank 0's specval {version} (digest {leader})"
    assert out0 == f"error: {line}; no seed was claimed\n" and out1 == f"error: {line}\n", out0 + out1
    # torchrun exits 1 whenever a rank fails; its report gives the rank's own status
    assert (code0, code1) == (1, 1)
    assert f"exitcode  : {EXIT_INPUT}" in node0.launcher_output() + node1.launcher_output()
    assert sorted(p.name for p in node0.where.iterdir()) == ["frozen.lock", "protocol.yaml"]  # nothing claimed


def test_a_node_that_vanishes_leaves_a_bundle_on_node_0_that_one_process_finishes(tmp_path, started, one_process):
    marker = tmp_path / "stalled.pid"
    stall = {"STALL_ON_RANK": "1", "STALL_AT_CALL": str(STALL_AT_CALL), "STALL_MARKER": str(marker)}
    node0, node1 = _two_nodes(started, tmp_path, "tests.fixtures.stalling_sut:StallingSUT", STATIC, **stall)
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not marker.is_file() or not marker.read_text():
        assert time.monotonic() < deadline and node0.process.poll() is None, "rank 1 never reached round 1"
        time.sleep(POLL_S)
    node1.vanish(int(marker.read_text()))
    _, out0 = node0.finish()
    assert "interrupted; the bundle" in out0 and "resume with" in out0, out0  # rank 0's line
    assert f"exitcode  : {EXIT_INTERRUPTED}" in node0.launcher_output()  # rank 0's status, in torchrun's report
    bundle = node0.where / bundle_of(out0)
    assert not (bundle / bundles.SUMS_FILE).exists()
    assert len(list((bundle / collect.SAMPLES_DIR).glob("*.parquet"))) == 2  # round 0, by both ranks

    resumed = CliRunner().invoke(main, ["run", "--resume", str(bundle), "--quiet"], catch_exceptions=False)
    assert resumed.exit_code == 0, resumed.output
    pd.testing.assert_frame_equal(samples(bundle), one_process)
    assert runner.verify(bundle) == []
    sessions = bundles.read_json(bundle / bundles.MANIFEST_FILE)["sessions"]
    assert [s["outcome"] for s in sessions] == ["interrupted", "PASS"]
