"""What a video holds, read from its demuxed packets without decoding a single frame.

Container headers are not trusted for frame counts or times (an mp4 header's frame count can be off, and LeRobot
stores many episodes back to back in one file): :func:`probe` demuxes every packet of the video stream, which
reads the bytes but decodes nothing, and keeps each frame's presentation timestamp (pts) and keyframe flag. The
result is cached per file (keyed by path, size and modification time), so a worker pays for it once per file.

>>> import tempfile, os
>>> from mmfeed.testing import frame_pattern, write_video
>>> path = write_video(os.path.join(tempfile.mkdtemp(), "v.mp4"), frame_pattern(10, height=48, width=64), gop=4)
>>> info = probe(path)
>>> info.num_frames, info.codec, info.keyframes().tolist()
(10, 'h264', [0, 4, 8])
"""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, BinaryIO, Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from mmfeed.codecs.errors import DecodeError

__all__ = ["IMAGE_FORMATS", "MAX_FRAME_PIXELS", "VIDEO_FORMATS", "FileOpener", "FramesTooLarge", "VideoInfo",
           "VideoSource", "check_container", "check_frame_pixels", "frames_at_times", "frames_of", "input_options",
           "is_container", "packets_of", "probe", "source_name", "validate_indices"]

MAX_FRAME_PIXELS = 4096 * 4096
"""The largest frame area (height x width, 16.7 MP) a video may have by default: a stream whose header declares
more is refused when it is opened, before any frame is decoded (an 8192x8192 H.264 file of 198 KB decodes into
gigabytes). Raise it with ``max_frame_pixels=`` (``open_dataset``, :class:`~mmfeed.codecs.video.DecodeOptions`,
:func:`probe`); None lifts it."""


@runtime_checkable
class FileOpener(Protocol):
    """A video file read through a Python file object: a file in object storage read by byte range, say.

    ``name`` is how errors name it (its URL), ``key`` identifies its content (URL and size, say: a key that
    changes when the file does) and ``open()`` returns a new seekable binary file over it. Such a file is probed
    from its container's index (:func:`probe`) and decoded with PyAV, so only the header and the groups of
    pictures a request needs are read.
    """

    name: str
    key: Hashable

    def open(self) -> BinaryIO: ...


VideoSource = str | os.PathLike | bytes | bytearray | memoryview | FileOpener
"""A video file path, the bytes of a whole video file held in memory (e.g. a tar member), or a
:class:`FileOpener`."""


@dataclass(frozen=True, eq=False)
class VideoInfo:
    """The frames of one video stream, in presentation order, as the demuxer sees them.

    ``pts[i]`` is frame i's presentation timestamp in ``time_base`` units and ``timestamps[i]`` the same in seconds
    (absolute, as the container stores it, which is what LeRobot's ``from_timestamp`` refers to);
    ``is_keyframe[i]`` says whether frame i can start decoding and ``gop_start[i]`` is the keyframe at or before it.
    """

    path: str
    codec: str
    width: int
    height: int
    fps: float
    time_base: Fraction
    stream_index: int
    pts: np.ndarray = field(repr=False)
    is_keyframe: np.ndarray = field(repr=False)
    gop_start: np.ndarray = field(repr=False)
    timestamps: np.ndarray = field(repr=False)
    duration: float = 0.0
    open_gop: bool = False
    """Some frame follows a keyframe in decode order but precedes it in display order (an open GOP's leading
    pictures, x265's default): decord returns wrong frames after seeking in such files."""

    @property
    def num_frames(self) -> int:
        """Frames in the stream, counted from its packets."""
        return int(len(self.pts))

    def keyframes(self) -> np.ndarray:
        """Indices of the keyframes, ascending."""
        return np.flatnonzero(self.is_keyframe)


