"""What a source raises when one sample cannot be read: :class:`SampleError`, naming the source, the episode, the
key and the reason; :func:`decode_with_context` turns a decoder's error into one, naming the request that failed.
The error policy that decides what such a failure does (raise, skip or warn) is the planned path's
(:mod:`mmfeed.loaders.planned.errors`).
"""

from __future__ import annotations

import numpy as np

from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.errors import DecodeError

__all__ = ["SampleError", "decode_with_context", "reason_of"]


class SampleError(ValueError):
    """A sample that cannot be loaded; the message names the source, the episode, the key and the reason."""


def decode_with_context(cache: VideoReaderCache, requests: list[FrameRequest], where: list[str]) -> list[np.ndarray]:
    """``cache.decode_batch(requests)``; a failure is re-raised naming the shard, key and stream of the request
    that failed (found by decoding the requests one by one) and the frames it asked for."""
    try:
        return cache.decode_batch(requests)
    except DecodeError as err:
        failed = err
        culprit = 0
        if len(requests) > 1:
            for culprit, request in enumerate(requests):
                try:
                    cache.decode_batch([request])
                except DecodeError as one:
                    failed = one
                    break
        request = requests[culprit]
        asked = request.indices if request.indices is not None else request.timestamps
        what = "frames" if request.indices is not None else "times"
        raise SampleError(f"{where[culprit]} {what} {_shown(asked)}: {reason_of(failed)}") from failed


def reason_of(err: DecodeError) -> str:
    """A decoder's error without the file name it starts with, for a message that names the file already (or
    the shard, key and feature of bytes decoded in memory)."""
    reason = str(err)
    return reason[len(err.path) + 2:] if err.path and reason.startswith(f"{err.path}: ") else reason


def _shown(values) -> str:
    """Frame indices or times for a message: all of a few, else the first three, the last and how many (a whole
    segment's 57 times would drown the reason); times to the microsecond."""
    values = np.asarray(values)
    items = [round(float(v), 6) if values.dtype.kind == "f" else int(v) for v in values.reshape(-1)]
    if len(items) <= 8:
        return str(items)
    return f"[{', '.join(map(str, items[:3]))}, ..., {items[-1]}] ({len(items)} of them)"
