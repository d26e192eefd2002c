"""`ScratchCache`: device scratch buffers reused from one kernel call to the next.

An eager call of a multi-launch kernel pays the host for every buffer it allocates; the
buffers a call only writes and reads itself (never returned) can be kept and handed to the next
call of the same shape. Reuse is safe when every use of a buffer is ordered after the previous
use: the key holds the device, the CUDA stream (work on one stream runs in enqueue order) and
the calling thread (two threads enqueueing on one stream would interleave their launches).
Calls captured in a CUDA Graph never share: they get fresh buffers from the graph's memory
pool, which lives as long as the graph (a cached buffer could be evicted and freed while a
graph still writes to it). A set comes with its tensors' data pointers, read once when it is
built, so that a launch can pass them as they are (`launcher.CompiledLaunch.enqueue`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import NamedTuple

import torch

DEFAULT_MAX_BYTES = 512 * 2**20  # the cache never holds more than this; larger sets are not kept


class Scratch(NamedTuple):
    """A scratch set: its tensors and their data pointers, in the same order."""

    tensors: tuple[torch.Tensor, ...]
    pointers: tuple[int, ...]

    @classmethod
    def of(cls, tensors: tuple[torch.Tensor, ...]) -> Scratch:
        return cls(tensors, tuple(t.data_ptr() for t in tensors))


class ScratchCache:
    """Least-recently-used cache of scratch tensor sets, bounded in bytes.

    Guarantee: `get` returns tensors no other live (key, device, stream, thread) combination
    holds, and never a tensor a CUDA Graph capture could outlive; contents are unspecified
    (stale values of an earlier call), so callers must write before they read, as with
    `torch.empty`."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, Scratch] = OrderedDict()
        self._bytes: dict[Hashable, int] = {}

    def get(
        self, key: Hashable, device: torch.device, make: Callable[[], tuple[torch.Tensor, ...]], stream: int | None
    ) -> Scratch:
        """The tensors `make()` built for this key on this device, stream and thread.
        `stream`: the device's current stream (its raw handle; None on the CPU)."""
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return Scratch.of(make())
        full_key = (key, device, stream, threading.get_ident())
        scratch = self._entries.get(full_key)
        if scratch is not None:
            self._entries.move_to_end(full_key)
            return scratch
        scratch = Scratch.of(make())
        self._insert(full_key, scratch)
        return scratch

    def _insert(self, full_key, scratch: Scratch) -> None:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in scratch.tensors}
        size = sum(storages.values())  # views of one allocation count once
        if size > self.max_bytes:
            return
        while self._entries and sum(self._bytes.values()) + size > self.max_bytes:
            oldest, _ = self._entries.popitem(last=False)
            del self._bytes[oldest]
        self._entries[full_key] = scratch
        self._bytes[full_key] = size

    def clear(self) -> None:
        """Drop every cached buffer (tests: the next call allocates afresh)."""
        self._entries.clear()
        self._bytes.clear()

    def __len__(self) -> int:
        return len(self._entries)