def source_name(source: VideoSource) -> str:
    """How errors and logs name ``source``: the path, or ``<N bytes in memory>``."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{memoryview(source).nbytes} bytes in memory>"
    if isinstance(source, FileOpener):
        return str(source.name)
    return os.fspath(source)


VIDEO_FORMATS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm"
"""The FFmpeg demuxers every video is opened with (``format_whitelist``): MP4/MOV and Matroska/WebM, which mmfeed
writes (mp4) and LeRobot and webdataset shards hold. Any other format FFmpeg would recognise is refused, above all
those that open other files or URLs themselves (HLS playlists, concat lists): a dataset's file cannot make the
reader fetch another."""

IMAGE_FORMATS = "png_pipe,jpeg_pipe,webp_pipe"
"""The FFmpeg demuxers the images a LeRobot data file holds are opened with (PNG, JPEG, WebP)."""

_FORMAT_NAMES = {VIDEO_FORMATS: "MP4/MOV and Matroska/WebM videos", IMAGE_FORMATS: "PNG, JPEG and WebP images"}

_CONTAINER_MAGIC = (b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"uuid", b"styp", b"sidx",
                    b"moof")
"""The box types an MP4/MOV file can start with (bytes 4..8); Matroska/WebM starts with the EBML magic."""

_EBML = b"\x1a\x45\xdf\xa3"


def input_options(formats: str = VIDEO_FORMATS, path: bool = True) -> dict[str, str]:
    """The options of every ``av.open`` that reads a dataset's file (PyAV's ``container_options``): only the
    demuxers ``formats``, and only the ``file`` protocol for a path, none at all for a Python file object or bytes
    (FFmpeg then opens nothing itself)."""
    return {"format_whitelist": formats, "protocol_whitelist": "file" if path else "none"}


def is_container(head: bytes) -> bool:
    """Whether the first bytes of a file (12 or more) are those of an MP4/MOV or a Matroska/WebM file."""
    return bytes(head[4:8]) in _CONTAINER_MAGIC or bytes(head[:4]) == _EBML


def check_container(source: VideoSource) -> None:
    """Raise :class:`DecodeError` naming ``source`` unless its first bytes are an MP4/MOV's or a Matroska/WebM's:
    checked before a path or bytes go to a decoder that opens files itself (decord, torchcodec), whatever FFmpeg
    inside it would make of them."""
    if isinstance(source, FileOpener):
        return  # read through PyAV only (open_reader refuses other backends for file objects)
    name = source_name(source)
    try:
        head = _head(source)
    except OSError as exc:
        raise DecodeError(f"{name}: cannot read the video file ({exc.strerror or exc})", path=name) from exc
    if not is_container(head):
        what = _what(head) or "its first bytes are no MP4/MOV's or Matroska/WebM's"
        raise DecodeError(f"{name}: not a video container ({what}); mmfeed opens only {_FORMAT_NAMES[VIDEO_FORMATS]}",
                          path=name)


def _head(source: VideoSource) -> bytes:
    """The first 64 bytes of ``source``."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(memoryview(source)[:64])
    if isinstance(source, FileOpener):
        with source.open() as f:
            return f.read(64)
    with open(os.fspath(source), "rb") as f:
        return f.read(64)


def _what(head: bytes) -> str | None:
    """What a file that FFmpeg would follow elsewhere is, by its first bytes (an HLS playlist, a concat list), or
    None."""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"#EXTM3U"):
        return "an HLS playlist"
    if text.startswith(b"ffconcat") or text.startswith(b"file "):
        return "an FFmpeg concat list"
    if b"<MPD" in text:
        return "a DASH manifest"
    if text.startswith(b"v=0"):
        return "an SDP session description"
    return None


