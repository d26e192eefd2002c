"""GPU checks of the Triton kernels at full size (skipped without CUDA)."""

import pytest
import torch

from conftest import generator
from engine.params import SamplingParams
from engine.sampling import Sampler, batched_probabilities, categorical, uniform_blocks
from test_sampling_accept_law import check_ragged_law, quadrature_law, dyadic, run_ragged

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
QWEN_VOCAB = 152064
# On the GPU tl.exp is exp2(x * log2 e) in hardware: relative error grows like |x - max| * 2**-23,
# so values of rows with large scaled logits (temperature 1e-3) differ from torch.exp by ~1e-5.
GPU_RTOL = 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_vocab_kernel_matches_reference(dtype):
    rows = [(1.0, 50, 0.9), (0.7, -1, 0.95), (0.0, -1, 1.0), (1.0, 1000, 1.0), (1.3, 5000, 0.8),
            (100.0, -1, 0.5), (1e-3, 20, 1.0), (1.0, -1, 1.0)]
    logits = (torch.randn(len(rows), QWEN_VOCAB, generator=generator(71)) * 4).to(dtype)
    t = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    k = torch.tensor([r[1] for r in rows])
    p = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    out = batched_probabilities(logits.cuda(), t.cuda(), k.cuda(), p.cuda(), backend="triton")
    out = out.cpu()
    for b, (temp, top_k, top_p) in enumerate(rows):
        ref = Sampler().probabilities(logits[b], SamplingParams(temperature=temp, top_k=top_k,
                                                                 top_p=top_p))
        assert torch.equal(out[b] > 0, ref > 0), f"row {b}: support differs"
        torch.testing.assert_close(out[b], ref, rtol=GPU_RTOL, atol=1e-7)


def test_uniform_blocks_bitwise_equal_on_cpu_and_cuda():
    seeds = torch.randint(0, 2**62, (64,), generator=generator(72))
    pos = torch.randint(0, 2**40, (64,), generator=generator(73))
    cpu = uniform_blocks(seeds, pos, 9, backend="torch")
    for backend in ("triton", "torch"):
        assert torch.equal(uniform_blocks(seeds.cuda(), pos.cuda(), 9, backend=backend).cpu(), cpu)


def test_categorical_backends_agree_on_gpu():
    w = torch.rand(64, QWEN_VOCAB, generator=generator(74))
    w[w < 0.5] = 0
    u = torch.rand(64, generator=generator(75), dtype=torch.float64)
    got = categorical(w.cuda(), u.cuda(), backend="triton").cpu()
    assert torch.equal(got, categorical(w, u, backend="torch"))


def test_quadrature_on_gpu():
    p1, q1, p2 = dyadic(31, [1]), dyadic(32, [4]), dyadic(33, [3])
    first, bonus, _ = quadrature_law(p1.cuda(), q1.cuda(), p2.cuda(), "triton")
    torch.testing.assert_close(first.cpu(), p1.double(), atol=1e-9, rtol=0)


def test_ragged_monte_carlo_triton_gpu():
    """Same statistics and false-fail rate (1e-3) as the torch Monte Carlo test."""
    out, num_drafts, p, _, _ = run_ragged("triton", "cuda")
    check_ragged_law(out, num_drafts, p)
