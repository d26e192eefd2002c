"""RequestPool (specval.adapters.request_pool) with a fake generator: no model, no torch.

Deterministic: every test is about which process ran which seed and what a failure says. The
workers import this module by name (spawn), so the fakes live at its top level. Each pool's workers
cost an interpreter start (~2 s of the 2-core CPU), so one pool of two workers serves the tests that
leave it usable.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from specval.adapters.request_pool import RequestPool
from specval.sut import SUTError

ROOT = Path(__file__).resolve().parents[3]
SEEDS = list(range(10, 17))  # 7 seeds over 3 processes: parts of 3, 2 and 2
EXIT_WAIT_S = 20.0  # a worker whose parent died exits at once; this bounds the wait on a loaded CPU
DEATH_STATUS = 9


def fake_generate(seed: int, fail_at: int | None = None, die_at: int | None = None) -> tuple[int, int]:
    """(seed, pid of the process that ran it); raises at `fail_at`, exits abruptly at `die_at`."""
    if seed == die_at:
        os._exit(DEATH_STATUS)
    if seed == fail_at:
        raise ValueError(f"planted failure at seed {seed}")
    return seed, os.getpid()


def make_fake():
    return fake_generate


def make_nothing():
    raise RuntimeError("planted failure while loading")


@pytest.fixture(scope="module")
def pool():
    pool = RequestPool(3, make_fake, "fake")
    yield pool
    pool.close()


def test_results_come_back_in_seed_order_from_contiguous_parts(pool):
    results = pool.map(fake_generate, SEEDS)
    first, second = pool.pids()
    assert [seed for seed, _ in results] == SEEDS
    assert [pid for _, pid in results] == [os.getpid()] * 3 + [first] * 2 + [second] * 2
    assert len({os.getpid(), first, second}) == 3
    assert pool.map(fake_generate, [5]) == [(5, os.getpid())]  # empty parts for the workers


def test_a_worker_exception_names_the_worker_and_the_seed_and_keeps_its_traceback(pool):
    with pytest.raises(SUTError, match=r"fake worker 2 of 2 \(pid \d+\) raised at seed 16: ValueError: planted") as err:
        pool.map(fake_generate, SEEDS, fail_at=16)
    text = "".join(traceback.format_exception(err.type, err.value, err.tb))
    assert 'raise ValueError(f"planted failure at seed {seed}")' in text  # the worker's own frame
    assert [seed for seed, _ in pool.map(fake_generate, SEEDS)] == SEEDS  # the worker still runs


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads signal dispositions from /proc")
def test_workers_ignore_sigint(pool):
    """A Ctrl-C reaches the whole process group; only the caller may act on it."""
    assert all(_ignored_signals(pid) >> (signal.SIGINT - 1) & 1 for pid in pool.pids())


def test_a_dead_worker_is_named_with_the_seed_it_was_running():
    pool = RequestPool(2, make_fake, "fake")
    try:
        (pid,) = pool.pids()
        with pytest.raises(SUTError, match=rf"fake worker 1 of 1 \(pid {pid}\) died at seed 13 "):
            pool.map(fake_generate, [10, 11, 12, 13], die_at=13)  # seed 12 ran on the worker before it
    finally:
        pool.close()


def test_a_worker_that_cannot_start_is_named():
    pool = RequestPool(2, make_nothing, "fake")
    try:
        with pytest.raises(SUTError, match="fake worker 1 of 1 raised while starting: RuntimeError: planted") as err:
            pool.map(fake_generate, [1, 2])
        assert "make_nothing" in "".join(traceback.format_exception(err.type, err.value, err.tb))
    finally:
        pool.close()


def _ignored_signals(pid: int) -> int:
    """The bit mask of the signals process `pid` ignores (bit n - 1: signal n)."""
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigIgn:"))
    return int(line.split()[1], 16)


def _exited(pid: int) -> bool:
    """Whether process `pid` has ended (gone, or a zombie nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def _wait_exited(pids: list[int]) -> bool:
    deadline = time.monotonic() + EXIT_WAIT_S
    while time.monotonic() < deadline:
        if all(_exited(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_close_ends_the_workers():
    other = RequestPool(2, make_fake, "fake")
    pids = other.pids()
    other.close()
    assert all(_exited(pid) for pid in pids)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_workers_do_not_outlive_a_killed_parent(tmp_path):
    script = (
        "import os, signal\n"
        "from specval.adapters.request_pool import RequestPool\n"
        "pool = RequestPool(2, dict, 'orphan')\n"
        "print(*pool.pids(), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )  # no close, no atexit: only the workers' own watch
    out = tmp_path / "pids.txt"  # a file, not a pipe: a surviving worker would hold a pipe open
    with out.open("w") as stdout:
        status = subprocess.run([sys.executable, "-c", script], cwd=ROOT, stdout=stdout, timeout=120).returncode
    assert status == -signal.SIGKILL
    pids = [int(pid) for pid in out.read_text().split()]
    assert len(pids) == 1 and _wait_exited(pids)
