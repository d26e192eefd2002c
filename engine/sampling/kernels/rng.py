"""Triton backend of `uniform_blocks`: Philox4x32-10 in uint32 arithmetic on the device.

Bit for bit the same derivation as `engine.sampling.rng.uniform_blocks_torch` (see
engine/sampling/rng.py for the layout, docs/sampling.md for the protocol).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.sampling.philox import PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1

BLOCK_CALLS = 128  # Philox calls per program


@triton.jit
def _unit_float64(a, b):
    """53 bits from two uint32 words -> float64 in [0, 1), exactly."""
    high = (a >> 5).to(tl.float64)
    low = (b >> 6).to(tl.float64)
    return (high * 67108864.0 + low) * 1.1102230246251565e-16  # 2**26, 2**-53


@triton.jit
def _uniform_blocks_kernel(
    seeds_ptr,  # [R] int64
    positions_ptr,  # [R] int64
    out_ptr,  # [R, NUM_UNIFORMS] float64
    num_calls,
    NUM_UNIFORMS: tl.constexpr,
    M0: tl.constexpr,
    M1: tl.constexpr,
    W0: tl.constexpr,
    W1: tl.constexpr,
    ROUNDS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    call = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seeds_ptr + row)
    pos = tl.load(positions_ptr + row)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = call.to(tl.uint32)
    c1 = tl.zeros([BLOCK], dtype=tl.uint32)
    c2 = tl.zeros([BLOCK], dtype=tl.uint32) + (pos & 0xFFFFFFFF).to(tl.uint32)
    c3 = tl.zeros([BLOCK], dtype=tl.uint32) + ((pos >> 32) & 0xFFFFFFFF).to(tl.uint32)
    m0 = tl.full([BLOCK], M0, tl.uint32)
    m1 = tl.full([BLOCK], M1, tl.uint32)
    for _ in tl.static_range(ROUNDS):
        hi0 = tl.umulhi(m0, c0)
        lo0 = m0 * c0
        hi1 = tl.umulhi(m1, c2)
        lo1 = m1 * c2
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + W0
        k1 = k1 + W1
    base = out_ptr + row.to(tl.int64) * NUM_UNIFORMS
    tl.store(base + 2 * call, _unit_float64(c0, c1), mask=2 * call < NUM_UNIFORMS)
    tl.store(base + 2 * call + 1, _unit_float64(c2, c3), mask=2 * call + 1 < NUM_UNIFORMS)


def uniform_blocks_triton(seeds, positions, num_uniforms: int) -> torch.Tensor:
    """Launch the Philox kernel; arguments were validated by
    `engine.sampling.rng.uniform_blocks`."""
    num_rows = seeds.shape[0]
    out = torch.empty((num_rows, num_uniforms), dtype=torch.float64, device=seeds.device)
    num_calls = (num_uniforms + 1) // 2
    if num_rows == 0:
        return out
    grid = (num_rows, triton.cdiv(num_calls, BLOCK_CALLS))
    _uniform_blocks_kernel[grid](seeds, positions, out, num_calls, **_options(num_uniforms))
    return out


def _options(num_uniforms: int) -> dict:
    return dict(
        NUM_UNIFORMS=num_uniforms,
        M0=PHILOX_M0,
        M1=PHILOX_M1,
        W0=PHILOX_W0,
        W1=PHILOX_W1,
        ROUNDS=PHILOX_ROUNDS,
        BLOCK=BLOCK_CALLS,
    )


def uniform_blocks_warmup(num_uniforms: int):
    """(kernel, arguments, grid, options) of the launch `uniform_blocks_triton` makes for blocks
    of `num_uniforms` (int64 seeds and positions, float64 out), tensors given as dtypes
    (`JITFunction.warmup`)."""
    arguments = (torch.int64, torch.int64, torch.float64, (num_uniforms + 1) // 2)
    return _uniform_blocks_kernel, arguments, (1, 1), _options(num_uniforms)
