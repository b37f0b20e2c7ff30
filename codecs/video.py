"""Video frames as uint8 ``[N, H, W, 3]`` numpy arrays (or I420 planes ``[N, H * 3 // 2, W]`` with
``frame_format="yuv420"``, see :mod:`mmfeed.codecs.colour`), by frame index or by presentation time.

Three backends sit behind one small protocol (:class:`VideoReader`) in the :data:`BACKENDS` registry: ``"decord"``
(H.264/HEVC, fast single-frame seeks), ``"pyav"`` (everything FFmpeg decodes, AV1 through libdav1d) and the optional
``"torchcodec"`` (imported only when asked for; see :mod:`mmfeed.codecs._torchcodec` for loading it).
``"auto"`` is PyAV for every codec: decord 0.6 cannot open AV1 and seeks open-GOP HEVC wrongly, and where it
works mmfeed's GOP-coalesced PyAV reader is the faster of the two (``python -m mmfeed.bench.decode``, 640x480
H.264: 1.26x decord on clips, 1.15x on sparse frames, 1.2x sequentially; 1.45x through the loader). decord stays
available by name, and so does torchcodec, which "auto" never picks: it is an optional package that loads only
with FFmpeg's shared libraries on the loader's path, so it cannot be assumed present, and it is not faster (same
benchmark, same request sets, one thread, coalesced batches: 0.94x PyAV on H.264 GOP 30 clips, 0.82x on sparse
frames, 0.99x on AV1 GOP 2 clips, 1.11x on sparse frames, all within the run's spread).

>>> import tempfile, os
>>> from mmfeed.testing import frame_pattern, read_index, write_video
>>> path = write_video(os.path.join(tempfile.mkdtemp(), "v.mp4"), frame_pattern(12, height=48, width=64))
>>> read_index(read_frames(path, indices=[9, 0, 9])).tolist()
[9, 0, 9]
>>> read_index(read_frames(path, timestamps=[0.1, 1 / 30])).tolist()
[3, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from numpy.typing import ArrayLike

from mmfeed.codecs._decord import DecordReader
from mmfeed.codecs._pyav import PyAVReader
from mmfeed.codecs._nvdec import pyav_cuda_error
from mmfeed.codecs._torchcodec import TorchCodecReader, check_device, cuda_decode_error
from mmfeed.codecs.colour import FRAME_FORMATS, frame_step_shape
from mmfeed.codecs.demux import check_container
from mmfeed.codecs.demux import (MAX_FRAME_PIXELS, FileOpener, VideoInfo, VideoSource, check_frame_pixels,
                                 frames_at_times, probe, validate_indices)
from mmfeed.codecs.errors import DecodeError
from mmfeed.codecs.nt_copy import copy_into

__all__ = [
    "BACKENDS",
    "DEFAULT_TOLERANCE_S",
    "DecodeOptions",
    "VideoReader",
    "choose_backend",
    "open_reader",
    "read_frames",
]


DEFAULT_TOLERANCE_S = 1e-4
"""LeRobot's default: a requested time must lie this close (seconds) to a frame's presentation time."""


class VideoReader(Protocol):
    """One open video. ``decode`` and ``decode_each`` take sorted, unique, validated frame indices."""

    name: str
    info: VideoInfo
    out_shape: tuple[int, int]

    def decode(self, indices: np.ndarray) -> np.ndarray:
        """uint8 ``[len(indices), H, W, 3]`` (H, W = ``out_shape``, after any decode-time resize), or
        ``[len(indices), H * 3 // 2, W]`` for a reader opened with ``frame_format="yuv420"``."""
        ...

    def decode_each(self, indices: np.ndarray, sink: Callable[[int, np.ndarray], None],
                    into: Callable[[int], np.ndarray | None] | None = None) -> None:
        """``sink(k, frame)`` for each index in order; ``frame`` is valid only during the call. Where ``into(k)``
        gives an array, the reader may write frame ``k`` straight into it instead of calling ``sink`` (PyAV's
        does; a reader of yuv420 frames, PyAV's being the only one, always does)."""
        ...

    def close(self) -> None:
        """Release the file."""
        ...


BACKENDS: dict[str, type] = {"decord": DecordReader, "pyav": PyAVReader, "torchcodec": TorchCodecReader}
"""Backend name -> reader class; every class takes ``(source, info, *, threads, size)``; PyAV also
``frame_format``."""


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """How frames are decoded; validated on construction.

    - ``backend``: ``"auto"`` or a key of :data:`BACKENDS`.
    - ``threads``: decoder threads per open video (default 1: one per worker process is the usual layout).
    - ``size``: ``(height, width)`` to scale every frame to inside the decoder's converter, or None.
    - ``crop``: ``(top, left, height, width)`` cut from each frame after any resize, or None.
    - ``frame_format``: ``"rgb24"`` (uint8 ``[H, W, 3]``) or ``"yuv420"`` (I420 planes ``[H * 3 // 2, W]``, as
      decoded, without a colour conversion; PyAV only, not decord or torchcodec; even sizes and crops;
      :func:`mmfeed.codecs.colour.yuv420_to_rgb` converts them later, on the device).
    - ``device``: ``"cuda"`` or ``"cuda:N"`` to decode with NVDEC and deliver torch uint8 tensors ``[N, H, W, 3]``
      on that GPU instead of numpy arrays: through PyAV's bundled FFmpeg (``backend="pyav"`` or ``"auto"``; RGB
      equal to the CPU path's, :mod:`mmfeed.codecs._nvdec`) or torchcodec's CUDA build (``backend="torchcodec"``,
      :mod:`mmfeed.codecs._torchcodec`); not decord. Checked here, so a machine that cannot (no CUDA, PyAV without
      hardware decoding, no torchcodec or its CPU build) fails when the options are made, saying what is missing.
    - ``max_frame_pixels``: the largest frame area (height x width) a video may have (default
      :data:`~mmfeed.codecs.demux.MAX_FRAME_PIXELS`, 4096x4096); a larger stream is refused from its header when
      it is probed, before any frame is decoded, whatever the backend. None lifts the limit.
    """

    backend: str = "auto"
    threads: int = 1
    size: tuple[int, int] | None = None
    crop: tuple[int, int, int, int] | None = None
    frame_format: str = "rgb24"
    device: str | None = None
    max_frame_pixels: int | None = MAX_FRAME_PIXELS

    def __post_init__(self) -> None:
        limit = self.max_frame_pixels
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"max_frame_pixels must be an int >= 1 (height x width) or None, got {limit!r}")
        if self.backend != "auto" and self.backend not in BACKENDS:
            raise ValueError(f"unknown video backend {self.backend!r}; choose 'auto' or one of {sorted(BACKENDS)}")
        if self.device is not None:
            if self.frame_format != "rgb24":
                raise ValueError(f"device={self.device!r} delivers RGB frames on the GPU; frame_format="
                                 f"{self.frame_format!r} is for host frames converted later: drop one of them")
            object.__setattr__(self, "device", check_device_option(self.device, self.backend))
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {self.threads!r}")
        if self.size is not None:
            size = tuple(self.size)
            if len(size) != 2 or not all(isinstance(v, int) and v >= 2 for v in size):
                raise ValueError(f"size must be (height, width) with ints >= 2, got {self.size!r}")
            object.__setattr__(self, "size", size)
        if self.crop is not None:
            crop = tuple(self.crop)
            if len(crop) != 4 or not all(isinstance(v, int) for v in crop) or min(crop[:2]) < 0 or min(crop[2:]) < 1:
                raise ValueError(f"crop must be (top, left, height, width) with top, left >= 0 and sizes >= 1, "
                                 f"got {self.crop!r}")
            object.__setattr__(self, "crop", crop)
        if self.frame_format not in FRAME_FORMATS:
            raise ValueError(f"frame_format must be one of {list(FRAME_FORMATS)}, got {self.frame_format!r}")
        if self.frame_format == "yuv420":
            if self.backend == "decord":
                raise ValueError("backend 'decord' cannot deliver frame_format='yuv420' (decord only gives RGB); "
                                 "use backend='pyav' or 'auto'")
            if self.backend == "torchcodec":
                raise ValueError("backend 'torchcodec' cannot deliver frame_format='yuv420' (mmfeed asks "
                                 "torchcodec for RGB only); use backend='pyav' or 'auto'")
            if self.size is not None and (self.size[0] % 2 or self.size[1] % 2):
                raise ValueError(f"frame_format='yuv420' needs an even frame size (4:2:0 chroma covers 2x2 pixels), "
                                 f"got size {self.size}")
            if self.crop is not None and any(v % 2 for v in self.crop):
                raise ValueError(f"frame_format='yuv420' needs an even crop (top, left, height, width), got "
                                 f"{self.crop}")

    def check_crop(self, info: VideoInfo) -> None:
        """Raise ValueError when the crop does not fit inside the (resized) frames of ``info``, or when yuv420
        frames of ``info`` would have an odd size."""
        h, w = self.size if self.size is not None else (info.height, info.width)
        if self.frame_format == "yuv420" and (h % 2 or w % 2):
            raise ValueError(f"{info.path}: frame_format='yuv420' needs an even frame size, but the frames are "
                             f"{h}x{w}; give an even size to scale them to")
        if self.crop is None:
            return
        top, left, ch, cw = self.crop
        if top + ch > h or left + cw > w:
            raise ValueError(f"{info.path}: crop {self.crop} (top, left, height, width) does not fit in {h}x{w} frames")


