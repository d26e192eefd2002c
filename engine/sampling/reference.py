"""The row-wise reference sampler: plain, sorted torch, written to be read.

Order of operations for one row (temperature > 0):
  1. upcast to float32 and divide by the temperature (x = logits / T);
  2. top-k: keep token i iff fewer than k tokens have a strictly larger x (ties at the k-th
     value all stay, so more than k tokens may survive);
  3. top-p: with pi = softmax of the survivors, keep token i iff the total pi of tokens with a
     strictly larger x is < p (the token that crosses p stays, with its ties; a row never
     empties). "Strictly larger probability" is decided on x, where the order is exact;
  4. softmax over the kept tokens; every other token gets exactly 0.
Temperature 0 gives the one-hot row of the argmax of the raw logits (lowest index on ties).
The masses of step 3 are summed in float64 over float32 softmax probabilities, whose float32
normaliser makes the top-p cut exact only up to float32 rounding (docs/sampling.md).
"""

from __future__ import annotations

import torch

from engine.params import SamplingParams


def top_k_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the tokens of row `x` that fewer than `k` tokens strictly exceed."""
    if k <= 0 or k >= x.numel():
        return torch.ones_like(x, dtype=torch.bool)
    kth_largest = torch.sort(x, descending=True).values[k - 1]
    return x >= kth_largest


def top_p_mask(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """Bool mask of the kept tokens whose strictly-larger mass (softmax over `keep`) is < p."""
    if p >= 1.0:
        return keep
    probs = torch.softmax(torch.where(keep, x, float("-inf")), dim=0).double()
    desc = torch.sort(x, descending=True)
    desc_probs = probs[desc.indices]
    mass_before = torch.cat([desc_probs.new_zeros(1), torch.cumsum(desc_probs, 0)])  # [V+1]
    # number of tokens with a strictly larger x = position of x among -desc (ascending)
    num_larger = torch.searchsorted(-desc.values, -x, right=False)
    return keep & (mass_before[num_larger] < p)


def greedy_row(logits: torch.Tensor) -> torch.Tensor:
    """One-hot float32 row at the first index of the maximum of `logits`."""
    row = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    row[int(torch.argmax(logits.float()))] = 1.0
    return row


class Sampler:
    """Row-wise reference for `batched_probabilities` (see the module docstring)."""

    def probabilities(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """Return float32[V], the sampling distribution of one row of logits under `params`.

        The input is not modified. Raises ValueError for a row that is not 1-D floating point.
        """
        if not isinstance(logits, torch.Tensor) or logits.dim() != 1:
            raise ValueError("logits must be a 1-D tensor (one row of the vocabulary)")
        if not logits.is_floating_point():
            raise ValueError(f"logits has dtype {logits.dtype}; expected a floating dtype")
        if params.is_greedy:
            return greedy_row(logits)
        temperature = torch.tensor(params.temperature, dtype=torch.float32)
        x = logits.float() / temperature
        keep = top_k_mask(x, params.top_k)
        keep = top_p_mask(x, keep, params.top_p)
        return torch.softmax(torch.where(keep, x, float("-inf")), dim=0)
