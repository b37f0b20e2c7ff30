"""The video decoders of one source, shared by every format: one :class:`~mmfeed.codecs.batch.VideoReaderCache`
per output frame size, built on first use from the source's read options, and empty again in each process the
source is pickled to (a worker opens its own decoders)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from mmfeed.codecs.batch import VideoReaderCache, readers_within
from mmfeed.codecs.video import DecodeOptions

__all__ = ["ReaderCaches"]


class ReaderCaches:
    """Decoder caches by output frame size (None: each stream at its stored size)."""

    def __init__(self) -> None:
        self._caches: dict[tuple[int, int] | None, VideoReaderCache] = {}
        self._lock = threading.Lock()  # one source may serve loaders in several threads

    def get(self, size: tuple[int, int] | None, decode: Callable[[tuple[int, int] | None], DecodeOptions],
            shapes: Callable[[], Sequence[tuple[int, int]]]) -> VideoReaderCache:
        """The cache of frame ``size``, built on first use with ``decode(size)`` (the source's
        ``ReadOptions.decode``); ``shapes()`` gives the stored sizes of the streams it may open when ``size`` is
        None (they bound how many readers it keeps open: :func:`~mmfeed.codecs.batch.readers_within`)."""
        with self._lock:
            cache = self._caches.get(size)
            if cache is None:
                cache = self._caches[size] = VideoReaderCache(
                    max_open=readers_within([size] if size is not None else list(shapes())), options=decode(size))
            return cache

    def values(self) -> Iterator[VideoReaderCache]:
        """The caches built so far."""
        return iter(list(self._caches.values()))

    def __len__(self) -> int:
        return len(self._caches)

    def __getstate__(self) -> dict:
        return {}  # decoders never travel: each process opens its own

    def __setstate__(self, state: dict) -> None:
        self.__init__()
