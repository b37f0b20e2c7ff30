"""Many frame requests at once: each file opened once, each needed GOP decoded once.

Robot training samples are clips (8 consecutive frames) or sparse frames (history at a few offsets) from the same
episode, and one batch asks for many of them. :func:`decode_batch` groups the requests by file, takes the sorted
union of the wanted frames, decodes it in one forward pass per run of GOPs (see :mod:`mmfeed.codecs._pyav`) and
scatters the frames back to the requests in the order asked. :class:`VideoReaderCache` keeps a few files open
(least recently used are closed), so consecutive batches on one file do not reopen it.

>>> import tempfile, os
>>> from mmfeed.testing import frame_pattern, read_index, write_video
>>> path = write_video(os.path.join(tempfile.mkdtemp(), "v.mp4"), frame_pattern(40, height=48, width=64))
>>> with VideoReaderCache(max_open=2) as cache:
...     clips = decode_batch([(path, [30, 31]), FrameRequest(path, timestamps=[0.0, 1.0])], cache=cache)
>>> [read_index(c).tolist() for c in clips]
[[30, 31], [0, 30]]
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from mmfeed.codecs.demux import FileOpener, VideoInfo, VideoSource, frames_at_times, probe, source_name
from mmfeed.codecs.video import (
    DEFAULT_TOLERANCE_S,
    DecodeOptions,
    VideoReader,
    decode_requests,
    open_reader,
    resolve_request,
)

__all__ = ["FrameRequest", "READER_BUDGET_BYTES", "VideoReaderCache", "decode_batch", "readers_within"]

READER_BUDGET_BYTES = 128 * 2**20
"""Decoder memory a source's reader cache may hold per thread (see :func:`readers_within`)."""


