"""Stage 2 of the probabilities kernels: `_select_kernel`, one program per row.

Row max and normaliser from the chunk statistics; greedy rows get their 1.0; truncating rows
compact their candidates at or above the row floor (raised to the top-k floor for small k) and
are proven SPARSE on them (`prove.py`) or marked FALLBACK (docs/sampling.md, "The Triton kernel
of batched_probabilities", step 2; measurements: docs/notes/performance-notebook.md). `_select_row` is also
run by the single launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine.sampling.kernels.launch_overlap import launch_dependents, wait_for_prerequisites
from engine.sampling.kernels.probabilities.common import _pivot, _unpack_x
from engine.sampling.kernels.probabilities.config import (
    _DENSE,
    _FALLBACK,
    _GREEDY,
    _SPARSE,
    CHUNK_ARGMAX,
    CHUNK_COUNT,
    CHUNK_FLOOR,
    CHUNK_MAX,
    CHUNK_MEAN,
    CHUNK_SUM,
    NUM_LEVELS,
    NUM_LEVELS_LOG2,
    ROW_MAX,
    ROW_NORM,
    ROW_SPREAD,
)
from engine.sampling.kernels.probabilities.prove import _prove_and_scatter


@triton.jit
def _certain_count(chunk_max, floors, counts, v):
    """Tokens >= v that the chunk statistics prove: at least one in a chunk whose max reaches
    v, and a chunk's `counts` stored candidates if its floor reaches v (each is >= the floor)."""
    at_floor = tl.where(floors >= v, counts, 0)
    return tl.sum(tl.maximum(at_floor, (chunk_max >= v).to(tl.int32)), 0)


@triton.jit
def _top_k_floor(chunk_max, floors, counts, m, spread, k, STEPS: tl.constexpr):
    """v = `_pivot`(m, spread, j) at the lowest level j whose pivot the chunk statistics prove
    k tokens reach (`_certain_count`); -inf if not even the last level's does. The k-th
    largest x is then >= v, so every token top-k keeps is >= v: a row floor for top-k
    that needs no candidate. A bisection for the highest level that does not prove k, over
    [-1, NUM_LEVELS - 1]: at most 6 block reductions over the row's chunks. Then STEPS
    halvings of the gap between that level's pivot (which does not prove k) and v (which
    does) raise v to the highest midpoint proved (`_refined_floor`): the levels are 2**(1/4)
    apart in distance from m, and one level can hold twice k tokens or more."""
    short = tl.zeros([1], tl.int32).sum(0) - 1  # level 0 proves k (or a level that does not)
    for bit in tl.static_range(NUM_LEVELS_LOG2, -1, -1):
        trial = short + (1 << bit)
        # Nested on purpose (SIM102 does not apply to Triton): `and` of tensors compiles to a
        # logical_and of both sides, evaluated unconditionally, while the inner `if` only counts
        # the levels that exist.
        if trial < NUM_LEVELS:  # noqa: SIM102
            if _certain_count(chunk_max, floors, counts, _pivot(m, spread, trial)) < k:
                short = trial
    level = short + 1
    v = _pivot(m, spread, tl.minimum(level, NUM_LEVELS - 1))
    # Nested on purpose (SIM102 does not apply to Triton): `STEPS > 0` is a constexpr, decided
    # at compile time, so STEPS=0 compiles no `_refined_floor`; the inner test is a runtime branch.
    if STEPS > 0:  # noqa: SIM102
        if (level > 0) & (level < NUM_LEVELS):
            v = _refined_floor(chunk_max, floors, counts, k, v, _pivot(m, spread, short), STEPS)
    return tl.where((level < NUM_LEVELS) & (v == v), v, float("-inf"))


@triton.jit
def _refined_floor(chunk_max, floors, counts, k, proved, unproved, STEPS: tl.constexpr):
    """The highest of STEPS bisection midpoints between `proved` (the chunk statistics prove
    k tokens at or above it) and `unproved` > proved (they do not) that they prove, or `proved`:
    each step halves the gap, so the result is within (unproved - proved) / 2**STEPS of the
    highest value they prove. Midpoints are lo / 2 + hi / 2 (no overflow); a NaN bound leaves
    `proved` (every comparison with NaN is false)."""
    lo = proved
    hi = unproved
    for _ in tl.static_range(STEPS):
        mid = lo * 0.5 + hi * 0.5
        holds = _certain_count(chunk_max, floors, counts, mid) >= k
        lo = tl.where(holds, mid, lo)
        hi = tl.where(holds, hi, mid)
    return lo


