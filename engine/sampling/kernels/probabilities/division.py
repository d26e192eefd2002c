"""x = logits / T for the probabilities kernels: the IEEE quotient, by division or by the row's
reciprocal with one correction (docs/sampling.md, "The scaled logits"; the reciprocal's
measurements: docs/notes/performance-notebook.md). Used by the chunk, write and whole-row stages.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The quotient by a row's reciprocal (`scaled_logits(..., RECIPROCAL=True)`) is the IEEE quotient
# RN(x / T) for 2**-T_RANGE <= T <= 2**T_RANGE and 2**-X_RANGE <= |x| <= 2**X_RANGE, where no
# step under- or overflows (docs/sampling.md, "The scaled logits"); a block holding any other x
# (0, +-inf, NaN, masked entries) or a row with another T divides as IEEE division does.
RECIPROCAL_T_RANGE, RECIPROCAL_X_RANGE = 24, 96
RECIPROCAL_T_MIN = tl.constexpr(2.0**-RECIPROCAL_T_RANGE)
RECIPROCAL_T_MAX = tl.constexpr(2.0**RECIPROCAL_T_RANGE)
# |x| in range iff its bits (sign cleared) minus those of 2**-X_RANGE, as uint32, are at most
# the bits' span from 2**-X_RANGE to 2**X_RANGE (a power of two's bits: (127 + e) << 23)
X_RANGE_LOW_BITS = tl.constexpr((127 - RECIPROCAL_X_RANGE) << 23)
X_RANGE_SPAN_BITS = tl.constexpr((2 * RECIPROCAL_X_RANGE) << 23)


@triton.jit
def scaled_logits(ptr, offs, mask, temperature, RECIPROCAL: tl.constexpr = False):
    """float32 x = logits / T, correctly rounded (the IEEE quotient), with -0.0 folded into
    +0.0; -inf if masked. RECIPROCAL: by the row's reciprocal and one correction
    (`reciprocal_quotient`): the same values, three instructions per entry instead of
    about ten."""
    x = tl.load(ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
    if RECIPROCAL:
        return reciprocal_quotient(x, temperature)
    return ieee_quotient(x, temperature)


@triton.jit
def ieee_quotient(x, t):
    """x / t by IEEE division (div.rn), -0.0 folded into +0.0."""
    q = tl.math.div_rn(x, tl.zeros_like(x) + t)
    return tl.where(q == 0.0, 0.0, q)


@triton.jit
def reciprocal_quotient(x, t):
    """The IEEE quotient x / t (as `ieee_quotient`) from y = RN(1 / t), one division per block:
    q = RN(x y), then Markstein's correction q' = RN(q + RN(x - q t) y), two FMAs. For
    2**-24 <= t <= 2**24 and 2**-96 <= |x| <= 2**96 (RECIPROCAL_T_RANGE, RECIPROCAL_X_RANGE),
    q' = RN(x / t): every step scales with the exponents of x and t there, and the check of
    every pair of float32 significands (test_division.py of tests/engine/sampling/kernels/
    probabilities) found no exception. No such x is 0, so no fold is needed. Any other x in the
    block (NaN included: its bits exceed the span), or another t, and the block takes
    `ieee_quotient`."""
    q = corrected_quotient(x, t, tl.math.div_rn(tl.full([], 1.0, tl.float32), t))
    if ~reciprocal_applies(x, t):
        q = ieee_quotient(x, t)
    return q


@triton.jit
def reciprocal_applies(x, t):
    """Whether `corrected_quotient` is proved for the block x and its row's t (a scalar):
    2**-24 <= t <= 2**24 and 2**-96 <= |x| <= 2**96 for every x (NaN is not: its bits exceed
    the span)."""
    offset = (x.to(tl.uint32, bitcast=True) & 0x7FFFFFFF) - X_RANGE_LOW_BITS  # wraps below
    return (t >= RECIPROCAL_T_MIN) & (t <= RECIPROCAL_T_MAX) & (tl.max(offset, 0) <= X_RANGE_SPAN_BITS)


@triton.jit
def corrected_quotient(x, t, y):
    """RN(x y) corrected once: RN(q + RN(x - q t) y), q = RN(x y) (Markstein). With y = RN(1 / t)
    it is RN(x / t) wherever `reciprocal_quotient` takes it."""
    q = x * y
    return tl.fma(tl.fma(-q, t, x), y, q)
