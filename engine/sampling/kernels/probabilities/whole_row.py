"""The whole-row kernel of `batched_probabilities`: one program handles one row.

This is the last, exact fallback of the chunked kernels (`kernels.probabilities`) for the rows
whose top-k / top-p cut neither its per-chunk candidates nor its split pivots can prove to hold
(k larger than the compact buffer, very flat rows with a large p, NaN or +inf logits). It runs
inside the write kernel (`write.py`), on the row's last program to finish, for random rows only
(temperature > 0, with top-k or top-p). docs/sampling.md describes it.

Per row (x = logits / T, decided on float32 x):
  A. one pass: row max m and Z = sum exp(x - m) (online), and the row mean;
  B. one pass: counts (and, for top-p-only rows, masses) of x >= m - d_i at NUM_PIVOTS pivots
     spaced geometrically by the row's spread m - mean; the highest pivot that provably holds
     every kept token (count >= k, or mass >= (p + MASS_MARGIN) * Z) is chosen;
  C. one pass: the tokens at or above that pivot are compacted into a per-row scratch buffer of
     `CAPACITY` slots (x and index);
then an exact radix search over the candidates finds one key threshold (keep iff
key(x) >= threshold, key = order-preserving uint32 image of x), and the output row is
zero-filled and the kept probabilities scattered. If no pivot qualifies or the candidates do
not fit, the same radix search runs over the whole row (exact, slow: ~66 passes).
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.sampling.kernels.probabilities.division import scaled_logits

NUM_PIVOTS = tl.constexpr(16)
MASS_MARGIN = tl.constexpr(1e-3)  # top-p coverage needs this much mass beyond p, against rounding
KEY_BITS = tl.constexpr(32)


@triton.jit
def _key(x):
    """int64 image of float32 x in [0, 2**32) whose order is the order of x."""
    bits = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return tl.where(bits >= 0x80000000, 0xFFFFFFFF - bits, bits + 0x80000000)


@triton.jit
def _count_from(src, n, temperature, key_lo, BLOCK: tl.constexpr):
    """Number of x with key(x) >= key_lo among src[0:n]."""
    total = tl.zeros([1], tl.int32).sum(0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = scaled_logits(src, offs, mask, temperature)
        total += tl.sum((mask & (_key(x) >= key_lo)).to(tl.int32), 0)
    return total


@triton.jit
def _mass_from(src, n, temperature, m, key_lo, BLOCK: tl.constexpr):
    """Sum of exp(x - m) over x with key(x) >= key_lo among src[0:n] (float32)."""
    total = tl.zeros([1], tl.float32).sum(0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = scaled_logits(src, offs, mask, temperature)
        total += tl.sum(tl.where(mask & (_key(x) >= key_lo), tl.exp(x - m), 0.0), 0)
    return total


@triton.jit
def _kth_key(src, n, temperature, k, BLOCK: tl.constexpr):
    """Largest key t with count(key >= t) >= k: the key of the k-th largest x."""
    ans = tl.zeros([1], tl.int64).sum(0)
    one = ans + 1
    for i in range(KEY_BITS):
        trial = ans | (one << (KEY_BITS - 1 - i))
        ans = tl.where(_count_from(src, n, temperature, trial, BLOCK) >= k, trial, ans)
    return ans


@triton.jit
def _top_p_key(src, n, temperature, m, key_k, target, BLOCK: tl.constexpr):
    """Smallest key kept by top-p: keep x iff the mass of survivors with larger key < target."""
    # f(t) = mass of survivors with key > t, nonincreasing; find T = max t with f(t) >= target
    ans = tl.zeros([1], tl.int64).sum(0)
    one = ans + 1
    for i in range(KEY_BITS):
        trial = ans | (one << (KEY_BITS - 1 - i))
        above = _mass_from(src, n, temperature, m, tl.maximum(trial + 1, key_k), BLOCK)
        ans = tl.where(above >= target, trial, ans)
    keeps_all = _mass_from(src, n, temperature, m, tl.maximum(key_k, 1), BLOCK) < target
    return tl.where(keeps_all, 0, ans + 1)


@triton.jit
def _threshold(src, n, temperature, m, z, k, p, use_k, use_p, BLOCK: tl.constexpr):
    """(key threshold, normaliser): keep iff key(x) >= threshold; probs = exp(x - m) / norm."""
    key_k = tl.zeros([1], tl.int64).sum(0)
    z_k = z
    if use_k:
        key_k = _kth_key(src, n, temperature, k, BLOCK)
        z_k = _mass_from(src, n, temperature, m, key_k, BLOCK)
    key_lo = key_k
    if use_p:
        key_lo = tl.maximum(key_k, _top_p_key(src, n, temperature, m, key_k, p * z_k, BLOCK))
    return key_lo, _mass_from(src, n, temperature, m, key_lo, BLOCK)


@triton.jit
def _row_stats(row_ptr, V, temperature, BLOCK: tl.constexpr):
    """(max, sum exp(x - max), mean) of x over the row, in one online pass."""
    m = tl.full([1], float("-inf"), tl.float32).max(0)
    z = tl.zeros([1], tl.float32).sum(0)
    s = tl.zeros([1], tl.float32).sum(0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = scaled_logits(row_ptr, offs, mask, temperature)
        m_new = tl.maximum(m, tl.max(x, 0))
        z = z * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        s += tl.sum(tl.where(mask, x, 0.0), 0)
        m = m_new
    return m, z, s / V


@triton.jit
def _pick_pivot(row_ptr, V, temperature, m, z, mean, k, p, use_k, BLOCK: tl.constexpr):
    """(pivot, count of x >= pivot, found): the highest pivot that holds every kept token."""
    i = tl.arange(0, NUM_PIVOTS)
    spread = m - mean
    pivots = m - spread * tl.exp2((i - (NUM_PIVOTS - 4)).to(tl.float32) * 0.5)  # [P]
    counts = tl.zeros([NUM_PIVOTS], tl.int32)
    masses = tl.zeros([NUM_PIVOTS], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_row = offs < V
        x = scaled_logits(row_ptr, offs, in_row, temperature)
        # lanes past V read as -inf: they must not count, or a -inf pivot (a row holding -inf
        # logits has mean -inf) would count more slots than `_compact` writes
        at_least = (x[:, None] >= pivots[None, :]) & in_row[:, None]  # [BLOCK, P]
        counts += tl.sum(at_least.to(tl.int32), 0)
        if not use_k:
            masses += tl.sum(tl.where(at_least, tl.exp(x - m)[:, None], 0.0), 0)
    covers = tl.where(use_k, counts >= k, masses >= (p + MASS_MARGIN) * z)
    best = tl.min(tl.where(covers, i, NUM_PIVOTS), 0)
    pivot = tl.sum(tl.where(i == best, pivots, 0.0), 0)
    count = tl.sum(tl.where(i == best, counts, 0), 0)
    return pivot, count, best < NUM_PIVOTS


@triton.jit
def take_at_least(row_ptr, V, temperature, start, pivot, base, BLOCK: tl.constexpr):
    """One step of compacting a row's x >= pivot in vocabulary order: for entries
    [start, start + BLOCK), (x, index, taken, slot = base + rank among the taken, next base)."""
    offs = start + tl.arange(0, BLOCK)
    mask = offs < V
    x = scaled_logits(row_ptr, offs, mask, temperature)
    take = mask & (x >= pivot)
    slot = base + tl.cumsum(take.to(tl.int32), 0) - 1
    return x, offs, take, slot, base + tl.sum(take.to(tl.int32), 0)


@triton.jit
def _compact(row_ptr, V, temperature, pivot, val_ptr, idx_ptr, BLOCK: tl.constexpr):
    """Write every x >= pivot and its index to the scratch row, in vocabulary order."""
    base = tl.zeros([1], tl.int32).sum(0)
    for start in range(0, V, BLOCK):
        x, offs, take, slot, base = take_at_least(row_ptr, V, temperature, start, pivot, base, BLOCK)
        tl.store(val_ptr + slot, x, mask=take)
        tl.store(idx_ptr + slot, offs, mask=take)


@triton.jit
def _write_dense(row_ptr, out_ptr, V, temperature, m, key_lo, norm, BLOCK: tl.constexpr):
    """Output pass over the row: exp(x - m) / norm where key(x) >= key_lo, else 0."""
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = scaled_logits(row_ptr, offs, mask, temperature)
        probs = tl.where(_key(x) >= key_lo, tl.exp(x - m) / norm, 0.0)
        tl.store(out_ptr + offs, probs, mask=mask)


@triton.jit
def _write_sparse(out_ptr, V, val_ptr, idx_ptr, n, m, key_lo, norm, BLOCK: tl.constexpr, CAPACITY: tl.constexpr):
    """Zero the row, then scatter the kept candidates' probabilities."""
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < V)
    tl.debug_barrier()  # the zeros land before the scatter (same addresses, other threads)
    slot = tl.arange(0, CAPACITY)
    x = tl.load(val_ptr + slot, mask=slot < n, other=float("-inf"))
    idx = tl.load(idx_ptr + slot, mask=slot < n, other=0)
    keep = (slot < n) & (_key(x) >= key_lo)
    tl.store(out_ptr + idx, tl.exp(x - m) / norm, mask=keep)


