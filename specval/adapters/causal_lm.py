"""Reference logits of a Hugging Face causal LM: the replay behind the transformers and vllm adapters.

Both adapters take the target's logits from transformers' own model class on the served weights, in
one forward pass without a KV cache, so a call carries no state from an earlier one. `model` is a
`transformers` causal LM (`model(input_ids=..., use_cache=False).logits`, `model.config.vocab_size`,
`model.device`); torch is imported on first use, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def last_logits(model, token_ids: Sequence[int]) -> np.ndarray:
    """f32[V]: the next-token logits after exactly `token_ids` (one cache-free forward)."""
    return _forward(model, list(token_ids), slice(-1, None))[0]


def logits_along(model, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> np.ndarray:
    """f32[len(token_ids), V]: row i is the next-token logits after prompt_ids + token_ids[:i], read
    from one cache-free forward over prompt + tokens at positions len(prompt) - 1 ... Causal masking
    lets row i see only its own prefix, so it equals `last_logits(model, prompt + tokens[:i])` up to
    float32 summation order. ValueError for an empty prompt (row 0 would have no position)."""
    if not len(prompt_ids):
        raise ValueError("logits_along: prompt_ids is empty; row 0 needs at least one prompt token")
    if not len(token_ids):
        return np.zeros((0, int(model.config.vocab_size)), dtype=np.float32)
    first = len(prompt_ids) - 1
    return _forward(model, list(prompt_ids) + list(token_ids), slice(first, first + len(token_ids)))


def _forward(model, ids: list[int], rows: slice) -> np.ndarray:
    """f32[rows, V]: the logits at positions `rows` of one forward over `ids`, without a cache."""
    import torch

    batch = torch.tensor([[int(i) for i in ids]], dtype=torch.int64, device=model.device)
    with torch.no_grad():
        logits = model(input_ids=batch, use_cache=False).logits[0, rows]
    return logits.float().cpu().numpy()
