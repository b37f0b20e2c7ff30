"""Recycled shared-memory payload buffers between DataLoader workers and the training process.

A worker hands a batch to the training process in shared memory. A fresh shared-memory buffer costs more than the
frames it carries: torch allocates its pages up front and each of them then faults in, once in the worker and once
in the training process (measured here: 45 ms to fill a fresh 52 MB buffer, 3 ms to fill one already mapped). So
the large payloads (decoded frames) go into buffers that are used again:

- in the worker, a :class:`BufferPool` keeps, per payload key, the buffers it has handed out. Each buffer ends
  in a small trailer (a magic and a state) that both processes see;
- in the training process, a :class:`ReleaseTracker` (one per :class:`~mmfeed.loaders.DataLoader`) notes every
  pooled buffer that arrives and keeps it mapped. When nothing but the tracker refers to a buffer any more (no
  tensor, view or numpy array of it is left), it marks the buffer free, and the worker writes the next batch into
  it. Because the training process still maps it, torch hands the next batch over without mapping it again.

The state of a buffer moves ``FREE -> IN_WORKER`` (the worker takes it) ``-> IN_MAIN`` (the tracker saw it
arrive) ``-> FREE`` (the tracker saw it unreferenced); each process writes only its own transitions, so no lock
is needed. A batch that never reaches a tracker (a plain torch DataLoader, pinned-memory copies) only costs the
pool its buffers: the worker allocates new ones, and drops its oldest when it holds ``per_key`` of a key already.
Recycling is turned on in the workers of an mmfeed DataLoader over a planned dataset (see ``recycle_buffers``).
"""

from __future__ import annotations

import ctypes
import math
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from mmfeed.loaders.clock import TimedBatch

__all__ = ["BufferPool", "ReleaseTracker", "enable_pool", "pooled_buffer"]

_MAGIC = b"mmfeed/shm/pool\x00"  # 16 bytes
_TRAILER = 32  # magic (16), state (int64), reserved (8)
FREE, IN_WORKER, IN_MAIN = 0, 1, 2
_ROUND = 1 << 20  # capacities are whole MiB, with some headroom, so that batches of similar size share buffers


def _state(storage: torch.UntypedStorage) -> ctypes.c_int64:
    """The state word of a pooled buffer (a view of shared memory: reads and writes go straight to it)."""
    return ctypes.c_int64.from_address(storage.data_ptr() + storage.nbytes() - _TRAILER + 16)


def _is_pooled(storage: torch.UntypedStorage) -> bool:
    n = storage.nbytes()
    return n >= _TRAILER and storage.device.type == "cpu" and \
        ctypes.string_at(storage.data_ptr() + n - _TRAILER, 16) == _MAGIC


def _uses(storage: torch.UntypedStorage) -> int:
    return torch._C._storage_Use_Count(storage._cdata)


@dataclass
class _Buffer:
    storage: torch.UntypedStorage
    capacity: int  # payload bytes, trailer excluded


class BufferPool:
    """The worker's side: shared-memory buffers handed out per payload key and taken again once freed."""

    def __init__(self, per_key: int) -> None:
        if per_key < 1:
            raise ValueError(f"a buffer pool keeps at least 1 buffer per key, got {per_key}")
        self.per_key = per_key
        self._buffers: dict[str, OrderedDict[int, _Buffer]] = {}
        self.allocated = 0  # buffers created, and buffers taken again: for tests and benchmarks
        self.reused = 0

    def take(self, key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """An uninitialised ``shape`` tensor in a pooled shared-memory buffer for payload ``key``."""
        nbytes = math.prod(shape) * dtype.itemsize
        buffers = self._buffers.setdefault(key, OrderedDict())
        best = None  # the smallest free buffer that fits
        for ptr, b in buffers.items():
            if b.capacity >= nbytes and (best is None or b.capacity < best[0]) and _state(b.storage).value == FREE:
                best = (b.capacity, ptr)
        if best is not None:
            buffer = buffers.pop(best[1])
            self.reused += 1
        else:
            while len(buffers) >= self.per_key:
                buffers.popitem(last=False)  # the least recently taken: the training process may hold it still
            capacity = -(-(nbytes + nbytes // 8) // _ROUND) * _ROUND
            storage = torch.UntypedStorage._new_shared(capacity + _TRAILER)
            ctypes.memmove(storage.data_ptr() + capacity, _MAGIC, 16)
            buffer = _Buffer(storage, capacity)
            self.allocated += 1
        _state(buffer.storage).value = IN_WORKER
        buffers[buffer.storage.data_ptr()] = buffer  # most recently taken last
        return torch.empty(0, dtype=dtype).set_(buffer.storage, 0, shape)


_pool: BufferPool | None = None
_pool_pid = -1


def enable_pool(per_key: int) -> None:
    """Recycle payload buffers in this process (a DataLoader worker), keeping up to ``per_key`` buffers per key."""
    global _pool, _pool_pid
    _pool, _pool_pid = BufferPool(per_key), os.getpid()


def pooled_buffer(key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor | None:
    """A recycled shared-memory tensor for ``key`` when this process recycles buffers, else None."""
    if _pool is None or _pool_pid != os.getpid():  # never use a pool inherited through fork
        return None
    return _pool.take(key, shape, dtype)


class ReleaseTracker:
    """The training process's side: frees pooled buffers once nothing refers to them.

    stale_after: batches after which a buffer that has not come back and that nothing refers to is let go (its
    worker dropped it, or ended).
    """

    def __init__(self, stale_after: int = 64) -> None:
        self.stale_after = stale_after
        self._seen: dict[int, tuple[torch.UntypedStorage, int]] = {}  # data_ptr -> (storage, batch last seen)
        self._batches = 0
        self.released = 0

    def __len__(self) -> int:
        return len(self._seen)

    def watch(self, batch: Any) -> None:
        """Free what the earlier batches no longer use, then note the pooled buffers of ``batch``."""
        self.sweep()
        self._batches += 1
        for tensor in _tensors(batch):
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            entry = self._seen.get(ptr)
            if entry is None:
                if not _is_pooled(storage):
                    continue
                entry = (storage, 0)
            self._seen[ptr] = (entry[0], self._batches)
            _state(entry[0]).value = IN_MAIN

    def sweep(self) -> None:
        """Mark free every buffer that arrived and is no longer referenced; let go of stale ones."""
        for ptr, (storage, last) in list(self._seen.items()):
            if _uses(storage) > 1:
                continue
            state = _state(storage)
            if state.value == IN_MAIN:
                state.value = FREE
                self.released += 1
            elif self._batches - last > self.stale_after:
                del self._seen[ptr]

    def clear(self) -> None:
        """Let go of every buffer (the workers that recycled them are gone)."""
        self._seen.clear()


def _tensors(batch: Any):
    """The CPU tensors of a batch: a PackedBatch's payloads, or the values of a dict, list or tuple (inside a
    TimedBatch when the loader times its workers)."""
    if isinstance(batch, TimedBatch):
        batch = batch.batch
    data = getattr(batch, "data", None)
    items = data.values() if isinstance(data, dict) else \
        batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        if isinstance(item, torch.Tensor) and item.device.type == "cpu":
            yield item