def check_device_option(device: object, backend: str) -> str:
    """The ``device`` option checked against ``backend`` and this machine: PyAV (``"pyav"`` or ``"auto"``, NVDEC
    through PyAV's bundled FFmpeg) and torchcodec decode onto a GPU, decord does not; ValueError naming the option,
    what is missing and the fix otherwise."""
    device = check_device(device)
    if backend not in ("auto", "pyav", "torchcodec"):
        raise ValueError(f"device={device!r} decodes on the GPU through PyAV or torchcodec only, but backend is "
                         f"{backend!r}; pass backend='pyav' (or 'auto', or 'torchcodec') with device=, or leave "
                         "device unset")
    reason = cuda_decode_error(device) if backend == "torchcodec" else pyav_cuda_error(device)
    if reason is not None:
        raise ValueError(f"device={device!r} cannot decode here: {reason}")
    return device


def choose_backend(info: VideoInfo, backend: str = "auto") -> str:
    """The backend ``backend`` resolves to for the video ``info`` describes.

    ``auto``: PyAV (see the module docstring for why not decord).
    """
    if backend != "auto":
        if backend not in BACKENDS:
            raise ValueError(f"unknown video backend {backend!r}; choose 'auto' or one of {sorted(BACKENDS)}")
        return backend
    return "pyav"