@triton.jit
def _compact(
    cand_ptr,
    count_ptr,
    compact_ptr,
    NUM_CHUNKS,
    floor,
    CAPACITY: tl.constexpr,
    TILE: tl.constexpr,
    COMPACT: tl.constexpr,
):
    """Copy the row's stored candidates with x >= floor to compact_ptr[0:COMPACT], in
    (chunk, slot) order; return how many there are (they fit iff the count is <= COMPACT).

    `cand_ptr` / `count_ptr` point to the row's first chunk: slot j of chunk c is at
    cand_ptr + c * CAPACITY + j. A step takes a [TILE chunks, CAPACITY slots] tile
    (`_compact_step`). Each step's loads are issued one step ahead (`_candidate_tile`), so
    their latency overlaps the step before."""
    num = tl.zeros([1], tl.int32).sum(0)
    chunks = tl.arange(0, TILE)
    count, packed = _candidate_tile(cand_ptr, count_ptr, chunks, chunks < NUM_CHUNKS, CAPACITY)
    for first in range(0, NUM_CHUNKS, TILE):
        chunks = first + TILE + tl.arange(0, TILE)
        next_count, next_packed = _candidate_tile(cand_ptr, count_ptr, chunks, chunks < NUM_CHUNKS, CAPACITY)
        num = _compact_step(count, packed, floor, num, compact_ptr, CAPACITY, COMPACT)
        count, packed = next_count, next_packed
    return num


@triton.jit
def _list_hot_chunks(chunk_max, NUM_CHUNKS, floor, list_ptr, CHUNKS_PAD: tl.constexpr):
    """Store, in chunk order, the row's chunks whose max is not below floor at
    list_ptr[0:CHUNKS_PAD] and return how many there are. A chunk whose max is below the floor
    stores no candidate >= it (every stored candidate is <= its chunk's max); a NaN max counts
    as hot, so the list holds every chunk `_compact` would take a candidate from."""
    chunks = tl.arange(0, CHUNKS_PAD)
    hot = ((chunk_max < floor) == 0) & (chunks < NUM_CHUNKS)
    ones = hot.to(tl.int32)
    tl.store(list_ptr + tl.cumsum(ones, 0) - 1, chunks, mask=hot)
    tl.debug_barrier()  # the list lands before any thread reads it
    return tl.sum(ones, 0)


@triton.jit
def _compact_listed(
    cand_ptr,
    count_ptr,
    list_ptr,
    compact_ptr,
    num_listed,
    floor,
    CAPACITY: tl.constexpr,
    TILE: tl.constexpr,
    COMPACT: tl.constexpr,
):
    """`_compact` over only the `num_listed` chunks at list_ptr (`_list_hot_chunks`): the same
    candidates in the same order, in ceil(num_listed / TILE) steps instead of
    ceil(NUM_CHUNKS / TILE). Each step's chunk numbers and loads are issued one step ahead."""
    num = tl.zeros([1], tl.int32).sum(0)
    count, packed = _listed_tile(cand_ptr, count_ptr, list_ptr, num_listed, 0, CAPACITY, TILE)
    for first in range(0, num_listed, TILE):
        next_count, next_packed = _listed_tile(cand_ptr, count_ptr, list_ptr, num_listed, first + TILE, CAPACITY, TILE)
        num = _compact_step(count, packed, floor, num, compact_ptr, CAPACITY, COMPACT)
        count, packed = next_count, next_packed
    return num


@triton.jit
def _listed_tile(cand_ptr, count_ptr, list_ptr, num_listed, first, CAPACITY: tl.constexpr, TILE: tl.constexpr):
    """`_candidate_tile` of the listed chunks [first, first + TILE)."""
    entries = first + tl.arange(0, TILE)
    listed = entries < num_listed
    chunks = tl.load(list_ptr + entries, mask=listed, other=0)
    return _candidate_tile(cand_ptr, count_ptr, chunks, listed, CAPACITY)


@triton.jit
def _compact_step(count, packed, floor, num, compact_ptr, CAPACITY: tl.constexpr, COMPACT: tl.constexpr):
    """Append a [TILE chunks, CAPACITY slots] tile's candidates with x >= floor (slot < the
    chunk's count) at compact_ptr[num:], in (chunk, slot) order; return the new num. A
    chunk's offset is a scan over its TILE counts, a slot's a scan along its chunk's CAPACITY
    slots (on the H200 2.4 us faster per row than one scan over the flattened tile:
    docs/notes/performance-notebook.md)."""
    slots = tl.arange(0, CAPACITY)
    valid = ((slots[None, :] < count[:, None]) & (_unpack_x(packed) >= floor)).to(tl.int32)
    per_chunk = tl.sum(valid, 1)
    before = tl.cumsum(per_chunk, 0) - per_chunk
    pos = num + before[:, None] + tl.cumsum(valid, 1) - 1
    tl.store(compact_ptr + pos, packed, mask=(valid != 0) & (pos < COMPACT))
    return num + tl.sum(per_chunk, 0)


