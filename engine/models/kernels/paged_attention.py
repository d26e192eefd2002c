"""Triton paged attention: each packed query row reads its own sequence's keys through the table.

The torch path, `engine.models.attention.paged_attention_torch`, gathers every sequence's blocks into a dense
[B, heads, max_blocks * block_size, head] copy, pads the queries to [B, max_query_len] and runs
one masked SDPA call. For the harness's batched collection (thousands of short sequences, a few
query rows each) that gather and the masked call are most of a round's device time
(docs/notes/performance-notebook.md). This kernel reads the cache in place instead.

One program per (query row, head). Row n of sequence s at position p attends over the keys at
positions 0..p of s, read block by block through s's block table, with the running maximum and
sum of a streaming softmax in float32; blocks past p are never read. The same visibility as the
SDPA path (its mask is key position <= query position, over the table's `num_blocks` blocks),
so the two agree up to float32 rounding (tests/engine/models/test_paged_attention_kernel.py bounds the
difference from a float64 reference), and a row's result depends only on its own sequence's
keys and its position, never on the batch, the padding or the table's width.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

NUM_WARPS = 1  # a program's tile is block_size x head (16 x 32 for the looped model): one warp


def paged_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    row_seq: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Attend query [N, heads, head] over the paged cache: row n sees the keys at positions
    0..positions[n] of sequence row_seq[n] (tables int64[B, num_blocks]; positions past the
    table are clipped to it, as the SDPA path's mask is). The cache [num_blocks, block_size,
    heads, head] is contiguous with a power-of-two block size (`engine.models.attention.
    kernel_supports`: the key tile is `tl.arange(0, block_size)`). Returns [N, heads, head] in the
    query's dtype. The caller has already written the rows' own keys and values."""
    num_rows, num_heads, head_size = query.shape
    out = torch.empty_like(query)
    if num_rows == 0:
        return out
    query, tables = query.contiguous(), block_tables.contiguous()
    _attend[(num_rows, num_heads)](
        query,
        key_cache,
        value_cache,
        out,
        tables,
        row_seq.contiguous(),
        positions.contiguous(),
        tables.shape[1],
        tables.stride(0),
        1.0 / math.sqrt(head_size),
        HEADS=num_heads,
        HEAD=head_size,
        BLOCK_D=triton.next_power_of_2(head_size),
        BLOCK_SIZE=key_cache.shape[1],
        num_warps=NUM_WARPS,
    )
    return out


@triton.jit(do_not_specialize=["num_blocks", "table_stride"])
def _attend(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    tables_ptr,
    row_seq_ptr,
    pos_ptr,
    num_blocks,
    table_stride,
    scale,
    HEADS: tl.constexpr,
    HEAD: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    in_head = d < HEAD
    q_offs = (row * HEADS + head) * HEAD + d
    q = tl.load(q_ptr + q_offs, mask=in_head, other=0.0).to(tl.float32)
    seq = tl.load(row_seq_ptr + row)
    pos = tl.load(pos_ptr + row)
    count = tl.minimum(pos // BLOCK_SIZE + 1, num_blocks)
    t = tl.arange(0, BLOCK_SIZE)
    best = tl.full([1], float("-inf"), tl.float32).max(0)
    total = tl.zeros([1], tl.float32).sum(0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for j in range(0, count):
        block = tl.load(tables_ptr + seq * table_stride + j)
        offs = ((block * BLOCK_SIZE + t)[:, None] * HEADS + head) * HEAD + d[None, :]
        seen = j * BLOCK_SIZE + t <= pos
        tile = seen[:, None] & in_head[None, :]  # unseen keys are not read (whatever they hold)
        k = tl.load(k_ptr + offs, mask=tile, other=0.0).to(tl.float32)
        score = tl.where(seen, tl.sum(k * q[None, :], 1) * scale, float("-inf"))
        new_best = tl.maximum(best, tl.max(score, 0))  # finite from block 0 on: key 0 is always seen
        shrink = tl.exp(best - new_best)
        weight = tl.exp(score - new_best)
        v = tl.load(v_ptr + offs, mask=tile, other=0.0).to(tl.float32)
        total = total * shrink + tl.sum(weight, 0)
        acc = acc * shrink + tl.sum(weight[:, None] * v, 0)
        best = new_best
    out = (acc / total).to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
    tl.store(out_ptr + q_offs, out, mask=in_head)