def _refuse_other_format(source: VideoSource, exc: Exception, name: str) -> None:
    """After ``av.open`` failed with the allow-list's EINVAL (FFmpeg took the file for a format not on it), raise
    the :class:`DecodeError` that says what it is: an HLS playlist or a concat list (by its first bytes) is not a
    video container; anything else gets the reason FFmpeg's MP4/MOV demuxer gives it, as a damaged file does. Any
    other failure returns: FFmpeg's own reason stands."""
    import av

    if not isinstance(exc, av.error.ArgumentError):
        return
    try:
        head = _head(source)
    except OSError:
        return
    what = _what(head)
    if what is not None:
        raise DecodeError(f"{name}: not a video container ({what}); mmfeed opens only "
                          f"{_FORMAT_NAMES[VIDEO_FORMATS]}", path=name) from exc
    try:
        target = source.open() if isinstance(source, FileOpener) else io.BytesIO(source) if isinstance(
            source, (bytes, bytearray, memoryview)) else os.fspath(source)
        with av.open(target, mode="r", format="mov", container_options=input_options(path=isinstance(target, str))):
            why = "FFmpeg takes it for a format other than MP4/MOV or Matroska/WebM"
    except (av.error.FFmpegError, OSError) as again:
        why = again.strerror if isinstance(again, av.error.FFmpegError) and again.strerror else again
    raise DecodeError(f"{name}: not a readable video file (unknown format, truncated or corrupt): {why}",
                      path=name) from exc


class FramesTooLarge(DecodeError):
    """A video whose stream header declares frames larger than ``max_frame_pixels`` (``height``, ``width`` and
    ``limit`` say by how much); refused before any frame is decoded."""

    def __init__(self, name: str, height: int, width: int, limit: int) -> None:
        super().__init__(f"{name}: frames of {height}x{width} ({height * width / 1e6:.1f} MP) exceed "
                         f"max_frame_pixels={limit} ({limit / 1e6:.1f} MP); pass a larger max_frame_pixels= to read "
                         "them", path=name)
        self.height, self.width, self.limit = height, width, limit


def check_frame_pixels(name: str, height: int, width: int, max_frame_pixels: int | None) -> None:
    """Raise :class:`FramesTooLarge` naming ``name`` when ``height x width`` frames exceed ``max_frame_pixels``."""
    if max_frame_pixels is not None and int(height) * int(width) > max_frame_pixels:
        raise FramesTooLarge(name, int(height), int(width), max_frame_pixels)


def pixel_limit(max_frame_pixels: int | None) -> dict[str, str]:
    """The FFmpeg codec option that makes decoders refuse larger pictures, also the ones ``av.open`` decodes to
    find the stream's parameters (``avformat_find_stream_info`` decodes a few frames of an H.264 stream)."""
    return {} if max_frame_pixels is None else {"max_pixels": str(min(int(max_frame_pixels), 2**31 - 1))}


def open_container(source: VideoSource, max_frame_pixels: int | None = MAX_FRAME_PIXELS, *, hwaccel: Any = None
                   ) -> "av.container.InputContainer":
    """``av.open`` on a path or in-memory bytes, turning every failure into a :class:`DecodeError`; a first video
    stream whose frames exceed ``max_frame_pixels`` (from its header: nothing of it is decoded) is refused.
    ``hwaccel``: PyAV's hardware decoding setting (:func:`mmfeed.codecs._nvdec.open_on_device`), or None."""
    import av

    name = source_name(source)
    if isinstance(source, FileOpener):
        target = source.open()
    elif not isinstance(source, (bytes, bytearray, memoryview)):
        if not os.path.isfile(name):
            raise DecodeError(f"{name}: no such video file", path=name)
        if os.path.getsize(name) == 0:
            raise DecodeError(f"{name}: the video file is empty (0 bytes)", path=name)
        target = name
    else:
        if memoryview(source).nbytes == 0:
            raise DecodeError(f"{name}: the video bytes are empty", path=name)
        target = io.BytesIO(source)
    try:
        container = av.open(target, mode="r", options=pixel_limit(max_frame_pixels),
                            container_options=input_options(VIDEO_FORMATS, path=isinstance(target, str)),
                            **({} if hwaccel is None else {"hwaccel": hwaccel}))
    except (av.error.FFmpegError, OSError, UnicodeDecodeError, RuntimeError) as exc:  # RuntimeError: PyAV's hwaccel
        if hwaccel is not None:
            _refuse_device(source, exc, name, max_frame_pixels)
        _refuse_other_format(source, exc, name)  # an HLS playlist, a concat list: not a video container
        # FFmpeg's words without the errno and the file name PyAV adds to them (the message names the file)
        why = exc.strerror if isinstance(exc, av.error.FFmpegError) and exc.strerror else exc
        raise DecodeError(
            f"{name}: not a readable video file (unknown format, truncated or corrupt): {why}", path=name
        ) from exc
    if container.streams.video:
        cc = container.streams.video[0].codec_context
        try:
            check_frame_pixels(name, cc.height, cc.width, max_frame_pixels)
        except DecodeError:
            container.close()
            raise
    return container


