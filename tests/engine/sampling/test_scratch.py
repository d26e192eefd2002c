"""ScratchCache: reuse per (key, device, stream, thread), bounded in bytes (CPU tensors)."""

import threading

import torch

from engine.sampling.scratch import ScratchCache

CPU = torch.device("cpu")


def make_set(num_bytes):
    return lambda: (torch.empty(num_bytes, dtype=torch.uint8),)


def test_a_key_gets_its_buffers_back_and_other_keys_do_not():
    cache = ScratchCache()
    first = cache.get("a", CPU, make_set(64), None)
    assert first.pointers == (first.tensors[0].data_ptr(),)
    assert cache.get("a", CPU, make_set(64), None).tensors[0] is first.tensors[0]
    assert cache.get("b", CPU, make_set(64), None).tensors[0] is not first.tensors[0]
    assert cache.get("a", CPU, make_set(64), 7).tensors[0] is not first.tensors[0]  # stream 7
    assert len(cache) == 3


def test_another_thread_gets_its_own_buffers():
    """Two threads enqueueing on one stream would interleave their launches: never shared."""
    cache = ScratchCache()
    mine = cache.get("a", CPU, make_set(64), None)
    theirs = []
    worker = threading.Thread(target=lambda: theirs.append(cache.get("a", CPU, make_set(64), None)))
    worker.start()
    worker.join()
    assert theirs[0].tensors[0] is not mine.tensors[0]
    assert cache.get("a", CPU, make_set(64), None).tensors[0] is mine.tensors[0]


def test_the_byte_bound_evicts_the_least_recently_used_and_skips_oversized_sets():
    cache = ScratchCache(max_bytes=200)
    a = cache.get("a", CPU, make_set(100), None)
    cache.get("b", CPU, make_set(100), None)
    cache.get("a", CPU, make_set(100), None)  # a is now the most recently used
    cache.get("c", CPU, make_set(100), None)  # evicts b
    assert cache.get("a", CPU, make_set(100), None).tensors[0] is a.tensors[0]
    assert len(cache) == 2
    cache.get("huge", CPU, make_set(300), None)  # larger than the bound: built, not kept
    assert len(cache) == 2


def test_views_of_one_allocation_count_once():
    cache = ScratchCache(max_bytes=100)
    base = torch.empty(80, dtype=torch.uint8)
    cache.get("views", CPU, lambda: (base[:40], base[40:]), None)  # 80 bytes, not 160
    assert len(cache) == 1
