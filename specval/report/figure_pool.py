"""Figure pool: the report's figures rendered in worker processes, beside the analysis.

A run starts the pool before it collects: each worker is a fresh interpreter (spawn) whose
initializer imports matplotlib and the plotting code, so the imports and the font cache are paid
while the system under test collects. As soon as the stage-1 reference exists, the run submits
the observed-vs-expected figures the protocol predicts (`predicted_criteria`); they render while
the quadrature sweeps and the criteria are computed. Once the summary exists, `figures` takes the
predicted figures whose criterion the summary kept with the same group and position, submits the
rest (the p-values and the token sources need the summary), and returns them in report order.

Guarantees:
- Bytes: every figure is rendered by the same function of the same inputs as `report.figures`
  (the serial path, the reference): the worker reads the same reference.json and gets the same
  group's tokens in row order; a prediction the summary does not confirm is not used.
- Workers never touch CUDA: they import neither torch nor the system under test, and their
  initializer hides every CUDA device (CUDA_VISIBLE_DEVICES="") before anything is imported.
  They ignore SIGINT: an interrupt is the parent's to handle, and the parent shuts them down.
- Shutdown on every exit: `with FigurePool(...)` shuts the workers down on leaving the block;
  leaving it by an exception (an interrupt, the SUT raising) terminates them at once.
- A lost worker (it died, or a figure took longer than FIGURE_TIMEOUT_S) does not hang the run
  and loses nothing: the pool is terminated, one line on stderr says so, and the figures are
  rendered in this process by `report.figures` (the same bytes, later).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pandas as pd

from specval import report
from specval.distribution.criteria import applicable_groups, criterion_name
from specval.protocol import Protocol
from specval.report import plots

SUMMARY_FIGURES = 2  # figures drawn from the summary: p-values across strata, token sources
POOL_MIN_SAMPLES = 100_000  # a smaller run renders serially: its collection is too short to hide the workers' start
FIGURE_TIMEOUT_S = 300.0  # a figure takes about a second; one this late is a lost worker
TERMINATE_JOIN_S = 10.0  # a terminated worker exits at once; this bounds the wait for one that does not
HIDDEN_DEVICES = ""  # CUDA_VISIBLE_DEVICES of a worker: no device

Prediction = tuple[str, str, int]  # (criterion name, group, position) of an observed-vs-expected figure


def predicted_criteria(protocol: Protocol) -> list[Prediction]:
    """The observed-vs-expected figures `report.observed_criteria` selects from a summary of
    `protocol`, predicted before the summary exists (a criterion without strata is predicted too;
    its figure is simply not used)."""
    return [
        (criterion_name(test, group), group, test.position)
        for test in protocol.tests
        if test.kind == "gof" and test.role != "control" and not test.by_path
        for group in applicable_groups(protocol, test)
    ]


def worker_count(protocol: Protocol, cpus: int | None = None) -> int:
    """Workers for a run of `protocol` on `cpus` usable cores (default: this process's): one per
    figure, leaving one core to the run, at most; 0 (serial) on one core or for a run of fewer
    than POOL_MIN_SAMPLES samples."""
    cpus = len(os.sched_getaffinity(0)) if cpus is None else cpus
    if cpus <= 1 or protocol.samples_per_group * len(protocol.groups) < POOL_MIN_SAMPLES:
        return 0
    return min(len(predicted_criteria(protocol)) + SUMMARY_FIGURES, cpus - 1)


def _worker_init() -> None:
    """In each worker, before its first task: no CUDA device, no SIGINT, the plotting code imported."""
    os.environ["CUDA_VISIBLE_DEVICES"] = HIDDEN_DEVICES
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import matplotlib.font_manager  # noqa: F401 - builds or loads the font cache now, not at the first figure

    plots.warm_up()


def _facts() -> dict:
    """What a worker is: its pid, the CUDA devices it sees, whether torch is loaded, its SIGINT handling."""
    return {
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch_loaded": "torch" in sys.modules,
        "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
    }


def _observed(path: str, name: str, tokens: np.ndarray, position: int) -> bytes | None:
    """A worker's observed-vs-expected figure, from the bundle's reference.json as `report.figures` reads it."""
    return plots.observed_figure(name, tokens, position, report.read_reference(Path(path)))


class FigurePool:
    """`workers` spawned processes rendering the report's figures (module doc)."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers: {workers}, expected >= 1 (0 workers: render with report.figures)")
        self._executor = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init
        )
        self._observed: dict[Prediction, Future] = {}
        self._released: list = []  # the worker processes, once `release` let them exit
        self._started = [self._executor.submit(_facts) for _ in range(workers)]  # spawns every worker now
        # The executor's manager thread also joins the workers; a worker is only known to be reaped
        # (its exit code recorded) once that thread is done, and shutdown(wait=False) forgets it.
        self._manager = getattr(self._executor, "_executor_manager_thread", None)

    def __enter__(self) -> FigurePool:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close(abort=kind is not None)

    def worker_facts(self) -> list[dict]:
        """`_facts` of the workers, once each has started (a worker may answer for another that is slow)."""
        return [future.result(timeout=FIGURE_TIMEOUT_S) for future in self._started]

    def close(self, abort: bool = False) -> None:
        """Shut the workers down and join them; `abort`: cancel what is queued and terminate them
        first. A worker still alive TERMINATE_JOIN_S after its shutdown is terminated."""
        processes = self._released or self._processes()
        if abort:
            self._terminate()
        self._executor.shutdown(wait=not abort, cancel_futures=True)
        for process in processes:
            process.join(TERMINATE_JOIN_S)
            if process.is_alive():
                process.terminate()
                process.join()
        if self._manager is not None:
            self._manager.join(TERMINATE_JOIN_S)

    def release(self) -> None:
        """Let the workers exit now, without waiting for them (`close` joins them later)."""
        self._released = self._processes()
        self._executor.shutdown(wait=False)

    def _processes(self) -> list:
        """The worker processes (the executor forgets them at its shutdown)."""
        return list((getattr(self._executor, "_processes", None) or {}).values())

    def _terminate(self) -> None:
        processes = self._released or self._processes()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(TERMINATE_JOIN_S)

    def submit_observed(self, path: Path, protocol: Protocol, samples: pd.DataFrame) -> None:
        """Submit the predicted observed-vs-expected figures of the bundle at `path`, whose
        reference.json is written and whose stage-1 `samples` are complete."""
        predicted = predicted_criteria(protocol)
        tokens = plots.tokens_by_group(samples, {group for _, group, _ in predicted}, protocol.positions)
        try:
            for name, group, position in predicted:
                self._observed[name, group, position] = self._executor.submit(
                    _observed, str(path), name, tokens[group], position
                )
        except BrokenProcessPool:
            self._observed.clear()  # a worker is lost: `submit` finds the pool broken and renders serially

    def submit(self, path: Path, summary: dict, samples: pd.DataFrame) -> Callable[[], dict[str, bytes]]:
        """Hand the figures of `report.figures(path, summary, samples)` to the workers; the returned
        function waits for them: the same bytes, or on a lost worker, `report.figures` rendered in
        this process (module doc)."""
        try:
            futures = self._submit_all(path, summary, samples)
        except BrokenProcessPool as err:
            return functools.partial(self._lost, err, path, summary, samples)
        return functools.partial(self._wait, futures, path, summary, samples)

    def figures(self, path: Path, summary: dict, samples: pd.DataFrame) -> dict[str, bytes]:
        """`report.figures(path, summary, samples)` rendered by the workers (`submit`, then wait)."""
        return self.submit(path, summary, samples)()

    def _submit_all(self, path: Path, summary: dict, samples: pd.DataFrame) -> tuple[list, Future, Future]:
        positions = summary["protocol"]["positions"]
        observed = [
            (
                name,
                self._observed.get((name, test["group"], test["position"]))
                or self._executor.submit(
                    _observed, str(path), name, plots.group_tokens(samples, test["group"], positions), test["position"]
                ),
            )
            for name, test in report.observed_criteria(summary)
        ]
        return (
            observed,
            self._executor.submit(plots.pvalues_across_strata, summary["tests"]),
            self._executor.submit(plots.acceptance_by_position, summary["groups"]),
        )

    def _wait(
        self, futures: tuple[list, Future, Future], path: Path, summary: dict, samples: pd.DataFrame
    ) -> dict[str, bytes]:
        observed, pvalues, sources = futures
        try:
            return report.assemble(
                [(name, _result(future)) for name, future in observed], _result(pvalues), _result(sources)
            )
        except (BrokenProcessPool, FutureTimeout) as err:
            return self._lost(err, path, summary, samples)

    def _lost(self, err: BaseException, path: Path, summary: dict, samples: pd.DataFrame) -> dict[str, bytes]:
        self._terminate()
        reason = f"{type(err).__name__}: {err}" if str(err) else f"no figure within {FIGURE_TIMEOUT_S:g} s"
        print(
            f"warning: a figure worker was lost ({reason}); the figures are rendered in this process", file=sys.stderr
        )
        return report.figures(path, summary, samples)


def _result(future: Future) -> bytes | None:
    return future.result(timeout=FIGURE_TIMEOUT_S)
