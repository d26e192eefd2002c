"""Packing query rows of many sequences and addressing one depth's paged KV for them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_cache import PAD_BLOCK
from engine.models.base import AttentionMetadata


@dataclass(frozen=True)
class RowLayout:
    """N packed query rows of B sequences: sequence b owns positions starts[b]..starts[b]+len-1."""

    positions: torch.Tensor  # int64[N] position of each row
    row_seq: torch.Tensor  # int64[N] sequence of each row
    row_slot: torch.Tensor  # int64[N] index of the row in its sequence's query block
    attend_mask: torch.Tensor  # bool[B, max_query_len, num_blocks * block_size]
    num_blocks: int  # blocks per sequence that the batch reads (max over sequences)
    block_size: int
    ends: tuple[int, ...]  # one past each sequence's last query position


def layout_rows(starts: list[int], lengths: list[int], block_size: int,
                device: torch.device) -> RowLayout:
    """Lay out rows; a padded query slot sees key 0 only, so it never yields NaN."""
    starts_t = torch.tensor(starts, dtype=torch.int64, device=device)
    lengths_t = torch.tensor(lengths, dtype=torch.int64, device=device)
    cu = torch.cumsum(lengths_t, 0) - lengths_t
    row_seq = torch.repeat_interleave(torch.arange(len(starts), device=device), lengths_t,
                                      output_size=sum(lengths))
    row_slot = torch.arange(row_seq.numel(), device=device) - cu[row_seq]
    num_blocks = -(-max(s + n for s, n in zip(starts, lengths)) // block_size)
    query_pos = starts_t[:, None] + torch.arange(max(lengths), device=device)[None, :]
    key_pos = torch.arange(num_blocks * block_size, device=device)
    valid = torch.arange(max(lengths), device=device)[None, :] < lengths_t[:, None]
    query_pos = torch.where(valid, query_pos, 0)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    ends = tuple(s + n for s, n in zip(starts, lengths))
    return RowLayout(starts_t[row_seq] + row_slot, row_seq, row_slot, mask, num_blocks, block_size,
                     ends)


def depth_metadata(layout: RowLayout, tables: list[list[int]]) -> AttentionMetadata:
    """Address one depth: `tables[b]` is sequence b's block table at that depth."""
    width = layout.num_blocks
    for table, end in zip(tables, layout.ends):
        if len(table) * layout.block_size < end:
            raise RuntimeError(f"block table of {len(table)} blocks cannot hold position {end - 1}")
    padded = [table[:width] + [PAD_BLOCK] * (width - len(table[:width])) for table in tables]
    block_tables = torch.tensor(padded, dtype=torch.int64, device=layout.positions.device)
    blocks = block_tables[layout.row_seq, layout.positions // layout.block_size]
    slots = blocks * layout.block_size + layout.positions % layout.block_size
    return AttentionMetadata(slots, block_tables, layout.row_seq, layout.row_slot, layout.attend_mask)
