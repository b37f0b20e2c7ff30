"""A local store of decoded frames, so that later epochs read frames instead of decoding them.

``open_dataset(path, cache=DIR, frame_size=(H, W))`` keeps every video segment a read touches (one camera of one
episode) decoded, at the delivered size and frame format, in ``DIR``: one ``.npy`` file per segment holding all its
frames, ``uint8 [frames, *step shape]``, memory-mapped by every process that reads it. The first read of a segment
decodes it whole, front to back (one sequential pass, the cheapest per frame), into ``<key>.npy.part`` and renames
it ``<key>.npy`` when complete; later reads, in any process, copy the asked frames out of the mapped file and never
open the video. Samples are bit-identical to uncached ones: the same decoder, options and frame addressing fill
the store.

Sharing: the workers and ranks of a node may fill one ``DIR`` at once. A writer holds an ``fcntl`` lock on
``<key>.lock`` while it fills (another process that wants the segment meanwhile decodes just its frames, without
waiting), and readers only ever open renamed, complete files, so nobody sees half-written frames. A writer killed
mid-fill leaves a ``.part`` that the next writer of that key overwrites (and eviction deletes); its lock dies
with it.

Budget: ``cache_bytes`` (default: half the free space of ``DIR``'s filesystem when the store is first used)
bounds the ``.npy`` files (a fill reserves its blocks first: on a full disk the segment is decoded as asked,
not stored). After each fill, the least recently used segments (by modification time, refreshed
when a process reads them, at most once a minute) are deleted until the store fits; a segment larger than the
whole budget is never stored. A process that still maps a deleted file keeps reading it safely.

Invalidation: the key of a segment hashes the video's identity (a local file's path, size and mtime; a remote
file's URL and size; a shard's recorded size and mtime with the member's offset and size), the segment's place in
it, the decode size, frame format and backend; a changed source gives new keys, and the stale files age out under
the budget (or go with ``mmfeed cache --clear``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import math
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.nt_copy import copy_into
from mmfeed.loaders.transport.errors import decode_with_context

__all__ = ["FrameStore", "Segment", "StoreInfo", "decode_stored", "npy_header", "stored", "take"]

LAYOUT = "mmfeed-frames-v1"
"""The folder inside ``DIR`` holding the store (a new layout gets a new name, so old files never mislead)."""

_TOUCH_EVERY_S = 60.0
_MAPPED = 256  # segment files a process keeps mapped (those it filled; reads go by pread, see FrameStore.read)


@dataclass(frozen=True)
class Segment:
    """One camera's frames of one episode, as the store keys them: ``identity`` says which video and where in it
    (anything hashable by ``repr``), ``frames`` how many it holds, ``shape`` one frame's step shape."""

    identity: tuple
    frames: int
    shape: tuple[int, ...]

    @cached_property
    def key(self) -> str:
        return hashlib.blake2b(repr((LAYOUT, self.identity, self.frames, self.shape)).encode(),
                               digest_size=16).hexdigest()

    @property
    def nbytes(self) -> int:
        return int(self.frames * int(np.prod(self.shape)))


@dataclass(frozen=True)
class StoreInfo:
    """What a store holds: complete segments, their bytes, leftover partial files, and the budget."""

    directory: str
    segments: int
    bytes: int
    partial: int
    budget_bytes: int


