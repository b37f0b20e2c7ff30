"""What a source raises when one sample cannot be read: :class:`SampleError`, naming the source, the episode, the
key and the reason; :func:`decode_with_context` turns a decoder's error into one, naming the request that failed.
The error policy that decides what such a failure does (raise, skip or warn) is the planned path's
(:mod:`mmfeed.loaders.planned.errors`).
"""

from __future__ import annotations

import numpy as np

from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.errors import DecodeError

__all__ = ["SampleError", "decode_with_context"]


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
        raise SampleError(f"{where[culprit]} {what} {np.asarray(asked).tolist()}: {failed}") from failed
