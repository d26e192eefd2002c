"""Host-side validation of tensor arguments (shapes, dtypes, devices, contiguity).

These checks read only tensor metadata, never tensor data, so they add no host-device
synchronisation to the launch path. Each failure is a ValueError naming the argument.
"""

from __future__ import annotations

import torch

FLOAT_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
PROB_DTYPES = (torch.float32,)
WEIGHT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


def require(name: str, t: object, *, ndim: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    """Check that `t` is a contiguous tensor with `ndim` dimensions and one of `dtypes`."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of {names}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    return t


def require_len(name: str, t: torch.Tensor, dim: int, size: int) -> None:
    """Check that dimension `dim` of `t` has `size` elements."""
    if t.shape[dim] != size:
        raise ValueError(
            f"{name} has {t.shape[dim]} elements in dimension {dim}; expected {size} (shape {tuple(t.shape)})"
        )


def require_same_device(names_and_tensors: dict[str, torch.Tensor]) -> torch.device:
    """Check that all tensors live on one device and return it."""
    first = None
    for name, t in names_and_tensors.items():
        device = t.device
        if first is None:
            first = device
        elif device != first:
            raise ValueError(f"{name} is on {device} but the other inputs are on {first}")
    return first
