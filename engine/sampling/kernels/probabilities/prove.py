"""The cut of a truncating row on its compacted candidates: the top-k and top-p thresholds
(by bisection over an order-preserving key, or by one pairwise pass for a few candidates), the
normaliser, and the scatter of the kept probabilities. Shared by the select stage and the write
stage's split fallback (docs/sampling.md, "The Triton kernel of batched_probabilities", step 2;
measurements: docs/notes/performance-notebook.md, "The select kernel").
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.sampling.kernels.probabilities.common import _key, _unpack_index, _unpack_x
from engine.sampling.kernels.probabilities.config import KEY_MAX, KEY_MIN, PAIR_STEP


@triton.jit
def _kth_key(key, valid, k):
    """Largest t with #(valid and key >= t) >= k: the key of the k-th largest valid x
    (defined when at least k keys are valid; callers check that before using it).

    The answer lies in [lo, hi], the smallest and the largest valid key. Bisection from lo,
    most significant bit first: a trial above hi cannot hold (no key reaches it) and is
    skipped without a block reduction, so keys spanning less than 2**n cost n reductions
    instead of 32. The invariant: ans holds, and answer - ans < 2**(bit + 1) before `bit`.
    Scalars are int64, so no trial overflows; a trial that is tried is <= hi, an int32."""
    lo = tl.min(tl.where(valid, key, KEY_MAX), 0).to(tl.int64)
    hi = tl.max(tl.where(valid, key, KEY_MIN), 0).to(tl.int64)
    ans = lo
    for bit in tl.static_range(31, -1, -1):
        trial = ans + (1 << bit)
        if trial <= hi:
            count = tl.sum((valid & (key >= trial.to(tl.int32))).to(tl.int32), 0)
            ans = tl.where(count >= k, trial, ans)
    return ans.to(tl.int32)


@triton.jit
def _top_p_key(key, mass, target):
    """Smallest key kept by top-p: keep iff the mass with a strictly larger key is < target.

    `mass` is exp(x - m) on the survivors of top-k and 0 elsewhere, and target > 0 is at most
    their total; above(t) = mass with key > t is nonincreasing, so T = max t with
    above(t) >= target exists. With lo and hi the smallest and largest key of positive mass,
    above(lo - 1) is the total (>= target) and above(hi) = 0, so T is in [lo - 1, hi - 1]:
    the bisection of `_kth_key` from lo - 1, skipping trials >= hi. Returns T + 1."""
    lo = tl.min(tl.where(mass > 0.0, key, KEY_MAX), 0).to(tl.int64)
    hi = tl.max(tl.where(mass > 0.0, key, KEY_MIN), 0).to(tl.int64)
    ans = lo - 1
    for bit in tl.static_range(31, -1, -1):
        trial = ans + (1 << bit)
        if trial < hi:
            above = tl.sum(tl.where(key > trial.to(tl.int32), mass, 0.0), 0)
            ans = tl.where(above >= target, trial, ans)
    return (ans + 1).to(tl.int32)


@triton.jit
def _covers_kept(num, mass, z, k, p, use_k):
    """Whether `num` candidates of total `mass` (exp(x - m)), which hold every token at or above
    the row floor, hold every kept token: at least k of them for top-k, else mass >= p * Z."""
    return ((num >= k) & use_k) | ((mass >= p * z) & (use_k == 0))


@triton.jit
def _threshold(x, valid, m, z, k, p, use_k, use_p):
    """(key_lo, norm, covered) on the candidates x[valid], which hold every token x >= F.

    covered: every kept token is among them (>= k of them for top-k, else mass >= p * Z)."""
    key = _key(x)
    e = tl.where(valid, tl.exp(x - m), 0.0)
    covered = _covers_kept(tl.sum(valid.to(tl.int32), 0), tl.sum(e, 0), z, k, p, use_k)
    key_k = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
    z_k = z
    if use_k:
        key_k = _kth_key(key, valid, k)
        z_k = tl.sum(tl.where(key >= key_k, e, 0.0), 0)
    key_lo = key_k
    if use_p:
        key_lo = tl.maximum(key_k, _top_p_key(key, tl.where(key >= key_k, e, 0.0), p * z_k))
    norm = tl.sum(tl.where(key >= key_lo, e, 0.0), 0)
    return key_lo, norm, covered


@triton.jit
def _prove_and_scatter(
    compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT: tl.constexpr, SMALL: tl.constexpr, TINY: tl.constexpr
):
    """(proven, norm): if the `num` packed candidates at compact_ptr fit COMPACT and hold every
    kept token, find the cut on them and scatter the kept probabilities into the zeroed row.
    Rows with at most TINY candidates (TINY > 0) find it without a search (`_prove_tiny`);
    rows with at most SMALL (SMALL > 0) search a SMALL block instead of COMPACT: each block
    reduction of the search then covers fewer slots."""
    if TINY > 0:
        if num <= TINY:
            proven, norm = _prove_tiny(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, TINY)
        else:
            proven, norm = _prove_searched(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT, SMALL)
    else:
        proven, norm = _prove_searched(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT, SMALL)
    return proven, norm


@triton.jit
def _prove_searched(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT: tl.constexpr, SMALL: tl.constexpr):
    """`_prove_and_scatter` by the key searches, on a SMALL block if SMALL > 0 and num fits it,
    else on the COMPACT block."""
    if SMALL > 0:
        if num <= SMALL:
            proven, norm = _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, SMALL)
        else:
            proven, norm = _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT)
    else:
        proven, norm = _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT)
    return proven, norm


@triton.jit
def _prove_tiny(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, TINY: tl.constexpr):
    """`_prove_and_scatter` on num <= TINY candidates, with the cut of `_threshold` but no
    search. Each thread takes a candidate i and writes its (key, exp(x - m)) to the slots
    after the block (a slot past num gets the key of -inf and no mass, below every
    candidate). One pass over those pairs then gives each candidate the number of candidates
    with a key >= its key (count_i) and the mass with a key > its key (above_i), read PAIR_STEP
    pairs a step as scalars, so every thread adds them in slot order. The k-th largest key is
    the largest key with count_i >= k; a candidate at or above it is kept by top-p iff above_i
    < p * Z_k (the bisection's rule: the masses above a candidate at or above the k-th key are
    all at or above it too). above_i only shrinks as key_i grows (the same terms in the same
    order, some zeroed, and rounding is monotone), so the kept set is every key at or above
    the smallest kept one. Three or four block reductions, against the ~50 dependent ones of
    the searches; the pass costs a few instructions per thread per candidate."""
    i = tl.arange(0, TINY)
    valid = i < num
    packed = tl.load(compact_ptr + i, mask=valid, other=0)
    x = tl.where(valid, _unpack_x(packed), float("-inf"))
    key = _key(x)
    e = tl.where(valid, tl.exp(x - m), 0.0)
    pairs = compact_ptr + TINY  # slots [TINY, 2 * TINY) of the row's COMPACT >= 2 * TINY
    tl.store(pairs + i, (key.to(tl.int64) << 32) | e.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)
    tl.debug_barrier()  # every pair lands before any thread reads it
    count = tl.zeros([TINY], tl.int32)
    above = tl.zeros([TINY], tl.float32)
    for first in range(0, num, PAIR_STEP):  # pairs up to num rounded up: all written
        for step in tl.static_range(PAIR_STEP):
            pair = tl.load(pairs + first + step)
            key_j = (pair >> 32).to(tl.int32)
            count += (key_j >= key).to(tl.int32)
            above += tl.where(key_j > key, pair.to(tl.int32).to(tl.float32, bitcast=True), 0.0)
    key_k = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
    z_k = z
    if use_k:
        key_k = tl.max(tl.where(valid & (count >= k), key, KEY_MIN), 0)
        z_k = tl.sum(tl.where(key >= key_k, e, 0.0), 0)
    keep = valid & (key >= key_k)
    if use_p:
        keep = keep & (above < p * z_k)
    norm = tl.sum(tl.where(keep, e, 0.0), 0)
    covered = _covers_kept(num, tl.sum(e, 0), z, k, p, use_k)
    if covered:
        tl.store(out_row + _unpack_index(packed), tl.exp(x - m) / norm, mask=keep)
    return covered, norm


@triton.jit
def _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT: tl.constexpr):
    """`_prove_and_scatter` on a block of COMPACT slots."""
    i = tl.arange(0, COMPACT)
    valid = i < num
    packed = tl.load(compact_ptr + i, mask=valid, other=0)
    x = tl.where(valid, _unpack_x(packed), float("-inf"))
    key_lo, norm, covered = _threshold(x, valid, m, z, k, p, use_k, use_p)
    proven = covered & (num <= COMPACT)
    if proven:
        keep = valid & (_key(x) >= key_lo)
        tl.store(out_row + _unpack_index(packed), tl.exp(x - m) / norm, mask=keep)
    return proven, norm
