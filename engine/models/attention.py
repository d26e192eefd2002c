"""Attention over the paged KV cache (packed ragged rows) and its dense causal counterpart."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models.base import AttentionMetadata


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_cache: torch.Tensor, value_cache: torch.Tensor,
                    metadata: AttentionMetadata) -> torch.Tensor:
    """Write the rows' key/value into the cache, then attend over each sequence's cached keys.

    query, key, value: [N, heads, head]; key_cache, value_cache: [num_blocks, block_size, heads,
    head]. Returns [N, heads, head]. Rows are scattered into a padded [B, max_query_len] block so
    that one SDPA call serves prefill, decode and verify rows alike.
    """
    num_heads, head_size = key.shape[1], key.shape[2]
    key_cache.view(-1, num_heads, head_size).index_copy_(0, metadata.slot_mapping, key)
    value_cache.view(-1, num_heads, head_size).index_copy_(0, metadata.slot_mapping, value)
    keys = _gather(key_cache, metadata.block_tables)  # [B, heads, Tk, head]
    values = _gather(value_cache, metadata.block_tables)
    num_seqs, max_query_len = metadata.attend_mask.shape[0], metadata.attend_mask.shape[1]
    padded = query.new_zeros(num_seqs, max_query_len, num_heads, head_size)
    padded[metadata.row_seq, metadata.row_slot] = query
    out = F.scaled_dot_product_attention(padded.transpose(1, 2), keys, values,
                                         attn_mask=metadata.attend_mask.unsqueeze(1))
    return out.transpose(1, 2)[metadata.row_seq, metadata.row_slot]


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_blocks, bs, H, Dh] gathered by int64[B, MB] -> [B, H, MB * bs, Dh]."""
    blocks = cache[block_tables]  # [B, MB, bs, H, Dh]
    num_seqs, max_blocks, block_size = blocks.shape[:3]
    return blocks.view(num_seqs, max_blocks * block_size, *blocks.shape[3:]).transpose(1, 2)


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Dense causal attention on [batch, T, heads, head] tensors (training and serial replay)."""
    out = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2),
                                         value.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)
