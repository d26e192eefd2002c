"""`categorical`: inverse-CDF draws with a float64 CDF, one per row.

Uniforms are float64 because a float32 CDF over a large vocabulary has steps (2**-24 of the
total) coarser than small probabilities, which would bias or even skip low-probability tokens.
"""

from __future__ import annotations

import torch

from engine.sampling import checks
from engine.sampling.backend import TORCH, resolve_backend

INVALID_ROW = -1  # returned for a row whose weights are not a distribution


def categorical(
    weights: torch.Tensor,  # [B, V] non-negative, unnormalised allowed
    u: torch.Tensor,  # [B] float64 in [0, 1)
    *,
    backend: str = "auto",
) -> torch.Tensor:  # [B] int64
    """Return, per row, the first index j with weights[j] > 0 and cdf[j] > u * total.

    The CDF and the total are float64. The result is always a positive-weight index, also
    when rounding pushes u * total up to the total (then the last positive-weight index).
    A row with a negative or NaN weight, or whose total is not finite or not > 0, gives
    INVALID_ROW (-1). Inputs are not modified; no host read of device data.
    """
    checks.require("weights", weights, ndim=2, dtypes=checks.WEIGHT_DTYPES)
    checks.require("u", u, ndim=1, dtypes=(torch.float64,))
    checks.require_len("u", u, 0, weights.shape[0])
    if weights.shape[1] == 0:
        raise ValueError("weights has an empty vocabulary dimension (shape [B, 0])")
    device = checks.require_same_device({"weights": weights, "u": u})
    if resolve_backend(backend, device) == TORCH:
        return categorical_torch(weights, u)
    from engine.sampling.kernels.categorical import categorical_triton

    return categorical_triton(weights, u)


def _last_positive(w: torch.Tensor) -> torch.Tensor:  # [B] int64
    """Index of the last positive weight of each row (0 when there is none)."""
    num_cols = w.shape[1]
    return num_cols - 1 - torch.argmax((w.flip(1) > 0).to(torch.int8), dim=1)


def categorical_torch(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Torch backend of `categorical`."""
    w = weights.double()  # [B, V]
    cdf = torch.cumsum(w, dim=1)  # [B, V]
    total = cdf[:, -1]  # [B]
    is_valid = torch.isfinite(total) & (total > 0) & (w >= 0).all(dim=1)
    hit = (w > 0) & (cdf > (u * total).unsqueeze(1))  # [B, V]
    first_hit = torch.argmax(hit.to(torch.int8), dim=1)
    index = torch.where(hit.any(dim=1), first_hit, _last_positive(w))
    return torch.where(is_valid, index, INVALID_ROW)