def open_reader(
    source: VideoSource, options: DecodeOptions | None = None, info: VideoInfo | None = None
) -> VideoReader:
    """Open ``source`` with the backend ``options`` ask for."""
    options = options or DecodeOptions()
    info = info if info is not None else probe(source, options.max_frame_pixels)
    check_frame_pixels(info.path, info.height, info.width, options.max_frame_pixels)  # every backend, before opening
    options.check_crop(info)
    name = choose_backend(info, options.backend)
    if name != "pyav" and isinstance(source, FileOpener):
        raise DecodeError(f"{info.path}: a video read through a file object (object storage, say) decodes with "
                          f"PyAV only, not {name!r}; use backend='pyav' or 'auto'", path=info.path)
    if name != "pyav":
        check_container(source)  # decord and torchcodec open it with their own FFmpeg, without PyAV's allow-list
    extra = {"frame_format": options.frame_format} if options.frame_format != "rgb24" else {}
    if name == "pyav":
        extra["max_frame_pixels"] = options.max_frame_pixels
    if options.device is not None:
        extra["device"] = options.device
    return BACKENDS[name](source, info, threads=options.threads, size=options.size, **extra)


def read_frames(
    path: VideoSource,
    indices: ArrayLike | None = None,
    *,
    timestamps: ArrayLike | None = None,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    backend: str = "auto",
    threads: int = 1,
    size: tuple[int, int] | None = None,
    crop: tuple[int, int, int, int] | None = None,
    frame_format: str = "rgb24",
    device: str | None = None,
    max_frame_pixels: int | None = MAX_FRAME_PIXELS,
) -> np.ndarray:
    """Decode frames of one video as uint8 ``[N, H, W, 3]`` (C-contiguous: ``torch.from_numpy`` shares it), or
    as I420 planes ``[N, H * 3 // 2, W]`` with ``frame_format="yuv420"``, or with ``device="cuda"`` (NVDEC, through
    PyAV or torchcodec) as a torch uint8 tensor ``[N, H, W, 3]`` on that GPU.

    Give ``indices`` (frame numbers in presentation order) or ``timestamps`` (seconds; the nearest frame by
    presentation time, an error when farther than ``tolerance_s``), or neither for every frame. Frames come back in
    the order asked, repeats included; each needed GOP is decoded once. Errors are :class:`DecodeError` naming the
    path, the bad index or time and the video's length. A video whose frames exceed ``max_frame_pixels`` (height x
    width, 4096x4096 by default; None lifts it) is refused from its stream header, before anything is decoded.
    For many requests use :func:`decode_batch` with a :class:`VideoReaderCache`, which keeps files open between
    calls.
    """
    options = DecodeOptions(backend=backend, threads=threads, size=size, crop=crop, frame_format=frame_format,
                            device=device, max_frame_pixels=max_frame_pixels)
    info = probe(path, max_frame_pixels)
    wanted = resolve_request(info, indices, timestamps, tolerance_s)
    options.check_crop(info)
    if len(wanted) == 0:
        return decode_requests(None, options, info, [wanted])[0]
    reader = open_reader(path, options, info)
    try:
        return decode_requests(reader, options, info, [wanted])[0]
    finally:
        reader.close()


