"""Compile the probabilities kernels of a vocabulary before their first call, in parallel.

On a fresh machine each Triton kernel compiles at its first launch, one after the other on the
calling thread: the engine's first sampling calls waited ~15 s for the three kernels of a large
batch and ~19 s more for the single launch of a small one (an H100 host, V = 256,
docs/notes/performance-notebook.md). `Warmups.start` compiles every kernel of a plan (the
plans of the row counts a caller names: `plan.warm_up`), each in a worker thread of its own,
through `JITFunction.warmup`: it fills the JIT's cache (and Triton's cache on disk) without
launching anything or touching device memory (tensors are given as dtypes). Triton's compiler releases the GIL in its lowering passes
and in ptxas, so the compiles overlap each other and whatever the caller does meanwhile (loading
a model, building its KV cache). The first call of a warming plan waits for its compiles (`wait`,
from `plan._launch`) instead of compiling them a second time.

Guarantees:
- results do not depend on it: a warm-up compiles the kernels the call's first launch would
  (the plan's kernels, grids, constexprs, warps and compile options, the caller's logits and
  top-k dtypes, every pointer specialised as 16-byte aligned, which every tensor the engine
  allocates is);
- a warm-up that fails, or that guessed another specialisation than a call takes, costs only
  time: the launch compiles what it needs itself, and raises its own error, if any;
- nothing happens off CUDA or under the interpreter (`plan.warm_up` returns 0).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_for
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.sampling.kernels.probabilities.plan import LaunchPlan

MAX_THREADS = 4  # the kernels of both plans of a vocabulary (single, and chunk, select, write)
# the dtype of each of plan.BUFFERS after the caller's four inputs and the output (see `_make_scratch`)
SCRATCH_DTYPES = (torch.float32,) * 4 + (torch.int32,) * 5 + (torch.int64,) * 3


class Warmups:
    """The plans being compiled in the background, each with the futures of its kernels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple, list[Future]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def __bool__(self) -> bool:
        """True while some plan's warm-up has not been waited for (one dict read)."""
        return bool(self._pending)

    def start(self, plan: "LaunchPlan", logits_dtype: torch.dtype, top_k_dtype: torch.dtype,
              device: torch.device) -> int:
        """Compile `plan`'s kernels for these dtypes on `device` (a CUDA device with its index)
        in the background; the number of kernels started (0 if the same kernels are already
        warming: `compiled_key`)."""
        key = compiled_key(plan, logits_dtype, top_k_dtype)
        buffers = (logits_dtype, torch.float32, top_k_dtype, torch.float32, torch.float32,
                   *SCRATCH_DTYPES)
        with self._lock:
            if key in self._pending:
                return 0
            if self._pool is None:
                self._pool = ThreadPoolExecutor(min(MAX_THREADS, os.cpu_count() or 1),
                                                thread_name_prefix="triton-warmup")
            futures = []
            for launch, args in zip(plan.launches, plan.arguments(buffers)):
                _ = launch.kernel.device_caches[device.index]  # created here, not in a race
                futures.append(self._pool.submit(_compile, launch, args, device))
            self._pending[key] = futures
            return len(futures)

    def wait(self, plan: "LaunchPlan", logits_dtype: torch.dtype, top_k_dtype: torch.dtype) -> None:
        """Block until the warm-up of this plan's kernels (if any) has finished; it is then
        forgotten. A failed warm-up is ignored: the call compiles its kernels itself."""
        with self._lock:
            futures = self._pending.pop(compiled_key(plan, logits_dtype, top_k_dtype), None)
        if futures:
            wait_for(futures)

    def wait_all(self) -> None:
        """Block until every warm-up has finished (tests, and callers that time the compiles)."""
        with self._lock:
            futures = [future for started in self._pending.values() for future in started]
            self._pending.clear()
        wait_for(futures)


def compiled_key(plan: "LaunchPlan", logits_dtype: torch.dtype, top_k_dtype: torch.dtype) -> tuple:
    """What the compiled kernels of a call depend on: each launch's kernel, constexprs, warps and
    compile options, the integer arguments (V, the number of chunks and wide_k, all set by V and
    the configuration) and the two caller dtypes; not the number of rows, which only sizes the
    grids. Calls of two plans with equal keys run the same compiled kernels."""
    return (plan.vocab, plan.num_chunks, plan.wide_k, logits_dtype, top_k_dtype,
            tuple((launch.kernel, launch.constexprs, launch.num_warps, launch.options)
                  for launch in plan.launches))


def _compile(launch, args: tuple, device: torch.device) -> None:
    """`launch`'s kernel compiled as its first launch with `args` would compile it."""
    with torch.cuda.device(device):
        launch.kernel.warmup(*args, grid=launch.grid, **dict(launch.constexprs),
                             num_warps=launch.num_warps, **dict(launch.options))


WARMUPS = Warmups()  # the process's warm-ups (Triton's JIT cache is per process too)
