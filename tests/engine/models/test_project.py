"""`engine.models.llama.project`: x @ W^T computed in the layout fastest for the row count.

Error analysis (fp32, any summation order the BLAS picks): each entry is a dot product of length
n, and any order of n - 1 additions of n exact-rounded products has |computed - exact| <=
gamma_n * sum_i |x_i w_i|, gamma_n = n u / (1 - n u), u = 2**-24 (Higham, Accuracy and Stability
of Numerical Algorithms, 3.1). The tests compare with the float64 product against that bound, so
they hold on every CPU kernel (ATEN_CPU_CAPABILITY) and BLAS order. Seeded inputs: deterministic,
no false-fail rate.
"""

from __future__ import annotations

import pytest
import torch

from engine.models.llama import FEW_ROWS, project

U32 = 2.0**-24


def _bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    n = x.shape[1]
    gamma = n * U32 / (1 - n * U32)
    return gamma * (x.double().abs() @ weight.double().abs().T)


@pytest.mark.parametrize("rows", [1, 2, 3, FEW_ROWS, FEW_ROWS + 1, 33])
def test_project_is_x_times_weight_transposed(rows):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=generator)
    weight = torch.randn(1536, 576, generator=generator)
    out = project(x, weight)
    assert out.shape == (rows, 1536) and out.dtype == torch.float32 and out.is_contiguous()
    error = (out.double() - x.double() @ weight.double().T).abs()
    assert bool((error <= _bound(x, weight)).all()), float((error / _bound(x, weight)).max())


def test_project_feeds_views_of_heads():
    """layer_step views the projection as [T, heads, head]: the result must be row-major."""
    x, weight = torch.randn(4, 64), torch.randn(96, 64)
    assert torch.equal(project(x, weight).view(4, 3, 32)[1, 2], project(x, weight)[1, 64:96])
