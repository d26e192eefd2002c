"""`batched_probabilities`: the sampling distribution of every row of a batch in one call.

Each row has its own temperature, top-k and top-p; greedy and random, truncating and
non-truncating rows mix freely. The semantics are those of `reference.Sampler` (order of
operations, tie rules), applied row by row. The Triton backend is a sort-free one-pass kernel;
the torch backend here sorts each row once and is the fast path on the CPU.
"""

from __future__ import annotations

import functools

import torch

from engine.sampling import checks
from engine.sampling.backend import TORCH, resolve_backend

NEG_INF = float("-inf")
# bound once for `_well_formed`, which runs on every call
_TENSOR, _FLOAT32 = torch.Tensor, torch.float32
_LOGIT_DTYPES, _INDEX_DTYPES = checks.FLOAT_LOGIT_DTYPES, checks.INDEX_DTYPES


def _well_formed(logits, temperature, top_k, top_p) -> torch.device | None:
    """The inputs' device when every check of `_check_inputs` passes, else None. The checks
    an eager call pays for (1.97 us against 3.59 for the named ones on the host of
    docs/notes/performance-notebook.md's H200 measurement): exact tensor types, so a subclass takes the named
    checks, which accept it. It must accept nothing the named checks reject."""
    if not (
        type(logits) is _TENSOR and type(temperature) is _TENSOR and type(top_k) is _TENSOR and type(top_p) is _TENSOR
    ):
        return None
    shape = logits.shape
    if not (
        len(shape) == 2
        and shape[1] > 0
        and logits.dtype in _LOGIT_DTYPES
        and temperature.dtype is _FLOAT32
        and top_p.dtype is _FLOAT32
        and top_k.dtype in _INDEX_DTYPES
        and temperature.shape == top_k.shape == top_p.shape == shape[:1]
        and logits.is_contiguous()
        and temperature.is_contiguous()
        and top_k.is_contiguous()
        and top_p.is_contiguous()
    ):
        return None
    device = logits.device
    if temperature.device == device and top_k.device == device and top_p.device == device:
        return device
    return None


def _check_inputs(logits, temperature, top_k, top_p) -> torch.device:
    device = _well_formed(logits, temperature, top_k, top_p)
    if device is not None:
        return device
    checks.require("logits", logits, ndim=2, dtypes=checks.FLOAT_LOGIT_DTYPES)
    checks.require("temperature", temperature, ndim=1, dtypes=(torch.float32,))
    checks.require("top_k", top_k, ndim=1, dtypes=checks.INDEX_DTYPES)
    checks.require("top_p", top_p, ndim=1, dtypes=(torch.float32,))
    num_rows = logits.shape[0]
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        checks.require_len(name, t, 0, num_rows)
    if logits.shape[1] == 0:
        raise ValueError("logits has an empty vocabulary dimension (shape [B, 0])")
    return checks.require_same_device({"logits": logits, "temperature": temperature, "top_k": top_k, "top_p": top_p})


def batched_probabilities(
    logits: torch.Tensor,  # [B, V] float32 / bfloat16 / float16
    temperature: torch.Tensor,  # [B] float32, 0 = greedy
    top_k: torch.Tensor,  # [B] int32 or int64, <= 0 or >= V = disabled
    top_p: torch.Tensor,  # [B] float32, 1 = disabled
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Return float32[B, V]: row b is `Sampler().probabilities(logits[b], params_b)` up to float32
    rounding: the top-k cut is exact, but a token whose strictly-larger mass lies within float32
    rounding of top_p (a band of ~3.5e-4 at V = 152,064) may be kept by one and not the other,
    as summation orders differ (docs/sampling.md, "Float tolerance at boundaries").

    Guarantees: inputs are never modified; no host read of device data; greedy rows are the
    one-hot argmax of the raw logits (lowest index on ties); kept tokens get the softmax of the
    scaled logits, every other token exactly 0. Per-row values are assumed valid (see
    `SamplingParams`); shapes, dtypes, devices and contiguity are checked (ValueError).
    """
    device = _check_inputs(logits, temperature, top_k, top_p)
    if resolve_backend(backend, device) == TORCH:
        return probabilities_torch(logits, temperature, top_k, top_p)
    return _triton_probabilities()(logits, temperature, top_k, top_p)


@functools.cache
def _triton_probabilities():
    """The Triton backend, imported on first use (CPU-only callers never import Triton)."""
    from engine.sampling.kernels.probabilities.plan import probabilities_triton

    return probabilities_triton


def _greedy_rows(logits: torch.Tensor) -> torch.Tensor:
    """One-hot float32 rows at the first index of each row's maximum."""
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return out.scatter_(1, torch.argmax(logits.float(), dim=1, keepdim=True), 1.0)


def _keep_mask(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:  # [B, V] bool
    """Tokens kept by top-k then top-p, decided on the scaled logits x[B, V]."""
    num_cols = x.shape[1]
    desc = torch.sort(x, dim=1, descending=True).values  # [B, V]
    k = torch.where((top_k <= 0) | (top_k >= num_cols), num_cols, top_k).long()  # [B]
    kth_largest = desc.gather(1, (k - 1).unsqueeze(1))  # [B, 1]
    desc_masked = torch.where(desc >= kth_largest, desc, NEG_INF)
    desc_probs = torch.softmax(desc_masked, dim=1).double()  # [B, V], in x order
    prefix = torch.cumsum(desc_probs, dim=1)
    mass_before = torch.cat([desc_probs.new_zeros(x.shape[0], 1), prefix[:, :-1]], 1)
    # the mass of strictly larger tokens is the prefix sum at the first of a run of ties
    first_of_tie = torch.ones_like(desc, dtype=torch.bool)
    first_of_tie[:, 1:] = desc[:, 1:] != desc[:, :-1]
    crosses = first_of_tie & (mass_before < top_p.double().unsqueeze(1))
    num_kept_positions = crosses.long().cumsum(1).argmax(1, keepdim=True)  # last True
    threshold = desc.gather(1, num_kept_positions)  # [B, 1] smallest kept x
    threshold = torch.where(top_p.unsqueeze(1) >= 1.0, NEG_INF, threshold)
    return (x >= kth_largest) & (x >= threshold)


def probabilities_torch(logits, temperature, top_k, top_p) -> torch.Tensor:
    """Torch backend of `batched_probabilities` (sorted, vectorised over rows)."""
    is_greedy = (temperature == 0).unsqueeze(1)  # [B, 1]
    safe_temperature = torch.where(is_greedy.squeeze(1), 1.0, temperature)
    x = logits.float() / safe_temperature.unsqueeze(1)  # [B, V]
    keep = _keep_mask(x, top_k, top_p)
    probs = torch.softmax(torch.where(keep, x, NEG_INF), dim=1)
    return torch.where(is_greedy, _greedy_rows(logits), probs)
