"""Counter-based uniform blocks: Philox4x32-10 keyed by the request's seed.

Block layout and keying (the RNG protocol of the engine):
- key   = (seed mod 2**32, seed >> 32) of the request's int64 seed;
- counter = (c, 0, position mod 2**32, position >> 32) for Philox call c = 0, 1, ...;
- call c yields uniforms for slots 2c and 2c+1: each uniform takes 53 bits from two 32-bit
  outputs, (a >> 5) * 2**26 + (b >> 6), times 2**-53, so it lies in [0, 1) exactly.
Uniform s of a block therefore depends only on (seed, position, s): not on the batch, the
other requests, the device or the backend. All arithmetic is integer, so CPU and CUDA, torch
and Triton give bitwise identical blocks. The Philox constants: philox.py (shared with the
kernel, kernels/rng.py).
"""

from __future__ import annotations

import torch

from engine.sampling import checks
from engine.sampling.backend import TORCH, resolve_backend
from engine.sampling.philox import MASK32, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1

TWO_POW_26 = float(2**26)
TWO_POW_MINUS_53 = 2.0**-53


def uniform_blocks(
    seeds: torch.Tensor,  # [R] int64
    positions: torch.Tensor,  # [R] int64
    num_uniforms: int,
    *,
    backend: str = "auto",
) -> torch.Tensor:  # [R, num_uniforms] float64 in [0, 1)
    """Return one block of `num_uniforms` float64 uniforms per request, on `seeds.device`.

    Row r is a pure function of (seeds[r], positions[r]); see the module docstring for the
    exact derivation. The engine passes the committed length at the start of the round as the
    position and 2K+1 (speculative) or 1 (plain) as `num_uniforms`.
    """
    if isinstance(num_uniforms, bool) or not isinstance(num_uniforms, int) or num_uniforms < 1:
        raise ValueError(f"num_uniforms={num_uniforms!r} is invalid: must be an int >= 1")
    checks.require("seeds", seeds, ndim=1, dtypes=(torch.int64,))
    checks.require("positions", positions, ndim=1, dtypes=(torch.int64,))
    checks.require_len("positions", positions, 0, seeds.shape[0])
    device = checks.require_same_device({"seeds": seeds, "positions": positions})
    if resolve_backend(backend, device) == TORCH:
        return uniform_blocks_torch(seeds, positions, num_uniforms)
    from engine.sampling.kernels.rng import uniform_blocks_triton

    return uniform_blocks_triton(seeds, positions, num_uniforms)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of a * b for 32-bit a, b, in int64 without overflow."""
    low_part = a * (b & 0xFFFF)  # < 2**48
    high_part = a * (b >> 16)  # < 2**48
    mid = low_part + ((high_part & 0xFFFF) << 16)  # < 2**49
    return (high_part >> 16) + (mid >> 32), mid & MASK32


def philox4x32(counter: list[torch.Tensor], key: list[torch.Tensor]) -> list[torch.Tensor]:
    """Philox4x32-10 on int64 tensors holding 32-bit values; returns four 32-bit outputs."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return [c0, c1, c2, c3]


def _to_unit_float64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """53 random bits from two 32-bit words -> float64 in [0, 1), exactly."""
    bits = (a >> 5) * (1 << 26) + (b >> 6)  # < 2**53, exact in float64
    return bits.double() * TWO_POW_MINUS_53


def uniform_blocks_torch(seeds, positions, num_uniforms: int) -> torch.Tensor:
    """Torch backend of `uniform_blocks` (int64 arithmetic masked to 32 bits)."""
    num_calls = (num_uniforms + 1) // 2
    call = torch.arange(num_calls, dtype=torch.int64, device=seeds.device).unsqueeze(0)
    shape = (seeds.shape[0], num_calls)
    pos = positions.unsqueeze(1)
    counter = [
        call.expand(shape),
        torch.zeros(shape, dtype=torch.int64, device=seeds.device),
        (pos & MASK32).expand(shape),
        ((pos >> 32) & MASK32).expand(shape),
    ]
    key = [(seeds & MASK32).unsqueeze(1), ((seeds >> 32) & MASK32).unsqueeze(1)]
    r0, r1, r2, r3 = philox4x32(counter, key)
    pairs = torch.stack([_to_unit_float64(r0, r1), _to_unit_float64(r2, r3)], dim=2)
    return pairs.reshape(seeds.shape[0], 2 * num_calls)[:, :num_uniforms].contiguous()