def _refuse_device(source: VideoSource, exc: BaseException, name: str, max_frame_pixels: int | None) -> None:
    """After ``av.open`` with a hardware decoder failed: where the file opens without one, raise a DecodeError
    saying it is the GPU decoder that failed (else return, and the file's own error follows)."""
    import av

    if isinstance(source, FileOpener):
        return
    try:
        open_container(source, max_frame_pixels).close()
    except DecodeError:
        return
    why = exc.strerror if isinstance(exc, av.error.FFmpegError) and exc.strerror else exc
    raise DecodeError(f"{name}: FFmpeg could not open a decoder on the CUDA device for it: {why}; leave device "
                      "unset to decode on the CPU", path=name) from exc


def packets_of(container: "av.container.InputContainer", stream: "av.video.stream.VideoStream") -> Iterator:
    """``container.demux(stream)``, closed whenever it stops. PyAV (18) frees the packet it reads into and its
    stream mask in a ``finally`` that runs only when its demux generator ends or is closed: one merely dropped half
    way (a ``break``, a seek, ``next(container.decode())``) keeps about 150 bytes of native memory for good, which
    a reader seeking once per sample pays per sample. This one is plain Python, which CPython closes as soon as it
    is dropped, and it closes PyAV's."""
    packets = container.demux(stream)
    try:
        yield from packets
    finally:
        packets.close()


def frames_of(container: "av.container.InputContainer", stream: "av.video.stream.VideoStream") -> Iterator:
    """``container.decode(stream)`` (each packet of :func:`packets_of`, decoded), its demuxing closed whenever it
    stops (``container.decode`` cannot close the demux generator it runs)."""
    packets = container.demux(stream)  # one generator layer, not packets_of's two: this runs once per frame
    try:
        for packet in packets:
            yield from packet.decode()
    finally:
        packets.close()


