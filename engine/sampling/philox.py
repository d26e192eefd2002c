"""Philox4x32-10 constants of the RNG protocol, shared by its front (rng.py, the torch backend)
and its Triton kernel (kernels/rng.py). Triton-free. The block layout and keying: rng.py.
"""

from __future__ import annotations

MASK32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
