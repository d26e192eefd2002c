"""Block manager: allocation, growth, truncation after rejection, release, reservations."""

from __future__ import annotations

import pytest
import torch

from engine.kv_cache import PAD_BLOCK, BlockManager, KVLayout, PagedKVCache


def test_grow_truncate_release_round_trip():
    blocks = BlockManager(num_blocks=8, block_size=4)
    blocks.reserve(6)
    shallow, deep = [], []
    blocks.grow(shallow, 9)  # 3 blocks
    blocks.grow(deep, 5)  # 2 blocks
    assert len(shallow) == 3 and len(deep) == 2
    assert PAD_BLOCK not in shallow + deep
    assert len(set(shallow + deep)) == 5 and blocks.num_free == 3
    blocks.truncate(shallow, 5)  # rejected tail: positions 5..8 dropped, 2 blocks kept
    assert len(shallow) == 2 and blocks.num_free == 4
    blocks.truncate(shallow, 5)  # idempotent
    assert blocks.num_free == 4
    blocks.release([shallow, deep], 6)
    assert blocks.num_free == 8 and blocks.num_reserved == 0 and shallow == [] and deep == []


def test_reservations_bound_admission():
    blocks = BlockManager(num_blocks=10, block_size=16)
    assert blocks.can_reserve(10) and not blocks.can_reserve(11)
    blocks.reserve(7)
    assert not blocks.can_reserve(4)
    with pytest.raises(RuntimeError, match="reserve"):
        blocks.reserve(4)


def test_freed_blocks_are_reused_and_reported_for_zeroing():
    blocks = BlockManager(num_blocks=2, block_size=2)
    table = []
    blocks.grow(table, 4)
    first = blocks.take_allocated()
    assert sorted(first) == [1, 2] and blocks.take_allocated() == []
    blocks.truncate(table, 0)
    other = []
    blocks.grow(other, 3)
    assert sorted(other) == [1, 2] and sorted(blocks.take_allocated()) == [1, 2]


def test_zero_blocks_clears_every_layer():
    cache = PagedKVCache(
        KVLayout(num_blocks=3, block_size=2, num_layers=2, num_heads=1, head_size=2), torch.float32, "cpu"
    )
    for pool in cache.key + cache.value:
        pool.fill_(float("nan"))
    cache.zero_blocks([1])
    for pool in cache.key + cache.value:
        assert torch.all(pool[1] == 0) and torch.isnan(pool[0]).all() and torch.isnan(pool[2]).all()