@triton.jit
def _candidate_tile(cand_ptr, count_ptr, chunks, live, CAPACITY: tl.constexpr):
    """(count, packed) of the [TILE] `chunks`: each chunk's candidate count (0 where not
    `live`) and all its CAPACITY slots, stored or not. Slots past a chunk's count hold
    whatever was there (the caller masks them with the count), so the two loads are
    independent: neither waits for the other's latency."""
    count = tl.load(count_ptr + chunks, mask=live, other=0)
    slots = chunks[:, None] * CAPACITY + tl.arange(0, CAPACITY)[None, :]
    packed = tl.load(cand_ptr + slots, mask=live[:, None], other=0)
    return count, packed


@triton.jit
def _select_sparse(
    chunk_i32_ptr,
    cand_ptr,
    compact_ptr,
    list_ptr,
    out_row,
    num_slots,
    first_slot,
    NUM_CHUNKS,
    chunk_max,
    floor,
    listed,
    m,
    z,
    k,
    p,
    use_k,
    use_p,
    CHUNKS_PAD: tl.constexpr,
    CAPACITY: tl.constexpr,
    TILE: tl.constexpr,
    COMPACT: tl.constexpr,
    SMALL: tl.constexpr,
    TINY: tl.constexpr,
    LISTED: tl.constexpr,
):
    """RowMode and normaliser of a truncating row, from its stored candidates >= `floor` (at
    least the largest chunk floor, so every token >= it is stored); SPARSE rows get their kept
    values here. With LISTED and `listed` (a floor high enough that few chunks reach it: the
    top-k floor) the compaction reads only the chunks whose max reaches the floor
    (`_compact_listed`), with the same result."""
    row_cands = cand_ptr + first_slot * CAPACITY
    row_counts = chunk_i32_ptr + CHUNK_COUNT * num_slots + first_slot
    # `listed` is known only at run time; LISTED off leaves the list out of the compiled kernel
    # (the select kernel as it was before it), hence the full compaction in two branches
    if LISTED:
        if listed:
            num_hot = _list_hot_chunks(chunk_max, NUM_CHUNKS, floor, list_ptr, CHUNKS_PAD)
            num = _compact_listed(row_cands, row_counts, list_ptr, compact_ptr, num_hot, floor, CAPACITY, TILE, COMPACT)
        else:
            num = _compact(row_cands, row_counts, compact_ptr, NUM_CHUNKS, floor, CAPACITY, TILE, COMPACT)
    else:
        num = _compact(row_cands, row_counts, compact_ptr, NUM_CHUNKS, floor, CAPACITY, TILE, COMPACT)
    tl.debug_barrier()  # the compacted candidates land before other threads read them
    is_sparse, norm = _prove_and_scatter(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT, SMALL, TINY)
    return tl.where(is_sparse, _SPARSE, _FALLBACK), tl.where(is_sparse, norm, z)


@triton.jit
def _select_kernel(
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out: 1.0 of greedy rows, kept values of SPARSE rows
    chunk_f32_ptr,  # [4, B * S] float32 (see _chunk_kernel)
    chunk_i32_ptr,  # [2, B * S] int32
    cand_ptr,  # [B * S, CAPACITY] int64
    compact_ptr,  # [B, COMPACT] int64 scratch
    row_f32_ptr,  # [3, B] float32 out: row max, normaliser (Z of FALLBACK rows), spread
    row_mode_ptr,  # [B] int64 out: RowMode
    ticket_ptr,  # [B] int32 out: zeroed, counts the split fallback's finished programs
    chunk_list_ptr,  # [B, CHUNKS_PAD] int32 scratch: a row's chunks that reach its floor
    V,
    NUM_CHUNKS,
    CHUNKS_PAD: tl.constexpr,
    CAPACITY: tl.constexpr,
    TILE: tl.constexpr,
    COMPACT: tl.constexpr,
    SMALL: tl.constexpr,
    TINY: tl.constexpr,
    LISTED: tl.constexpr,  # top-k floor rows compact only the chunks that reach it
    FLOOR_STEPS: tl.constexpr,  # bisection steps that refine the top-k floor
    PDL: tl.constexpr,  # launched overlapping the chunk kernel: wait for its results first
):
    if PDL:
        wait_for_prerequisites()
    _select_row(
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
        tl.program_id(0).to(tl.int64),
        CHUNKS_PAD,
        CAPACITY,
        TILE,
        COMPACT,
        SMALL,
        TINY,
        LISTED,
        FLOOR_STEPS,
    )
    if PDL:
        launch_dependents()  # once every row is done: the write kernel may start