@triton.jit
def write_row(row_ptr, out_row, V, t, k, p, val_ptr, idx_ptr, BLOCK: tl.constexpr, CAPACITY: tl.constexpr):
    """Write the probabilities of one random row with top-k (k in [1, V)) and/or top-p (< 1).

    `val_ptr` / `idx_ptr` point to this row's CAPACITY scratch slots. Exact for any row.
    """
    use_k = (k > 0) & (k < V)
    m, z, mean = _row_stats(row_ptr, V, t, BLOCK)
    pivot, n, found = _pick_pivot(row_ptr, V, t, m, z, mean, k, p, use_k, BLOCK)
    if found & (n <= CAPACITY):
        _compact(row_ptr, V, t, pivot, val_ptr, idx_ptr, BLOCK)
        tl.debug_barrier()  # the scratch row is complete before it is read
        key_lo, norm = _threshold(val_ptr, n, 1.0, m, z, k, p, use_k, p < 1.0, CAPACITY)
        _write_sparse(out_row, V, val_ptr, idx_ptr, n, m, key_lo, norm, BLOCK, CAPACITY)
    else:
        key_lo, norm = _threshold(row_ptr, V, t, m, z, k, p, use_k, p < 1.0, BLOCK)
        _write_dense(row_ptr, out_row, V, t, m, key_lo, norm, BLOCK)
