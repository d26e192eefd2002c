"""`warmup`: the probabilities kernels compiled ahead, in background threads.

On the CPU nothing compiles, so these tests give the plan stand-in kernels that record what
they were asked for; the GPU test (tests/engine/sampling/test_gpu.py) checks that a warmed
call then compiles and loads nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import defaultdict

import pytest
import torch

from engine.sampling import warm_probabilities
from engine.sampling.kernels.probabilities import plan as plan_module
from engine.sampling.kernels.probabilities.config import DEFAULT_CONFIG
from engine.sampling.kernels.warmup import Warmups, compiled_key

VOCAB = 256  # the looped model's: the single launch below 512 rows, three launches above


class StandInKernel:
    """Records each `warmup(...)` and each `kernel[grid](...)` launch, as Triton's JIT takes them."""

    def __init__(self, name: str, delay_s: float = 0.0, fails: bool = False):
        self.name, self.delay_s, self.fails = name, delay_s, fails
        self.device_caches = defaultdict(dict)  # Triton's JIT: one cache per device index
        self.warmups, self.launches = [], []
        self.finished = threading.Event()

    def warmup(self, *args, grid, **kwargs):
        time.sleep(self.delay_s)
        if self.fails:
            raise RuntimeError(f"{self.name}: planted compile failure")
        self.warmups.append((args, grid, kwargs))
        self.finished.set()

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, grid, kwargs))


@pytest.fixture(autouse=True)
def no_cuda_device_switch(monkeypatch):
    """The compile threads enter `torch.cuda.device(...)`, which a CPU build of torch refuses."""
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())


def stand_in_plan(rows: int, **kernel_options):
    """`launch_plan` of [rows, VOCAB] with each launch's kernel replaced by a StandInKernel."""
    plan = plan_module.launch_plan(DEFAULT_CONFIG, rows, VOCAB)
    launches = tuple(
        dataclasses.replace(launch, kernel=StandInKernel(launch.kernel.fn.__name__, **kernel_options))
        for launch in plan.launches
    )
    return dataclasses.replace(plan, launches=launches)


def test_a_warmup_asks_each_kernel_for_the_launch_its_first_call_makes():
    """The warm-up's arguments are the first launch's with each tensor replaced by its dtype
    (Triton's `MockTensor`: dtype and a 16-byte aligned pointer), and the same grid,
    constexprs, warps and options: so the JIT compiles the specialisation the call takes."""
    for rows in (4, 4096):  # the single launch and the three launches
        plan = stand_in_plan(rows)
        warmups = Warmups()
        assert warmups.start_plan(plan, torch.float32, torch.int64, torch.device("cuda", 0)) == len(plan.launches)
        warmups.wait_all()
        logits = torch.randn(rows, VOCAB)
        tensors = (
            logits,
            torch.ones(rows),
            torch.full((rows,), 50),
            torch.full((rows,), 0.9),
            torch.empty_like(logits),
            *plan_module._make_scratch(plan, "cpu"),
        )
        for launch, args in zip(plan.launches, plan.arguments(tensors)):
            launch.through_jit(args)
            ((launched, grid, options),) = launch.kernel.launches
            ((warmed, warm_grid, warm_options),) = launch.kernel.warmups
            assert warmed == tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in launched)
            assert (warm_grid, warm_options) == (grid, options)


def test_row_counts_that_share_kernels_compile_them_once():
    """Every row count above the single launch's bound runs the same three kernels: the second
    plan starts nothing while the first warms. The single launch is another kernel."""
    big, bigger, small = stand_in_plan(4096), stand_in_plan(16384), stand_in_plan(4)
    bigger = dataclasses.replace(bigger, launches=big.launches)  # the same kernel objects
    assert compiled_key(big, torch.float32, torch.int64) == compiled_key(bigger, torch.float32, torch.int64)
    assert compiled_key(big, torch.float32, torch.int64) != compiled_key(big, torch.bfloat16, torch.int64)
    warmups = Warmups()
    device = torch.device("cuda", 0)
    assert warmups.start_plan(big, torch.float32, torch.int64, device) == 3
    assert warmups.start_plan(bigger, torch.float32, torch.int64, device) == 0
    assert warmups.start_plan(small, torch.float32, torch.int64, device) == 1
    warmups.wait_all()
    assert not warmups


def test_a_call_waits_for_its_plan_and_only_for_it():
    """`wait` returns once the plan's compiles finished, and forgets it (the registry is empty
    again, so later calls skip the check); a failed compile is not raised there."""
    slow, failing = stand_in_plan(4096, delay_s=0.3), stand_in_plan(4, fails=True)
    warmups = Warmups()
    device = torch.device("cuda", 0)
    warmups.start_plan(slow, torch.float32, torch.int64, device)
    warmups.start_plan(failing, torch.float32, torch.int64, device)
    assert warmups
    warmups.wait(slow, torch.float32, torch.int64)
    assert all(launch.kernel.finished.is_set() for launch in slow.launches)
    assert warmups  # the failing plan is still pending
    warmups.wait(failing, torch.float32, torch.int64)  # its error is the launch's to raise
    assert not warmups
    assert not failing.launches[0].kernel.warmups


def test_nothing_is_warmed_off_cuda_or_for_the_torch_backend():
    assert plan_module.warm_up(VOCAB, (1, 4096), torch.device("cpu")) == 0
    assert warm_probabilities(VOCAB, (1, 4096), torch.device("cpu"), backend="torch") == 0
    with pytest.raises(ValueError, match="backend"):
        warm_probabilities(VOCAB, (1,), torch.device("cpu"), backend="fast")


def test_closing_drops_the_warmups_not_started_and_lets_running_ones_finish():
    """More requests than worker threads: `cancel` drops the queued ones (their kernels are never
    asked), the running ones finish; the registry is empty after it."""
    from engine.sampling.kernels.warmup import MAX_THREADS

    kernels = [StandInKernel(f"k{i}", delay_s=0.3) for i in range(MAX_THREADS + 2)]
    warmups = Warmups()
    device = torch.device("cuda", 0)
    assert warmups.start("all", [(k, (), (1,), {}) for k in kernels], device) == len(kernels)
    time.sleep(0.1)  # the first requests are running
    dropped = warmups.cancel()
    assert dropped >= 2 and not warmups
    time.sleep(0.5)  # past every running compile
    assert sum(k.finished.is_set() for k in kernels) == len(kernels) - dropped


def test_warmups_no_call_waits_for_leave_the_calls_check_off_and_start_once():
    """`waited=False` (the round's Philox, draw and accept kernels): the registry stays falsy, so
    the probabilities calls skip their check; the same key starts once; `wait_all` still waits
    for it and `cancel` still reaches it."""
    warmups = Warmups()
    device = torch.device("cuda", 0)
    kernel = StandInKernel("round", delay_s=0.2)
    assert warmups.start("round", [(kernel, (), (1,), {})], device, waited=False) == 1
    assert not warmups
    assert warmups.start("round", [(kernel, (), (1,), {})], device, waited=False) == 0
    warmups.wait_all()
    assert kernel.finished.is_set() and len(kernel.warmups) == 1
    assert warmups.start("round", [(kernel, (), (1,), {})], device, waited=False) == 1  # forgotten by wait_all
    warmups.wait_all()