def decode_requests(
    reader: VideoReader | None, options: DecodeOptions, info: VideoInfo, wanted: Sequence[np.ndarray],
    outs: Sequence[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """Decode the union of several requests on one file once and copy each frame straight into every request's
    output array that asked for it (one copy per delivered frame, crop applied on the way). ``outs`` may give
    a request its own output (uint8 ``[N, H, W, 3]``, or ``[N, H * 3 // 2, W]`` for yuv420; e.g. a slice of a
    batch's payload) to be filled in place."""
    if options.device is not None:
        return decode_on_device(reader, options, info, wanted, outs)
    h, w = options.size if options.size is not None else (info.height, info.width)
    top, left, oh, ow = options.crop if options.crop is not None else (0, 0, h, w)
    step = frame_step_shape(oh, ow, options.frame_format)
    given = list(outs) if outs is not None else [None] * len(wanted)
    for out, x in zip(given, wanted):
        if out is not None and (out.shape != (len(x), *step) or out.dtype != np.uint8):
            raise ValueError(f"{info.path}: an output for {len(x)} frames must be uint8 {(len(x), *step)}, got "
                             f"{out.dtype} {out.shape}")
    outs = [np.empty((len(x), *step), dtype=np.uint8) if out is None else out for out, x in zip(given, wanted)]
    total = sum(len(x) for x in wanted)
    if total == 0:
        return outs
    if reader is None:
        raise ValueError(f"{info.path}: frames were requested but no reader was given")
    flat = np.concatenate(wanted)
    union, inverse = np.unique(flat, return_inverse=True)
    inverse = inverse.reshape(-1)
    if len(wanted) == 1 and given[0] is None and options.crop is None and len(union) == len(flat) \
            and np.array_equal(union, flat):
        return [reader.decode(union)]  # one sorted request: the reader's own output is the answer
    targets: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(len(union))]
    start = 0
    for out, x in zip(outs, wanted):
        for row, k in enumerate(inverse[start : start + len(x)].tolist()):
            targets[k].append((out, row))
        start += len(x)

    if options.crop is None:
        sunk = [False] * len(union)

        def sink(k: int, frame: np.ndarray) -> None:
            sunk[k] = True
            for out, row in targets[k]:
                copy_into(out[row], frame)

        # each frame may be written straight into its first place
        firsts = [out[row] if out.flags.c_contiguous else None for (out, row), *_ in targets]
        reader.decode_each(union, sink, firsts.__getitem__)
        for k, places in enumerate(targets):  # a frame written into its first place is copied to the others
            if len(places) > 1 and not sunk[k]:
                first = places[0][0][places[0][1]]
                for out, row in places[1:]:
                    copy_into(out[row], first)
    elif options.frame_format == "yuv420":
        def sink(k: int, frame: np.ndarray) -> None:
            for out, row in targets[k]:
                crop_yuv420(frame, out[row], top, left)

        reader.decode_each(union, sink)
    else:
        def sink(k: int, frame: np.ndarray) -> None:
            part = frame[top : top + oh, left : left + ow]
            for out, row in targets[k]:
                copy_into(out[row], part)

        reader.decode_each(union, sink)
    return outs


def decode_on_device(
    reader: VideoReader | None, options: DecodeOptions, info: VideoInfo, wanted: Sequence[np.ndarray],
    outs: Sequence[Any] | None = None,
) -> list[Any]:
    """:func:`decode_requests` for frames decoded onto ``options.device``: the union of the requests decoded in one
    call (one ``[U, H, W, 3]`` tensor on the GPU), each request one gather from it (crop applied), into its own
    ``out`` when that is a uint8 tensor on the device. A host array as ``out`` (a shared-memory payload, a frame
    cache) is refused: device frames are never copied back through host memory."""
    import torch

    h, w = options.size if options.size is not None else (info.height, info.width)
    top, left, oh, ow = options.crop if options.crop is not None else (0, 0, h, w)
    given = list(outs) if outs is not None else [None] * len(wanted)
    device = torch.device(options.device)
    for out, x in zip(given, wanted):
        if out is None:
            continue
        if not isinstance(out, torch.Tensor) or out.device.type != "cuda":
            raise ValueError(f"{info.path}: device={options.device!r} leaves frames on the GPU, but this request asks "
                             f"for them in a host {type(out).__name__} (a shared-memory batch payload or a frame "
                             "cache); read device frames through read_frames, decode_batch, a source's read_many or "
                             "its windows() view, or leave device unset")
        if tuple(out.shape) != (len(x), oh, ow, 3) or out.dtype != torch.uint8:
            raise ValueError(f"{info.path}: an output for {len(x)} frames must be uint8 {(len(x), oh, ow, 3)}, got "
                             f"{out.dtype} {tuple(out.shape)}")
    total = sum(len(x) for x in wanted)
    if total and reader is None:
        raise ValueError(f"{info.path}: frames were requested but no reader was given")
    if total == 0:
        return [torch.empty((len(x), oh, ow, 3), dtype=torch.uint8, device=device) if out is None else out
                for out, x in zip(given, wanted)]
    union = np.unique(np.concatenate(wanted))
    return gather_requests(reader.decode(union)[:, top : top + oh, left : left + ow], wanted, given)


def gather_requests(frames: Any, wanted: Sequence[np.ndarray], outs: Sequence[Any | None]) -> list[Any]:
    """Each request's frames from ``frames`` (a torch tensor holding, in order, the frames of the sorted union of
    ``wanted``), one ``index_select`` per request on the tensor's device, into its ``out`` tensor when given."""
    import torch

    union, inverse = np.unique(np.concatenate(wanted), return_inverse=True)
    if len(union) != len(frames):
        raise ValueError(f"{len(frames)} frames given for a union of {len(union)} wanted frames")
    rows = torch.from_numpy(inverse.reshape(-1)).to(frames.device)
    result, start = [], 0
    for out, x in zip(outs, wanted):
        part = rows[start : start + len(x)]
        start += len(x)
        if out is None:
            result.append(frames.index_select(0, part))
        else:
            torch.index_select(frames, 0, part, out=out)
            result.append(out)
    return result


def crop_yuv420(frame: np.ndarray, out: np.ndarray, top: int, left: int) -> None:
    """Write the ``out``-sized crop at even ``(top, left)`` of the I420 ``frame`` ``[H * 3 // 2, W]`` into the
    C-contiguous I420 ``out`` ``[h * 3 // 2, w]``, plane by plane (each chroma plane at half the offsets)."""
    big_h, big_w = frame.shape[0] * 2 // 3, frame.shape[1]
    h, w = out.shape[0] * 2 // 3, out.shape[1]
    if not out.flags.c_contiguous:
        raise ValueError(f"a yuv420 output frame must be C-contiguous, got strides {out.strides}")
    src, dst = np.ascontiguousarray(frame).reshape(-1), out.reshape(-1)
    dst[: h * w].reshape(h, w)[...] = src[: big_h * big_w].reshape(big_h, big_w)[top : top + h, left : left + w]
    for p in range(2):
        s0, d0 = big_h * big_w + p * (big_h * big_w // 4), h * w + p * (h * w // 4)
        plane = src[s0 : s0 + big_h * big_w // 4].reshape(big_h // 2, big_w // 2)
        dst[d0 : d0 + h * w // 4].reshape(h // 2, w // 2)[...] = \
            plane[top // 2 : (top + h) // 2, left // 2 : (left + w) // 2]


def resolve_request(
    info: VideoInfo, indices: ArrayLike | None, timestamps: ArrayLike | None, tolerance_s: float
) -> np.ndarray:
    """The frame indices a request names (validated int64), from ``indices``, ``timestamps`` or neither (all)."""
    if indices is not None and timestamps is not None:
        raise ValueError(f"{info.path}: give frame indices or timestamps, not both")
    if timestamps is not None:
        return frames_at_times(info, timestamps, tolerance_s)
    if indices is None:
        return np.arange(info.num_frames, dtype=np.int64)
    return validate_indices(info, indices)
