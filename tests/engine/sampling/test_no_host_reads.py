"""No host read of device data in the launch path of any sampling function.

Host reads (.item, .tolist, .cpu, .numpy, bool()/int()/float() of a tensor, synchronize) are
patched to raise. The torch backends run for real; for the Triton backends the kernels are
replaced by recorders, so the launchers' own host code is what gets checked here (the GPU
suite runs the real kernels under the same patch).
"""

import importlib

import pytest
import torch

from engine.sampling import batched_probabilities, categorical, speculative_accept, uniform_blocks
from tests.fixtures.sampling_helpers import generator

READS = ["item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__"]
KERNELS = [
    # the launch plan names the probabilities kernels where plan.py imported them
    ("engine.sampling.kernels.probabilities.plan", "_chunk_kernel"),
    ("engine.sampling.kernels.probabilities.plan", "_select_kernel"),
    ("engine.sampling.kernels.probabilities.plan", "_write_kernel"),
    ("engine.sampling.kernels.probabilities.plan", "_single_kernel"),
    ("engine.sampling.kernels.categorical", "_categorical_kernel"),
    ("engine.sampling.kernels.accept", "_accept_kernel"),
    ("engine.sampling.kernels.rng", "_uniform_blocks_kernel"),
]


class HostRead(AssertionError):
    pass


def forbid_host_reads(monkeypatch):
    def boom(*args, **kwargs):
        raise HostRead("host read in the launch path")

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, boom)
    monkeypatch.setattr(torch.cuda, "synchronize", boom)


class Recorder:
    """Stands in for a Triton kernel: `kernel[grid](*args)` records the launch."""

    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1

        return launch


def call_all(backend, device="cpu"):
    g = generator(61)
    logits = torch.randn(4, 50, generator=g).to(device)
    temps = torch.tensor([1.0, 0.0, 0.5, 2.0], device=device)
    ks = torch.tensor([5, -1, 0, 3], device=device)
    ps = torch.tensor([0.9, 1.0, 0.3, 1.0], device=device)
    probs = batched_probabilities(logits, temps, ks, ps, backend=backend)
    u = uniform_blocks(
        torch.arange(4, device=device), torch.zeros(4, dtype=torch.int64, device=device), 5, backend=backend
    )
    categorical(probs, u[:, 0].contiguous(), backend=backend)
    drafts = torch.tensor([1, 2, 3, 4, 5], device=device)
    cu = torch.tensor([0, 2, 2, 4, 5], device=device)
    target = torch.softmax(torch.randn(9, 50, generator=g), 1).to(device)
    speculative_accept(
        drafts,
        cu,
        target[:5].contiguous(),
        target,
        u,
        torch.tensor([False, True, False, False], device=device),
        backend=backend,
    )


def test_torch_backend_never_reads_the_host(monkeypatch):
    forbid_host_reads(monkeypatch)
    call_all("torch")


def test_patch_is_effective(monkeypatch):
    forbid_host_reads(monkeypatch)
    with pytest.raises(HostRead):
        torch.ones(2).sum().item()


@pytest.fixture
def fresh_launch_plans():
    """Launch plans hold their kernels (`KernelLaunch`): plans cached before the kernels are
    replaced would launch the real ones, and plans built with the recorders must not outlive
    the test."""
    from engine.sampling.kernels.probabilities import launch_plan

    launch_plan.cache_clear()
    yield
    launch_plan.cache_clear()


def test_triton_launchers_never_read_the_host(monkeypatch, fresh_launch_plans):
    recorders = []
    for module_name, kernel in KERNELS:
        recorder = Recorder()
        monkeypatch.setattr(importlib.import_module(module_name), kernel, recorder)
        recorders.append(recorder)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets backend="triton" accept CPU tensors
    forbid_host_reads(monkeypatch)
    call_all("triton")  # batched_probabilities at B = 4: the single launch
    from engine.sampling.kernels.probabilities import SINGLE_LAUNCH_ENTRIES as entries

    rows = entries // 50 + 1  # B * V above the single launch's threshold: three launches
    batched_probabilities(
        torch.randn(rows, 50), torch.ones(rows), torch.full((rows,), 5), torch.ones(rows), backend="triton"
    )
    assert all(r.launches == 1 for r in recorders)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_kernels_never_read_the_host_on_gpu(monkeypatch):
    call_all("triton", "cuda")  # compile and warm up first
    forbid_host_reads(monkeypatch)
    call_all("triton", "cuda")
