"""Stopwatch: wall seconds of the named steps of one run, for the manifest's `analysis_steps`.

A step timed twice (each stage of a two-stage protocol) adds up under its one name; the names
keep the order in which they were first timed. The seconds are wall time (`time.perf_counter`),
so a step that waits for worker processes counts its wait, not their CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """Seconds per step name, summed over the `step` blocks of that name."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the block under `name` (also when it raises: the time was spent)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` measured elsewhere to `name` (e.g. a span less the steps timed within it)."""
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    def seconds(self) -> dict[str, float]:
        """A copy of the seconds per step, in first-timed order."""
        return dict(self._seconds)
