"""The model interface the runners drive: a stack of depths with paged KV per depth.

A *depth* is the unit of early exit. For the looped model one depth is one application of the
recurrent stack (one loop); for a layered model it would be a group of consecutive layers. Each
depth owns `num_layers_per_depth` attention layers, and each of those has its own KV entries in
the paged cache (see `engine.kv_cache`), addressed through the depth's own block table.

The runners only ever call the five members below, in this order for a batch of query rows:

    hidden = model.embed(token_ids)                                   # [N, hidden]
    for depth in range(first, last + 1):                              # 1-based, contiguous
        hidden = model.forward_depth(depth, hidden, positions, metadata[depth], kv)
    logits = model.readout(hidden)                                    # float32 [N, V]

so a draft reads out after `draft_depth` depths and the verify pass continues from the draft's
hidden states at depth `draft_depth + 1`: every depth is computed once per position.
`replay` is the serial, cache-free reference used by tests; `target_logits` is its full-depth
readout alone, which the harness reads along whole sequences (`engine.LLM.target_logits_along`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Where N packed query rows of B sequences write and read the paged KV of one depth.

    Rows of one sequence are consecutive and in position order. Keys are gathered through the
    block table and masked causally by position, so stale entries beyond a sequence's committed
    length are never read: a row at position p sees exactly the keys at positions 0..p, all of
    which were written by this batch or an earlier one.
    """

    slot_mapping: torch.Tensor  # int64[N] flat slot (block * block_size + offset) of each row's KV
    block_tables: torch.Tensor  # int64[B, max_blocks] this depth's blocks per sequence, 0-padded
    row_seq: torch.Tensor  # int64[N] sequence index (0..B-1) of each row
    row_slot: torch.Tensor  # int64[N] index of each row inside its sequence's query block
    attend_mask: torch.Tensor  # bool[B, max_query_len, max_blocks * block_size] key visible
    positions: torch.Tensor  # int64[N] position of each row
    causal: bool = True  # attend_mask is exactly "key position <= row position" (False: a mutant's mask)


@dataclass(frozen=True)
class ReplayResult:
    """Cache-free serial evaluation of one token sequence through the first `num_depths` depths."""

    logits: torch.Tensor  # float32[num_depths, T, V] readout after each depth
    keys: torch.Tensor  # float32[num_depths, num_layers_per_depth, T, heads, head_size] (post-RoPE)
    values: torch.Tensor  # float32[num_depths, num_layers_per_depth, T, heads, head_size]


class DepthModel(Protocol):
    """What a model must provide to be served by the engine (see the module docstring)."""

    vocab_size: int
    num_depths: int
    num_layers_per_depth: int
    num_kv_heads: int
    head_size: int
    eos_token_id: int

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """int64[N] -> hidden[N, D] in the model dtype."""

    def forward_depth(
        self, depth: int, hidden: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata, kv: PagedKV
    ) -> torch.Tensor:
        """Run depth `depth` (1-based) on hidden[N, D]; writes this depth's KV for the N rows."""

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden[N, D] -> float32 logits[N, V] (final norm + LM head, valid after any depth)."""

    def replay(self, token_ids: torch.Tensor, num_depths: int) -> ReplayResult:
        """Serial cache-free evaluation of int64[T] through depths 1..num_depths."""

    def target_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """float32[T, V]: `replay(token_ids, num_depths).logits[-1]` bit for bit, with one readout
        (after the last depth) and no key/value copies."""


class PagedKV(Protocol):
    """Per-layer key/value block pools, shared by all depths (each depth has its own blocks)."""

    key: tuple[torch.Tensor, ...]  # num_layers_per_depth x [num_blocks, block_size, heads, head]
    value: tuple[torch.Tensor, ...]  # same shapes as key
