"""Fixtures shared by the sampling tests: the backends to run (helpers: tests/fixtures/sampling_helpers.py)."""

from __future__ import annotations

import pytest
import torch

from engine.sampling.backend import triton_can_run_on

CPU = torch.device("cpu")
TRITON_SKIP_REASON = "Triton backend needs CUDA or TRITON_INTERPRET=1 (scripts/test.sh sets it)"

BACKEND_PARAMS = [
    pytest.param("torch", id="torch"),
    pytest.param(
        "triton",
        id="triton",
        marks=pytest.mark.skipif(not triton_can_run_on(CPU), reason=TRITON_SKIP_REASON),
    ),
]


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request) -> str:
    """Each test taking `backend` runs once per backend on CPU tensors."""
    return request.param
