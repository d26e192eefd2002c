"""Helpers of the sampling tests (a uniquely named module: `conftest` names collide across test
folders when several are collected in one run)."""

from __future__ import annotations

import torch

from engine.sampling.backend import triton_can_run_on

__all__ = ["generator", "triton_can_run_on"]


def generator(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed, so every random input is reproducible."""
    return torch.Generator().manual_seed(seed)
