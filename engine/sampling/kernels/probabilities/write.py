"""Stage 3 of the probabilities kernels: `_write_kernel`, one program per (row, write chunk).

DENSE rows write exp(x - m) / Z; FALLBACK rows count their tokens at split pivots and the row's
last program proves the cut on a split pivot or runs the whole-row kernel (`whole_row.py`)
(docs/sampling.md, "The Triton kernel of batched_probabilities", step 3; measurements:
docs/notes/performance-notebook.md, "The write kernel at 64 registers").
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.sampling.kernels.launch_overlap import wait_for_prerequisites
from engine.sampling.kernels.probabilities.common import _pack
from engine.sampling.kernels.probabilities.config import (
    _DENSE,
    _FALLBACK,
    _WHOLE_ROW,
    FLT_MAX,
    MASS_MARGIN,
    NUM_SPLIT_PIVOTS,
    ROW_MAX,
    ROW_NORM,
    ROW_SPREAD,
    SPLIT_PIVOT_ZERO,
)
from engine.sampling.kernels.probabilities.division import scaled_logits
from engine.sampling.kernels.probabilities.prove import _prove_and_scatter
from engine.sampling.kernels.probabilities.whole_row import take_at_least, write_row


@triton.jit
def _write_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out
    row_f32_ptr,  # [3, B] float32 (see _select_kernel)
    row_mode_ptr,  # [B] int64 in/out: FALLBACK rows no split pivot proves -> WHOLE_ROW
    split_i32_ptr,  # [B, W, NUM_SPLIT_PIVOTS] int32 scratch: counts at the split pivots
    split_f32_ptr,  # [B, W, NUM_SPLIT_PIVOTS] float32 scratch: masses at the split pivots
    compact_ptr,  # [B, COMPACT] int64 scratch: a FALLBACK row's candidates at its split pivot
    ticket_ptr,  # [B] int32: programs of the row done counting (zeroed by _select_kernel)
    row_val_ptr,  # [B, ROW_CAPACITY] float32 scratch of the whole-row kernel
    row_idx_ptr,  # [B, ROW_CAPACITY] int32 scratch of the whole-row kernel
    V,
    CHUNK: tl.constexpr,
    SUB: tl.constexpr,  # entries per step of the split count and gather, a divisor of CHUNK
    WRITE_PAD: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
    SMALL: tl.constexpr,
    REVERSE: tl.constexpr,  # a row's write chunks from the last to the first (reverse_write)
    PDL: tl.constexpr,  # launched overlapping the select kernel: wait for its results first
):
    """DENSE rows: exp(x - m) / Z over this program's CHUNK entries. FALLBACK rows: this
    program's counts at the split pivots; the row's last program to finish counting (atomic
    ticket, acquire-release) proves the row on a split pivot (`_split_finish`). Other rows
    were written by the chunk and select kernels: the program exits after one load. With
    REVERSE, program (row, j) takes write chunk W - 1 - j: the same work in another order,
    the one that re-reads first the logits the chunk kernel read last (programs start in the
    order of their ids, row fastest, in both kernels), the likeliest to be still in L2."""
    if PDL:
        wait_for_prerequisites()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    if REVERSE:
        chunk = tl.num_programs(1) - 1 - chunk
    num_rows = tl.num_programs(0).to(tl.int64)
    mode = tl.load(row_mode_ptr + row)
    if mode == _DENSE:
        _write_dense(
            logits_ptr + row * V,
            out_ptr + row * V,
            V,
            tl.load(temperature_ptr + row),
            tl.load(row_f32_ptr + ROW_MAX * num_rows + row),
            tl.load(row_f32_ptr + ROW_NORM * num_rows + row),
            chunk * CHUNK,
            CHUNK,
            CHUNK,
        )
    elif mode == _FALLBACK:
        t = tl.load(temperature_ptr + row)
        _split_count(
            logits_ptr + row * V, V, t, row_f32_ptr, num_rows, row, chunk, split_i32_ptr, split_f32_ptr, CHUNK, SUB
        )
        tl.debug_barrier()  # every thread's counts precede the release below
        num_write = tl.num_programs(1)
        if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == num_write - 1:
            _split_finish(
                logits_ptr + row * V,
                out_ptr + row * V,
                V,
                t,
                tl.load(top_k_ptr + row),
                tl.load(top_p_ptr + row),
                row_f32_ptr,
                num_rows,
                row,
                row_mode_ptr,
                split_i32_ptr,
                split_f32_ptr,
                compact_ptr + row * COMPACT,
                num_write,
                row_val_ptr + row * ROW_CAPACITY,
                row_idx_ptr + row * ROW_CAPACITY,
                SUB,
                WRITE_PAD,
                COMPACT,
                BLOCK,
                ROW_CAPACITY,
                SMALL,
            )


@triton.jit
def _write_dense(row_ptr, out_row, V, t, m, norm, first, length, BLOCK: tl.constexpr):
    """exp(x - m) / norm over the row's entries [first, first + length), BLOCK at a time."""
    for start in range(first, first + length, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = scaled_logits(row_ptr, offs, mask, t)
        tl.store(out_row + offs, tl.exp(x - m) / norm, mask=mask)


@triton.jit
def _split_pivots(row_f32_ptr, num_rows, row):
    """[NUM_SPLIT_PIVOTS] pivots m - spread * 2**((j - SPLIT_PIVOT_ZERO) / 4), spread = m - the
    mean of the chunks' finite means: nonincreasing in j, never below -FLT_MAX (-inf logits
    never count); NaN (nothing counts, the whole-row kernel decides) if m is not finite."""
    m = tl.load(row_f32_ptr + ROW_MAX * num_rows + row)
    spread = tl.load(row_f32_ptr + ROW_SPREAD * num_rows + row)
    j = tl.arange(0, NUM_SPLIT_PIVOTS)
    drop = spread * tl.exp2((j - SPLIT_PIVOT_ZERO).to(tl.float32) * 0.25)
    return tl.maximum(m - drop, -FLT_MAX), m


@triton.jit
def _pivot_counts(row_ptr, V, t, pivots, m, first, length, SUB: tl.constexpr):
    """([P] counts, [P] masses exp(x - m)) of the x >= each pivot among the row's entries
    [first, first + length), SUB at a time."""
    counts = tl.zeros([NUM_SPLIT_PIVOTS], tl.int32)
    masses = tl.zeros([NUM_SPLIT_PIVOTS], tl.float32)
    for start in range(first, first + length, SUB):
        offs = start + tl.arange(0, SUB)
        in_row = offs < V
        x = scaled_logits(row_ptr, offs, in_row, t)
        at_least = (x[:, None] >= pivots[None, :]) & in_row[:, None]  # [SUB, P]
        counts += tl.sum(at_least.to(tl.int32), 0)
        masses += tl.sum(tl.where(at_least, tl.exp(x - m)[:, None], 0.0), 0)
    return counts, masses


@triton.jit
def _split_count(
    row_ptr,
    V,
    t,
    row_f32_ptr,
    num_rows,
    row,
    chunk,
    split_i32_ptr,
    split_f32_ptr,
    CHUNK: tl.constexpr,
    SUB: tl.constexpr,
):
    """Counts and masses exp(x - m) of this program's x >= each split pivot, stored per
    (row, program): summed later in a fixed order, so the pick does not depend on timing."""
    pivots, m = _split_pivots(row_f32_ptr, num_rows, row)
    counts, masses = _pivot_counts(row_ptr, V, t, pivots, m, chunk * CHUNK, CHUNK, SUB)
    slot = (row * tl.num_programs(1) + chunk) * NUM_SPLIT_PIVOTS + tl.arange(0, NUM_SPLIT_PIVOTS)
    tl.store(split_i32_ptr + slot, counts)
    tl.store(split_f32_ptr + slot, masses)


@triton.jit
def _best_pivot(row_counts, row_masses, z, k, p, use_k):
    """(best pivot index, candidates at it in the row): the highest split pivot holding every
    kept token (count >= k; top-p only: mass >= (p + MASS_MARGIN) * Z); best =
    NUM_SPLIT_PIVOTS if none does."""
    j = tl.arange(0, NUM_SPLIT_PIVOTS)
    covers = tl.where(use_k, row_counts >= k, row_masses >= (p + MASS_MARGIN) * z)
    best = tl.min(tl.where(covers, j, NUM_SPLIT_PIVOTS), 0)
    return best, tl.sum(tl.where(j == best, row_counts, 0), 0)


@triton.jit
def _split_pick(split_i32_ptr, split_f32_ptr, row, NUM_WRITE, z, k, p, use_k, WRITE_PAD: tl.constexpr):
    """`_best_pivot` of the W programs' counts, summed in one fixed order."""
    w = tl.arange(0, WRITE_PAD)
    j = tl.arange(0, NUM_SPLIT_PIVOTS)
    slot = (row * NUM_WRITE + w[:, None]) * NUM_SPLIT_PIVOTS + j[None, :]
    live = (w < NUM_WRITE)[:, None] & (j < NUM_SPLIT_PIVOTS)[None, :]
    counts = tl.load(split_i32_ptr + slot, mask=live, other=0)  # [W, P]
    masses = tl.load(split_f32_ptr + slot, mask=live, other=0.0)
    return _best_pivot(tl.sum(counts, 0), tl.sum(masses, 0), z, k, p, use_k)


@triton.jit
def _split_gather(row_ptr, V, t, pivot, dst_ptr, SUB: tl.constexpr, COMPACT: tl.constexpr):
    """Store the row's x >= pivot (packed with the index) at dst_ptr[0:COMPACT], vocabulary
    order (the caller has counted that they fit)."""
    base = tl.zeros([1], tl.int32).sum(0)
    for start in range(0, V, SUB):
        x, offs, take, pos, base = take_at_least(row_ptr, V, t, start, pivot, base, SUB)
        tl.store(dst_ptr + pos, _pack(x, offs), mask=take & (pos < COMPACT))


@triton.jit
def _split_finish(
    row_ptr,
    out_row,
    V,
    t,
    k,
    p,
    row_f32_ptr,
    num_rows,
    row,
    row_mode_ptr,
    split_i32_ptr,
    split_f32_ptr,
    compact_row,
    num_write,
    row_val,
    row_idx,
    SUB: tl.constexpr,
    WRITE_PAD: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
    SMALL: tl.constexpr,
):
    """A FALLBACK row, in one program once every program of the row has counted: pick the
    split pivot on the stored counts and prove the row on it (`_split_prove`)."""
    z = tl.load(row_f32_ptr + ROW_NORM * num_rows + row)
    pivots, m = _split_pivots(row_f32_ptr, num_rows, row)
    best, total = _split_pick(split_i32_ptr, split_f32_ptr, row, num_write, z, k, p, (k > 0) & (k < V), WRITE_PAD)
    _split_prove(
        row_ptr,
        out_row,
        V,
        t,
        k,
        p,
        z,
        pivots,
        m,
        best,
        total,
        row_mode_ptr,
        row,
        compact_row,
        row_val,
        row_idx,
        SUB,
        COMPACT,
        BLOCK,
        ROW_CAPACITY,
        SMALL,
    )


@triton.jit
def _serial_finish(
    row_ptr,
    out_row,
    V,
    t,
    k,
    p,
    row_f32_ptr,
    num_rows,
    row,
    row_mode_ptr,
    compact_row,
    row_val,
    row_idx,
    SUB: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
    SMALL: tl.constexpr,
):
    """A FALLBACK row of the single launch, in one program: count the whole row at the split
    pivots (one pass), then pick and prove as `_split_finish` does."""
    z = tl.load(row_f32_ptr + ROW_NORM * num_rows + row)
    pivots, m = _split_pivots(row_f32_ptr, num_rows, row)
    counts, masses = _pivot_counts(row_ptr, V, t, pivots, m, 0, V, SUB)
    best, total = _best_pivot(counts, masses, z, k, p, (k > 0) & (k < V))
    _split_prove(
        row_ptr,
        out_row,
        V,
        t,
        k,
        p,
        z,
        pivots,
        m,
        best,
        total,
        row_mode_ptr,
        row,
        compact_row,
        row_val,
        row_idx,
        SUB,
        COMPACT,
        BLOCK,
        ROW_CAPACITY,
        SMALL,
    )


@triton.jit
def _split_prove(
    row_ptr,
    out_row,
    V,
    t,
    k,
    p,
    z,
    pivots,
    m,
    best,
    total,
    row_mode_ptr,
    row,
    compact_row,
    row_val,
    row_idx,
    SUB: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
    SMALL: tl.constexpr,
):
    """Gather the row's candidates at split pivot `best` (`total` of them), prove the cut on
    them and scatter; a row no pivot proves within COMPACT candidates runs the whole-row
    kernel (WHOLE_ROW)."""
    use_k = (k > 0) & (k < V)
    proven = (best < NUM_SPLIT_PIVOTS) & (total <= COMPACT)
    if proven:
        pivot = tl.sum(tl.where(tl.arange(0, NUM_SPLIT_PIVOTS) == best, pivots, 0.0), 0)
        _split_gather(row_ptr, V, t, pivot, compact_row, SUB, COMPACT)
        tl.debug_barrier()  # the gathered candidates land before other threads read them
        proven, norm = _prove_and_scatter(compact_row, total, out_row, m, z, k, p, use_k, p < 1.0, COMPACT, SMALL, 0)
    if proven == 0:
        write_row(row_ptr, out_row, V, t, k, p, row_val, row_idx, BLOCK, ROW_CAPACITY)
        tl.store(row_mode_ptr + row, tl.zeros([1], tl.int64).sum(0) + _WHOLE_ROW)