class FrameStore:
    """The decoded-frame store in ``directory`` (created when missing) under a budget of ``budget_bytes``
    (None: half the filesystem's free space, measured at first use). Pickles as its directory and budget: each
    process maps its own files."""

    def __init__(self, directory: str | os.PathLike, budget_bytes: int | None = None) -> None:
        if budget_bytes is not None and (isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int)
                                         or budget_bytes < 1):
            raise ValueError(f"cache_bytes must be an int >= 1 (bytes of decoded frames the cache may hold), got "
                             f"{budget_bytes!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.root = os.path.join(self.directory, LAYOUT)
        self._budget = budget_bytes
        self._mapped: OrderedDict[str, tuple[np.ndarray, tuple[int, int]]] = OrderedDict()  # key -> (map, file id)
        self._offsets: dict[str, int] = {}  # key -> where its frames start in its file (after the .npy header)
        self._touched: dict[str, float] = {}
        self.filled = 0  # segments this process decoded into the store
        self.hits = 0  # segment reads served from the store

    @property
    def budget_bytes(self) -> int:
        if self._budget is None:
            self._ensure_root()
            self._budget = max(1, shutil.disk_usage(self.root).free // 2)
        return self._budget

    def __getstate__(self) -> dict:
        return {"directory": self.directory, "budget_bytes": self._budget}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"], state["budget_bytes"])

    # -- reading and filling ---------------------------------------------------------------------------------
    def get(self, segment: Segment) -> np.ndarray | None:
        """The segment's frames (a read-only map of its complete file), or None when the store lacks it. A file of
        the wrong size (damaged outside mmfeed) is deleted and reported missing, so it is filled again. A map kept
        from earlier serves only while its file is still the one in the store: once another process evicted it
        (or replaced it), the segment is missing here too, so it is filled again."""
        key = segment.key
        path = os.path.join(self.root, key + ".npy")
        kept = self._mapped.get(key)
        if kept is not None:
            try:
                st = os.stat(path)
                current = (st.st_dev, st.st_ino) == kept[1]
            except OSError:
                current = False
            if not current:
                del self._mapped[key]
                self._offsets.pop(key, None)
                kept = None
        if kept is None:
            try:
                with open(path, "rb", buffering=0) as f:
                    offset = self._offset(segment, path, f)
                    if offset is None:
                        return None
                    st = os.fstat(f.fileno())
                    frames = np.memmap(f, np.uint8, "r", offset=offset, shape=(segment.frames, *segment.shape))
            except FileNotFoundError:
                self._offsets.pop(key, None)
                return None
            except (ValueError, OSError):  # shorter than its header says, since its offset was kept
                self._offsets.pop(key, None)
                _remove(path)
                return None
            self._mapped[key] = kept = (frames, (st.st_dev, st.st_ino))
            while len(self._mapped) > _MAPPED:
                self._mapped.popitem(last=False)
        else:
            self._mapped.move_to_end(key)
        self._hit(key)
        return kept[0]

    def read(self, segment: Segment, idx: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
        """Frames ``idx`` of the segment read from its file into ``out`` (allocated when None) and returned, or
        None when the store lacks it. One ``preadv`` per run of consecutive frames, straight into ``out``: no
        mapping, so a process that reads a large store holds none of it (a map of every segment a global
        shuffle touches is the whole store in the process's RSS), and no header parsed again (its frames'
        offset is kept per segment). A file of the wrong header or size is deleted and reported missing."""
        key = segment.key
        path = os.path.join(self.root, key + ".npy")
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        shape = tuple(segment.shape)
        if out is None:
            out = np.empty((len(idx), *shape), np.uint8)
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            self._offsets.pop(key, None)
            return None
        with f:
            offset = self._offset(segment, path, f)
            if offset is None:
                return None
            fd = f.fileno()
            frame = math.prod(shape)
            into = out if out.flags.c_contiguous else np.empty(out.shape, np.uint8)
            flat = memoryview(into.reshape(-1))
            k, steps = 0, idx.tolist()
            while k < len(steps):
                run = 1
                while k + run < len(steps) and steps[k + run] == steps[k] + run:
                    run += 1
                want = run * frame
                if os.preadv(fd, [flat[k * frame:k * frame + want]], offset + steps[k] * frame) != want:
                    self._offsets.pop(key, None)  # truncated or replaced since: filled again
                    _remove(path)
                    return None
                k += run
        if into is not out:
            out[...] = into
        self._hit(key)
        return out

    def _offset(self, segment: Segment, path: str, f: Any) -> int | None:
        """Where the segment's frames start in its file ``path``, open as ``f`` (kept once known); None for a
        file whose header or size does not fit the segment (damaged outside mmfeed), which is deleted, so it is
        filled again."""
        offset = self._offsets.get(segment.key)
        if offset is not None:
            return offset
        offset = _frames_offset(f, segment)
        if offset is None:
            _remove(path)
            return None
        self._offsets[segment.key] = offset
        return offset

    def _hit(self, key: str) -> None:
        now = time.monotonic()
        if now - self._touched.get(key, -_TOUCH_EVERY_S) >= _TOUCH_EVERY_S:  # least recently used goes first
            self._touched[key] = now
            try:
                os.utime(os.path.join(self.root, key + ".npy"))
            except OSError:
                pass
        self.hits += 1

    def fill(self, segment: Segment, decode: Callable[[np.ndarray], None]) -> np.ndarray | None:
        """Decode the segment into the store with ``decode(out)`` (it writes every frame into ``out``,
        ``uint8 [frames, *shape]``) and return its frames; None, decoding nothing, when another process is filling
        it right now or it is larger than the budget. ``decode`` raising leaves nothing behind."""
        if segment.frames < 1 or segment.nbytes > self.budget_bytes:
            return None
        self._ensure_root()
        key = segment.key
        base = os.path.join(self.root, key)
        with _Lock(base + ".lock", block=False) as held:
            if not held:
                return None
            done = self.get(segment)  # filled by another process between our miss and our lock
            if done is not None:
                return done
            part = base + ".npy.part"  # a killed writer's leftover of this key is overwritten
            out = _allocate(part, (segment.frames, *segment.shape))
            if out is None:
                return None
            try:
                decode(out)
                out.flush()
            except BaseException:
                del out
                _remove(part)
                raise
            del out
            os.replace(part, base + ".npy")
        self.filled += 1
        self.evict(keep=key)
        return self.get(segment)

    # -- the budget ------------------------------------------------------------------------------------------
    def evict(self, keep: str | None = None) -> int:
        """Delete least recently used segments (never ``keep``) until the store fits its budget, and partial files
        no writer holds; returns the bytes freed. One process evicts at a time (a lock on the store)."""
        if not os.path.isdir(self.root):
            return 0
        freed = 0
        with _Lock(os.path.join(self.root, ".evict.lock"), block=True):
            entries = self._entries()
            total = sum(size for _, size, _ in entries)
            for name, size, _ in sorted(entries, key=lambda e: e[2]):
                if total <= self.budget_bytes:
                    break
                if name[:-len(".npy")] == keep:
                    continue
                if _remove(os.path.join(self.root, name)):
                    total -= size
                    freed += size
            for name in os.listdir(self.root):
                if name.endswith(".npy.part"):
                    base = os.path.join(self.root, name[:-len(".npy.part")])
                    with _Lock(base + ".lock", block=False) as held:
                        if held:  # its writer is gone (a lock dies with its process)
                            freed += _size(base + ".npy.part")
                            _remove(base + ".npy.part")
        return freed

    def info(self) -> StoreInfo:
        """Segments and bytes held, leftover partial files, the budget."""
        entries = self._entries() if os.path.isdir(self.root) else []
        partial = sum(n.endswith(".npy.part") for n in os.listdir(self.root)) if os.path.isdir(self.root) else 0
        return StoreInfo(self.directory, len(entries), sum(e[1] for e in entries), partial, self.budget_bytes)

    def clear(self) -> None:
        """Delete the whole store (its folder inside ``directory``)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self._mapped.clear()
        self._touched.clear()

    def _entries(self) -> list[tuple[str, int, float]]:
        out = []
        for entry in os.scandir(self.root):
            if entry.name.endswith(".npy"):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                out.append((entry.name, st.st_size, st.st_mtime))
        return out

    def _ensure_root(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as err:
            raise ValueError(f"cache={self.directory!r}: cannot create the frame store there: {err}; give a "
                             "writable local directory") from err


def take(frames: np.ndarray, idx: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """Frames ``idx`` of a stored segment, copied into ``out`` when given: one slice copy for consecutive frames
    (a window's; twice as fast as a gather), else a copy per frame."""
    idx = np.asarray(idx, dtype=np.int64)
    if out is None:
        out = np.empty((len(idx), *frames.shape[1:]), dtype=frames.dtype)
    if len(idx) and int(idx[-1]) - int(idx[0]) == len(idx) - 1 and (len(idx) == 1 or (np.diff(idx) == 1).all()):
        copy_into(out, frames[int(idx[0]): int(idx[-1]) + 1])
    else:
        for k, i in enumerate(idx.tolist()):
            copy_into(out[k], frames[i])
    return out


def stored(store: FrameStore | None, segment: Segment | None, idx: np.ndarray, out: np.ndarray | None
           ) -> np.ndarray | None:
    """Frames ``idx`` of ``segment`` from the store (into ``out`` when given), or None when it lacks them."""
    if store is None or segment is None or (len(idx) and int(np.max(idx)) >= segment.frames):
        return None
    return store.read(segment, idx, out)


def decode_stored(store: FrameStore | None, cache: VideoReaderCache, requests: Sequence[FrameRequest],
                  where: Sequence[str], segments: Sequence[Segment | None], idx: Sequence[np.ndarray],
                  whole: Callable[[int, np.ndarray], FrameRequest]) -> list[np.ndarray]:
    """:func:`~mmfeed.loaders.transport.errors.decode_with_context` through a store: request ``i`` asks frames
    ``idx[i]`` of ``segments[i]``; a segment the store lacks is first decoded whole into it (``whole(i, out)`` is
    the request that decodes all its frames into ``out``) and the asked frames are copied out of it. Requests
    without a store or a segment, or whose segment another process is filling or exceeds the budget, are decoded
    as asked."""
    got: list[np.ndarray | None] = [None] * len(requests)
    missed = list(range(len(requests)))
    if store is not None:
        missed = []
        for i, segment in enumerate(segments):
            frames = None
            if segment is not None and (not len(idx[i]) or int(np.max(idx[i])) < segment.frames):
                got[i] = store.read(segment, idx[i], requests[i].out)
                if got[i] is not None:
                    continue
                frames = store.fill(segment, lambda out, i=i: decode_with_context(cache, [whole(i, out)],
                                                                                  [where[i]]))
            if frames is None:
                missed.append(i)
            else:
                got[i] = take(frames, idx[i], requests[i].out)
    if missed:
        decoded = decode_with_context(cache, [requests[i] for i in missed], [where[i] for i in missed])
        for i, frames in zip(missed, decoded):
            got[i] = frames
    return got  # type: ignore[return-value]


def _frames_offset(f: Any, segment: Segment) -> int | None:
    """Where the frames start in a segment's ``.npy`` file (open as ``f``): after a header that declares
    ``uint8 [frames, *shape]`` in C order, with exactly those bytes after it; None for anything else."""
    header = npy_header(f)
    if header is None:
        return None
    shape, fortran, dtype, offset = header
    size = os.fstat(f.fileno()).st_size
    if shape != (segment.frames, *segment.shape) or fortran or dtype != np.uint8 or \
            size != offset + math.prod(shape):
        return None
    return offset


def npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """The header of the ``.npy`` array that file ``f`` is positioned at: its shape, whether it is in Fortran
    order, its dtype, and where its data starts in the file; None where no header can be read there."""
    try:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(f)
    except (ValueError, OSError, EOFError, SyntaxError):
        return None
    return shape, fortran, dtype, f.tell()


class _Lock:
    """An exclusive ``fcntl`` lock on ``path`` for a ``with`` block; the block gets whether it is held (a
    non-blocking lock that another process holds is not)."""

    def __init__(self, path: str, block: bool) -> None:
        self.path, self.block, self.fd = path, block, -1

    def __enter__(self) -> bool:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.block else fcntl.LOCK_NB))
        except OSError as err:
            os.close(self.fd)
            self.fd = -1
            if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        return True

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing releases the lock
            self.fd = -1


def _allocate(path: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """A writable map of a new ``.npy`` file of ``uint8`` ``shape`` at ``path``, its blocks reserved first (a full
    disk is then an answer here, None, not a SIGBUS in the middle of writing frames)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": shape})
        offset = f.tell()
        try:
            os.posix_fallocate(f.fileno(), offset, max(1, int(np.prod(shape))))
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            f.close()
            _remove(path)
            return None
    return np.memmap(path, dtype=np.uint8, mode="r+", offset=offset, shape=shape)


def _remove(path: str) -> bool:
    try:
        os.remove(path)
        return True
    except FileNotFoundError:
        return False


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
