"""How long Triton spent compiling kernels in this process, from its compilation listener.

Triton (3.4 on) calls `triton.knobs.compilation.listener` after every `triton.compile`: with
`cache_hit` False when it built the kernel (front end, every lowering stage, ptxas, the cache
write) and True when it loaded a finished one from its cache, and the stage times in
microseconds. `install()` chains a listener that adds them up; any listener already installed
(a profiler's) is still called. The sums cover every Triton kernel of the process (the engine's,
and any other library's), from install on. Under the CPU interpreter nothing is compiled, and a
Triton without the listener gives no clock (`install()` returns None).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import triton

MICROSECONDS = 1e-6


@dataclass(frozen=True)
class CompileTotals:
    """Kernels built and loaded since `install()`, and the seconds each took in all."""

    compiled: int = 0
    compile_s: float = 0.0
    loaded: int = 0
    load_s: float = 0.0

    def since(self, start: CompileTotals) -> CompileTotals:
        """What was added after `start` (totals read earlier from the same clock)."""
        return CompileTotals(
            self.compiled - start.compiled,
            self.compile_s - start.compile_s,
            self.loaded - start.loaded,
            self.load_s - start.load_s,
        )


_lock = threading.Lock()
_totals: CompileTotals | None = None


def install() -> CompileTotals | None:
    """Start counting (once per process; later calls change nothing); the totals so far, or None
    where this Triton has no compilation listener."""
    global _totals
    compilation = getattr(getattr(triton, "knobs", None), "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        return None
    with _lock:
        if _totals is None:
            _totals = CompileTotals()
            compilation.listener = _chained(compilation.listener)
        return _totals


def totals() -> CompileTotals | None:
    """The totals since `install()`; None if it was never called or found no listener."""
    with _lock:
        return _totals


def _chained(previous):
    def listener(*, src, metadata, metadata_group, times, cache_hit) -> None:
        global _totals
        seconds = times.total * MICROSECONDS
        with _lock:
            t = _totals
            _totals = (
                CompileTotals(t.compiled, t.compile_s, t.loaded + 1, t.load_s + seconds)
                if cache_hit
                else CompileTotals(t.compiled + 1, t.compile_s + seconds, t.loaded, t.load_s)
            )
        if previous is not None:
            previous(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    return listener
