"""Stage 1 of the probabilities kernels: `_chunk_kernel`, one program per (row, chunk).

x = logits / T, the chunk's max, sum exp(x - max) and (greedy rows) first argmax; greedy and
truncating rows zero their chunk of the output, and truncating rows store every x at or above
the chunk's floor as a candidate (docs/sampling.md, "The Triton kernel of
batched_probabilities", step 1; measurements: docs/notes/performance-notebook.md). `_chunk_work` is also the
first step of the single launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.sampling.kernels.launch_overlap import launch_dependents
from engine.sampling.kernels.probabilities.common import _pack, _pivot
from engine.sampling.kernels.probabilities.config import (
    CHUNK_ARGMAX,
    CHUNK_COUNT,
    CHUNK_FLOOR,
    CHUNK_MAX,
    CHUNK_MEAN,
    CHUNK_SUM,
    FLT_MAX,
    LOG2_E,
    NUM_LEVELS_LOG2,
    SCAN_ROW,
)
from engine.sampling.kernels.probabilities.division import scaled_logits


@triton.jit
def _count_at_least(x, pivot):
    return tl.sum((x >= pivot).to(tl.int32), 0)


@triton.jit
def _searched_floor(x, m, CAPACITY: tl.constexpr):
    """The lowest pivot level whose count fits CAPACITY (+inf if even the max ties do not)."""
    finite = x > float("-inf")
    num_finite = tl.sum(finite.to(tl.int32), 0)
    mean = tl.sum(tl.where(finite, x, 0.0), 0) / tl.maximum(num_finite, 1).to(tl.float32)
    spread = tl.where(num_finite > 0, m - mean, 0.0)
    level = tl.zeros([1], tl.int32).sum(0)
    fits = _count_at_least(x, _pivot(m, spread, level)) <= CAPACITY
    for bit in tl.static_range(NUM_LEVELS_LOG2 - 1, -1, -1):
        trial = level + (1 << bit)
        fits_trial = _count_at_least(x, _pivot(m, spread, trial)) <= CAPACITY
        level = tl.where(fits_trial, trial, level)
    floor = _pivot(m, spread, level)
    return tl.where(fits & (floor == floor), floor, float("inf"))  # NaN (inf logits): none


@triton.jit
def _quick_floor(x, m, sigmas):
    """(floor, mean): mean + sigmas * std of the finite x, clamped to [-FLT_MAX, m] (+inf if
    NaN), and their mean.

    Moments are taken of d = m - x >= 0, which keeps the variance free of cancellation."""
    finite = x > float("-inf")
    n = tl.maximum(tl.sum(finite.to(tl.int32), 0), 1).to(tl.float32)
    d = tl.where(finite, m - x, 0.0)
    mean_d = tl.sum(d, 0) / n
    var_d = tl.maximum(tl.sum(d * d, 0) / n - mean_d * mean_d, 0.0)
    floor = tl.maximum(m - tl.maximum(mean_d - sigmas * tl.sqrt(var_d), 0.0), -FLT_MAX)
    return tl.where(floor == floor, floor, float("inf")), m - mean_d


@triton.jit
def _store_taken(x, offs, take, cand_ptr, CAPACITY: tl.constexpr, EVICTION: tl.constexpr):
    """Store the taken x (packed with their index) at cand_ptr[0:CAPACITY], in index order.

    A taken entry's slot is the number of taken entries before it. The [N] block is scanned as
    [N / SCAN_ROW, SCAN_ROW] (a free reshape: a thread's consecutive entries form a row): a scan
    along each row in registers plus one scan of the row totals. One 1-D scan over N costs about
    6x the instructions (benchmarks/sass_lines.py, docs/notes/performance-notebook.md); the slots are the same."""
    n: tl.constexpr = x.shape[0]
    shape: tl.constexpr = (n // SCAN_ROW, SCAN_ROW)
    take = tl.reshape(take.to(tl.int32), shape)
    rows = tl.sum(take, 1)
    pos = (tl.cumsum(rows, 0) - rows)[:, None] + tl.cumsum(take, 1) - 1
    packed = _pack(tl.reshape(x, shape), tl.reshape(offs, shape))
    tl.store(cand_ptr + pos, packed, mask=(take != 0) & (pos < CAPACITY), eviction_policy=EVICTION)


@triton.jit
def _keep_candidates(
    x,
    offs,
    m,
    sigmas,
    cand_ptr,
    floor_ptr,
    mean_ptr,
    count_ptr,
    CAPACITY: tl.constexpr,
    KEEP_ALL: tl.constexpr,
    EVICTION: tl.constexpr,
):
    """Store every x >= the chunk floor (packed with its index), then the floor, the mean of
    the finite x (m for KEEP_ALL: its rows need no split fallback) and the count.
    KEEP_ALL (the chunk is the whole row and has a slot per entry): the floor is -FLT_MAX, so
    every finite x is a candidate and no top-k or top-p row needs the fallback, unless the
    chunk holds NaN or +inf (floor +inf: no candidates, the exact fallback decides)."""
    if KEEP_ALL:
        bad = tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 0) > 0
        floor = tl.where(bad, float("inf"), -FLT_MAX)
        num_taken = _count_at_least(x, floor)
        mean = m
    else:
        floor, mean = _quick_floor(x, m, sigmas)
        num_taken = _count_at_least(x, floor)
        if num_taken > CAPACITY:  # a heavy upper tail: search the pivot levels
            floor = _searched_floor(x, m, CAPACITY)
            num_taken = _count_at_least(x, floor)
    complete = num_taken <= CAPACITY  # holds by construction; never overflow the slots
    _store_taken(x, offs, x >= floor, cand_ptr, CAPACITY, EVICTION)
    tl.store(floor_ptr, tl.where(complete, floor, float("inf")), eviction_policy=EVICTION)
    tl.store(mean_ptr, mean, eviction_policy=EVICTION)
    tl.store(count_ptr, tl.where(complete, num_taken, 0), eviction_policy=EVICTION)


@triton.jit
def _chunk_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out: zeros in greedy and truncating rows
    chunk_f32_ptr,  # [4, B * S] float32: max, sum exp(x - max), candidate floor, finite mean
    chunk_i32_ptr,  # [2, B * S] int32: first argmax (greedy rows), candidate count
    cand_ptr,  # [B * S, CAPACITY] int64: packed candidates (x, vocabulary index)
    V,
    NUM_CHUNKS,
    pivot_sigmas,  # float32: z of the quick floor
    wide_sigmas,  # float32: z of the quick floor of rows with k > wide_k (a lower floor)
    wide_k,  # int: rows with a larger top-k aim at the wide share of candidates
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
    KEEP_ALL: tl.constexpr,
    HOIST: tl.constexpr,  # see _chunk_work
    FTZ_SUM: tl.constexpr,  # the chunk sums' exp flushes to zero (_exp_sum; CUDA only)
    EVICTION: tl.constexpr,  # L2 policy of the statistics and candidates ("" or "evict_last")
    RECIPROCAL: tl.constexpr,  # x / T by the row's reciprocal (scaled_logits)
    PDL: tl.constexpr,  # let the select kernel start once every program is done
):
    _chunk_work(
        logits_ptr,
        temperature_ptr,
        top_k_ptr,
        top_p_ptr,
        out_ptr,
        chunk_f32_ptr,
        chunk_i32_ptr,
        cand_ptr,
        V,
        NUM_CHUNKS,
        pivot_sigmas,
        wide_sigmas,
        wide_k,
        tl.program_id(0).to(tl.int64),
        tl.program_id(1),
        CHUNK,
        CAPACITY,
        KEEP_ALL,
        HOIST,
        FTZ_SUM,
        EVICTION,
        RECIPROCAL,
    )
    if PDL:
        launch_dependents()


@triton.jit
def _chunk_work(
    logits_ptr,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    out_ptr,
    chunk_f32_ptr,
    chunk_i32_ptr,
    cand_ptr,
    V,
    NUM_CHUNKS,
    pivot_sigmas,
    wide_sigmas,
    wide_k,
    row,
    chunk,
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
    KEEP_ALL: tl.constexpr,
    HOIST: tl.constexpr,
    FTZ_SUM: tl.constexpr,
    EVICTION: tl.constexpr,
    RECIPROCAL: tl.constexpr,
):
    """The work of one (row, chunk) program of `_chunk_kernel` (also run by `_single_kernel`).
    HOIST: the row's k and p are loaded with T and the logits, before any of them is used, so
    their latencies overlap (else where they are first needed, after the chunk sum)."""
    num_slots = tl.num_programs(0).to(tl.int64) * NUM_CHUNKS
    slot = row * NUM_CHUNKS + chunk
    t = tl.load(temperature_ptr + row)
    if HOIST:
        k = tl.load(top_k_ptr + row)
        p = tl.load(top_p_ptr + row)
    is_greedy = t == 0.0
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    x = scaled_logits(logits_ptr + row * V, offs, mask, tl.where(is_greedy, 1.0, t), RECIPROCAL)
    m = tl.max(x, 0)
    tl.store(chunk_f32_ptr + CHUNK_MAX * num_slots + slot, m, eviction_policy=EVICTION)
    zeros = tl.zeros([CHUNK], tl.float32)
    if is_greedy:
        arg = chunk * CHUNK + tl.argmax(x, 0, tie_break_left=True)
        tl.store(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + slot, arg)
        tl.store(out_ptr + row * V + offs, zeros, mask=mask)
    else:
        z = _exp_sum(x, m, FTZ_SUM)
        tl.store(chunk_f32_ptr + CHUNK_SUM * num_slots + slot, z, eviction_policy=EVICTION)
        if not HOIST:
            k = tl.load(top_k_ptr + row)
        use_k = (k > 0) & (k < V)
        if not HOIST:
            p = tl.load(top_p_ptr + row)
        if use_k | (p < 1.0):
            tl.store(out_ptr + row * V + offs, zeros, mask=mask)
            sigmas = tl.where(use_k & (k > wide_k), wide_sigmas, pivot_sigmas)
            _keep_candidates(
                x,
                offs,
                m,
                sigmas,
                cand_ptr + slot * CAPACITY,
                chunk_f32_ptr + CHUNK_FLOOR * num_slots + slot,
                chunk_f32_ptr + CHUNK_MEAN * num_slots + slot,
                chunk_i32_ptr + CHUNK_COUNT * num_slots + slot,
                CAPACITY,
                KEEP_ALL,
                EVICTION,
            )


@triton.jit
def _exp_sum(x, m, FTZ: tl.constexpr):
    """sum exp(x - m) over the finite x. FTZ (CUDA only): each exp is one ex2.approx.ftz, so
    terms below 2**-126 count as 0 where tl.exp's ex2 keeps them (three more instructions per
    entry); a sum holding exp(0) = 1 absorbs such terms in rounding either way."""
    d = x - m
    if FTZ:
        e = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [d * LOG2_E], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        e = tl.exp(d)
    return tl.sum(tl.where(x > float("-inf"), e, 0.0), 0)
