"""Paged KV cache: per-layer block pools shared by all depths, one block table per depth.

A block holds `block_size` consecutive positions of one (sequence, depth) for every layer of that
depth. A sequence owns `num_depths` block tables; the shallow depths of a speculative round may
hold more positions than the deep ones until the round is committed and the rejected tail is
truncated.

Block PAD_BLOCK (0) is never handed out: block tables are padded with it, and it stays zero, so
padded key slots can never carry another request's values (a NaN times a zero attention weight
would still be NaN). Blocks are zeroed when handed out, for the same reason: a failed request
may leave non-finite values behind.

The pool also holds one scratch block after the usable ones (`scratch_block`), never handed
out: padding rows of captured decode rounds write there (see engine.runners.graphs).

Capacity is reserved at admission (`reserve`): a request is admitted only if its worst case fits
next to every admitted request's worst case, so `grow` never runs out of blocks mid-round and a
full pool makes requests queue instead of corrupting anyone's cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.runners.transfer import to_device

PAD_BLOCK = 0  # reserved all-zero block that pads block tables
NUM_RESERVED_BLOCKS = 2  # PAD_BLOCK and the scratch block: pool size = usable blocks + 2


def scratch_block(num_usable_blocks: int) -> int:
    """Id of the scratch block of a pool whose usable blocks are 1..num_usable_blocks."""
    return num_usable_blocks + 1


@dataclass(frozen=True)
class KVLayout:
    """Shape of the cache; `num_blocks` counts every block of the pool (PAD_BLOCK included)."""

    num_blocks: int
    block_size: int
    num_layers: int  # layers per depth
    num_heads: int
    head_size: int


class PagedKVCache:
    """Key/value block pools (`key[layer]`, `value[layer]`: [num_blocks, block_size, heads, head])."""

    def __init__(self, layout: KVLayout, dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (layout.num_blocks, layout.block_size, layout.num_heads, layout.head_size)
        self.layout = layout
        self.key = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(layout.num_layers))
        self.value = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(layout.num_layers))

    def zero_blocks(self, blocks) -> None:
        """Clear freshly allocated blocks (a list of ids, an int64 array, or an int64 tensor on the
        pools' device) in every layer."""
        if len(blocks):
            index = blocks if isinstance(blocks, torch.Tensor) else to_device(blocks, torch.int64, self.key[0].device)
            for pool in self.key + self.value:
                pool.index_fill_(0, index, 0)


class BlockManager:
    """Allocates blocks to per-depth block tables; enforces per-request reservations.

    `num_blocks` usable blocks are managed (ids 1..num_blocks; PAD_BLOCK is extra). Ids handed
    out since the last `take_allocated` call are recorded so the caller can zero them.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks, PAD_BLOCK, -1))  # stack: pop() hands out low ids first
        self._allocated: list[int] = []
        self.num_reserved = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def can_reserve(self, num_blocks: int) -> bool:
        return self.num_reserved + num_blocks <= self.num_blocks

    def reserve(self, num_blocks: int) -> None:
        if not self.can_reserve(num_blocks):
            raise RuntimeError(
                f"cannot reserve {num_blocks} blocks: {self.num_reserved} of {self.num_blocks} already reserved"
            )
        self.num_reserved += num_blocks

    def grow(self, table: list[int], num_positions: int) -> None:
        """Append blocks to `table` until it holds `num_positions` positions."""
        while len(table) < self.blocks_for(num_positions):
            if not self._free:
                raise RuntimeError("block pool exhausted despite reservation (accounting bug)")
            table.append(self._free.pop())
            self._allocated.append(table[-1])

    def take_allocated(self) -> list[int]:
        """Blocks handed out since the previous call (to be zeroed before use)."""
        allocated, self._allocated = self._allocated, []
        return allocated

    def truncate(self, table: list[int], num_positions: int) -> None:
        """Free the blocks of `table` that lie wholly beyond the first `num_positions` positions."""
        keep = self.blocks_for(num_positions)
        while len(table) > keep:
            self._free.append(table.pop())

    def take(self, count: int) -> list[int]:
        """Hand out `count` blocks outside any table (batched collection); the caller has
        reserved them, zeroes them, and returns them with `give_back`."""
        if count > len(self._free):
            raise RuntimeError("block pool exhausted despite reservation (accounting bug)")
        taken = self._free[len(self._free) - count :][::-1]
        del self._free[len(self._free) - count :]
        return taken

    def give_back(self, blocks: list[int], num_reserved: int) -> None:
        """Return blocks from `take` and drop their reservation."""
        self._free.extend(reversed(blocks))
        self.num_reserved -= num_reserved

    def release(self, tables: list[list[int]], num_reserved: int) -> None:
        """Free every block of a finished request and drop its reservation."""
        for table in tables:
            self.truncate(table, 0)
        self.num_reserved -= num_reserved
