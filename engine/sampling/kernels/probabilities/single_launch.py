"""The single launch of the probabilities kernels for small batches (B * V <=
`KernelConfig.single_launch_entries`): `_single_kernel` runs the three stages in one launch of
(row, chunk) programs, the row's last program selecting and writing the row (docs/sampling.md;
measurements: docs/notes/performance-notebook.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.sampling.kernels.probabilities.chunk import _chunk_work
from engine.sampling.kernels.probabilities.config import _DENSE, _FALLBACK
from engine.sampling.kernels.probabilities.select import _select_row
from engine.sampling.kernels.probabilities.write import _serial_finish, _write_dense


@triton.jit
def _single_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out
    chunk_f32_ptr,  # [4, B * S] float32 (see _chunk_kernel)
    chunk_i32_ptr,  # [2, B * S] int32
    cand_ptr,  # [B * S, CAPACITY] int64
    compact_ptr,  # [B, COMPACT] int64 scratch
    row_f32_ptr,  # [3, B] float32 scratch (see _select_kernel)
    row_mode_ptr,  # [B] int64 out: RowMode
    ticket_ptr,  # [B] int32: zero before the launch; the row's last program zeroes it again
    chunk_list_ptr,  # [B, CHUNKS_PAD] int32 scratch (see _select_kernel)
    row_val_ptr,  # [B, ROW_CAPACITY] float32 scratch of the whole-row kernel
    row_idx_ptr,  # [B, ROW_CAPACITY] int32 scratch of the whole-row kernel
    V,
    NUM_CHUNKS,
    pivot_sigmas,
    wide_sigmas,
    wide_k,
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
    KEEP_ALL: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    SELECT_TILE: tl.constexpr,
    COMPACT: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
    SMALL: tl.constexpr,
    TINY: tl.constexpr,
    LISTED: tl.constexpr,
    HOIST: tl.constexpr,
    FTZ_SUM: tl.constexpr,
    EVICTION: tl.constexpr,
):
    """All three steps in one launch of (row, chunk) programs (small batches): the chunk work,
    then the row's last program to finish it (atomic ticket, acquire-release) selects the row
    (`_select_row`) and writes what the write kernel would: a DENSE row over all V entries,
    a FALLBACK row counted at the split pivots over the whole row (`_serial_finish`)."""
    row = tl.program_id(0).to(tl.int64)
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
        row,
        tl.program_id(1),
        CHUNK,
        CAPACITY,
        KEEP_ALL,
        HOIST,
        FTZ_SUM,
        EVICTION,
        False,
    )  # IEEE division: the reciprocal made B = 1 slower on the H200
    tl.debug_barrier()  # every thread's stores precede the release below
    if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == NUM_CHUNKS - 1:
        mode, m, norm = _select_row(
            temperature_ptr,
            top_k_ptr,
            top_p_ptr,
            out_ptr,
            chunk_f32_ptr,
            chunk_i32_ptr,
            cand_ptr,
            compact_ptr,
            row_f32_ptr,
            row_mode_ptr,
            ticket_ptr,
            chunk_list_ptr,
            V,
            NUM_CHUNKS,
            row,
            CHUNKS_PAD,
            CAPACITY,
            SELECT_TILE,
            COMPACT,
            SMALL,
            TINY,
            LISTED,
            0,
        )  # the top-k floor at its level: not measured refined
        t = tl.load(temperature_ptr + row)
        if mode == _DENSE:
            _write_dense(logits_ptr + row * V, out_ptr + row * V, V, t, m, norm, 0, V, BLOCK)
        elif mode == _FALLBACK:
            tl.debug_barrier()  # the row statistics land before other threads read them
            _serial_finish(
                logits_ptr + row * V,
                out_ptr + row * V,
                V,
                t,
                tl.load(top_k_ptr + row),
                tl.load(top_p_ptr + row),
                row_f32_ptr,
                tl.num_programs(0).to(tl.int64),
                row,
                row_mode_ptr,
                compact_ptr + row * COMPACT,
                row_val_ptr + row * ROW_CAPACITY,
                row_idx_ptr + row * ROW_CAPACITY,
                SUB,
                COMPACT,
                BLOCK,
                ROW_CAPACITY,
                SMALL,
            )
