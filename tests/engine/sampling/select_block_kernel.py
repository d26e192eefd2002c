"""Triton kernels that run parts of the select kernel alone, for tests: the compaction and
proof (`_compact`, then `_prove_and_scatter`), the compaction over the listed chunks
(`_list_hot_chunks`, `_compact_listed`), the two key searches (`_kth_key`, `_top_p_key`) and
the top-k row floor (`_top_k_floor`). Kept in their own module: Triton resolves a kernel's
callees among its module's globals, so the test's kernels must name them at module level."""

import triton
import triton.language as tl

from engine.sampling.probabilities_kernel import (_compact, _compact_listed, _key, _kth_key,
                                                  _list_hot_chunks, _prove_and_scatter,
                                                  _top_k_floor, _top_p_key)


@triton.jit
def compact_and_prove(cand_ptr, count_ptr, compact_ptr, out_ptr, result_ptr, num_chunks, floor,
                      m, z, k, p, CAPACITY: tl.constexpr, TILE: tl.constexpr,
                      COMPACT: tl.constexpr, SMALL: tl.constexpr, TINY: tl.constexpr):
    """compact_ptr[:num] = the stored candidates >= floor; out_ptr = the kept probabilities
    (scattered into a zeroed row); result = (num, proven, norm) as float32."""
    num = _compact(cand_ptr, count_ptr, compact_ptr, num_chunks, floor, CAPACITY, TILE, COMPACT)
    tl.debug_barrier()
    proven, norm = _prove_and_scatter(compact_ptr, num, out_ptr, m, z, k, p, (k > 0), p < 1.0,
                                      COMPACT, SMALL, TINY)
    tl.store(result_ptr, num.to(tl.float32))
    tl.store(result_ptr + 1, proven.to(tl.float32))
    tl.store(result_ptr + 2, norm)


@triton.jit
def both_compactions(cand_ptr, count_ptr, max_ptr, list_ptr, full_ptr, listed_ptr, result_ptr,
                     num_chunks, floor, CHUNKS_PAD: tl.constexpr, CAPACITY: tl.constexpr,
                     TILE: tl.constexpr, COMPACT: tl.constexpr):
    """full_ptr = `_compact` of every chunk, listed_ptr = `_compact_listed` of the chunks that
    `_list_hot_chunks` lists (from the chunk maxima at max_ptr); result = (num of each, number
    of listed chunks), int32."""
    chunks = tl.arange(0, CHUNKS_PAD)
    chunk_max = tl.load(max_ptr + chunks, mask=chunks < num_chunks, other=float("-inf"))
    num_full = _compact(cand_ptr, count_ptr, full_ptr, num_chunks, floor, CAPACITY, TILE,
                        COMPACT)
    num_hot = _list_hot_chunks(chunk_max, num_chunks, floor, list_ptr, CHUNKS_PAD)
    num_listed = _compact_listed(cand_ptr, count_ptr, list_ptr, listed_ptr, num_hot, floor,
                                 CAPACITY, TILE, COMPACT)
    tl.store(result_ptr, num_full)
    tl.store(result_ptr + 1, num_listed)
    tl.store(result_ptr + 2, num_hot)


@triton.jit
def key_searches(x_ptr, mass_ptr, result_ptr, n, k, target, BLOCK: tl.constexpr):
    """result = (`_kth_key` of the first n keys of x for k, `_top_p_key` of them with `mass`
    for target), int32."""
    i = tl.arange(0, BLOCK)
    valid = i < n
    key = _key(tl.load(x_ptr + i, mask=valid, other=float("-inf")))
    mass = tl.load(mass_ptr + i, mask=valid, other=0.0)
    tl.store(result_ptr, _kth_key(key, valid, k))
    tl.store(result_ptr + 1, _top_p_key(key, mass, target))


@triton.jit
def top_k_floor(max_ptr, floor_ptr, count_ptr, result_ptr, num_chunks, m, spread, k,
                CHUNKS_PAD: tl.constexpr, STEPS: tl.constexpr):
    """result = `_top_k_floor` of the first num_chunks chunk maxima, floors and counts, with
    STEPS refining bisection steps."""
    chunks = tl.arange(0, CHUNKS_PAD)
    live = chunks < num_chunks
    chunk_max = tl.load(max_ptr + chunks, mask=live, other=float("-inf"))
    floors = tl.load(floor_ptr + chunks, mask=live, other=float("-inf"))
    counts = tl.load(count_ptr + chunks, mask=live, other=0)
    tl.store(result_ptr, _top_k_floor(chunk_max, floors, counts, m, spread, k, STEPS))
