"""Parts of RLDS records read alone, by byte range: a sample's own keys and pictures, never its whole episode.

An OXE episode's record holds every step's pictures of every camera (about a megabyte for 40 steps of a 256x256
and a 128x128 JPEG camera); a sample of a global shuffle wants two or three of those pictures and a few rows of
its state and actions. The sidecar index (:mod:`.index`) keeps, for every record, where each key's ``Feature``
message lies and, for every camera, where each step's picture lies, each with its CRC-32C. :class:`RecordRanges`
reads such ranges of a local shard with ``pread`` (one file descriptor per shard and process, opened on first
use: workers forked or spawned open their own) and checks each against the CRC the index keeps: the record's own
CRC covers bytes a sample no longer reads, so a flipped byte is still an error naming the shard, the record and
the range, never wrong data.

The pictures of a whole batch are gathered at once (:meth:`RecordRanges.gather`): sorted by shard and offset,
neighbours (frames ``[t-1, t]`` of a window lie side by side in their record) read in one range, into one buffer,
and checked in one pass of the CRC kernel.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from mmfeed.loaders.formats.rlds.tfrecord import _HEADER, crc32c, crc32c_spans
from mmfeed.loaders.transport.errors import SampleError

__all__ = ["RecordRanges", "read_plan"]

_GAP = 1 << 16  # pictures asked together are read in one range while what lies between them is at most this


class RecordRanges:
    """Byte ranges of the payloads of records in local shards, each checked against its CRC-32C.

    paths: each shard's local path, by shard number.
    describe: ``describe(episode)`` names an episode's shard, record and byte offset, for errors.
    """

    def __init__(self, paths: Sequence[str], describe: Callable[[int], str]) -> None:
        self._paths = list(paths)
        self._describe = describe
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._local = threading.local()  # each thread's scratch buffer for gather(..., scratch=True)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_fds={}, _pid=None, _lock=None, _local=None)  # a pickled copy opens its own files
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock, self._local = threading.Lock(), threading.local()

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            for fd in self._fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _fd(self, shard: int) -> int:
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's descriptors stay the parent's
                self._fds, self._pid = {}, os.getpid()
            fd = self._fds.get(shard)
            if fd is None:
                fd = self._fds[shard] = os.open(self._paths[shard], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            return fd

    def read(self, episode: int, shard: int, record: int, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of the payload of the record whose frame starts at byte ``record`` of ``shard``."""
        n = stop - start
        data = os.pread(self._fd(shard), n, record + _HEADER + start)
        if len(data) != n:
            raise SampleError(f"{self._describe(episode)}: bytes {start}..{stop} of the record {_short(n - len(data))}")
        return data

    def checked(self, episode: int, shard: int, record: int, start: int, stop: int, crc: int, what: str) -> bytes:
        """:meth:`read`, the bytes held to ``crc`` (their CRC-32C as indexed); ``what`` names them in the error."""
        data = self.read(episode, shard, record, start, stop)
        self._check(data, crc, episode, what, start, stop)
        return data

    def gather(self, pieces: np.ndarray, name: Callable[[int], str], scratch: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
        """Pieces of payloads, as few reads as neighbours allow: ``pieces`` int64 ``[n, 6]``, one row each
        (episode, shard, the record's frame offset, start and stop in its payload, CRC-32C); ``name(k)`` says
        what piece ``k`` is, for errors. Returns one uint8 buffer and each piece's ``[start, stop)`` in it, every
        piece checked against its CRC in one pass. Pieces of a shard whose gaps are at most 64 KiB share a read
        (frames ``[t-1, t]`` of a window lie side by side in their record). ``scratch``: the buffer is this
        thread's scratch, which its next ``scratch`` call overwrites (a batch's pictures, decoded before the next
        batch is read: its pages stay mapped, where a new 2 MB buffer each batch faults them in again)."""
        n = len(pieces)
        if not n:
            return np.zeros(0, np.uint8), np.empty((0, 2), np.int64)
        groups, where, total = read_plan(np.ascontiguousarray(pieces, dtype=np.int64), _HEADER, _GAP)
        buffer = self._scratch(total) if scratch else np.empty(total, np.uint8)
        view, at = memoryview(buffer), 0
        fds = {s: self._fd(s) for s in set(groups[:, 0].tolist())}
        for s, a, b, k in groups.tolist():
            size = b - a
            got = os.preadv(fds[s], [view[at:at + size]], a)
            if got != size:
                raise SampleError(f"{self._describe(int(pieces[k, 0]))}: {name(k)}: bytes {a}..{b} of the shard "
                                  f"{_short(size - got)}")
            at += size
        crcs = crc32c_spans(buffer, where, check=False)  # each piece inside its group's read
        bad = np.flatnonzero(crcs != pieces[:, 5])
        if bad.size:
            k = int(bad[0])
            episode, _, _, start, stop, crc = pieces[k].tolist()
            self._fail(episode, name(k), start, stop, crc, int(crcs[k]))
        return buffer, where

    def _scratch(self, size: int) -> np.ndarray:
        """This thread's scratch buffer, at least ``size`` bytes (grown by half again when it is not): its first
        ``size``."""
        held = getattr(self._local, "buffer", None)
        if held is None or len(held) < size:
            held = self._local.buffer = np.empty(size + size // 2, np.uint8)
        return held[:size]

    def _check(self, data: bytes | memoryview, crc: int, episode: int, what: str, start: int, stop: int) -> None:
        actual = crc32c(data)
        if actual != crc:
            self._fail(episode, what, start, stop, crc, actual)

    def _fail(self, episode: int, what: str, start: int, stop: int, indexed: int, read: int) -> None:
        raise SampleError(f"{self._describe(episode)}: {what} (bytes {start}..{stop} of the record) fails its CRC-32C "
                          f"check (indexed {indexed:#010x}, read {read:#010x}): the shard is corrupt or changed since "
                          "it was indexed; download it again")


@njit(cache=True, nogil=True)
def read_plan(pieces: np.ndarray, header: int, gap: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The reads that fetch ``pieces`` (:meth:`RecordRanges.gather`'s rows; ``header``: the bytes of a record's
    frame before its payload): sorted by shard and offset, a piece joins the read before it where it starts at
    most ``gap`` bytes past everything that read holds. Returns the reads, int64 ``[g, 4]`` (shard, first and
    end byte in the shard, a piece it holds), each piece's ``[start, stop)`` in the reads laid back to back
    (``[n, 2]``, in ``pieces``' order), and the bytes of all the reads."""
    n = pieces.shape[0]
    low = pieces[:, 2] + header + pieces[:, 3]
    high = pieces[:, 2] + header + pieces[:, 4]
    order = np.argsort(low, kind="mergesort")
    order = order[np.argsort(pieces[order, 1], kind="mergesort")]  # by shard, then offset
    groups = np.empty((n, 4), np.int64)
    where = np.empty((n, 2), np.int64)
    g, at = -1, 0
    for j in range(n):
        k = order[j]
        if g < 0 or pieces[k, 1] != groups[g, 0] or low[k] - groups[g, 2] > gap:
            if g >= 0:
                at += groups[g, 2] - groups[g, 1]
            g += 1
            groups[g, 0], groups[g, 1], groups[g, 2], groups[g, 3] = pieces[k, 1], low[k], high[k], k
        elif high[k] > groups[g, 2]:
            groups[g, 2] = high[k]
        where[k, 0] = at + low[k] - groups[g, 1]
        where[k, 1] = at + high[k] - groups[g, 1]
    if g >= 0:
        at += groups[g, 2] - groups[g, 1]
    return groups[:g + 1], where, at


def _short(missing: int) -> str:
    return (f"end {missing} bytes short: the shard is truncated or changed since it was indexed; download it "
            "again")
