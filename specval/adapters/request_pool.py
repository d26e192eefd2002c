"""RequestPool: the requests of one `sample` call run by several processes at once.

An engine that runs one request at a time (transformers' assisted generation takes batches of one)
on a CPU where one request does not keep every core busy gains throughput from running requests side
by side, each process with its own copy of the model. A pool of `size` runs a call's requests on
`size` processes: the calling process and `size - 1` spawned workers (fresh interpreters: nothing
of the caller's torch state is inherited).

Guarantees:
- Same results, same order: `map` splits the seeds into `size` contiguous parts
  (`numpy.array_split`: lengths differ by at most one, a part may be empty), runs the first part in
  the caller and part i in worker i, one task per seed, and returns the results in seed order. Every
  result is `generate(seed=seed, **request)`: in the caller with the `generate` it passes, in a
  worker with the one `make()` built there. When both are the same engine and a request is a pure
  function of its seed, the results are those one process would return.
- A worker starts when the pool is built and runs `make()` (e.g. loads its model) at once, so its
  start overlaps whatever the caller does meanwhile; its requests wait until `make()` is done.
- Failures name the worker and the seed: an exception a worker raises, in `make()` or at a seed,
  becomes SUTError naming the worker (number and pid) and the seed, raised from the worker's
  exception, whose own cause holds the worker's formatted traceback (concurrent.futures'
  `_RemoteTraceback`), so `traceback.format_exception` of the SUTError prints it. A worker that
  dies (killed, out of memory, `os._exit`) becomes SUTError naming it and the seed it was running:
  a worker runs its tasks in the order given, so its first seed without a result is that seed.
- No orphans: `close()` cancels each worker's queued tasks, waits for the one it is running (at
  most one request, or `make()`) and joins it. A worker also exits as soon as the process that
  built the pool ends, however it ends (a thread waits on the parent's sentinel), and it ignores
  SIGINT: an interrupt is the caller's to handle.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from specval.sut import SUTError

Generate = Callable[..., Any]  # generate(seed=seed, **request) -> one request's result
ORPHANED_EXIT = 3  # status of a worker that outlived the process that built its pool

_generate: Generate | None = None  # in a worker: what its `make()` built


def _detach() -> None:
    """Each worker's initializer: SIGINT ignored, and an exit as soon as the parent process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, name="exit-with-parent", daemon=True).start()


def _exit_with_parent() -> None:
    multiprocessing.parent_process().join()  # returns once the parent's sentinel closes: it has ended
    os._exit(ORPHANED_EXIT)


def _start(make: Callable[[], Generate]) -> int:
    """A worker's first task: build its `generate`; the worker's pid."""
    global _generate
    _generate = make()
    return os.getpid()


def _run(seed: int, request: dict[str, Any]) -> Any:
    return _generate(seed=seed, **request)


def _failure(who: str, when: str, err: BaseException) -> SUTError:
    """SUTError for `err`, the death of worker `who` or an exception it raised, `when` it happened."""
    if isinstance(err, BrokenProcessPool):
        return SUTError(f"{who} died {when} ({err})")
    return SUTError(f"{who} raised {when}: {type(err).__name__}: {err}")


class RequestPool:
    """The caller and `size - 1` worker processes running one call's requests (module doc)."""

    def __init__(self, size: int, make: Callable[[], Generate], name: str):
        if size < 2:
            raise ValueError(f"size: {size}, expected >= 2 (one process needs no pool)")
        self.size, self.name = size, name
        context = multiprocessing.get_context("spawn")
        # One single-process executor per worker: a task runs on the worker it is given to, in the
        # order given, and a worker's death breaks only its own tasks.
        self._executors = [ProcessPoolExecutor(1, mp_context=context, initializer=_detach) for _ in range(size - 1)]
        self._started = [executor.submit(_start, make) for executor in self._executors]  # spawns each worker now

    def pids(self) -> list[int]:
        """The workers' process ids, once each has run `make()` (SUTError if one failed to)."""
        return [self._pid(worker) for worker in range(1, self.size)]

    def map(self, generate: Generate, seeds: Sequence[int], **request: Any) -> list:
        """`generate(seed=seed, **request)` for every seed, in seed order: the first part of the seeds
        here, part i on worker i (module doc)."""
        parts = np.array_split(np.asarray(seeds, dtype=np.int64), self.size)
        queued: list[list[tuple[int, Future]]] = []
        try:
            for worker, part in enumerate(parts[1:], start=1):
                queued.append(self._submit(worker, part, request))
            results = [generate(seed=int(seed), **request) for seed in parts[0]]
            for worker, tasks in enumerate(queued, start=1):
                results += [self._result(worker, seed, task) for seed, task in tasks]
        except BaseException:
            for tasks in queued:
                for _, task in tasks:
                    task.cancel()
            raise
        return results

    def close(self) -> None:
        """Worker by worker: cancel its queued tasks, let it end the one it is running, join it."""
        for executor in self._executors:
            executor.shutdown(wait=True, cancel_futures=True)

    def _who(self, worker: int) -> str:
        return f"{self.name} worker {worker} of {self.size - 1}"

    def _pid(self, worker: int) -> int:
        started = self._started[worker - 1]
        try:
            return started.result()
        except Exception as err:
            raise _failure(self._who(worker), "while starting", err) from err

    def _submit(self, worker: int, part: np.ndarray, request: dict[str, Any]) -> list[tuple[int, Future]]:
        executor = self._executors[worker - 1]
        try:
            return [(int(seed), executor.submit(_run, int(seed), request)) for seed in part]
        except BrokenProcessPool as err:  # it died in an earlier call, or while starting
            self._pid(worker)
            raise _failure(self._who(worker), "in an earlier call", err) from err

    def _result(self, worker: int, seed: int, task: Future) -> Any:
        pid = self._pid(worker)
        try:
            return task.result()
        except Exception as err:
            raise _failure(f"{self._who(worker)} (pid {pid})", f"at seed {seed}", err) from err
