"""Colour conversion straight into the caller's array: libswscale's ``sws_scale`` on a decoded PyAV frame.

PyAV's ``VideoReformatter.reformat`` always converts into a frame it allocates, which the reader then copies into
the batch. A 240x320 RGB frame costs about 60 us that way and 40 us converted straight into the batch (measured on
this project's AV1 frames), a third of the colour conversion and copy a batch pays beside decoding.

:class:`DirectRGB` drives the very libswscale PyAV is linked with (found among the libraries mapped into this
process at the versions PyAV reports: a wheel's bundled copy or a system one, never decord's own) through
``ctypes``, with the settings PyAV's reformat passes (bilinear, one thread, the frame's own matrix and range),
and checks itself: the first frame of each layout (pixel format, sizes, line sizes, matrix, range, the
destination's alignment) is converted both ways, into a guarded scratch array laid out like the destination, and
the direct path is taken for that layout only if the pixels are identical and nothing was written past the frame.
swscale's SIMD converters take another path for some widths, and some write whole 16-pixel chunks past a row's
end (a 24-pixel-wide frame gets 8 pixels written past it), so destinations are also limited to rows of a
multiple of 16 pixels. When it scales, swscale needs to know where the chroma samples sit, which PyAV's reformat
takes from the frame (H.264 decoders tag them left of centre, dav1d leaves AV1 frames untagged) and PyAV does
not expose: each stream finds its own from its frames. Anything not checked, or that did not pass, goes through
reformat as before; no sample changes.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import operator
import os
import threading
from typing import Any, Callable

import numpy as np

__all__ = ["DirectRGB", "one_thread", "swscale_library"]

log = logging.getLogger(__name__)

_SWS_BILINEAR = 2  # the interpolation PyAV's reformat defaults to
_GUARD = 64  # bytes after the scratch frame that must come back untouched
_lib: Any = None  # the loaded (swscale, avutil) pair, False when unavailable


def _mapped(name: str) -> list[str]:
    """The paths of the shared libraries ``name`` (``libswscale``) this process has mapped (decord or torchcodec
    may bring copies of their own beside PyAV's)."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                base = os.path.basename(path)
                if (base.startswith(name + "-") or base.startswith(name + ".")) and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def _pyav_copy(name: str, version: tuple[int, int, int] | None) -> Any:
    """The mapped library ``name`` whose version is the one PyAV reports for it (``av.library_versions``)."""
    if version is None:
        return None
    for path in _mapped(name):
        try:
            lib = ctypes.CDLL(path)
            got = getattr(lib, name[3:] + "_version")()  # swscale_version(), avutil_version()
        except (OSError, AttributeError):
            continue
        if (got >> 16, (got >> 8) & 0xFF, got & 0xFF) == tuple(version):
            return lib
    return None


def swscale_library() -> Any:
    """``(libswscale, libavutil)`` as ``ctypes`` libraries with the prototypes used here: the very copies PyAV
    loaded (mapped in this process, at the versions PyAV reports); ``None`` where they cannot be found (not
    Linux, PyAV missing)."""
    global _lib
    if _lib is None:
        _lib = False
        try:
            av = importlib.import_module("av")
            importlib.import_module("av.video.reformatter")  # maps libswscale and libavutil into this process
        except ImportError:
            return None
        versions = getattr(av, "library_versions", {})
        sws, avu = (_pyav_copy(name, versions.get(name)) for name in ("libswscale", "libavutil"))
        if sws is None or avu is None:
            log.debug("PyAV's libswscale/libavutil not found among the mapped libraries: converting through "
                      "reformat")
            return None
        try:
            c_int, c_void_p, c_char_p = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
            avu.av_get_pix_fmt.restype, avu.av_get_pix_fmt.argtypes = c_int, [c_char_p]
            avu.av_opt_set_int.restype = c_int
            avu.av_opt_set_int.argtypes = [c_void_p, c_char_p, ctypes.c_int64, c_int]
            sws.sws_alloc_context.restype, sws.sws_alloc_context.argtypes = c_void_p, []
            sws.sws_init_context.restype, sws.sws_init_context.argtypes = c_int, [c_void_p, c_void_p, c_void_p]
            sws.sws_freeContext.restype, sws.sws_freeContext.argtypes = None, [c_void_p]
            sws.sws_getCoefficients.restype, sws.sws_getCoefficients.argtypes = c_void_p, [c_int]
            sws.sws_setColorspaceDetails.restype = c_int
            sws.sws_setColorspaceDetails.argtypes = [c_void_p, c_void_p, c_int, c_void_p, c_int, c_int, c_int, c_int]
            ptrs, ints = ctypes.POINTER(c_void_p), ctypes.POINTER(c_int)
            sws.sws_scale.restype = c_int
            sws.sws_scale.argtypes = [c_void_p, ptrs, ints, c_int, c_int, ptrs, ints]
        except AttributeError as exc:
            log.debug("libswscale through ctypes unavailable (%s): converting through reformat", exc)
            return None
        _lib = (sws, avu)
    return _lib or None


def _new_context(lib: Any, layout: tuple, siting: tuple[int, int] | None) -> int | None:
    """An initialised SwsContext for ``layout`` on one thread, with the matrix and range PyAV's reformat would
    take from the frame and the chroma ``siting`` (``None``: swscale's default); ``None`` if swscale refuses."""
    name, width, height, _, w, h, colorspace, color_range, _ = layout
    sws, avu = lib
    src_format, dst_format = avu.av_get_pix_fmt(name.encode()), avu.av_get_pix_fmt(b"rgb24")
    if src_format < 0:
        return None
    ctx = sws.sws_alloc_context()
    if not ctx:
        return None
    options = {b"srcw": width, b"srch": height, b"src_format": src_format, b"dstw": w, b"dsth": h,
               b"dst_format": dst_format, b"sws_flags": _SWS_BILINEAR, b"threads": 1}
    if siting is not None:
        options.update({b"src_h_chr_pos": siting[0], b"src_v_chr_pos": siting[1]})
    ok = all(avu.av_opt_set_int(ctx, key, value, 0) >= 0 for key, value in options.items())
    if ok and sws.sws_init_context(ctx, None, None) >= 0:
        full = color_range == 2 or name.startswith("yuvj")  # AVCOL_RANGE_JPEG, or a full-range pixel format
        coefficients = sws.sws_getCoefficients(colorspace)
        if sws.sws_setColorspaceDetails(ctx, coefficients, int(full), coefficients, 1, 0, 1 << 16, 1 << 16) >= 0:
            return ctx
    sws.sws_freeContext(ctx)
    return None


# Where a subsampled frame's chroma samples sit, for swscale to scale them (av_chroma_location_enum_to_pos, in
# 1/256 of a luma sample): None is swscale's default (centred, what dav1d's untagged AV1 frames get), then left
# (H.264 decoders tag it), top-left and top. PyAV's reformat takes the frame's, which PyAV does not expose; the
# check finds which one a stream's frames convert with. Unscaled conversions do not depend on it.
_SITINGS: tuple[tuple[int, int] | None, ...] = (None, (0, 128), (0, 0), (128, 0))
_REFUSED, _INSENSITIVE, _UNKNOWN = "refused", "insensitive", "unknown"
_PENDING_FRAMES = 8  # frames of a stream that may fail to tell the sitings apart before its layout is refused
# layout -> verdict, for the whole process (a fact of the layout): refused, insensitive, or the sitings to choose from
_verdicts: dict[tuple, Any] = {}


class _ContextTable(dict):
    """(layout, siting) -> SwsContext of one thread; frees them when dropped (the thread ended)."""

    def __init__(self, lib: Any) -> None:
        super().__init__()
        self.lib = lib

    def get_or_make(self, layout: tuple, siting: tuple[int, int] | None) -> int | None:
        ctx = self.get((layout, siting))
        if ctx is None:
            ctx = _new_context(self.lib, layout, siting)
            if ctx is not None:
                self[layout, siting] = ctx
        return ctx

    def __del__(self) -> None:
        try:
            for ctx in self.values():
                self.lib[0].sws_freeContext(ctx)
        except Exception:  # interpreter shutdown
            pass


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.table = _ContextTable(swscale_library())


_line_size = operator.attrgetter("line_size")
_per_thread = _PerThread()  # a context is used by one thread at a time (a reader is; so are its contexts)


class DirectRGB:
    """One stream's direct RGB conversions: :meth:`convert_into` writes a frame's RGB pixels into an array, or
    says it did not (the caller then converts through ``reformat``). Used by one thread at a time, as a reader
    is."""

    def __init__(self) -> None:
        self._lib = swscale_library()
        self._sitings: dict[tuple, Any] = {}  # layout but alignment -> this stream's chroma siting, when it matters
        self._pending: dict[tuple, int] = {}  # the same -> frames that did not tell the sitings apart yet
        self._src_p, self._src_s = (ctypes.c_void_p * 4)(), (ctypes.c_int * 4)()
        self._dst_p, self._dst_s = (ctypes.c_void_p * 4)(), (ctypes.c_int * 4)()
        self.taken = 0  # frames converted straight into the caller's array

    def close(self) -> None:
        """Take no direct path any more (idempotent): later frames go through reformat."""
        self._lib = None

    def convert_into(self, frame: Any, out: np.ndarray, reference: Callable[[Any], np.ndarray]) -> bool:
        """Convert ``frame`` (a decoded ``av.VideoFrame``) to RGB straight into ``out`` (C-contiguous uint8
        ``[H, W, 3]``, the size to scale to); ``False`` (``out`` untouched) where the direct path is not taken.
        ``reference(frame)``: the caller's own conversion (an ``[H, W, 3]`` array), which each new layout is
        checked against."""
        if self._lib is None:
            return False
        h, w = out.shape[0], out.shape[1]
        address = out.__array_interface__["data"][0]  # (runs once a frame: no ctypes object built)
        if w % 16 or address % 16 or not out.flags.c_contiguous:
            return False
        planes = frame.planes
        layout = (frame.format.name, frame.width, frame.height, tuple(map(_line_size, planes)), w, h,
                  int(frame.colorspace), int(frame.color_range), address % 64)
        verdict = _verdicts.get(layout)
        if verdict is None:
            verdict = _verdicts[layout] = self._judge(layout, frame, reference)
        if verdict == _REFUSED:
            return False
        siting = None
        if isinstance(verdict, tuple):  # the chroma siting matters: this stream's
            siting = self._sitings.get(layout[:-1], _UNKNOWN)  # the stream's, whatever the alignment
            if siting == _UNKNOWN:
                siting = self._find_siting(layout, frame, verdict, reference)
            if siting in (_UNKNOWN, _REFUSED):
                return False
        ctx = _per_thread.table.get_or_make(layout, siting)
        if ctx is None:
            return False
        self._scale(ctx, planes, frame.height, address, w)
        self.taken += 1
        return True

    def _scale(self, ctx: int, planes: Any, height: int, address: int, width: int) -> None:
        src_p, src_s = self._src_p, self._src_s
        for i, plane in enumerate(planes):
            src_p[i], src_s[i] = plane.buffer_ptr, plane.line_size
        self._dst_p[0], self._dst_s[0] = address, width * 3
        self._lib[0].sws_scale(ctx, src_p, src_s, 0, height, self._dst_p, self._dst_s)

    def _try(self, layout: tuple, frame: Any, sitings: tuple = _SITINGS) -> list[np.ndarray | None]:
        """``frame`` converted with each of ``sitings`` into a guarded scratch array aligned like the
        destination; ``None`` where swscale refused or wrote outside the frame."""
        _, _, height, _, w, h, _, _, misalign = layout
        size, got = h * w * 3, []
        for siting in sitings:
            ctx = _per_thread.table.get_or_make(layout, siting)
            if ctx is None:
                got.append(None)
                continue
            raw = np.full(size + 128 + _GUARD, 0xA5, dtype=np.uint8)
            start = (-raw.ctypes.data) % 64 + misalign
            self._scale(ctx, frame.planes, height, raw.ctypes.data + start, w)
            inside = (raw[:start] == 0xA5).all() and (raw[start + size :] == 0xA5).all()
            got.append(raw[start : start + size].reshape(h, w, 3) if inside else None)
        return got

    def _judge(self, layout: tuple, frame: Any, reference: Callable[[Any], np.ndarray]) -> Any:
        """The verdict on a layout this process has not seen. Insensitive to the chroma siting (every siting
        converts a frame of random samples alike, as an unscaled 4:2:0 conversion does): taken if the first frame
        converts to the reference's pixels without a byte written outside it. Sensitive: the sitings that differ
        on random samples (of those that agree, the first), among which each stream finds its own
        (:meth:`_find_siting`). Refused otherwise."""
        probe = _random_frame(frame)
        tried = self._try(layout, probe) if probe is not None else [None]
        distinct: list[int] = []
        for i, t in enumerate(tried):
            if t is not None and not any(np.array_equal(tried[j], t) for j in distinct):
                distinct.append(i)
        if any(t is None for t in tried):
            verdict: Any = _REFUSED
        elif len(distinct) == 1:
            got = self._try(layout, frame, _SITINGS[:1])[0]
            verdict = _INSENSITIVE if got is not None and np.array_equal(got, reference(frame)) else _REFUSED
        else:
            verdict = tuple(_SITINGS[i] for i in distinct)
        if verdict == _REFUSED:
            log.debug("direct swscale conversion not taken for %s: converting through reformat", layout)
        return verdict

    def _find_siting(self, layout: tuple, frame: Any, sitings: tuple,
                     reference: Callable[[Any], np.ndarray]) -> Any:
        """This stream's siting for a scaled layout, once one frame tells it: exactly one of ``sitings`` gives the
        reference's pixels. A frame on which several do (flat chroma) tells nothing (``_UNKNOWN``); after a few
        such, or on one that none matches, the stream converts the layout through reformat (``_REFUSED``)."""
        got, want = self._try(layout, frame, sitings), reference(frame)
        matches = [i for i, g in enumerate(got) if g is not None and np.array_equal(g, want)]
        key = layout[:-1]
        if len(matches) == 1:
            self._sitings[key] = sitings[matches[0]]
            return self._sitings[key]
        self._pending[key] = self._pending.get(key, 0) + 1
        if not matches or self._pending[key] >= _PENDING_FRAMES:
            self._sitings[key] = _REFUSED
            log.debug("direct swscale conversion not taken for %s on this stream: converting through reformat",
                      layout)
            return _REFUSED
        return _UNKNOWN


def _random_frame(frame: Any) -> Any:
    """A frame of ``frame``'s pixel format, size, matrix and range whose samples are random (seeded), or None."""
    import av

    try:
        probe = av.VideoFrame(frame.width, frame.height, frame.format.name)
    except (ValueError, av.error.FFmpegError):
        return None
    rng = np.random.default_rng(0)
    for plane in probe.planes:
        data = np.frombuffer(plane, np.uint8)
        data[:] = rng.integers(0, 256, data.size, dtype=np.uint8)
    probe.colorspace, probe.color_range = frame.colorspace, frame.color_range
    return probe


_ONE_THREAD: dict | None = None


def one_thread() -> dict:
    """``{"threads": 1}`` where PyAV's reformat takes it (its default there, 0, lets swscale pick a thread
    count per call: measured here 70-80 us of overhead per frame, 81 -> 9 us for a 48x64 frame, 142 -> 42 us at
    240x320, identical pixels), else nothing. One thread per call suits a worker that decodes on one thread."""
    global _ONE_THREAD
    if _ONE_THREAD is None:
        import av
        from av.video.reformatter import VideoReformatter

        try:
            VideoReformatter().reformat(av.VideoFrame(16, 16, "yuv420p"), format="rgb24", threads=1)
            _ONE_THREAD = {"threads": 1}
        except TypeError:
            _ONE_THREAD = {}
    return _ONE_THREAD
