"""PyAV backend: every codec FFmpeg decodes (AV1 through libdav1d), with GOP-coalesced random access.

Given the sorted frames a caller wants from one file, :meth:`PyAVReader.decode` seeks to the keyframe at or
before the first one, decodes forward keeping only wanted frames, and, before each next wanted frame, chooses
between decoding through (it is in the current GOP, or only a few frames away) and seeking to its own keyframe
(the keyframe flags of the demux index say which GOP holds each frame). Each frame that comes out of the decoder
is identified by its pts, never by counting frames after a seek, so an inexact seek cannot shift the output.

Frames come out as RGB (one swscale conversion per frame, through one reformatter per file) or, with
``frame_format="yuv420"``, as the decoder's own I420 planes (scaled inside swscale when a size is asked), without
a colour conversion: :mod:`mmfeed.codecs.colour` converts them later, on the device.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import numpy as np

from mmfeed.codecs.demux import MAX_FRAME_PIXELS, VideoInfo, VideoSource, pixel_limit, frames_of, open_container
from mmfeed.codecs.errors import DecodeError
from mmfeed.codecs._sws import DirectRGB, one_thread
from mmfeed.codecs.nt_copy import copy_into
from mmfeed.codecs._nvdec import open_on_device, pyav_cuda_error, upload_nv12

__all__ = ["PyAVReader", "decode_totals", "seek_cost_frames"]

log = logging.getLogger(__name__)

# Readers opened, frames decoded and seeks by the PyAVReaders of each thread: readers come and go (caches close
# them), a benchmark takes differences of these running totals around the work it measures. Per thread, so that
# loader threads working side by side (worker_mode="thread") each count only their own batch.
_local = threading.local()


def _counts() -> dict[str, int]:
    counts = getattr(_local, "totals", None)
    if counts is None:
        counts = _local.totals = {"opened": 0, "frames_decoded": 0, "seeks": 0}
    return counts


def decode_totals() -> dict[str, int]:
    """``{"opened", "frames_decoded", "seeks"}`` of the PyAV readers this thread used so far (running totals; a
    forked child's thread starts from its parent's): readers opened, frames the decoder produced (GOP
    dependencies included) and seeks."""
    return dict(_counts())


def seek_cost_frames(threads: int) -> int:
    """Frames of useless decoding that one seek is worth: decode through to the next wanted GOP when at most this
    many unwanted frames lie before it. A single-threaded seek is nearly free (measured: seeking beats decoding
    even one unwanted AV1 frame); with frame threading a seek drains ``threads`` frames in flight."""
    return 0 if threads <= 1 else int(threads)


class PyAVReader:
    """Random access into one video with PyAV; see the module docstring for how requests are coalesced."""

    name = "pyav"

    def __init__(
        self, source: VideoSource, info: VideoInfo, *, threads: int = 1, size: tuple[int, int] | None = None,
        frame_format: str = "rgb24", max_frame_pixels: int | None = MAX_FRAME_PIXELS, device: str | None = None,
    ) -> None:
        if frame_format not in ("rgb24", "yuv420"):
            raise ValueError(f"frame_format must be 'rgb24' or 'yuv420', got {frame_format!r}")
        h, w = size if size is not None else (info.height, info.width)
        if frame_format == "yuv420" and (h % 2 or w % 2):
            raise ValueError(f"{info.path}: frame_format='yuv420' needs an even frame size, got {h}x{w}")
        self.device = None if device is None else _device_decoding(info, device, frame_format)
        self.cpu_fallback = False  # device: FFmpeg decoded a frame on the CPU instead of NVDEC (logged once)
        self.info = info
        self._size = size
        self.frame_format = frame_format
        self.colour: tuple[str, bool] | None = None  # yuv420: (matrix, full_range) of the frames, once one is seen
        self._scratch: np.ndarray | None = None  # yuv420: the [H * 3 // 2, W] array each frame's planes go to
        self._planes: tuple[np.ndarray, ...] | None = None
        if self.device is None:
            self._container = open_container(source, max_frame_pixels)
        else:
            self._container = open_on_device(self.device, lambda accel: open_container(source, max_frame_pixels,
                                                                                       hwaccel=accel))
        if not self._container.streams.video:
            self._container.close()
            raise DecodeError(f"{info.path}: holds no video stream", path=info.path)
        self._stream = self._container.streams.video[0]
        self._stream.codec_context.options = pixel_limit(max_frame_pixels)  # a larger picture later in the stream
        self._stream.thread_count = int(threads)
        self._stream.thread_type = "AUTO" if threads > 1 else "SLICE"
        self._seek_cost = seek_cost_frames(threads)
        import av
        from av.video.reformatter import VideoReformatter

        self._ffmpeg_error = av.error.FFmpegError  # what a failing decoder raises
        self._reformatter = VideoReformatter()
        self._direct = DirectRGB() if frame_format == "rgb24" else None
        self._index_of = {int(p): i for i, p in enumerate(info.pts)}
        self._gop_start = info.gop_start.tolist()  # each frame's keyframe, as Python ints (read once a frame)
        self._frames = None  # the live decode generator, or None when the next read must seek
        self._pos = -1  # presentation index of the last frame the decoder produced
        self.frames_decoded = 0  # running counters, for benchmarks and tests
        _counts()["opened"] += 1
        self.seeks = 0

    @property
    def out_shape(self) -> tuple[int, int]:
        """(height, width) of the frames this reader returns."""
        return self._size if self._size is not None else (self.info.height, self.info.width)

    def decode(self, indices: np.ndarray) -> np.ndarray:
        """Frames at the sorted, unique, in-range ``indices`` as uint8 ``[N, H, W, 3]`` (yuv420:
        ``[N, H * 3 // 2, W]``); with a ``device``, a torch tensor ``[N, H, W, 3]`` on that GPU."""
        if self.device is not None:
            return self._decode_on_device(indices)
        h, w = self.out_shape
        step = (h, w, 3) if self.frame_format == "rgb24" else (h * 3 // 2, w)
        out = np.empty((len(indices), *step), dtype=np.uint8)

        def store(k: int, frame: np.ndarray) -> None:
            out[k] = frame

        self.decode_each(indices, store, lambda k: out[k])
        return out

    def decode_each(self, indices: np.ndarray, sink: Callable[[int, np.ndarray], None],
                    into: Callable[[int], np.ndarray | None] | None = None) -> None:
        """Call ``sink(k, frame)`` for each of the sorted, unique ``indices``, in order; ``frame`` is an
        ``[H, W, 3]`` (yuv420: ``[H * 3 // 2, W]``) uint8 array that is valid only during the call (copy what you
        keep). Where ``into(k)`` gives an array (``[H, W, 3]``, yuv420: C-contiguous ``[H * 3 // 2, W]``), the
        frame may be written straight into it instead, and ``sink`` is then not called for it (one copy less):
        yuv420 planes always are, RGB pixels where :class:`~mmfeed.codecs._sws.DirectRGB` takes the frame's
        layout."""
        # Local bound methods: one kept on the reader would make a reference cycle, and a reader freed by the
        # cyclic collector may be freed in a forked worker, whose copy of swscale's threads never answers.
        rgb = self.frame_format == "rgb24"
        convert, direct = (self._rgb, self._direct) if rgb else (self._yuv, None)
        for k, target in enumerate(indices.tolist()):
            frame = self._decode_one(target)
            out = into(k) if into is not None else None
            if out is None:
                sink(k, convert(frame))
            elif not rgb:
                self._yuv(frame, out)
            elif not direct.convert_into(frame, out, convert):
                sink(k, convert(frame))

    def _decode_on_device(self, indices: np.ndarray):
        """:meth:`decode` with NVDEC (:mod:`mmfeed.codecs._nvdec`): every frame's NV12 planes copied into one
        device tensor, converted to RGB in one pass, then resized where a ``size`` asks."""
        import torch

        from mmfeed.codecs._torchcodec import resize_on_device
        from mmfeed.codecs.colour import nv12_to_rgb_torch

        info, device = self.info, torch.device(self.device)
        current, default = torch.cuda.current_stream(device), torch.cuda.default_stream(device)
        with torch.cuda.stream(default):  # FFmpeg's copies out of the decoder run on this stream
            nv12 = torch.empty((len(indices), info.height * 3 // 2, info.width), dtype=torch.uint8, device=device)
            on_gpu = True
            for k, target in enumerate(indices.tolist()):
                frame = self._decode_one(int(target))
                if self.colour is None:
                    self.colour = _colour_of(frame)
                if (frame.height, frame.width) != (info.height, info.width):
                    raise DecodeError(f"{info.path}: frame {target} is {frame.height}x{frame.width}, but the stream's "
                                      f"header says {info.height}x{info.width}; leave device unset to decode it on "
                                      "the CPU", path=info.path, index=int(target))
                on_gpu = upload_nv12(frame, nv12[k]) and on_gpu
                del frame  # the decoder's surface goes back to FFmpeg's pool (after the copy, on the same stream)
            matrix, full = self.colour if self.colour is not None else ("bt601", False)
            rgb = nv12_to_rgb_torch(nv12, matrix=matrix, full_range=full)
            if self.out_shape != (info.height, info.width):
                rgb = resize_on_device(rgb, self.out_shape)
        current.wait_stream(default)
        if not on_gpu and not self.cpu_fallback:
            self.cpu_fallback = True
            log.warning("%s: FFmpeg decodes this %s video on the CPU, not with NVDEC (a codec or profile this GPU "
                        "does not decode); frames are still delivered on %s", info.path, info.codec, self.device)
        return rgb.contiguous()

    def close(self) -> None:
        """Close the container (idempotent)."""
        self._stop_decoding()
        if self._direct is not None:
            self._direct.close()
        self._container.close()

    def _stop_decoding(self) -> None:
        """End the live decode (its demuxing closed: PyAV frees its packet buffer only then, see
        :func:`~mmfeed.codecs.demux.packets_of`); the next read seeks."""
        frames, self._frames = self._frames, None
        if frames is not None:
            frames.close()

    def _decode_one(self, target: int):
        # go on decoding where the target lies ahead and the frames decoded in vain on the way cost less than a
        # seek to its own keyframe (seek_cost >= 0); seek otherwise. This runs once a frame: keyframes are read
        # from a list of ints, and nothing here imports or raises on the usual way.
        key = self._gop_start[target]
        if self._frames is None or target <= self._pos or key - self._pos - 1 > self._seek_cost:
            self._seek(key)
        frame = self._advance_to(target)
        return frame if frame is not None else self._retry(target)

    def _retry(self, target: int):
        """``target`` when the decoder passed it or ended without producing it (an inexact seek, or frames that
        need an earlier GOP): decoded again from the keyframe before its own, then from the first frame."""
        info = self.info
        for back in (self._gop_start[max(self._gop_start[target] - 1, 0)], 0):
            log.debug("%s: frame %d not produced after seek; retrying from frame %d", info.path, target, back)
            self._seek(back)
            frame = self._advance_to(target)
            if frame is not None:
                return frame
        raise DecodeError(
            f"{info.path}: frame {target} could not be decoded (the decoder never produced pts "
            f"{int(info.pts[target])}); the video has {info.num_frames} frames ({info.duration:.3f} s)",
            path=info.path,
            index=target,
            num_frames=info.num_frames,
            duration=info.duration,
        )

    def _seek(self, frame_index: int) -> None:
        pts = int(self.info.pts[frame_index])
        self._stop_decoding()
        try:
            self._container.seek(pts, stream=self._stream, backward=True, any_frame=False)
        except (self._ffmpeg_error, OSError) as exc:
            raise DecodeError(
                f"{self.info.path}: seeking to frame {frame_index} (pts {pts}) failed: {exc}",
                path=self.info.path,
                index=frame_index,
                num_frames=self.info.num_frames,
                duration=self.info.duration,
            ) from exc
        self.seeks += 1
        _counts()["seeks"] += 1
        self._frames = frames_of(self._container, self._stream)
        self._pos = -1

    def _advance_to(self, target: int):
        """Decode on to frame ``target``: the frame, or None where the decoder passed it or the stream ended (the
        live decode is then ended)."""
        index_of, decoded, frame = self._index_of, 0, None
        try:
            for got in self._frames:
                decoded += 1
                pts = got.pts
                idx = index_of.get(pts, -1) if pts is not None else -1
                if idx >= 0:
                    self._pos = idx
                    if idx >= target:
                        frame = got if idx == target else None
                        break
        except self._ffmpeg_error as exc:
            raise self._failed(target, exc) from exc
        finally:  # counted once per call, not per frame
            self.frames_decoded += decoded
            _counts()["frames_decoded"] += decoded
        if frame is None:
            self._stop_decoding()
        return frame

    def _failed(self, target: int, exc: Exception) -> DecodeError:
        """The error for a decoder that failed on the way to frame ``target`` (the live decode ended)."""
        self._stop_decoding()
        return DecodeError(
            f"{self.info.path}: decoding failed on the way to frame {target}: {exc}; the video has "
            f"{self.info.num_frames} frames ({self.info.duration:.3f} s)",
            path=self.info.path,
            index=target,
            num_frames=self.info.num_frames,
            duration=self.info.duration,
        )

    def _rgb(self, frame) -> np.ndarray:
        # One reformatter for the whole file: frame.to_ndarray(format=...) would build a new swscale context for
        # every frame, which costs more than decoding a 640x480 H.264 frame.
        # The converted frame's plane is viewed, not copied (to_ndarray() would copy it once more): the caller's
        # sink makes the one copy, into the batch, while the frame is alive.
        h, w = self.out_shape
        plane = self._reformatter.reformat(frame, format="rgb24", width=w, height=h, **one_thread()).planes[0]
        return np.frombuffer(plane, np.uint8).reshape(h, plane.line_size)[:, : w * 3].reshape(h, w, 3)

    def _yuv(self, frame, out: np.ndarray | None = None) -> np.ndarray:
        # The decoder's planes as they are when they already are yuv420p at the wanted size; otherwise swscale
        # scales (and converts the pixel format) to yuv420p. Each plane is copied once, into ``out`` or a
        # [H * 3 // 2, W] array the reader reuses (frame.to_ndarray() allocates and stacks: 13 -> 5 us for a
        # 96x128 frame).
        h, w = self.out_shape
        if frame.format.name != "yuv420p" or frame.height != h or frame.width != w:
            frame = self._reformatter.reformat(frame, format="yuv420p", width=w, height=h, **one_thread())
        if self.colour is None:
            self._note_colour(frame)
        if out is None:
            if self._planes is None:
                self._scratch = np.empty((h * 3 // 2, w), dtype=np.uint8)
                self._planes = _plane_views(self._scratch, h, w)
            out, planes = self._scratch, self._planes
        else:
            planes = _plane_views(out, h, w)
        for plane, dst in zip(frame.planes, planes):
            copy_into(dst, np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[: dst.shape[0], : dst.shape[1]])
        return out

    def _note_colour(self, frame) -> None:
        """Record the matrix and range the frames are tagged with; the RGB path (swscale) converts with them, so
        ``yuv420_to_rgb`` must be given the same to match it (BT.601 limited range is its default)."""
        matrix, full = self.colour = _colour_of(frame)
        if matrix != "bt601" or full:
            log.warning("%s: frames are tagged %s%s; convert its yuv420 frames with yuv420_to_rgb(matrix=%r, "
                        "full_range=%s) to match the RGB path", self.info.path, matrix,
                        ", full range" if full else "", matrix, full)


def _colour_of(frame) -> tuple[str, bool]:
    """(matrix, full_range) a frame is tagged with, as swscale reads them (untagged: BT.601, limited range)."""
    return _MATRICES.get(int(frame.colorspace), "bt601"), int(frame.color_range) == 2  # 2: AVCOL_RANGE_JPEG


def _device_decoding(info: VideoInfo, device: str, frame_format: str) -> str:
    """``device`` checked for this reader: RGB frames of even size, a GPU PyAV can decode onto, the training
    process (DecodeError naming the file and what is missing otherwise)."""
    from mmfeed.codecs._torchcodec import check_device, device_refusal

    device = check_device(device)
    if frame_format != "rgb24":
        raise ValueError(f"{info.path}: device={device!r} delivers RGB frames; frame_format={frame_format!r} is "
                         "for host frames converted later (leave device unset)")
    if info.height % 2 or info.width % 2:
        raise DecodeError(f"{info.path}: device={device!r} decodes 4:2:0 frames of even size, but this video is "
                          f"{info.height}x{info.width}; leave device unset", path=info.path)
    reason = pyav_cuda_error(device) or device_refusal()
    if reason is not None:
        raise DecodeError(f"{info.path}: device={device!r} is unavailable: {reason}", path=info.path)
    return device


def _plane_views(frame: np.ndarray, h: int, w: int) -> tuple[np.ndarray, ...]:
    """The Y, U and V planes of a C-contiguous I420 ``[h * 3 // 2, w]`` array, as views."""
    flat, q = frame.reshape(-1), h * w // 4
    return (flat[: h * w].reshape(h, w), flat[h * w : h * w + q].reshape(h // 2, w // 2),
            flat[h * w + q :].reshape(h // 2, w // 2))


# AVColorSpace -> the matrix swscale converts with (anything else, unspecified included, is BT.601).
_MATRICES = {1: "bt709", 4: "fcc", 7: "smpte240m", 9: "bt2020", 10: "bt2020"}
