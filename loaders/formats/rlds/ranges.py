"""Parts of RLDS records read alone, by byte range: a sample's own keys and pictures, never its whole episode.

An OXE episode's record holds every step's pictures of every camera (about a megabyte for 40 steps of a 256x256
and a 128x128 JPEG camera); a sample of a global shuffle wants two or three of those pictures and a few rows of
its state and actions. The sidecar index (:mod:`.index`) keeps, for every record, where each key's ``Feature``
message lies and, for every camera, where each step's picture lies, each with its CRC-32C. :class:`RecordRanges`
reads such ranges of a local shard with ``pread`` (one file descriptor per shard and process, opened on first
use: workers forked or spawned open their own) and checks each against the CRC the index keeps: the record's own
CRC covers bytes a sample no longer reads, so a flipped byte is still an error naming the shard, the record and
the range, never wrong data.

Pictures asked together (frames ``[t-1, t]`` of a window lie side by side in their record) are read in one
range where the gap between them is small, one range each otherwise.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

import numpy as np

from mmfeed.loaders.formats.rlds.tfrecord import crc32c
from mmfeed.loaders.transport.errors import SampleError

__all__ = ["RecordRanges"]

_HEADER = 12  # a record's payload starts this far into its frame (u64 length and its masked CRC)
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

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_fds={}, _pid=None, _lock=None)  # a pickled copy opens its own files
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

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
            raise SampleError(f"{self._describe(episode)}: bytes {start}..{stop} of the record end {n - len(data)} "
                              "bytes short: the shard is truncated or changed since it was indexed; download it "
                              "again")
        return data

    def checked(self, episode: int, shard: int, record: int, start: int, stop: int, crc: int, what: str) -> bytes:
        """:meth:`read`, the bytes held to ``crc`` (their CRC-32C as indexed); ``what`` names them in the error."""
        data = self.read(episode, shard, record, start, stop)
        _check(data, crc, self._describe(episode), what, start, stop)
        return data

    def pictures(self, episode: int, shard: int, record: int, table: np.ndarray, what: str) -> list[memoryview]:
        """The pictures ``table`` locates (uint32 ``[n, 3]``: start, stop and CRC-32C in the payload), in its
        order, each checked; side by side ones in one read."""
        out: list[memoryview | None] = [None] * len(table)
        rows = table.astype(np.int64)
        order = np.argsort(rows[:, 0], kind="stable")
        k = 0
        while k < len(order):
            first = last = k
            while last + 1 < len(order) and rows[order[last + 1], 0] - rows[order[last], 1] <= _GAP:
                last += 1
            low = int(rows[order[first], 0])
            high = int(rows[order[first:last + 1], 1].max())
            view = memoryview(self.read(episode, shard, record, low, high))
            for j in order[first:last + 1].tolist():
                a, b, crc = (int(v) for v in rows[j])
                piece = view[a - low:b - low]
                _check(piece, crc, self._describe(episode), f"{what} picture {j} of the request", a, b)
                out[j] = piece
            k = last + 1
        return out  # type: ignore[return-value]


def _check(data: bytes | memoryview, crc: int, where: str, what: str, start: int, stop: int) -> None:
    actual = crc32c(data)
    if actual != crc:
        raise SampleError(f"{where}: {what} (bytes {start}..{stop} of the record) fails its CRC-32C check (indexed "
                          f"{crc:#010x}, read {actual:#010x}): the shard is corrupt or changed since it was indexed; "
                          "download it again")
