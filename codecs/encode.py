"""Frames to mp4 bytes: the one video encoder of mmfeed (shard writers and test videos use it).

:func:`encode_video` encodes uint8 RGB frames with PyAV into an in-memory mp4. The output is deterministic:
the encoder runs on one thread and the muxer writes no wall-clock time, so equal frames and settings
give equal bytes on any machine with the same FFmpeg build; shards written twice are then byte-identical.

>>> import numpy as np
>>> from mmfeed.codecs import probe
>>> data = encode_video(np.zeros((4, 32, 48, 3), np.uint8), fps=15.0, gop=2)
>>> info = probe(data)
>>> info.num_frames, info.height, info.width, info.keyframes().tolist()
(4, 32, 48, [0, 2])
"""

from __future__ import annotations

import io
import os
from fractions import Fraction

import numpy as np

__all__ = ["CODECS", "encode_video", "encoder_name"]

CODECS = {"h264": "libx264", "av1": "libsvtav1", "hevc": "libx265"}
"""Short codec names -> the PyAV encoder they use; any other encoder PyAV has may be named directly."""

_DEFAULT_CRF = {"libx264": 18, "libsvtav1": 30, "libx265": 18}
"""Near-lossless for H.264/HEVC (the burned-in frame indices survive), LeRobot's setting for AV1."""

_THREADS = "1"
"""Encoder threads (FFmpeg's generic ``threads`` option). One, because x265's output depends on the thread count
and libx264's varies from run to run with several; one thread costs little at robot-camera frame sizes, and
episodes encode in parallel across processes. libx264 also runs without macroblock-tree rate control, whose
assembly gave a different stream in about one run in twenty on small frames (with ``asm=0`` or ``mbtree=0``
every run gave the same bytes)."""


def encode_video(
    frames: np.ndarray,
    *,
    fps: float,
    codec: str = "h264",
    gop: int = 30,
    crf: int | None = None,
    bframes: int = 0,
) -> bytes:
    """The mp4 bytes of uint8 ``[T, H, W, 3]`` RGB ``frames`` at ``fps``, encoded as yuv420p.

    codec: ``"h264"`` (libx264), ``"av1"`` (libsvtav1), ``"hevc"`` (libx265) or the name of another PyAV
        encoder (``"mpeg4"``); gop: the keyframe interval in frames; crf: quality (lower is better; defaults
        above); bframes: B-frames between references (H.264 only; 0 keeps decode order equal to display order).
    Raises ValueError for an unknown codec, frames that are not non-empty ``[T, H, W, 3]`` or an odd frame size.
    """
    import av

    encoder = encoder_name(codec)
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"frames must be a non-empty uint8 [T, H, W, 3] array, got shape {frames.shape}")
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise ValueError(f"frame size {frames.shape[1]}x{frames.shape[2]} must be even for yuv420p")
    if isinstance(gop, bool) or not isinstance(gop, (int, np.integer)) or gop < 1:
        raise ValueError(f"gop must be an int >= 1 (frames between keyframes), got {gop!r}")
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps!r}")
    options = {"g": str(int(gop)), "threads": _THREADS}
    quality = _DEFAULT_CRF.get(encoder) if crf is None else crf
    if encoder == "libx264":
        options.update(crf=str(quality), preset="veryfast", bf=str(bframes), mbtree="0")
    elif encoder == "libx265":
        options.update(crf=str(quality), preset="veryfast", **{"x265-params": "log-level=error"})
    elif encoder == "libsvtav1":
        options.update(crf=str(quality), preset="11")
        os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration otherwise
    elif quality is not None:
        options.update(crf=str(quality))
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(encoder, rate=Fraction(fps).limit_denominator(1001), options=options)
        stream.width = frames.shape[2]
        stream.height = frames.shape[1]
        stream.pix_fmt = "yuv420p"
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def encoder_name(codec: str) -> str:
    """The PyAV encoder ``codec`` names (``"h264"`` -> ``"libx264"``); ValueError when PyAV has no such encoder.

    >>> encoder_name("av1")
    'libsvtav1'
    """
    import av

    name = CODECS.get(codec, codec)
    try:
        av.codec.Codec(name, "w")
    except (av.error.FFmpegError, ValueError, TypeError):
        raise ValueError(f"unknown codec {codec!r}; choose one of {sorted(CODECS)} or a PyAV encoder name") from None
    return name
