"""`engine.models.kernels.paged_attention`: the Triton paged attention against a float64 reference.

Error analysis (float32 arithmetic inside the kernel, any order of its sums; u = 2**-24,
gamma_n = n u / (1 - n u), Higham, Accuracy and Stability of Numerical Algorithms, 3.1). For a
row with visible keys j = 0..p and D head dimensions:
- score s_j = scale * sum_i q_i k_ji: |error| <= E_j = gamma_{D+1} * scale * sum_i |q_i k_ji|
  (D products, D - 1 additions, the scale multiply);
- unnormalised weight exp(s_j - m): the score error moves it by a factor within exp(+-2 E) (E =
  max E_j; the running maximum m carries one score's error), and exp of an argument of size x
  adds a relative error below (x + 4) u (the argument's own rounding, x u, is amplified by 1 in
  relative terms; `tl.exp` on the GPU is exp2 of x log2(e), within 2 ulp, the CPU's exp within 1);
  each of the at most `count` rescalings by exp(m_old - m_new) adds the same;
- the normalised weights then carry relative errors below rho = expm1(2 E) + (count + 1)(X + 4) u
  + gamma_{p+2} (X: the largest |s_j - m|, the sums of p + 1 terms and the division), so
  |o - o_exact| <= 2 rho max_j |v_j| per output entry.
The tests use that bound (computed per row from the inputs). An output stored as bfloat16 adds
one bfloat16 ulp, 2**-7 |o|: the GPU rounds to nearest (2**-8 |o|), Triton's CPU interpreter
truncates (seen: up to 2**-7 |o|). Seeded inputs, deterministic: no false-fail rate. A wrong
mask, a shifted position or a wrong block moves outputs by O(0.1), thousands of times the bound.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.models.attention import kernel_supports, paged_attention_torch
from engine.models.kernels.paged_attention import paged_attention_triton
from engine.runners.layout import block_table_tensor, layout_rows, metadata_for
from engine.sampling.backend import triton_can_run_on

pytestmark = pytest.mark.skipif(
    not triton_can_run_on(torch.device("cpu")),
    reason="Triton kernel needs CUDA or TRITON_INTERPRET=1 (scripts/test.sh sets it)",
)

U32 = 2.0**-24
ULP_BF16 = 2.0**-7
NUM_POOL_BLOCKS = 80


def _gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def _case(head_size: int, block_size: int, starts, lengths, dtype=torch.float32, seed=0, device="cpu"):
    """Random caches, tables of shuffled blocks and the metadata of the packed rows."""
    generator = torch.Generator().manual_seed(seed)
    heads = 3
    shape = (NUM_POOL_BLOCKS, block_size, heads, head_size)
    key_cache = torch.randn(shape, generator=generator).to(dtype)
    value_cache = torch.randn(shape, generator=generator).to(dtype)
    layout = layout_rows(list(starts), list(lengths), block_size, torch.device("cpu"))
    order = torch.randperm(NUM_POOL_BLOCKS - 1, generator=generator) + 1  # block 0 is the pad block
    per_seq = layout.num_blocks
    tables = [order[b * per_seq : (b + 1) * per_seq].tolist() for b in range(len(starts))]
    table = block_table_tensor(tables, per_seq, layout.ends, block_size, layout.positions.device)
    metadata = metadata_for(layout, table)
    query = torch.randn(int(sum(lengths)), heads, head_size, generator=generator).to(dtype)
    return query.to(device), key_cache.to(device), value_cache.to(device), metadata


def _kernel(query, key_cache, value_cache, metadata):
    device = query.device
    return paged_attention_triton(
        query,
        key_cache,
        value_cache,
        metadata.block_tables.to(device),
        metadata.row_seq.to(device),
        metadata.positions.to(device),
    )


def _reference_and_bound(query, key_cache, value_cache, metadata):
    """float64 attention of the same inputs and the per-entry bound of the module docstring."""
    q, k_cache, v_cache = (t.double().cpu() for t in (query, key_cache, value_cache))
    reference = paged_attention_torch(q, k_cache, v_cache, metadata)
    head_size, block_size = q.shape[-1], k_cache.shape[1]
    scale = 1.0 / math.sqrt(head_size)
    bounds = torch.empty_like(reference)
    for n in range(q.shape[0]):
        seq, pos = int(metadata.row_seq[n]), int(metadata.positions[n])
        keys = k_cache[metadata.block_tables[seq]].reshape(-1, *k_cache.shape[2:])[: pos + 1]  # [p+1, H, D]
        values = v_cache[metadata.block_tables[seq]].reshape(-1, *v_cache.shape[2:])[: pos + 1]
        scores = scale * (keys * q[n][None]).sum(-1)  # [p+1, H]
        error = _gamma(head_size + 1) * scale * (keys.abs() * q[n].abs()[None]).sum(-1).max(0).values  # [H]
        spread = scores.max(0).values - scores.min(0).values  # [H]
        count = pos // block_size + 1
        rho = torch.expm1(2 * error) + (count + 1) * (spread + 4) * U32 + _gamma(pos + 2)
        bounds[n] = (2 * rho * values.abs().max(0).values.max(-1).values)[:, None]
    return reference, bounds


@pytest.mark.parametrize("head_size, block_size", [(32, 16), (24, 4), (8, 2)])
def test_kernel_matches_float64_reference(head_size, block_size):
    # prefill rows from 0, single decode rows, verify blocks that cross block boundaries
    starts, lengths = (0, 7, 13, 2), (9, 1, 4, 3)
    query, key_cache, value_cache, metadata = _case(head_size, block_size, starts, lengths, seed=head_size)
    out = _kernel(query, key_cache, value_cache, metadata)
    reference, bound = _reference_and_bound(query, key_cache, value_cache, metadata)
    assert out.shape == query.shape and out.dtype == torch.float32
    error = (out.double() - reference).abs()
    assert bool((error <= bound).all()), float((error / bound).max())


def test_bfloat16_inputs_give_bfloat16_rows():
    query, key_cache, value_cache, metadata = _case(32, 16, (0, 20), (5, 4), dtype=torch.bfloat16, seed=3)
    out = _kernel(query, key_cache, value_cache, metadata)
    reference, bound = _reference_and_bound(query, key_cache, value_cache, metadata)
    assert out.dtype == torch.bfloat16
    error = (out.double() - reference).abs()
    assert bool((error <= bound + ULP_BF16 * reference.abs()).all())


def test_keys_past_a_row_are_never_read():
    """NaN everywhere a row may not look (later positions of its blocks, other sequences' blocks,
    blocks past its position): the rows are unchanged, bit for bit."""
    query, key_cache, value_cache, metadata = _case(32, 4, (5, 9), (3, 2), seed=7)
    clean = _kernel(query, key_cache, value_cache, metadata)
    for cache in (key_cache, value_cache):
        flat = cache.view(-1, *cache.shape[2:])
        visible = torch.zeros(flat.shape[0], dtype=torch.bool)
        last = int(metadata.positions.max())
        for seq in range(metadata.block_tables.shape[0]):
            seq_last = int(metadata.positions[metadata.row_seq == seq].max())
            slots = (metadata.block_tables[seq][:, None] * 4 + torch.arange(4)[None]).reshape(-1)
            visible[slots[: seq_last + 1]] = True
        assert last > 0
        flat[~visible] = float("nan")
    poisoned = _kernel(query, key_cache, value_cache, metadata)
    assert torch.equal(clean, poisoned)


def test_a_row_does_not_depend_on_the_table_width_or_its_neighbours():
    query, key_cache, value_cache, metadata = _case(16, 4, (6, 1, 10), (2, 3, 1), seed=11)
    alone = _kernel(query, key_cache, value_cache, metadata)
    wider = torch.cat([metadata.block_tables, torch.zeros_like(metadata.block_tables)], dim=1)
    keep = metadata.row_seq == 2
    only = _kernel(
        query[keep],
        key_cache,
        value_cache,
        type(metadata)(
            metadata.slot_mapping[keep],
            wider,
            metadata.row_seq[keep],
            metadata.row_slot[keep],
            metadata.attend_mask,
            metadata.positions[keep],
        ),
    )
    assert torch.equal(alone[keep], only)


def test_positions_past_the_table_see_the_whole_table():
    """As the SDPA path's mask does: a row whose position lies past the table attends over all of it."""
    query, key_cache, value_cache, metadata = _case(8, 4, (4,), (3,), seed=5)
    clipped = metadata.block_tables[:, :1]  # one block of 4 keys: positions 4..6 lie past it
    short = type(metadata)(
        metadata.slot_mapping,
        clipped,
        metadata.row_seq,
        metadata.row_slot,
        metadata.attend_mask[:, :, :4],
        metadata.positions,
    )
    out = _kernel(query, key_cache, value_cache, short)
    reference, bound = _reference_and_bound(
        query,
        key_cache,
        value_cache,
        type(short)(
            short.slot_mapping,
            clipped,
            short.row_seq,
            short.row_slot,
            short.attend_mask,
            torch.full_like(short.positions, 3),
        ),
    )
    assert bool(((out.double() - reference).abs() <= bound).all())


def test_supports_only_contiguous_power_of_two_blocks():
    assert kernel_supports(torch.zeros(4, 16, 2, 8))
    assert not kernel_supports(torch.zeros(4, 12, 2, 8))
    assert not kernel_supports(torch.zeros(4, 16, 2, 8).transpose(0, 1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_kernel_matches_float64_reference():
    query, key_cache, value_cache, metadata = _case(32, 16, (0, 40, 3), (41, 4, 1), seed=1, device="cuda")
    out = _kernel(query, key_cache, value_cache, metadata).cpu()
    reference, bound = _reference_and_bound(query, key_cache, value_cache, metadata)
    assert bool(((out.double() - reference).abs() <= bound).all())
