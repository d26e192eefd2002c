"""Packing query rows of many sequences and addressing one depth's paged KV for them.

Two entry points build the same `RowLayout`:
- `layout_rows` from host lists (prefill, tests): starts and lengths known on the host;
- `device_layout` from device tensors (speculative rounds): the start positions live on the
  device (the asynchronous runner never reads them back), and the host supplies only upper
  bounds for the shapes (rows, longest query block, KV blocks to gather). It builds no tensor
  from host data, so it can run inside a CUDA Graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv_cache import PAD_BLOCK
from engine.models.base import AttentionMetadata
from engine.runners.transfer import to_device


@dataclass(frozen=True)
class RowLayout:
    """N packed query rows of B sequences: sequence b owns positions starts[b]..starts[b]+len-1."""

    positions: torch.Tensor  # int64[N] position of each row
    row_seq: torch.Tensor  # int64[N] sequence of each row
    row_slot: torch.Tensor  # int64[N] index of the row in its sequence's query block
    attend_mask: torch.Tensor  # bool[B, max_query_len, num_blocks * block_size]
    num_blocks: int  # blocks per sequence that the batch reads (an upper bound on the host)
    block_size: int
    ends: tuple[int, ...] | None  # one past each sequence's last query position (host layouts)
    causal: bool = True  # attend_mask is exactly "key position <= query position"


def device_layout(
    starts: torch.Tensor, lengths: torch.Tensor, *, num_rows: int, max_length: int, num_blocks: int, block_size: int
) -> RowLayout:
    """Lay out rows from device starts int64[B] and lengths int64[B] (sum = num_rows, max <=
    max_length, every end <= num_blocks * block_size: the caller guarantees these bounds).
    A padded query slot sees key 0 only, so it never yields NaN."""
    device = starts.device
    cu = torch.cumsum(lengths, 0) - lengths
    row_seq = torch.repeat_interleave(torch.arange(starts.shape[0], device=device), lengths, output_size=num_rows)
    row_slot = torch.arange(num_rows, device=device) - cu[row_seq]
    slot = torch.arange(max_length, device=device)[None, :]
    query_pos = torch.where(slot < lengths[:, None], starts[:, None] + slot, 0)
    key_pos = torch.arange(num_blocks * block_size, device=device)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]
    return RowLayout(starts[row_seq] + row_slot, row_seq, row_slot, mask, num_blocks, block_size, None)


def layout_rows(starts: list[int], lengths: list[int], block_size: int, device: torch.device) -> RowLayout:
    """Lay out rows whose starts and lengths are host values (exact bounds)."""
    ends = tuple(s + n for s, n in zip(starts, lengths))
    layout = device_layout(
        to_device(starts, torch.int64, device),
        to_device(lengths, torch.int64, device),
        num_rows=sum(lengths),
        max_length=max(lengths),
        num_blocks=-(-max(ends) // block_size),
        block_size=block_size,
    )
    return RowLayout(
        layout.positions, layout.row_seq, layout.row_slot, layout.attend_mask, layout.num_blocks, block_size, ends
    )


def table_capacity(block_tables: list[list[int]], block_size: int) -> int:
    """Positions a request's KV can hold at every depth (its shortest table)."""
    return min(len(table) for table in block_tables) * block_size


def block_table_tensor(
    tables: list[list[int]], num_blocks: int, ends: tuple[int, ...], block_size: int, device: torch.device
) -> torch.Tensor:
    """int64[B, num_blocks]: host block tables padded with PAD_BLOCK; refuses a table that
    cannot hold its sequence's last position (ends[b] - 1)."""
    for table, end in zip(tables, ends):
        if len(table) * block_size < end:
            raise RuntimeError(f"block table of {len(table)} blocks cannot hold position {end - 1}")
    padded = [table[:num_blocks] + [PAD_BLOCK] * (num_blocks - len(table[:num_blocks])) for table in tables]
    return to_device(padded, torch.int64, device)


def metadata_for(layout: RowLayout, block_tables: torch.Tensor) -> AttentionMetadata:
    """Address one depth from a device block table int64[B, >= num_blocks] (no host read)."""
    block_tables = block_tables[:, : layout.num_blocks]
    blocks = block_tables[layout.row_seq, layout.positions // layout.block_size]
    slots = blocks * layout.block_size + layout.positions % layout.block_size
    return AttentionMetadata(
        slots, block_tables, layout.row_seq, layout.row_slot, layout.attend_mask, layout.positions, layout.causal
    )


def depth_metadata(layout: RowLayout, tables: list[list[int]]) -> AttentionMetadata:
    """Address one depth of a host layout: `tables[b]` is sequence b's block table there."""
    return metadata_for(
        layout, block_table_tensor(tables, layout.num_blocks, layout.ends, layout.block_size, layout.positions.device)
    )