def probe(source: VideoSource, max_frame_pixels: int | None = MAX_FRAME_PIXELS) -> VideoInfo:
    """Demux ``source`` (no decoding) and return its :class:`VideoInfo`; cached per file path, size and mtime.

    Raises :class:`DecodeError` naming the file when it is missing, empty, unreadable or has no video stream, or
    when its stream header declares frames larger than ``max_frame_pixels`` (:data:`MAX_FRAME_PIXELS`).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _probe(source, max_frame_pixels=max_frame_pixels)
    if isinstance(source, FileOpener):
        return _probe_opener(source, max_frame_pixels)
    name = os.path.abspath(os.fspath(source))
    try:
        st = os.stat(name)
    except OSError as exc:
        raise DecodeError(f"{os.fspath(source)}: no such video file ({exc})", path=os.fspath(source)) from exc
    return _probe_cached(name, st.st_size, st.st_mtime_ns, max_frame_pixels)


@functools.lru_cache(maxsize=512)
def _probe_cached(path: str, size: int, mtime_ns: int, max_frame_pixels: int | None) -> VideoInfo:
    # size and mtime_ns are only part of the key: a rewritten file is probed again.
    return _probe(path, max_frame_pixels=max_frame_pixels)


@functools.lru_cache(maxsize=512)
def _probe_opener(source: FileOpener, max_frame_pixels: int | None) -> VideoInfo:
    # the opener's key (URL and size, say) is what the cache keys on: a rewritten file is probed again
    return _probe(source, indexed=True, max_frame_pixels=max_frame_pixels)


_REORDER_CHECK = 32
"""Packets an indexed probe demuxes to see that presentation order is decode order (no B-frames)."""


def _indexed(container, stream) -> tuple[list[int], list[bool], int] | None:
    """Frame times and keyframe flags from the container's index (an mp4's sample table: read with its header,
    no frame data), or None when the index cannot be trusted for them: the first packets show frames reordered
    (B-frames: the index holds decode times) or their times disagree with it."""
    entries = [e for e in stream.index_entries if not e.is_discard]
    if not entries:
        return None
    times = [int(e.timestamp) for e in entries]
    if any(b <= a for a, b in zip(times, times[1:])):
        return None
    seen = 0
    for packet in packets_of(container, stream):
        if packet.size == 0:
            continue
        if packet.pts is None or packet.pts != packet.dts or seen >= len(times) or packet.pts != times[seen]:
            return None
        seen += 1
        if seen == _REORDER_CHECK:
            break
    duration = int(stream.duration / len(times)) if stream.duration and len(times) else 0
    return times, [bool(e.is_keyframe) for e in entries], duration


def _probe(source: VideoSource, indexed: bool = False,
           max_frame_pixels: int | None = MAX_FRAME_PIXELS) -> VideoInfo:
    import av

    name = source_name(source)
    with open_container(source, max_frame_pixels) as container:
        if not container.streams.video:
            kinds = sorted({s.type for s in container.streams}) or ["none"]
            raise DecodeError(f"{name}: holds no video stream (streams: {', '.join(kinds)})", path=name)
        stream = container.streams.video[0]
        cc = stream.codec_context
        codec = cc.codec.canonical_name if cc.codec is not None else cc.name
        pts_list: list[int] = []
        key_list: list[bool] = []
        last_duration = 0
        open_gop = False
        key_pts = None  # pts of the latest keyframe in decode order
        from_index = _indexed(container, stream) if indexed else None
        if from_index is not None:
            pts_list, key_list, last_duration = from_index
        elif indexed:  # the check demuxed the first packets: demux the whole stream from the start
            container.seek(0, stream=stream, backward=True, any_frame=True)
        try:
            for packet in (packets_of(container, stream) if from_index is None else ()):
                if packet.size == 0:  # the flush packets PyAV yields at the end
                    continue
                ts = packet.pts if packet.pts is not None else packet.dts
                if ts is None:
                    raise DecodeError(
                        f"{name}: packet {len(pts_list)} has no timestamp; remux the file into mp4/mkv",
                        path=name,
                    )
                pts_list.append(int(ts))
                key_list.append(bool(packet.is_keyframe))
                if packet.is_keyframe:
                    key_pts = int(ts)
                elif key_pts is not None and ts < key_pts:
                    open_gop = True
                last_duration = int(packet.duration or 0)
        except av.error.FFmpegError as exc:
            raise DecodeError(f"{name}: demuxing failed after {len(pts_list)} packets: {exc}", path=name) from exc
        if not pts_list:
            raise DecodeError(f"{name}: the video stream holds no frames", path=name, num_frames=0)
        time_base = Fraction(stream.time_base) if stream.time_base else Fraction(1, 90000)
        rate = stream.average_rate or stream.guessed_rate
        width, height = int(cc.width), int(cc.height)
        index = int(stream.index)
    order = np.argsort(np.asarray(pts_list, dtype=np.int64), kind="stable")
    pts = np.asarray(pts_list, dtype=np.int64)[order]
    is_key = np.asarray(key_list, dtype=bool)[order]
    if not is_key.any():
        is_key[0] = True  # nothing flagged (some raw streams): decode from the start
    key_positions = np.flatnonzero(is_key)
    gop_start = key_positions[np.maximum(np.searchsorted(key_positions, np.arange(len(pts)), "right") - 1, 0)]
    timestamps = pts.astype(np.float64) * float(time_base)
    if rate:
        fps = float(rate)
    elif len(pts) > 1:
        fps = 1.0 / float(np.median(np.diff(timestamps)))
    else:
        fps = 0.0
    frame_time = last_duration * float(time_base) if last_duration else (1.0 / fps if fps else 0.0)
    return VideoInfo(
        path=name,
        codec=str(codec),
        width=width,
        height=height,
        fps=fps,
        time_base=time_base,
        stream_index=index,
        pts=pts,
        is_keyframe=is_key,
        gop_start=gop_start.astype(np.int64),
        timestamps=timestamps,
        duration=float(timestamps[-1] + frame_time),
        open_gop=open_gop,
    )


def validate_indices(info: VideoInfo, indices: ArrayLike) -> np.ndarray:
    """``indices`` as int64 ``[N]``, checked against the video's length (no negative, Python-style indexing)."""
    arr = np.asarray(indices)
    if arr.ndim == 0:
        arr = arr[None]
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise TypeError(f"{info.path}: frame indices must be a 1-D sequence of ints, got shape {arr.shape}")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{info.path}: frame indices must be integers, got dtype {arr.dtype}; pass times in seconds as "
            "timestamps=... instead"
        )
    arr = arr.astype(np.int64, copy=False)
    n = info.num_frames
    bad = np.flatnonzero((arr < 0) | (arr >= n))
    if bad.size:
        i = int(arr[bad[0]])
        raise DecodeError(
            f"{info.path}: frame index {i} is out of range for a video of {n} frames ({info.duration:.3f} s); "
            f"valid indices are 0..{n - 1}",
            path=info.path,
            index=i,
            num_frames=n,
            duration=info.duration,
        )
    return arr


