"""Synthetic videos whose pixels carry their own frame index.

Each frame has a top band of ``INDEX_BITS`` black or white blocks spelling the frame index in binary, over a
moving colour pattern. The blocks are large and saturated, so the index survives lossy codecs (H.264, AV1 at
LeRobot's settings) and tests can check that the frame they got is the frame they asked for::

    >>> frames = frame_pattern(3, height=48, width=64, start=7)
    >>> read_index(frames).tolist()
    [7, 8, 9]
"""

from __future__ import annotations

import os

import numpy as np

from mmfeed.codecs.encode import CODECS, encode_video

INDEX_BITS = 16
"""Bits of frame index drawn into each frame (indices up to 65535)."""


def frame_pattern(
    num_frames: int, *, height: int, width: int, start: int = 0, seed: int = 0
) -> np.ndarray:
    """Frames ``start .. start + num_frames - 1`` of the pattern as uint8 ``[N, H, W, 3]``.

    ``seed`` changes the colours (one seed per camera makes cameras tell apart); the index band is the same.
    """
    if height < 16 or width < 2 * INDEX_BITS:
        raise ValueError(f"frame size {height}x{width} is too small: need height >= 16 and width >= {2 * INDEX_BITS}")
    idx = np.arange(start, start + num_frames, dtype=np.int64)
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, size=3)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    t = idx[:, None, None, None].astype(np.float32)
    wave = np.sin(xx[None, :, :, None] / 9.0 + yy[None, :, :, None] / 13.0 + t / 5.0 + phase)
    frames = (96 + 64 * wave).astype(np.uint8)
    band = _band_height(height)
    bits = (idx[:, None] >> np.arange(INDEX_BITS)[None, :]) & 1  # [N, bits], least significant first
    block_w = width // INDEX_BITS
    for b in range(INDEX_BITS):
        value = np.where(bits[:, b] == 1, 235, 20).astype(np.uint8)
        frames[:, :band, b * block_w : (b + 1) * block_w, :] = value[:, None, None, None]
    return frames


def read_index(frames: np.ndarray) -> np.ndarray:
    """The frame index drawn into each of ``frames`` (uint8 ``[N, H, W, 3]`` or ``[H, W, 3]``), as int64 ``[N]``."""
    frames = np.asarray(frames)
    if frames.ndim == 3:
        frames = frames[None]
    if len(frames) == 0:
        return np.zeros(0, dtype=np.int64)
    n, height, width, _ = frames.shape
    band = _band_height(height)
    block_w = width // INDEX_BITS
    # Read the middle of each block so that codec ringing at block edges cannot flip a bit.
    y0, y1 = band // 4, max(band // 4 + 1, 3 * band // 4)
    out = np.zeros(n, dtype=np.int64)
    for b in range(INDEX_BITS):
        x0 = b * block_w + block_w // 4
        x1 = max(x0 + 1, b * block_w + 3 * block_w // 4)
        level = frames[:, y0:y1, x0:x1, :].reshape(n, -1).mean(axis=1)
        out |= (level > 128).astype(np.int64) << b
    return out


def write_video(
    path: str | os.PathLike,
    frames: np.ndarray,
    *,
    fps: float = 30.0,
    codec: str = "h264",
    gop: int = 30,
    crf: int | None = None,
    bframes: int = 0,
) -> str:
    """Encode uint8 ``[N, H, W, 3]`` RGB ``frames`` into an mp4 at ``path`` and return the path.

    ``codec`` is ``"h264"`` (libx264), ``"av1"`` (libsvtav1, LeRobot's default) or ``"hevc"``; ``gop`` is the
    keyframe interval. ``crf`` defaults to a near-lossless 18 for H.264 and LeRobot's 30 for AV1. The bytes are
    :func:`mmfeed.codecs.encode_video`'s (deterministic: equal frames give an equal file).
    """
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; choose one of {sorted(CODECS)}")
    data = encode_video(frames, fps=fps, codec=codec, gop=gop, crf=crf, bframes=bframes)
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _band_height(height: int) -> int:
    return max(8, (height // 8) // 2 * 2)
