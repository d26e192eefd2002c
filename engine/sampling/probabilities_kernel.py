"""Triton backend of `batched_probabilities`: one program per row, sort-free.

Per random row with top-k or top-p (x = logits / T, decided on float32 x):
  A. one pass: row max m and Z = sum exp(x - m) (online), and the row mean;
  B. one pass: counts (and, for top-p-only rows, masses) of x >= m - d_i at NUM_PIVOTS pivots
     spaced geometrically by the row's spread m - mean; the highest pivot that provably holds
     every kept token (count >= k, or mass >= (p + MASS_MARGIN) * Z) is chosen;
  C. one pass: the tokens at or above that pivot are compacted into a per-row scratch buffer of
     `candidate_capacity` slots (x and index);
  then an exact radix search over the candidates finds one key threshold (keep iff
  key(x) >= threshold, key = order-preserving uint32 image of x), and the output row is
  zero-filled and the kept probabilities scattered. Total traffic: three reads and one write.
If no pivot qualifies or the candidates do not fit (k > capacity, flat rows with large p),
the same radix search runs over the whole row instead (exact, slower: ~66 passes).
Greedy rows (T == 0) take one argmax pass over the raw logits; rows without truncation one
stats pass and the output pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 2048  # vocabulary entries per loop step
NUM_WARPS = 8
NUM_PIVOTS = 16
CANDIDATE_CAPACITY = 2048  # default scratch slots per row (a power of two)
MASS_MARGIN = 1e-3  # top-p coverage needs this much mass beyond p, against rounding
KEY_BITS = 32


@triton.jit
def _scaled(ptr, offs, mask, temperature):
    """float32 x = logits / T (IEEE division), with -0.0 folded into +0.0; -inf if masked."""
    x = tl.load(ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
    x = tl.math.div_rn(x, tl.zeros_like(x) + temperature)
    return tl.where(x == 0.0, 0.0, x)


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
        x = _scaled(src, offs, mask, temperature)
        total += tl.sum((mask & (_key(x) >= key_lo)).to(tl.int32), 0)
    return total


@triton.jit
def _mass_from(src, n, temperature, m, key_lo, BLOCK: tl.constexpr):
    """Sum of exp(x - m) over x with key(x) >= key_lo among src[0:n] (float32)."""
    total = tl.zeros([1], tl.float32).sum(0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = _scaled(src, offs, mask, temperature)
        total += tl.sum(tl.where(mask & (_key(x) >= key_lo), tl.exp(x - m), 0.0), 0)
    return total


@triton.jit
def _kth_key(src, n, temperature, k, BLOCK: tl.constexpr, KEY_BITS: tl.constexpr):
    """Largest key t with count(key >= t) >= k: the key of the k-th largest x."""
    ans = tl.zeros([1], tl.int64).sum(0)
    one = ans + 1
    for i in range(KEY_BITS):
        trial = ans | (one << (KEY_BITS - 1 - i))
        ans = tl.where(_count_from(src, n, temperature, trial, BLOCK) >= k, trial, ans)
    return ans


@triton.jit
def _top_p_key(src, n, temperature, m, key_k, target, BLOCK: tl.constexpr,
               KEY_BITS: tl.constexpr):
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
def _threshold(src, n, temperature, m, z, k, p, use_k, use_p, BLOCK: tl.constexpr,
               KEY_BITS: tl.constexpr):
    """(key threshold, normaliser): keep iff key(x) >= threshold; probs = exp(x - m) / norm."""
    key_k = tl.zeros([1], tl.int64).sum(0)
    z_k = z
    if use_k:
        key_k = _kth_key(src, n, temperature, k, BLOCK, KEY_BITS)
        z_k = _mass_from(src, n, temperature, m, key_k, BLOCK)
    key_lo = key_k
    if use_p:
        key_lo = tl.maximum(
            key_k, _top_p_key(src, n, temperature, m, key_k, p * z_k, BLOCK, KEY_BITS)
        )
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
        x = _scaled(row_ptr, offs, mask, temperature)
        m_new = tl.maximum(m, tl.max(x, 0))
        z = z * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        s += tl.sum(tl.where(mask, x, 0.0), 0)
        m = m_new
    return m, z, s / V


@triton.jit
def _pick_pivot(row_ptr, V, temperature, m, z, mean, k, p, use_k, MASS_MARGIN: tl.constexpr,
                BLOCK: tl.constexpr, NUM_PIVOTS: tl.constexpr):
    """(pivot, count of x >= pivot, found): the highest pivot that holds every kept token."""
    i = tl.arange(0, NUM_PIVOTS)
    spread = m - mean
    pivots = m - spread * tl.exp2((i - (NUM_PIVOTS - 4)).to(tl.float32) * 0.5)  # [P]
    counts = tl.zeros([NUM_PIVOTS], tl.int32)
    masses = tl.zeros([NUM_PIVOTS], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = _scaled(row_ptr, offs, offs < V, temperature)
        at_least = x[:, None] >= pivots[None, :]  # [BLOCK, P]
        counts += tl.sum(at_least.to(tl.int32), 0)
        if not use_k:
            masses += tl.sum(tl.where(at_least, tl.exp(x - m)[:, None], 0.0), 0)
    covers = tl.where(use_k, counts >= k, masses >= (p + MASS_MARGIN) * z)
    best = tl.min(tl.where(covers, i, NUM_PIVOTS), 0)
    pivot = tl.sum(tl.where(i == best, pivots, 0.0), 0)
    count = tl.sum(tl.where(i == best, counts, 0), 0)
    return pivot, count, best < NUM_PIVOTS


@triton.jit
def _compact(row_ptr, V, temperature, pivot, val_ptr, idx_ptr, BLOCK: tl.constexpr):
    """Write every x >= pivot and its index to the scratch row, in vocabulary order."""
    base = tl.zeros([1], tl.int32).sum(0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = _scaled(row_ptr, offs, mask, temperature)
        take = mask & (x >= pivot)
        slot = base + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(val_ptr + slot, x, mask=take)
        tl.store(idx_ptr + slot, offs, mask=take)
        base += tl.sum(take.to(tl.int32), 0)


@triton.jit
def _write_greedy(row_ptr, out_ptr, V, BLOCK: tl.constexpr):
    """One-hot row at the first index of the maximum of the raw logits."""
    best = tl.full([1], float("-inf"), tl.float32).max(0)
    best_idx = tl.zeros([1], tl.int32).max(0)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        block_max = tl.max(x, 0)
        take = block_max > best  # strict: an earlier block wins ties
        best_idx = tl.where(take, start + tl.argmax(x, 0, tie_break_left=True), best_idx)
        best = tl.where(take, block_max, best)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.where(offs == best_idx, 1.0, 0.0), mask=offs < V)


@triton.jit
def _write_dense(row_ptr, out_ptr, V, temperature, m, key_lo, norm, BLOCK: tl.constexpr):
    """Output pass over the row: exp(x - m) / norm where key(x) >= key_lo, else 0."""
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = _scaled(row_ptr, offs, mask, temperature)
        probs = tl.where(_key(x) >= key_lo, tl.exp(x - m) / norm, 0.0)
        tl.store(out_ptr + offs, probs, mask=mask)


@triton.jit
def _write_sparse(out_ptr, V, val_ptr, idx_ptr, n, m, key_lo, norm, BLOCK: tl.constexpr,
                  CAPACITY: tl.constexpr):
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
def _probabilities_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32
    val_ptr,  # [B, CAPACITY] float32 scratch
    idx_ptr,  # [B, CAPACITY] int32 scratch
    V,
    BLOCK: tl.constexpr,
    CAPACITY: tl.constexpr,
    NUM_PIVOTS: tl.constexpr,
    MASS_MARGIN: tl.constexpr,
    KEY_BITS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * V
    out_row = out_ptr + row * V
    t = tl.load(temperature_ptr + row)
    if t == 0.0:
        _write_greedy(row_ptr, out_row, V, BLOCK)
    else:
        k = tl.load(top_k_ptr + row).to(tl.int32)
        p = tl.load(top_p_ptr + row)
        use_k = (k > 0) & (k < V)
        use_p = p < 1.0
        m, z, mean = _row_stats(row_ptr, V, t, BLOCK)
        sparse = use_k & (k < 0)  # False, typed like the flags
        key_lo = tl.zeros([1], tl.int64).sum(0)
        norm = z
        n = tl.zeros([1], tl.int32).sum(0)
        if use_k | use_p:
            pivot, n, found = _pick_pivot(row_ptr, V, t, m, z, mean, k, p, use_k, MASS_MARGIN,
                                          BLOCK, NUM_PIVOTS)
            sparse = found & (n <= CAPACITY)
            if sparse:
                vals, idxs = val_ptr + row * CAPACITY, idx_ptr + row * CAPACITY
                _compact(row_ptr, V, t, pivot, vals, idxs, BLOCK)
                tl.debug_barrier()  # the scratch row is complete before it is read
                key_lo, norm = _threshold(vals, n, 1.0, m, z, k, p, use_k, use_p, CAPACITY,
                                          KEY_BITS)
            else:
                key_lo, norm = _threshold(row_ptr, V, t, m, z, k, p, use_k, use_p, BLOCK,
                                          KEY_BITS)
        if sparse:
            _write_sparse(out_row, V, val_ptr + row * CAPACITY, idx_ptr + row * CAPACITY, n, m,
                          key_lo, norm, BLOCK, CAPACITY)
        else:
            _write_dense(row_ptr, out_row, V, t, m, key_lo, norm, BLOCK)


def probabilities_triton(
    logits, temperature, top_k, top_p, *, candidate_capacity: int = CANDIDATE_CAPACITY,
    block: int = BLOCK_V,
) -> torch.Tensor:
    """Launch one program per row; arguments were validated by `batched_probabilities`.

    `candidate_capacity` (a power of two) bounds the scratch rows; tests make it small to
    exercise the whole-row fallback. `block` is the vocabulary step of each pass.
    """
    num_rows, vocab = logits.shape
    dev = logits.device
    out = torch.empty((num_rows, vocab), dtype=torch.float32, device=dev)
    vals = torch.empty((num_rows, candidate_capacity), dtype=torch.float32, device=dev)
    idxs = torch.empty((num_rows, candidate_capacity), dtype=torch.int32, device=dev)
    if num_rows > 0:
        _probabilities_kernel[(num_rows,)](
            logits, temperature, top_k, top_p, out, vals, idxs, vocab,
            BLOCK=block, CAPACITY=candidate_capacity, NUM_PIVOTS=NUM_PIVOTS,
            MASS_MARGIN=MASS_MARGIN, KEY_BITS=KEY_BITS, num_warps=NUM_WARPS,
        )
    return out
