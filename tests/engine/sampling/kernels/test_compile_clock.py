"""`engine.sampling.kernels.compile_clock`: Triton's compilation listener, summed and chained.

Nothing is compiled here (the CPU has no Triton target): the tests call the installed listener
as `triton.compile` does, with the stage times in microseconds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import triton

from engine.sampling.kernels import compile_clock

pytestmark = pytest.mark.skipif(
    not hasattr(getattr(triton, "knobs", None), "compilation"), reason="this Triton has no compilation listener"
)


@pytest.fixture
def fresh_clock(monkeypatch):
    """A process without a clock or a listener; both restored afterwards."""
    monkeypatch.setattr(compile_clock, "_totals", None)
    monkeypatch.setattr(triton.knobs.compilation, "listener", None)


def _call(times_us: int, cache_hit: bool) -> None:
    times = SimpleNamespace(total=times_us)
    triton.knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=times, cache_hit=cache_hit)


def test_builds_and_cache_loads_are_summed_apart(fresh_clock):
    assert compile_clock.totals() is None
    assert compile_clock.install() == compile_clock.CompileTotals()
    _call(1_500_000, cache_hit=False)
    _call(2_000_000, cache_hit=False)
    _call(250_000, cache_hit=True)
    assert compile_clock.totals() == compile_clock.CompileTotals(compiled=2, compile_s=3.5, loaded=1, load_s=0.25)


def test_install_is_idempotent_and_keeps_an_earlier_listener(fresh_clock):
    seen = []
    triton.knobs.compilation.listener = lambda **kwargs: seen.append(kwargs["cache_hit"])
    compile_clock.install()
    listener = triton.knobs.compilation.listener
    compile_clock.install()
    assert triton.knobs.compilation.listener is listener  # not chained twice
    _call(1_000, cache_hit=False)
    assert seen == [False]
    assert compile_clock.totals().compiled == 1


def test_since_is_what_was_added_after_a_reading(fresh_clock):
    compile_clock.install()
    _call(1_000_000, cache_hit=False)
    start = compile_clock.totals()
    _call(500_000, cache_hit=False)
    _call(250_000, cache_hit=True)
    assert compile_clock.totals().since(start) == compile_clock.CompileTotals(
        compiled=1, compile_s=0.5, loaded=1, load_s=0.25
    )