@triton.jit
def _select_row(
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
    CHUNKS_PAD: tl.constexpr,
    CAPACITY: tl.constexpr,
    TILE: tl.constexpr,
    COMPACT: tl.constexpr,
    SMALL: tl.constexpr,
    TINY: tl.constexpr,
    LISTED: tl.constexpr,
    FLOOR_STEPS: tl.constexpr,
):
    """The work of one row's program of `_select_kernel` (also run by `_single_kernel`):
    stores the row's RowMode, max, normaliser and spread, zeroes its ticket; returns the mode,
    the max and the normaliser."""
    num_rows = tl.num_programs(0).to(tl.int64)
    num_slots = num_rows * NUM_CHUNKS
    first_slot = row * NUM_CHUNKS
    chunks = tl.arange(0, CHUNKS_PAD)
    live = chunks < NUM_CHUNKS
    stats = chunk_f32_ptr + first_slot + chunks  # every load first: their latencies overlap
    chunk_max = tl.load(stats + CHUNK_MAX * num_slots, mask=live, other=float("-inf"))
    chunk_sum = tl.load(stats + CHUNK_SUM * num_slots, mask=live, other=0.0)
    means = tl.load(stats + CHUNK_MEAN * num_slots, mask=live, other=float("-inf"))
    floors = tl.load(stats + CHUNK_FLOOR * num_slots, mask=live, other=float("-inf"))
    counts = tl.load(chunk_i32_ptr + CHUNK_COUNT * num_slots + first_slot + chunks, mask=live, other=0)
    t = tl.load(temperature_ptr + row)
    k = tl.load(top_k_ptr + row)
    p = tl.load(top_p_ptr + row)
    m = tl.max(chunk_max, 0)
    mode = tl.zeros([1], tl.int32).sum(0) + _GREEDY
    norm = tl.zeros([1], tl.float32).sum(0) + 1.0
    tl.store(ticket_ptr + row, 0)
    if t == 0.0:
        first = tl.min(tl.where(live & (chunk_max == m), chunks, NUM_CHUNKS - 1), 0)
        arg = tl.load(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + first_slot + first)
        tl.store(out_ptr + row * V + arg, 1.0)
    else:
        z = tl.sum(tl.where(chunk_max > float("-inf"), chunk_sum * tl.exp(chunk_max - m), 0.0), 0)
        use_k = (k > 0) & (k < V)
        use_p = p < 1.0
        mode = tl.zeros([1], tl.int32).sum(0) + _DENSE
        norm = z
        has_mean = live & (means > float("-inf"))
        spread = m - tl.sum(tl.where(has_mean, means, 0.0), 0) / tl.maximum(tl.sum(has_mean.to(tl.float32), 0), 1.0)
        if use_k | use_p:
            floor = tl.max(floors, 0)  # every token >= it is stored
            top_k_floor = use_k & (k <= TINY)
            if top_k_floor:  # every token top-k keeps is >= the top-k floor too
                floor = tl.maximum(floor, _top_k_floor(chunk_max, floors, counts, m, spread, k, FLOOR_STEPS))
            mode, norm = _select_sparse(
                chunk_i32_ptr,
                cand_ptr,
                compact_ptr + row * COMPACT,
                chunk_list_ptr + row * CHUNKS_PAD,
                out_ptr + row * V,
                num_slots,
                first_slot,
                NUM_CHUNKS,
                chunk_max,
                floor,
                top_k_floor,
                m,
                z,
                k,
                p,
                use_k,
                use_p,
                CHUNKS_PAD,
                CAPACITY,
                TILE,
                COMPACT,
                SMALL,
                TINY,
                LISTED,
            )
        tl.store(row_f32_ptr + ROW_MAX * num_rows + row, m)
        tl.store(row_f32_ptr + ROW_NORM * num_rows + row, norm)
        tl.store(row_f32_ptr + ROW_SPREAD * num_rows + row, spread)
    tl.store(row_mode_ptr + row, mode.to(tl.int64))
    return mode, m, norm
