"""Recycled shared-memory payload buffers between DataLoader workers and the training process.

Two rooms use it, so it lives beside both: the planned path's collation takes buffers in a worker
(:func:`pooled_buffer`, :mod:`mmfeed.loaders.planned.collate`) and the loop turns the pool on in its workers
(:func:`enable_pool`) and frees buffers in the training process (:class:`ReleaseTracker`); the loop imports the
planned path, never the reverse.

A worker hands a batch to the training process in shared memory. A fresh shared-memory buffer costs more than the
frames it carries: torch allocates its pages up front and each of them then faults in, once in the worker and once
in the training process (measured here: 45 ms to fill a fresh 52 MB buffer, 3 ms to fill one already mapped). So
the large payloads (decoded frames) go into buffers that are used again:

- in the worker, a :class:`BufferPool` keeps, per payload key, the buffers it has handed out. Each buffer ends
  in a small trailer (a magic, a state and the pool's nonce) that both processes see;
- in the training process, a :class:`ReleaseTracker` (one per :class:`~mmfeed.loaders.DataLoader`) notes every
  pooled buffer that arrives and keeps it mapped. When nothing but the tracker refers to a buffer any more (no
  tensor, view or numpy array of it is left), it marks the buffer free, and the worker writes the next batch into
  it. Because the training process still maps it, torch hands the next batch over without mapping it again.

The state of a buffer moves ``FREE -> IN_WORKER`` (the worker takes it) ``-> IN_MAIN`` (the tracker saw it
arrive) ``-> FREE`` (the tracker saw it unreferenced); each process writes only its own transitions, so no lock
is needed.

A buffer's descriptor crosses to the training process once. torch sends a shared-memory tensor's file descriptor
with every batch, over a fresh authenticated connection to the worker's resource-sharer thread: 0.45 CPU-ms a
batch between the two processes (measured; pickling and unpickling the batch's ids and metadata by value costs
about 0.17). So a worker that recycles buffers (and only such a worker) pickles a
:class:`~mmfeed.packing.PackedBatch` for its queue with :func:`_reduce_batch`: each pooled buffer is named by its
pool and serial (:class:`_PoolRef`), and its storage travels, by torch's descriptor, only the first time. The
batch's small arrays (ids, masks, metadata, small payloads: about 120 KB for 32 RLDS samples) are copied into one
more pooled buffer (key :data:`SMALL_KEY`), so the pickle names places only (about 1.5 KB) instead of carrying
their bytes through the queue's pipe. The
training process keeps each buffer it received in a registry (:func:`_rebuild_batch`) until the worker says, in a
later batch, that it dropped the buffer, or the loader's tracker forgets the pool (its workers are gone). A buffer
the worker dropped before the batch that first holds it was pickled goes the ordinary way, descriptor and all.

A batch that never reaches a tracker (a plain torch DataLoader, pinned-memory copies) only costs the pool its
buffers: the worker allocates new ones, and drops its oldest when it holds ``per_key`` of a key already.
Recycling is turned on in the workers of an mmfeed DataLoader over a planned dataset (see ``recycle_buffers``).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from mmfeed.loaders.clock import TimedBatch
from mmfeed.packing.batch import PackedBatch, map_tensors, small_array

__all__ = ["BufferPool", "ReleaseTracker", "enable_pool", "give_back", "phase_headroom", "phase_offset",
           "pooled_buffer", "received_buffers"]

_MAGIC = b"mmfeed/shm/pool\x00"  # 16 bytes
_TRAILER = 32  # magic (16), state (int64), the pool's nonce (8)
FREE, IN_WORKER, IN_MAIN = 0, 1, 2
_ALIGN = 64  # each small array starts on a cache line of the buffer, aligned for any dtype
_ROUND = 1 << 20  # capacities are whole MiB, with some headroom, so that batches of similar size share buffers


def _state(storage: torch.UntypedStorage) -> ctypes.c_int64:
    """The state word of a pooled buffer (a view of shared memory: reads and writes go straight to it)."""
    return ctypes.c_int64.from_address(storage.data_ptr() + storage.nbytes() - _TRAILER + 16)


def _is_pooled(storage: torch.UntypedStorage) -> bool:
    n = storage.nbytes()
    return n >= _TRAILER and storage.device.type == "cpu" and \
        ctypes.string_at(storage.data_ptr() + n - _TRAILER, 16) == _MAGIC


def _nonce(storage: torch.UntypedStorage) -> bytes:
    """The nonce of the pool a pooled buffer belongs to."""
    return ctypes.string_at(storage.data_ptr() + storage.nbytes() - _TRAILER + 24, 8)


def _uses(storage: torch.UntypedStorage) -> int:
    return torch._C._storage_Use_Count(storage._cdata)


@dataclass
class _Buffer:
    storage: torch.UntypedStorage
    capacity: int  # payload bytes, trailer excluded
    serial: int  # its number in its pool
    sent: bool = False  # pickled for the training process (its descriptor went with it) at least once


class BufferPool:
    """The worker's side: shared-memory buffers handed out per payload key and taken again once freed."""

    def __init__(self, per_key: int) -> None:
        if per_key < 1:
            raise ValueError(f"a buffer pool keeps at least 1 buffer per key, got {per_key}")
        self.per_key = per_key
        # names this pool's buffers in the training process: this process's pid, then 4 random bytes
        self.nonce = os.getpid().to_bytes(4, "little") + os.urandom(4)
        self._buffers: dict[str, OrderedDict[int, _Buffer]] = {}
        self._by_ptr: dict[int, _Buffer] = {}
        self._dropped: list[int] = []  # serials of sent buffers dropped since the last batch was pickled
        self._lock = threading.Lock()  # the worker's loop takes buffers; a queue's feeder thread may pickle batches
        self.allocated = 0  # buffers created, and buffers taken again: for tests and benchmarks
        self.reused = 0

    def take(self, key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8, phase: int = 0
             ) -> torch.Tensor:
        """An uninitialised ``shape`` tensor in a pooled shared-memory buffer for payload ``key``, starting
        ``phase`` bytes past a 64-byte boundary (see :func:`phase_offset`)."""
        phase_offset(0, phase, dtype.itemsize)  # a bad phase is refused before a buffer is taken
        nbytes = math.prod(shape) * dtype.itemsize + phase_headroom(phase)
        with self._lock:
            buffers = self._buffers.setdefault(key, OrderedDict())
            best = None  # the smallest free buffer that fits
            for ptr, b in buffers.items():
                if b.capacity >= nbytes and (best is None or b.capacity < best[0]) \
                        and _state(b.storage).value == FREE:
                    best = (b.capacity, ptr)
            if best is not None:
                buffer = buffers.pop(best[1])
                self.reused += 1
            else:
                while len(buffers) >= self.per_key:
                    # the least recently taken: the training process may hold it still
                    _, old = buffers.popitem(last=False)
                    del self._by_ptr[old.storage.data_ptr()]
                    if old.sent:
                        self._dropped.append(old.serial)
                capacity = -(-(nbytes + nbytes // 8) // _ROUND) * _ROUND
                storage = torch.UntypedStorage._new_shared(capacity + _TRAILER)
                ctypes.memmove(storage.data_ptr() + capacity, _MAGIC, 16)
                ctypes.memmove(storage.data_ptr() + capacity + 24, self.nonce, 8)
                buffer = _Buffer(storage, capacity, self.allocated)
                self._by_ptr[storage.data_ptr()] = buffer
                self.allocated += 1
            _state(buffer.storage).value = IN_WORKER
            buffers[buffer.storage.data_ptr()] = buffer  # most recently taken last
        offset = phase_offset(buffer.storage.data_ptr(), phase, dtype.itemsize)
        return torch.empty(0, dtype=dtype).set_(buffer.storage, offset // dtype.itemsize, shape)

    def give_back(self, tensor: torch.Tensor) -> None:
        """Free ``tensor``'s buffer again when it is one of this pool's, taken and never sent."""
        with self._lock:
            buffer = self._by_ptr.get(tensor.untyped_storage().data_ptr())
            if buffer is not None and not buffer.sent and _state(buffer.storage).value == IN_WORKER:
                _state(buffer.storage).value = FREE

    def ref(self, tensor: torch.Tensor) -> _PoolRef | None:
        """``tensor`` (a view of one of this pool's buffers) as the training process will rebuild it: its buffer
        named, with the buffer's storage the first time only; None for a tensor of no buffer the pool holds."""
        with self._lock:
            buffer = self._by_ptr.get(tensor.untyped_storage().data_ptr())
            if buffer is None:
                return None
            first, buffer.sent = not buffer.sent, True
        return _PoolRef(self.nonce, buffer.serial, buffer.storage if first else None, tensor.dtype,
                        tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))

    def take_dropped(self) -> list[int]:
        """The serials of the sent buffers dropped since the last call (the training process may forget them)."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
        return dropped


_pool: BufferPool | None = None
_pool_pid = -1


def enable_pool(per_key: int) -> None:
    """Recycle payload buffers in this process (a DataLoader worker), keeping up to ``per_key`` buffers per key,
    and hand each buffer's descriptor to the training process once (:func:`_reduce_batch`)."""
    global _pool, _pool_pid
    _pool, _pool_pid = BufferPool(per_key), os.getpid()
    ForkingPickler.register(PackedBatch, _reduce_batch)


def pooled_buffer(key: str, shape: tuple[int, ...], dtype: torch.dtype = torch.uint8, phase: int = 0
                  ) -> torch.Tensor | None:
    """A recycled shared-memory tensor for ``key`` (starting ``phase`` bytes past a 64-byte boundary) when this
    process recycles buffers, else None."""
    if _pool is None or _pool_pid != os.getpid():  # never use a pool inherited through fork
        return None
    return _pool.take(key, shape, dtype, phase)


def phase_offset(address: int, phase: int, itemsize: int = 1) -> int:
    """The bytes past ``address`` at which a buffer starts ``phase`` bytes past a 64-byte boundary (0 for phase 0:
    where it is). A decoder may store faster into one phase than another: libjpeg-turbo writes a row that starts
    32-byte aligned with non-temporal stores (see :data:`mmfeed.loaders.formats.rlds.pictures.SLOT_PHASE`). A
    ValueError for a phase outside ``[0, 64)`` or not a multiple of ``itemsize``."""
    if not 0 <= phase < _ALIGN or phase % itemsize:
        raise ValueError(f"a buffer's phase is a multiple of its item size ({itemsize}) in [0, {_ALIGN}), got {phase}")
    return (phase - address) % _ALIGN if phase else 0


def phase_headroom(phase: int) -> int:
    """The spare bytes a buffer needs to start ``phase`` bytes past a 64-byte boundary wherever it was allocated
    (none for phase 0: it starts where it was allocated)."""
    return _ALIGN if phase else 0


def give_back(tensor: object) -> None:
    """Return a pooled buffer this worker took but never sent (a batch abandoned before it was made) to its pool:
    it is free again. Anything else is left as it is."""
    if _pool is not None and _pool_pid == os.getpid() and isinstance(tensor, torch.Tensor):
        _pool.give_back(tensor)


@dataclass(frozen=True)
class _PoolRef:
    """A tensor in a pooled buffer, as a worker pickles it: the buffer named by its pool's nonce and its serial,
    and the tensor's place in it; ``storage`` only the first time the buffer goes to the training process."""

    nonce: bytes
    serial: int
    storage: torch.UntypedStorage | None
    dtype: torch.dtype
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


SMALL_KEY = "_small"
"""The pool key of each batch's buffer of small arrays (ids, masks, metadata, small payloads)."""


class _Packed:
    """A small array of a batch as a worker pickles it: its place in the batch's buffer of small arrays (offset in
    bytes, numpy dtype string, shape)."""

    __slots__ = ("offset", "dtype", "shape")

    def __init__(self, offset: int, dtype: str, shape: tuple[int, ...]) -> None:
        self.offset, self.dtype, self.shape = offset, dtype, shape

    def __reduce__(self) -> tuple:
        return _Packed, (self.offset, self.dtype, self.shape)


@functools.lru_cache(maxsize=None)
def _torch_dtype(dtype: str) -> torch.dtype:
    return torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype


def _reduce_batch(batch: PackedBatch) -> tuple:
    """How a worker that recycles buffers pickles a batch for its queue, in one walk over its tensors: each tensor
    of a pooled buffer as a :class:`_PoolRef`; the small arrays :meth:`PackedBatch.__getstate__` pickles by value
    copied into one pooled buffer, each a :class:`_Packed` (a batch's ids, masks and metadata come to about
    120 KB, which would otherwise be copied through the queue's pipe and unpickled array by array); plus the
    buffers dropped since the last batch."""
    if _pool is None or _pool_pid != os.getpid():  # a pool inherited through fork is not this process's
        return batch.__reduce_ex__(2)
    small: list[tuple[int, np.ndarray]] = []
    end = 0

    def reduce(tensor: torch.Tensor) -> Any:
        nonlocal end
        array = small_array(tensor)
        if array is None:
            return _pool.ref(tensor) or tensor
        small.append((end, array))
        packed = _Packed(end, array.dtype.str, array.shape)
        end += -(-array.nbytes // _ALIGN) * _ALIGN
        return packed

    state = batch.pickled_state(reduce)
    buffer = None
    if small:
        arena = _pool.take(SMALL_KEY, (max(end, 1),))
        flat = arena.numpy()
        for offset, array in small:
            flat[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)[...] = array
        buffer = _pool.ref(arena)
    return _rebuild_batch, (type(batch), state, _pool.nonce, _pool.take_dropped(), buffer)


_received: dict[bytes, dict[int, torch.UntypedStorage]] = {}  # the training process's: nonce -> serial -> buffer
_received_lock = threading.Lock()


def received_buffers() -> int:
    """The pooled buffers this (training) process keeps mapped, of every worker: each one a shared-memory storage
    its worker may write the next batch into. Bounded: a worker keeps ``per_key`` buffers a payload key, and says
    which it dropped."""
    with _received_lock:
        return sum(len(buffers) for buffers in _received.values())


def _rebuild_batch(cls: type, state: dict[str, Any], nonce: bytes, dropped: list[int],
                   small: _PoolRef | None = None) -> PackedBatch:
    """The training process's side of :func:`_reduce_batch`: the batch over the buffers received so far, which
    keep what this batch brings (``small``: its buffer of small arrays); then the buffers its worker dropped are
    forgotten."""
    with _received_lock:
        def tensor(ref: _PoolRef) -> torch.Tensor:
            buffers = _received.setdefault(ref.nonce, {})
            if ref.storage is not None:
                buffers[ref.serial] = ref.storage
            storage = buffers.get(ref.serial)
            if storage is None:
                raise RuntimeError(f"a batch refers to shared buffer {ref.serial} of worker pool {ref.nonce.hex()}, "
                                   "which this process never received (was the batch pickled by its worker for "
                                   "another process too?)")
            return torch.empty(0, dtype=ref.dtype).set_(storage, ref.offset, ref.shape, ref.stride)

        storage = None if small is None else tensor(small).untyped_storage()

        def rebuild(ref: _PoolRef | _Packed) -> torch.Tensor:
            if isinstance(ref, _PoolRef):
                return tensor(ref)
            dtype = _torch_dtype(ref.dtype)
            return torch.empty(0, dtype=dtype).set_(storage, ref.offset // dtype.itemsize, ref.shape)

        state = {k: map_tensors(v, rebuild, (_PoolRef, _Packed)) for k, v in state.items()}
        if dropped:
            buffers = _received.get(nonce, {})
            for serial in dropped:
                buffers.pop(serial, None)
    batch = cls.__new__(cls)
    batch.__setstate__(state)
    return batch


def _forget(nonces: set[bytes], *, alive_too: bool = False) -> set[bytes]:
    """Let go of the buffers received from those of these pools whose worker process has ended (``alive_too``:
    of all of them); the nonces kept."""
    kept = set()
    with _received_lock:
        for nonce in nonces:
            if alive_too or not _alive(int.from_bytes(nonce[:4], "little")):
                _received.pop(nonce, None)
            else:
                kept.add(nonce)
    return kept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or another user's process took its pid
        return False
    return True


class ReleaseTracker:
    """The training process's side: frees pooled buffers once nothing refers to them.

    stale_after: batches after which a buffer that has not come back and that nothing refers to is let go (its
    worker dropped it, or ended).
    """

    def __init__(self, stale_after: int = 64) -> None:
        self.stale_after = stale_after
        self._seen: dict[int, tuple[torch.UntypedStorage, int]] = {}  # data_ptr -> (storage, batch last seen)
        self._pools: set[bytes] = set()  # the nonces of the pools whose buffers arrived
        self._batches = 0
        self.released = 0

    def __del__(self) -> None:
        _forget(self._pools, alive_too=True)

    def __len__(self) -> int:
        return len(self._seen)

    def watch(self, batch: Any) -> None:
        """Free what the earlier batches no longer use, then note the pooled buffers of ``batch``."""
        self.sweep()
        self.note(batch)

    def note(self, batch: Any) -> None:
        """Note the pooled buffers of ``batch``: in the training process, each marked in use there."""
        self._batches += 1
        for tensor in _tensors(batch):
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            entry = self._seen.get(ptr)
            if entry is None:
                if not _is_pooled(storage):
                    continue
                entry = (storage, 0)
                self._pools.add(_nonce(storage))
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
        # a pool's buffers stay received while its worker lives: an iterator left behind may bring more batches
        self._pools = _forget(self._pools)


def _tensors(batch: Any):
    """The CPU tensors of a batch: a PackedBatch's payloads and document ids (which name its buffer of small
    arrays), or the values of a dict, list or tuple (inside a TimedBatch when the loader times its workers)."""
    if isinstance(batch, TimedBatch):
        batch = batch.batch
    data = getattr(batch, "data", None)
    items = [batch.document_ids, *data.values()] if isinstance(batch, PackedBatch) else \
        data.values() if isinstance(data, dict) else \
        batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        if isinstance(item, torch.Tensor) and item.device.type == "cpu":
            yield item
