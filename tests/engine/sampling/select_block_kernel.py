"""A Triton kernel that runs the select kernel's compaction and proof alone (`_compact`, then
`_prove_and_scatter`), for tests. Kept in its own module: Triton resolves a kernel's callees
among its module's globals, so the test's kernel must name them at module level."""

import triton
import triton.language as tl

from engine.sampling.probabilities_kernel import _compact, _prove_and_scatter


@triton.jit
def compact_and_prove(cand_ptr, count_ptr, compact_ptr, out_ptr, result_ptr, num_chunks, floor,
                      m, z, k, p, CAPACITY: tl.constexpr, TILE: tl.constexpr,
                      COMPACT: tl.constexpr, SMALL: tl.constexpr):
    """compact_ptr[:num] = the stored candidates >= floor; out_ptr = the kept probabilities
    (scattered into a zeroed row); result = (num, proven, norm) as float32."""
    num = _compact(cand_ptr, count_ptr, compact_ptr, num_chunks, floor, CAPACITY, TILE, COMPACT)
    tl.debug_barrier()
    proven, norm = _prove_and_scatter(compact_ptr, num, out_ptr, m, z, k, p, (k > 0), p < 1.0,
                                      COMPACT, SMALL)
    tl.store(result_ptr, num.to(tl.float32))
    tl.store(result_ptr + 1, proven.to(tl.float32))
    tl.store(result_ptr + 2, norm)
