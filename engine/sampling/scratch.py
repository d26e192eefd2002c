"""`ScratchCache`: device scratch buffers reused from one kernel call to the next.

An eager call of a multi-launch kernel pays the host for every buffer it allocates; the
buffers a call only writes and reads itself (never returned) can be kept and handed to the next
call of the same shape. Reuse is safe when every use of a buffer is ordered after the previous
use: the key holds the device, the CUDA stream (work on one stream runs in enqueue order) and
the calling thread (two threads enqueueing on one stream would interleave their launches).
Calls captured in a CUDA Graph never share: they get fresh buffers from the graph's memory
pool, which lives as long as the graph (a cached buffer could be evicted and freed while a
graph still writes to it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

import torch

DEFAULT_MAX_BYTES = 512 * 2**20  # the cache never holds more than this; larger sets are not kept


class ScratchCache:
    """Least-recently-used cache of scratch tensor sets, bounded in bytes.

    Guarantee: `get` returns tensors no other live (key, device, stream, thread) combination
    holds, and never a tensor a CUDA Graph capture could outlive; contents are unspecified
    (stale values of an earlier call), so callers must write before they read, as with
    `torch.empty`."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[torch.Tensor, ...]] = OrderedDict()
        self._bytes: dict[Hashable, int] = {}

    def get(self, key: Hashable, device: torch.device,
            make: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """The tensors `make()` built for this key on this device, stream and thread."""
        if device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                return make()
            stream = torch.cuda.current_stream(device).cuda_stream
        else:
            stream = None
        full_key = (key, device, stream, threading.get_ident())
        tensors = self._entries.get(full_key)
        if tensors is not None:
            self._entries.move_to_end(full_key)
            return tensors
        tensors = make()
        self._insert(full_key, tensors)
        return tensors

    def _insert(self, full_key, tensors) -> None:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        size = sum(storages.values())  # views of one allocation count once
        if size > self.max_bytes:
            return
        while self._entries and sum(self._bytes.values()) + size > self.max_bytes:
            oldest, _ = self._entries.popitem(last=False)
            del self._bytes[oldest]
        self._entries[full_key] = tensors
        self._bytes[full_key] = size

    def clear(self) -> None:
        """Drop every cached buffer (tests: the next call allocates afresh)."""
        self._entries.clear()
        self._bytes.clear()

    def __len__(self) -> int:
        return len(self._entries)
