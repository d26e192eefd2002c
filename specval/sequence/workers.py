"""Workers: the threads the sequence kind computes on beside its main thread.

The float64 reference parts of a chunk (`specval.sequence.reference`) and the p-valued criteria of
a family (`specval.sequence.verdict.evaluate`) are pure numpy on arrays of their own, and numpy
releases the GIL in the array operations they spend their time in, so threads run them side by
side. Guarantee: every result is the one the same computation gives on one thread; results come
back in the order the jobs were given; the adapter is only ever called from the caller's thread.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TypeVar

WORKERS_MAX = 8  # threads at most: the parts' memory grows with the chunks in flight
QUEUED_PER_WORKER = 2  # jobs waiting per worker: bounds the replayed logits held at once
# Python's GIL switch interval while a run computes beside its adapter (Python's default: 5 ms). The
# adapter's thread needs the GIL for a moment between device rounds; at 5 ms it waited behind the
# workers' numpy code, round after round. seq_cuda --profile full on one H100
# (`python -m benchmarks.sequence_phases ... --switch-interval`): collection 26.1 s at 5 ms, 8.8 s
# at 0.2 ms; the whole run 87.9 -> 56.3 s.
HANDOFF_INTERVAL_S = 2e-4

T = TypeVar("T")


def count(cpus: int | None = None) -> int:
    """Threads to use: one per usable core (default: this process's), at most WORKERS_MAX."""
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    return max(1, min(WORKERS_MAX, cpus))


class _Pool:
    """`workers` daemon threads running submitted jobs, each into its own Future."""

    def __init__(self, workers: int) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._count = workers
        for number in range(workers):
            threading.Thread(target=self._serve, name=f"specval-sequence-{number}", daemon=True).start()

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            future, job = task
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                future.set_result(job())
            except BaseException as error:  # handed to the caller's thread, which raises it
                future.set_exception(error)

    def submit(self, job: Callable[[], T]) -> Future:
        future: Future = Future()
        self._tasks.put((future, job))
        return future

    def close(self) -> None:
        """Every thread ends after the jobs queued before this call (none is waited for)."""
        for _ in range(self._count):
            self._tasks.put(None)


@contextlib.contextmanager
def prompt_handoff(interval: float = HANDOFF_INTERVAL_S):
    """For the block, a thread waiting for the GIL waits at most `interval` seconds for the holder
    (`sys.setswitchinterval`; never raised above what it was). Results are unchanged: the interval
    only moves the points where threads take turns. The previous interval is restored on exit."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, interval))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def pipelined(jobs: Iterable[Callable[[], T]], workers: int) -> list[T]:
    """The results of `jobs` in order, each job run on a pool of `workers` threads as soon as the
    iterable yields it, so that what produces the next job (a replay, on the caller's thread)
    overlaps the jobs before it. At most `workers` x QUEUED_PER_WORKER jobs wait at once. An error in
    a job, or one raised on the caller's thread (KeyboardInterrupt included), is raised here at once:
    the jobs still queued are cancelled, the running ones abandoned, the iterable not advanced."""
    out: list[T] = []
    pool, pending = _Pool(workers), deque()
    try:
        for job in jobs:
            pending.append(pool.submit(job))
            while len(pending) > workers * QUEUED_PER_WORKER:
                out.append(pending.popleft().result())
        out.extend(future.result() for future in pending)
    except BaseException:
        for future in pending:
            future.cancel()
        raise
    finally:
        pool.close()
    return out
