"""Compile Triton kernels before their first call, in background threads.

On a fresh machine each Triton kernel compiles at its first launch, one after the other on the
calling thread: the engine's first sampling calls waited ~8 s for the write kernel alone, ~12 s
for the three probabilities kernels of a large batch, and ~15 s more for the single launch of a
small one (an H100 host, V = 256, docs/notes/performance-notebook.md). `Warmups.start` compiles
each of a list of launch requests (kernel, arguments, grid, options) in a worker thread of its
own through `JITFunction.warmup`: it fills the JIT's cache (and Triton's cache on disk) without
launching anything or touching device memory (tensors are given as dtypes). Triton's compiler
releases the GIL in its lowering passes and in ptxas, so the compiles overlap each other and
whatever the caller does meanwhile. The requests come from the kernels' modules: a plan's
launches (`start_plan`, for a `probabilities.layout.LaunchPlan`; `probabilities.plan.warm_up`),
and `accept_warmup`, `categorical_warmup`, `uniform_blocks_warmup`. The first call of a warming
probabilities plan waits for its compiles (`wait`, from `plan._launch`) instead of compiling them
a second time; the other kernels compile in about a second each and are not waited for (a call
that comes first compiles its kernel itself, as without a warm-up).

Guarantees:
- results do not depend on it: a request asks for the kernel the call's first launch compiles
  (its constexprs, warps and compile options, integer arguments and dtypes, every pointer
  specialised as 16-byte aligned, which every tensor the engine allocates is);
- a warm-up that fails, or that asked for another specialisation than a call takes, costs only
  time: the launch compiles what it needs itself, and raises its own error, if any;
- nothing happens off CUDA or under the interpreter (the fronts return 0).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # `layout` is below this module and `plan` (which imports this one); only
    # for annotations: at run time its import would first run the package's `__init__`, which
    # imports `plan`, which imports this module before it is complete
    from engine.sampling.kernels.probabilities.layout import LaunchPlan

MAX_THREADS = 4  # the kernels of both plans of a vocabulary (single, and chunk, select, write)


class Warmups:
    """The plans being compiled in the background, each with the futures of its kernels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple, list[Future]] = {}  # plans whose first call waits (`wait`)
        self._unwaited: dict[tuple, list[Future]] = {}  # kernels no call waits for (kept for dedup)
        self._pool: ThreadPoolExecutor | None = None

    def __bool__(self) -> bool:
        """True while some plan's warm-up has not been waited for (one dict read); warm-ups no
        call waits for do not count, so the probabilities calls skip the check once their plans
        are ready."""
        return bool(self._pending)

    def start(self, key, requests, device: torch.device, waited: bool = True) -> int:
        """Compile each request (kernel, arguments, grid, options: what `JITFunction.warmup`
        takes, tensors as dtypes) on CUDA `device` (the current one where it has no index) in
        the background, under `key`; the number started (0 if `key` was started before and,
        when `waited`, not waited for yet). `waited=False`: no call will `wait` for `key`."""
        if device.index is None:
            device = torch.device(device.type, torch.cuda.current_device())
        registry = self._pending if waited else self._unwaited
        with self._lock:
            if key in registry:
                return 0
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    min(MAX_THREADS, os.cpu_count() or 1), thread_name_prefix="triton-warmup"
                )
            futures = []
            for kernel, arguments, grid, options in requests:
                _ = kernel.device_caches[device.index]  # created here, not in a race
                futures.append(self._pool.submit(_compile, kernel, arguments, grid, options, device))
            registry[key] = futures
            return len(futures)

    def start_plan(
        self, plan: LaunchPlan, logits_dtype: torch.dtype, top_k_dtype: torch.dtype, device: torch.device
    ) -> int:
        """`start` for every launch of `plan` with these caller dtypes, under `compiled_key`; a
        call of a plan with that key waits for it (`wait`)."""
        buffers = plan.buffer_dtypes(logits_dtype, top_k_dtype)
        requests = [
            (
                launch.kernel,
                arguments,
                launch.grid,
                {**dict(launch.constexprs), "num_warps": launch.num_warps, **dict(launch.options)},
            )
            for launch, arguments in zip(plan.launches, plan.arguments(buffers))
        ]
        return self.start(compiled_key(plan, logits_dtype, top_k_dtype), requests, device)

    def wait(self, plan: LaunchPlan, logits_dtype: torch.dtype, top_k_dtype: torch.dtype) -> None:
        """Block until the warm-up of this plan's kernels (if any) has finished; it is then
        forgotten. A failed warm-up is ignored: the call compiles its kernels itself."""
        with self._lock:
            futures = self._pending.pop(compiled_key(plan, logits_dtype, top_k_dtype), None)
        if futures:
            wait_for(futures)

    def cancel(self) -> int:
        """Drop every warm-up that has not started compiling (a caller closing early: an
        interpreted process would otherwise run the queued compiles before it exits); compiles
        already running finish. The number dropped."""
        return sum(future.cancel() for future in self._take_all())

    def wait_all(self) -> None:
        """Block until every warm-up has finished (tests, and callers that time the compiles)."""
        wait_for(self._take_all())

    def _take_all(self) -> list[Future]:
        """Every future started, waited for or not; both registries are then empty."""
        with self._lock:
            futures = [
                future
                for registry in (self._pending, self._unwaited)
                for started in registry.values()
                for future in started
            ]
            self._pending.clear()
            self._unwaited.clear()
        return futures


def compiled_key(plan: LaunchPlan, logits_dtype: torch.dtype, top_k_dtype: torch.dtype) -> tuple:
    """What the compiled kernels of a call depend on: each launch's kernel, constexprs, warps and
    compile options, the integer arguments (V, the number of chunks and wide_k, all set by V and
    the configuration) and the two caller dtypes; not the number of rows, which only sizes the
    grids. Calls of two plans with equal keys run the same compiled kernels."""
    return (
        plan.vocab,
        plan.num_chunks,
        plan.wide_k,
        logits_dtype,
        top_k_dtype,
        tuple((launch.kernel, launch.constexprs, launch.num_warps, launch.options) for launch in plan.launches),
    )


def _compile(kernel, arguments: tuple, grid: tuple, options: dict, device: torch.device) -> None:
    """`kernel` compiled as a launch with these arguments and options would compile it."""
    with torch.cuda.device(device):
        kernel.warmup(*arguments, grid=grid, **options)


WARMUPS = Warmups()  # the process's warm-ups (Triton's JIT cache is per process too)
