"""Workers: the threads the sequence kind computes on beside its main thread.

The float64 reference parts of a chunk (`specval.sequence.reference`) and the p-valued criteria of
a family (`specval.sequence.verdict.evaluate`) are pure numpy on arrays of their own, and numpy
releases the GIL in the array operations they spend their time in, so threads run them side by
side. Guarantee: every result is the one the same computation gives on one thread; results come
back in the order the jobs were given; the adapter is only ever called from the caller's thread.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

WORKERS_MAX = 8  # threads at most: the parts' memory grows with the chunks in flight
QUEUED_PER_WORKER = 2  # jobs waiting per worker: bounds the replayed logits held at once

T = TypeVar("T")


def count(cpus: int | None = None) -> int:
    """Threads to use: one per usable core (default: this process's), at most WORKERS_MAX."""
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    return max(1, min(WORKERS_MAX, cpus))


def pipelined(jobs: Iterable[Callable[[], T]], workers: int) -> list[T]:
    """The results of `jobs` in order, each job run on a pool of `workers` threads as soon as the
    iterable yields it, so that what produces the next job (a replay, on the caller's thread)
    overlaps the jobs before it. At most `workers` x QUEUED_PER_WORKER jobs wait at once. An error
    in a job is raised here, after the jobs still queued are cancelled; the iterable is not
    advanced further."""
    out: list[T] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="specval-sequence") as pool:
        pending: deque[Future] = deque()
        try:
            for job in jobs:
                pending.append(pool.submit(job))
                while len(pending) > workers * QUEUED_PER_WORKER:
                    out.append(pending.popleft().result())
            out.extend(future.result() for future in pending)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return out
