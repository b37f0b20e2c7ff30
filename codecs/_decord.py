"""decord backend: fast random access into H.264/HEVC (decord 0.6 cannot open AV1).

decord keeps its own frame index; the reader checks that it counts the same frames as the demux index of
:func:`mmfeed.codecs.demux.probe`, so that index i means the same frame in both backends.
"""

from __future__ import annotations

import importlib.util
import io
from typing import Callable

import numpy as np

from mmfeed.codecs.errors import DecodeError
from mmfeed.codecs.demux import VideoInfo, VideoSource

__all__ = ["DECORD_CODECS", "DecordReader", "decord_available", "each_in_chunks"]

DECORD_CODECS = frozenset({"h264", "hevc", "mpeg4", "vp8", "vp9", "mjpeg"})
"""Codecs that decord 0.6's bundled FFmpeg decodes; AV1 (LeRobot's default) is not among them."""


def each_in_chunks(decode: Callable[[np.ndarray], np.ndarray], indices: np.ndarray,
                   sink: Callable[[int, np.ndarray], None], chunk: int = 32) -> None:
    """``sink(k, frame)`` for each of ``indices`` in order, from ``decode(indices)`` called ``chunk`` indices at a
    time (for readers that decode a batch at once: memory bounded by the chunk)."""
    for lo in range(0, len(indices), chunk):
        frames = decode(indices[lo : lo + chunk])
        for k in range(len(frames)):
            sink(lo + k, frames[k])


def decord_available() -> bool:
    """Whether the optional ``decord`` package is importable."""
    return importlib.util.find_spec("decord") is not None


class DecordReader:
    """Random access into one video with decord; ``decode`` hands sorted indices to ``get_batch``."""

    name = "decord"

    def __init__(
        self, source: VideoSource, info: VideoInfo, *, threads: int = 1, size: tuple[int, int] | None = None
    ) -> None:
        self.info = info
        self._size = size
        if not decord_available():
            raise DecodeError(
                f"{info.path}: backend 'decord' is not installed (pip install decord); use backend='pyav'",
                path=info.path,
            )
        if info.codec not in DECORD_CODECS:
            raise DecodeError(
                f"{info.path}: decord cannot open {info.codec.upper()} video (it decodes "
                f"{', '.join(sorted(DECORD_CODECS))}); use backend='pyav' or backend='auto'",
                path=info.path,
                num_frames=info.num_frames,
                duration=info.duration,
            )
        if info.open_gop:
            raise DecodeError(
                f"{info.path}: decord returns wrong frames after seeking in videos with open GOPs (frames that "
                "follow a keyframe in decode order but precede it in display order, as x265 writes by default); "
                "use backend='pyav' or backend='auto'",
                path=info.path,
                num_frames=info.num_frames,
                duration=info.duration,
            )
        import decord

        target = io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray, memoryview)) else info.path
        h, w = size if size is not None else (-1, -1)
        try:
            self._vr = decord.VideoReader(target, ctx=decord.cpu(0), width=w, height=h, num_threads=int(threads))
        except (RuntimeError, decord.DECORDError) as exc:
            raise DecodeError(f"{info.path}: decord cannot open the file: {exc}", path=info.path) from exc
        if len(self._vr) != info.num_frames:
            n = len(self._vr)
            self._vr = None
            raise DecodeError(
                f"{info.path}: decord counts {n} frames but the file's packets hold {info.num_frames}; "
                "use backend='pyav'",
                path=info.path,
                num_frames=info.num_frames,
                duration=info.duration,
            )

    @property
    def out_shape(self) -> tuple[int, int]:
        """(height, width) of the frames this reader returns."""
        return self._size if self._size is not None else (self.info.height, self.info.width)

    def decode(self, indices: np.ndarray) -> np.ndarray:
        """Frames at the sorted, unique, in-range ``indices`` as uint8 ``[N, H, W, 3]``."""
        h, w = self.out_shape
        if len(indices) == 0:
            return np.zeros((0, h, w, 3), dtype=np.uint8)
        import decord

        try:
            frames = to_numpy(self._vr.get_batch(indices.tolist()))
        except (RuntimeError, decord.DECORDError) as exc:
            raise DecodeError(
                f"{self.info.path}: decord failed decoding frames {indices[0]}..{indices[-1]}: {exc}; the video "
                f"has {self.info.num_frames} frames ({self.info.duration:.3f} s)",
                path=self.info.path,
                index=int(indices[0]),
                num_frames=self.info.num_frames,
                duration=self.info.duration,
            ) from exc
        return np.ascontiguousarray(frames, dtype=np.uint8)

    def decode_each(self, indices: np.ndarray, sink: Callable[[int, np.ndarray], None],
                    into: Callable[[int], np.ndarray | None] | None = None, chunk: int = 32) -> None:
        """Call ``sink(k, frame)`` for each of the sorted, unique ``indices``, in order (``frame``: ``[H, W, 3]``
        uint8, valid only during the call); decoded ``chunk`` frames at a time to bound memory. ``into`` is not
        used: every frame goes through ``sink``."""
        each_in_chunks(self.decode, indices, sink, chunk)

    def close(self) -> None:
        """Drop the decord reader (decord has no explicit close)."""
        self._vr = None


def to_numpy(batch) -> np.ndarray:
    """A decord NDArray as numpy without copying it (through DLPack; ``asnumpy`` copies every frame once more)."""
    try:
        import torch.utils.dlpack

        return torch.utils.dlpack.from_dlpack(batch.to_dlpack()).numpy()
    except (ImportError, AttributeError, RuntimeError, TypeError):
        return batch.asnumpy()
