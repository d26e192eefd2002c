"""The division by a row's reciprocal (`KernelConfig.reciprocal_division`) is IEEE division.

`corrected_quotient(x, t, RN(1 / t))` must equal RN(x / t), bit for bit, wherever
`reciprocal_applies` lets the kernels take it (2**-24 <= t <= 2**24, 2**-96 <= |x| <= 2**96).
Multiplying x or t by a power of two inside that range multiplies every step's exact value by
it and nothing under- or overflows (docs/sampling.md, "The scaled logits"), so the result
depends on the two significands alone: the GPU test checks all 2**46 pairs, and the corners of
the range on a sample; the CPU test checks a sample of pairs under the interpreter (whose fma
rounds once, as the GPU's does). Both also count the uncorrected product RN(x RN(1 / t)), which
does misround, so a check that could not see a wrong quotient would fail.
"""

import dataclasses
import math

import pytest
import torch
import triton
import triton.language as tl

from engine.sampling.kernels.probabilities.division import (
    RECIPROCAL_T_RANGE,
    RECIPROCAL_X_RANGE,
    corrected_quotient,
    ieee_quotient,
    reciprocal_applies,
    reciprocal_quotient,
)
from tests.fixtures.sampling_helpers import assert_rows_match, baseline_config, generator, params, triton_can_run_on

SIGNIFICAND_BITS = 23
ONE_BITS = 0x3F800000  # the bits of 1.0: + i for i < 2**23 are the significands of [1, 2)
SIGN_BIT = -(2**31)  # int32 bits of -0.0


def float_bits(exponent: int) -> int:
    """int32 bits of 2**exponent (a normal float32)."""
    return (127 + exponent) << SIGNIFICAND_BITS


@triton.jit
def _misrounded_kernel(
    count_ptr, t_bits_ptr, x_first, x_stride, X_STEPS: tl.constexpr, BLOCK: tl.constexpr, CORRECT: tl.constexpr
):
    """count[i] = how many x with bits x_first + j * x_stride (j < X_STEPS * BLOCK) give a
    quotient by t = bits(t_bits[i]) other than RN(x / t): corrected (CORRECT) or RN(x RN(1/t))."""
    i = tl.program_id(0)
    t = tl.load(t_bits_ptr + i).to(tl.float32, bitcast=True)
    y = tl.math.div_rn(tl.full([], 1.0, tl.float32), t)
    wrong = tl.zeros([BLOCK], tl.int32)
    for step in range(X_STEPS):
        bits = x_first + (step * BLOCK + tl.arange(0, BLOCK)) * x_stride
        x = bits.to(tl.float32, bitcast=True)
        q = corrected_quotient(x, t, y) if CORRECT else x * y  # CORRECT is a constexpr: one branch compiled
        exact = tl.math.div_rn(x, tl.zeros_like(x) + t)
        wrong += (q.to(tl.int32, bitcast=True) != exact.to(tl.int32, bitcast=True)).to(tl.int32)
    tl.store(count_ptr + i, tl.sum(wrong, 0))


def misrounded(
    t_bits: torch.Tensor, x_first: int, x_stride: int, x_steps: int, block: int, correct: bool = True
) -> torch.Tensor:
    """Per t, the number of misrounded quotients (see `_misrounded_kernel`)."""
    counts = torch.empty(t_bits.shape, dtype=torch.int32, device=t_bits.device)
    _misrounded_kernel[(t_bits.numel(),)](
        counts, t_bits, x_first, x_stride, X_STEPS=x_steps, BLOCK=block, CORRECT=correct
    )
    return counts


@triton.jit
def _quotient_kernel(x_ptr, t_ptr, out_ptr, applies_ptr, BLOCK: tl.constexpr, RECIPROCAL: tl.constexpr):
    """Row i of out: x[i] / t[i] by `reciprocal_quotient` (or `ieee_quotient`); applies[i]:
    `reciprocal_applies` of the row."""
    i = tl.program_id(0)
    offs = i * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    t = tl.load(t_ptr + i)
    q = reciprocal_quotient(x, t) if RECIPROCAL else ieee_quotient(x, t)  # a constexpr: one branch compiled
    tl.store(out_ptr + offs, q)
    tl.store(applies_ptr + i, reciprocal_applies(x, t).to(tl.int32))


