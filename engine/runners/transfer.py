"""Host-to-device copies that never make the host wait for the device.

`torch.tensor(values, device="cuda")` copies from pageable memory and then synchronises the
stream, so the host would wait for every round already queued: that would serialise the
asynchronous runner. `to_device` stages the values in pinned memory and copies them with
`non_blocking=True` (stream-ordered; the caching host allocator keeps the staging buffer alive
until the copy has run). On the CPU it is a plain `torch.tensor`.
"""

from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A device tensor holding `values` (a list, nested lists, a scalar sequence, or a numpy
    array: its buffer is copied at once, where a long list costs ~50 ns per element)."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)