def readers_within(frame_shapes: Iterable[tuple[int, ...]], budget_bytes: int = READER_BUDGET_BYTES) -> int:
    """How many readers to keep open per thread: the budget over a decoder's frame pool at the largest frame
    (about 8 frames of 4:2:0 pictures), between 4 and 64. Reopening a video costs a probe, a container open and
    a converter (6-10 ms measured): under a global shuffle over more videos than the cache holds it happens on
    nearly every read, so the cache is sized by memory, not by a fixed count.

    >>> readers_within([(240, 320, 3)]), readers_within([(1080, 1920, 3)])
    (64, 5)
    """
    area = max((int(s[0]) * int(s[1]) for s in frame_shapes), default=0)
    if area <= 0:
        return 8
    return int(min(64, max(4, budget_bytes // (area * 3 // 2 * 8))))


@dataclass(frozen=True, eq=False)
class FrameRequest:
    """Frames of one video: ``indices`` or ``timestamps`` (seconds, nearest frame within ``tolerance_s``), decoded
    into ``out`` when it is given."""

    path: VideoSource
    indices: ArrayLike | None = None
    timestamps: ArrayLike | None = None
    tolerance_s: float = DEFAULT_TOLERANCE_S
    out: np.ndarray | None = None
    """Optional uint8 ``[N, H, W, 3]`` array (``[N, H * 3 // 2, W]`` for yuv420 frames) to decode into (and
    return), e.g. a slice of a batch's payload."""

    @classmethod
    def coerce(cls, request: "FrameRequest | tuple") -> "FrameRequest":
        """A :class:`FrameRequest` from itself or a ``(path, indices)`` pair (integer indices only)."""
        if isinstance(request, FrameRequest):
            return request
        if isinstance(request, tuple) and len(request) == 2:
            path, indices = request
            arr = np.asarray(indices)
            if arr.size and (arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer)):
                raise TypeError(
                    f"request for {source_name(path)}: a (path, indices) pair takes integer frame indices, got "
                    f"{arr.dtype}; for times in seconds use FrameRequest(path, timestamps=...)"
                )
            return cls(path, indices=indices)
        raise TypeError(f"a frame request is a FrameRequest or a (path, indices) pair, got {type(request).__name__}")


# Every cache alive in this process, so that a forked child parks all inherited readers the moment it starts,
# before any code could drop a cache (and with it the readers) in the child. Process-level fork safety is the one
# reason for this module-level state.
_LIVE_CACHES: weakref.WeakSet = weakref.WeakSet()


def _park_inherited_readers() -> None:
    for cache in list(_LIVE_CACHES):
        cache._after_fork()


os.register_at_fork(after_in_child=_park_inherited_readers)


class VideoReaderCache:
    """Open video readers, at most ``max_open`` of them per thread, the least recently used closed first.

    Readers are keyed by file (absolute path, size and modification time; in-memory bytes by object identity,
    kept alive while cached) and by thread: a decoder is never shared by two threads, so one cache (and the source
    holding it) serves loaders running in several threads at once. The cache holds no open file when pickled, and
    a forked process ignores the readers it inherited, so it can be built before DataLoader workers start: each
    worker opens its own readers.
    """

    def __init__(
        self,
        max_open: int = 8,
        *,
        backend: str = "auto",
        threads: int = 1,
        size: tuple[int, int] | None = None,
        crop: tuple[int, int, int, int] | None = None,
        frame_format: str = "rgb24",
        device: str | None = None,
        options: DecodeOptions | None = None,
    ) -> None:
        if not isinstance(max_open, int) or isinstance(max_open, bool) or max_open < 1:
            raise ValueError(f"max_open must be an int >= 1, got {max_open!r}")
        self.max_open = max_open
        # ``options`` (a DecodeOptions) replaces the six keywords when given, as when unpickling.
        self.options = options or DecodeOptions(backend=backend, threads=threads, size=size, crop=crop,
                                                frame_format=frame_format, device=device)
        self._readers: OrderedDict[Any, tuple[VideoReader, Any]] = OrderedDict()
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self.opened = 0
        _LIVE_CACHES.add(self)  # running counter: readers opened so far

    def reader(self, source: VideoSource, info: VideoInfo | None = None) -> VideoReader:
        """The calling thread's open reader for ``source``, opening it (and closing the least recently used) when
        needed; ``info`` saves a second probe of in-memory sources."""
        self._after_fork()
        key = (threading.get_ident(), self._key(source))
        with self._lock:
            entry = self._readers.get(key)
            if entry is not None:
                self._readers.move_to_end(key)
                return entry[0]
        reader = open_reader(source, self.options, info if info is not None else self.info(source))
        with self._lock:
            self.opened += 1
            self._readers[key] = (reader, source)
            # At most max_open readers per thread, the least recently used closed first; a thread never closes
            # another's (it may be decoding with it), and readers of threads that ended go.
            alive = {t.ident for t in threading.enumerate()}
            mine = [k for k in self._readers if k[0] == key[0]]
            stale = [k for k in self._readers if k[0] not in alive] + mine[: max(len(mine) - self.max_open, 0)]
            for k in stale:
                self._readers.pop(k)[0].close()
        return reader

    def info(self, source: VideoSource) -> VideoInfo:
        """The probe of ``source`` (the open reader's, if this thread has one cached)."""
        self._after_fork()
        with self._lock:
            entry = self._readers.get((threading.get_ident(), self._key(source)))
        return entry[0].info if entry is not None else probe(source, self.options.max_frame_pixels)

    def read(
        self,
        path: VideoSource,
        indices: ArrayLike | None = None,
        *,
        timestamps: ArrayLike | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
    ) -> np.ndarray:
        """:func:`mmfeed.codecs.read_frames` through this cache's readers and options."""
        return self.decode_batch([FrameRequest(path, indices, timestamps, tolerance_s)])[0]

    def decode_batch(self, requests: Iterable[FrameRequest | tuple]) -> list[np.ndarray]:
        """See :func:`decode_batch`."""
        reqs = [FrameRequest.coerce(r) for r in requests]
        groups: dict[Any, list[int]] = {}
        keys: dict[str, Any] = {}  # a path asked many times is stat'ed once per call
        for i, r in enumerate(reqs):
            if isinstance(r.path, str):
                key = keys.get(r.path)
                if key is None:
                    key = keys[r.path] = self._key(r.path)
            else:
                key = self._key(r.path)
            groups.setdefault(key, []).append(i)
        out: list[np.ndarray | None] = [None] * len(reqs)
        for members in groups.values():
            source = reqs[members[0]].path
            info = self.info(source)
            self.options.check_crop(info)
            wanted = _resolve_all(info, [reqs[i] for i in members])
            reader = self.reader(source, info) if any(len(w) for w in wanted) else None
            outs = [reqs[i].out for i in members]
            for i, frames in zip(members, decode_requests(reader, self.options, info, wanted, outs)):
                out[i] = frames
        return out  # type: ignore[return-value]

    def close(self) -> None:
        """Close every open reader (of every thread)."""
        self._after_fork()
        with self._lock:
            while self._readers:
                _, (reader, _) = self._readers.popitem(last=False)
                reader.close()

    def __len__(self) -> int:
        self._after_fork()
        return len(self._readers)

    def _after_fork(self) -> None:
        if self._pid == os.getpid():
            return
        # A forked worker inherited the parent's open files (and their shared file offsets): never use them, and
        # never free them either: tearing down a decoder copied by fork() (its swscale slice threads) waits forever
        # on threads that do not exist in this process. The inherited readers are given one extra reference, so
        # nothing in this process, not even dropping the whole cache or interpreter shutdown, ever frees them.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self._readers))
        self._readers = OrderedDict()
        self._lock = threading.RLock()  # the parent's may have been held by a thread that does not exist here
        self._pid = os.getpid()

    def __enter__(self) -> "VideoReaderCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {"max_open": self.max_open, "options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_open"], options=state["options"])

    @staticmethod
    def _key(source: VideoSource) -> Any:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return ("memory", id(source))
        # a path is the usual source, and isinstance against the FileOpener protocol costs 10 us
        if not isinstance(source, str) and isinstance(source, FileOpener):
            return ("opener", source.key)
        path = os.path.abspath(os.fspath(source))
        try:
            st = os.stat(path)
        except OSError:
            return (path, None, None)
        return (path, st.st_size, st.st_mtime_ns)


def _resolve_all(info: VideoInfo, requests: Sequence[FrameRequest]) -> list[np.ndarray]:
    """:func:`resolve_request` of many requests on one file; requests by time with one tolerance (a batch of
    windows) are resolved in one vectorized search, which returns the same indices and raises the same error."""
    tolerance = requests[0].tolerance_s
    if len(requests) > 1 and all(r.indices is None and r.timestamps is not None and r.tolerance_s == tolerance
                                 for r in requests):
        times = [np.atleast_1d(np.asarray(r.timestamps)) for r in requests]
        if all(t.ndim == 1 and t.dtype.kind == "f" for t in times):
            return _split_at(frames_at_times(info, np.concatenate(times), tolerance),
                             np.cumsum([0, *(len(t) for t in times)]))
    return [resolve_request(info, r.indices, r.timestamps, r.tolerance_s) for r in requests]


def _split_at(items: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """``[items[offsets[r]:offsets[r + 1]] for r ...]`` (views), faster than ``np.split`` for many requests."""
    bounds = offsets.tolist()
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def decode_batch(
    requests: Iterable[FrameRequest | tuple], cache: VideoReaderCache | None = None
) -> list[np.ndarray]:
    """Decode many requests, one uint8 ``[N_i, H, W, 3]`` array per request (``[N_i, H * 3 // 2, W]`` with a
    cache whose options ask for yuv420; a torch tensor on the GPU with a cache whose options give a ``device``), in
    request order.

    ``requests`` are :class:`FrameRequest` objects or ``(path, indices)`` pairs. For each file, the union of all
    frames wanted from it is sorted and decoded in one forward pass per run of GOPs: seek to the keyframe at or
    before a run's first wanted frame, decode forward, keep only the wanted frames, and seek again only when the
    next wanted frame lies beyond the next keyframe. The result equals decoding the requests one by one. Without a
    ``cache`` a temporary :class:`VideoReaderCache` with default options is used and closed.
    """
    if cache is not None:
        return cache.decode_batch(requests)
    with VideoReaderCache() as temporary:
        return temporary.decode_batch(requests)