def quotients(x: torch.Tensor, t: torch.Tensor, reciprocal: bool):
    out = torch.empty_like(x)
    applies = torch.empty(t.shape, dtype=torch.int32, device=t.device)
    _quotient_kernel[(x.shape[0],)](x, t, out, applies, BLOCK=x.shape[1], RECIPROCAL=reciprocal)
    return out, applies.bool()


def float32_after(value: float, towards: float) -> float:
    """The float32 next to `value` (a float32) in the direction of `towards`."""
    return torch.nextafter(torch.tensor(value), torch.tensor(towards)).item()


def bits_of(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def sample_t_bits(exponent: int, count: int, seed: int, device="cpu") -> torch.Tensor:
    """Bits of t = 2**exponent * s: the edge significands (1, the next three, 1.5, the last
    two) and `count` random ones."""
    edges = torch.tensor([0, 1, 2, 3, 2**22, 2**23 - 2, 2**23 - 1])
    drawn = torch.randint(0, 2**SIGNIFICAND_BITS, (count,), generator=generator(seed))
    return (float_bits(exponent) + torch.cat([edges, drawn])).to(torch.int32).to(device)


cpu_only = pytest.mark.skipif(not triton_can_run_on(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")


def on_gpu(test):
    """Marked `gpu`, skipped without CUDA."""
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.gpu(needs_cuda(test))


@cpu_only
def test_corrected_quotient_is_ieee_division_on_a_sample():
    """57 significands of t (edges and random) times 4,096 of x spread over [1, 2) (stride
    2,047, odd, so every low bit pattern occurs): no misrounded quotient. The uncorrected
    product misrounds some of the same pairs (found by this check: it can fail)."""
    t_bits = sample_t_bits(0, 50, seed=401)
    args = (t_bits, ONE_BITS, 2047, 4, 1024)
    assert int(misrounded(*args).sum()) == 0
    assert int(misrounded(*args, correct=False).sum()) > 0


@cpu_only
def test_reciprocal_applies_exactly_in_its_range():
    """`reciprocal_applies` holds for a block of x at the edges of the range (+-2**-96,
    +-2**96) with t at 2**-24 or 2**24, and fails for one x just outside, 0, +-inf, NaN, or t
    just outside; each block then gives the IEEE quotient bit for bit."""
    low, high = 2.0**-RECIPROCAL_X_RANGE, 2.0**RECIPROCAL_X_RANGE
    edge = torch.tensor([low, -low, high, -high, 1.0, -3.5, 1e20, -1e-20] * 2)
    outside = [float32_after(low, 0.0), -float32_after(high, math.inf), 0.0, -0.0, math.inf, -math.inf, math.nan]
    t_low, t_high = 2.0**-RECIPROCAL_T_RANGE, 2.0**RECIPROCAL_T_RANGE
    rows, ts, applies = [], [], []
    for t in (t_low, t_high, 0.7):
        rows.append(edge)
        ts.append(t)
        applies.append(True)
        for value in outside:
            row = edge.clone()
            row[5] = value
            rows.append(row)
            ts.append(t)
            applies.append(False)
    for t in (float32_after(t_low, 0.0), float32_after(t_high, math.inf)):
        rows.append(edge)
        ts.append(t)
        applies.append(False)
    x, t = torch.stack(rows), torch.tensor(ts)
    fast, fast_applies = quotients(x, t, reciprocal=True)
    ieee, _ = quotients(x, t, reciprocal=False)
    assert fast_applies.tolist() == applies
    assert torch.equal(bits_of(fast), bits_of(ieee))
    # the float64 quotient rounded to float32 is the float32 quotient: 53 >= 2 * 24 + 2 bits, so
    # rounding twice gives the once-rounded result for a division (Figueroa 1995)
    expected = (x.double() / t.double()[:, None]).float()
    expected[expected == 0.0] = 0.0  # the kernels fold -0.0 into +0.0
    assert torch.equal(bits_of(ieee[~x.isnan()]), bits_of(expected[~x.isnan()]))


@cpu_only
def test_reciprocal_division_changes_no_result():
    """`reciprocal_division` on and off: bitwise the same probabilities and row modes (three
    launches: the single launch keeps IEEE division). The rows hold blocks the reciprocal is not proved for (a
    0, a -inf, a tiny logit, the masked tail of the last chunk) and rows with t outside its range,
    which divide as before."""
    from engine.sampling.kernels import probabilities as k

    logits = torch.randn(6, 2900, generator=generator(402)) * 3
    logits[1, 5], logits[2, 100], logits[3, 7] = 0.0, float("-inf"), 1e-35
    t, top_k, p = params([1.0, 0.7, 0.7, 1.3, 1e-9, 3e7], [-1, -1, 5, 30, -1, 400], [1.0, 1.0, 1.0, 0.8, 0.3, 1.0])
    results = []
    for reciprocal in (False, True):
        config = baseline_config(chunk=128, chunk_capacity=16, reciprocal_division=reciprocal, single_launch_entries=0)
        results.append(k.run_probabilities(logits, t, top_k, p, config))
        assert_rows_match(results[-1].probs, logits, t, top_k, p)
    assert torch.equal(results[0].probs, results[1].probs)
    assert torch.equal(results[0].row_mode, results[1].row_mode)


@pytest.mark.parametrize("reciprocal", [False, True])
def test_the_plan_passes_reciprocal_division_to_the_chunk_work(reciprocal):
    """The chunk kernel takes the option; the single launch, the select and the write kernels
    divide as IEEE division does."""
    from engine.sampling.kernels import probabilities as k

    config = dataclasses.replace(k.DEFAULT_CONFIG, reciprocal_division=reciprocal)
    chunk, select, write = k.launch_plan(config, 8, 152064).launches
    (single,) = k.launch_plan(config, 1, 700).launches
    assert dict(chunk.constexprs)["RECIPROCAL"] is reciprocal
    for launch in (single, select, write):
        assert "RECIPROCAL" not in dict(launch.constexprs)


@on_gpu
def test_corrected_quotient_is_ieee_division_for_every_significand_pair():
    """All 2**23 significands of t in [1, 2) times all 2**23 of x in [1, 2): 2**46 quotients, none
    misrounded (the uncorrected product, on the first 2**14 t, misrounds: the check can fail)."""
    t_bits = (ONE_BITS + torch.arange(2**SIGNIFICAND_BITS, device="cuda")).to(torch.int32)
    block = 1024
    steps = 2**SIGNIFICAND_BITS // block
    wrong = sum(int(misrounded(part, ONE_BITS, 1, steps, block).sum()) for part in t_bits.split(2**19))
    assert wrong == 0
    assert int(misrounded(t_bits[: 2**14], ONE_BITS, 1, steps, block, correct=False).sum()) > 0


@on_gpu
@pytest.mark.parametrize("t_exponent", [-RECIPROCAL_T_RANGE, RECIPROCAL_T_RANGE - 1])
@pytest.mark.parametrize("x_exponent", [-RECIPROCAL_X_RANGE, RECIPROCAL_X_RANGE - 1])
@pytest.mark.parametrize("sign", [1, -1])
def test_corrected_quotient_at_the_corners_of_its_range(t_exponent, x_exponent, sign):
    """The corners of the proved range, where a step would under- or overflow first: 65,543
    significands of t at 2**t_exponent times 8,192 of x at +-2**x_exponent (stride 1,023), and
    x = +-2**96 and t = 2**24 exactly, none misrounded."""
    t_bits = torch.cat(
        [
            sample_t_bits(t_exponent, 2**16, seed=403, device="cuda"),
            torch.tensor([float_bits(RECIPROCAL_T_RANGE)], dtype=torch.int32, device="cuda"),
        ]
    )
    x_first = float_bits(x_exponent) + (SIGN_BIT if sign < 0 else 0)
    assert int(misrounded(t_bits, x_first, 1023, 8, 1024).sum()) == 0
    top = float_bits(RECIPROCAL_X_RANGE) + (SIGN_BIT if sign < 0 else 0)
    assert int(misrounded(t_bits, top, 0, 1, 16).sum()) == 0