def frames_at_times(info: VideoInfo, timestamps: ArrayLike, tolerance_s: float = 1e-4) -> np.ndarray:
    """The frame nearest in presentation time to each of ``timestamps`` (seconds), as int64 indices.

    As in LeRobot, a time whose nearest frame is more than ``tolerance_s`` away is an error, not a silent pick.
    """
    if not tolerance_s >= 0:
        raise ValueError(f"tolerance_s must be >= 0 seconds, got {tolerance_s!r}")
    ts = np.asarray(timestamps)
    if ts.ndim == 0:
        ts = ts[None]
    if ts.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ts.ndim != 1 or not np.issubdtype(ts.dtype, np.number) or ts.dtype == bool:
        raise TypeError(f"{info.path}: timestamps must be a 1-D sequence of seconds, got {ts.dtype} {ts.shape}")
    ts = ts.astype(np.float64, copy=False)
    frame_ts = info.timestamps
    right = np.clip(np.searchsorted(frame_ts, ts), 0, len(frame_ts) - 1)
    left = np.maximum(right - 1, 0)
    pick = np.where(np.abs(frame_ts[left] - ts) <= np.abs(frame_ts[right] - ts), left, right)
    err = np.abs(frame_ts[pick] - ts)
    bad = np.flatnonzero(~(err <= tolerance_s))  # NaN times are bad too
    if bad.size:
        k = int(bad[0])
        t, j = float(ts[k]), int(pick[k])
        raise DecodeError(
            f"{info.path}: no frame within {tolerance_s:g} s of time {t:.6f} s; the nearest is frame {j} at "
            f"{frame_ts[j]:.6f} s; the video has {info.num_frames} frames spanning "
            f"{frame_ts[0]:.6f}..{info.duration:.6f} s at {info.fps:g} fps",
            path=info.path,
            timestamp=t,
            num_frames=info.num_frames,
            duration=info.duration,
        )
    return pick.astype(np.int64)
