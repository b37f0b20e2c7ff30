"""The C heap of a DataLoader worker process, given back between epochs.

A persistent worker allocates and frees much the same sizes batch after batch, but in an order that leaves holes
in glibc's heap: a request that fits none of them grows the heap, and the pages it added stay with the process
once freed (glibc returns only the top of the heap on its own, and only past a threshold). Over hundreds of epochs
that is memory without bound. :func:`epoch_began`, called by the planned dataset with every step's epoch, gives
the free heap back (``malloc_trim(0)``: the free pages inside the heap too) when a worker process starts on
another epoch. Elsewhere than glibc nothing happens.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import torch

__all__ = ["epoch_began", "release_free_heap"]

_malloc_trim: Any = None  # glibc's malloc_trim, False where the C library has none
_epoch_in_worker: tuple[int, int] | None = None  # (pid, epoch) of the last step this worker process loaded
trims = 0
"""Times :func:`epoch_began` gave the free heap back in this process (for tests and benchmarks)."""


def release_free_heap() -> bool:
    """Give the memory glibc's allocator holds free in this process back to the system (``malloc_trim(0)``: the
    free pages inside the heap too, not only its top); False where the C library has no such call. Measured on
    the packed loader's workers: 2-3 MB held free after each epoch, and the heap a third of a MB larger every few
    epochs; trimmed at each epoch's start, it stays level."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
            _malloc_trim.argtypes, _malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (AttributeError, OSError):
            _malloc_trim = False
    if not _malloc_trim:
        return False
    _malloc_trim(0)
    return True


def epoch_began(epoch: int) -> None:
    """Called with the epoch of every step a planned dataset loads: in a DataLoader worker process, the first
    step of another epoch than the last one loaded there first gives back the heap the earlier epoch left free
    (:func:`release_free_heap`; a fraction of a millisecond). The training process's heap is left alone."""
    global _epoch_in_worker, trims
    pid = os.getpid()
    last = _epoch_in_worker
    if last is not None and last[0] == pid and last[1] == epoch:
        return
    if torch.utils.data.get_worker_info() is None:
        return
    _epoch_in_worker = (pid, epoch)
    if last is not None and last[0] == pid:
        release_free_heap()
        trims += 1
