"""Round structure and request pairing of the sequence verdict, on hand-made inputs."""

from __future__ import annotations

import numpy as np

from specval.sequence import verdict


def test_round_positions_follow_the_sources():
    sources = np.array(
        [["accepted", "accepted", "correction", "accepted", "accepted", "accepted", "bonus", "plain"], ["plain"] * 8],
        dtype=object,
    )
    position, previous = verdict.round_positions(sources, 3)
    assert position[0].tolist() == [1, 2, 3, 1, 2, 3, 4, 1]
    assert previous[0].tolist() == [0, 0, 0, 3, 3, 3, 3, 4]
    assert position[1].tolist() == [1] * 8 and previous[1].tolist() == [0] + [1] * 7


def test_round_positions_clip_a_run_longer_than_k_plus_one():
    position, _ = verdict.round_positions(np.array([["accepted"] * 6], dtype=object), 2)
    assert position[0].tolist() == [1, 2, 3, 3, 3, 3]


def _layout(batches: int, size: int) -> verdict.GroupSequences:
    batch = np.repeat(np.arange(batches), size)
    slot = np.tile(np.arange(size), batches)
    empty = np.zeros((batches * size, 1))
    return verdict.GroupSequences(empty, empty, batch, slot, {}, empty, empty)


def test_adjacent_pairs_are_slots_2i_and_2i_plus_1_of_one_batch():
    data = _layout(3, 4)
    a, b = verdict.adjacent_pairs(data)
    assert list(zip(data.batch[a], data.slot[a], data.batch[b], data.slot[b])) == [
        (k, s, k, s + 1) for k in range(3) for s in (0, 2)
    ]


def test_cross_pairs_are_disjoint_and_join_batches_of_one_prompt():
    data = _layout(8, 2)  # 2 prompts: batches 0, 2, 4, 6 after prompt 0
    a, b = verdict.cross_pairs(data, num_prompts=2)
    pairs = sorted(set(zip(data.batch[a].tolist(), data.batch[b].tolist())))
    assert pairs == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert len(set(a) | set(b)) == len(a) + len(b)
    assert all((x - y) % 2 == 0 for x, y in pairs)
