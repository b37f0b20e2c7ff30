"""YUV 4:2:0 frames to RGB, with the arithmetic of FFmpeg's own converter, on any device.

A decoder delivers frames as I420 planes (``frame_format="yuv420"``): uint8 ``[..., H * 3 // 2, W]`` holding the
luma plane (``H x W``), then the U plane and the V plane (each ``H / 2 x W / 2``, row-major, back to back): the
layout of PyAV's ``frame.to_ndarray()`` for ``yuv420p``. Half the bytes of RGB cross shared memory and the
host-to-device copy, and the colour conversion leaves the decoding workers for the accelerator::

    rgb = yuv420_to_rgb(batch.data["observation.images.cam_high"].to("cuda"))   # uint8 [n, H, W, 3]

:func:`yuv420_to_rgb_torch` reproduces libswscale's unscaled ``yuv420p -> rgb24`` converter of x86 builds (SSSE3,
``libswscale/x86/yuv_2_rgb.asm``): each chroma sample serves its 2x2 block of pixels;
``y = ((8 Y - 8 * 16) * cy) >> 16``, ``r = y + ((8 (V - 128) * crv) >> 16)``, ``b = y + ((8 (U - 128) * cbu) >> 16)``,
``g = y + ((8 (U - 128) * cgu) >> 16) + ((8 (V - 128) * cgv) >> 16)`` (each ``>> 16`` the high half of a 16-bit
multiply, so a floor), clamped to 0..255, with the 16-bit coefficients swscale derives from its colour table
(:func:`swscale_coefficients`). On an x86 CPU with SSSE3 it gives PyAV's ``rgb24`` of the same planes bit for bit,
for every matrix and range. swscale's C fallback (no SSSE3, or FFmpeg built without x86 assembly) uses lookup
tables and differs from that by up to 3 levels, as it does from the exact BT.601 formula; other architectures
have their own assembly. :func:`yuv420_to_rgb_swscale` runs swscale itself, for the CPU.

Frames scaled to a ``size`` inside the decoder are the exception no conversion can remove: swscale scales straight
to RGB with its own chroma filtering and luma kept above 8 bits, while a 4:2:0 frame at that size carries a
quarter of the chroma samples and 8-bit luma. Converting it gives PyAV's ``rgb24`` of those planes exactly, and
differs from the directly scaled RGB by a level or two on smooth content and more at sharp colour edges.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

__all__ = ["FRAME_FORMATS", "MATRICES", "frame_step_shape", "nv12_to_rgb_torch", "swscale_coefficients",
           "yuv420_planes", "yuv420_to_rgb", "yuv420_to_rgb_swscale", "yuv420_to_rgb_torch"]

FRAME_FORMATS = ("rgb24", "yuv420")
"""How decoded frames are delivered: ``"rgb24"`` uint8 ``[H, W, 3]``, ``"yuv420"`` I420 planes ``[H * 3 // 2, W]``."""

MATRICES = {
    # libswscale's ff_yuv2rgb_coeffs: (crv, cbu, cgu, cgv) * 65536 of the limited-range inverse matrix
    "bt601": (104597, 132201, 25675, 53279),
    "bt709": (117489, 138438, 13975, 34925),
    "fcc": (104448, 132798, 24759, 53109),
    "smpte240m": (117579, 136230, 16907, 35559),
    "bt2020": (110013, 140363, 12277, 42626),
}
"""Colour matrices by name, as swscale's table holds them (BT.601 is what swscale assumes for untagged video)."""


def frame_step_shape(height: int, width: int, frame_format: str = "rgb24") -> tuple[int, ...]:
    """The array shape of one decoded ``height x width`` frame in ``frame_format``."""
    if frame_format == "rgb24":
        return (int(height), int(width), 3)
    if frame_format == "yuv420":
        if height % 2 or width % 2:
            raise ValueError(f"yuv420 frames need an even height and width, got {height}x{width}")
        return (int(height) * 3 // 2, int(width))
    raise ValueError(f"frame_format must be one of {list(FRAME_FORMATS)}, got {frame_format!r}")


def _round16(value: int) -> int:
    """swscale's roundToInt16: ``(value + 2**15) >> 16`` (a floor), clipped to int16."""
    return max(-0x7FFF, min(0x7FFF, (value + (1 << 15)) >> 16))


def _trunc_div(a: int, b: int) -> int:
    """C integer division (towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


@lru_cache(maxsize=None)
def swscale_coefficients(matrix: str = "bt601", full_range: bool = False) -> tuple[int, int, int, int, int, int]:
    """``(y_offset, cy, crv, cbu, cgu, cgv)``: the 16-bit constants swscale's x86 yuv->rgb converter multiplies
    by (``ff_yuv2rgb_c_init_tables`` with neutral brightness, contrast and saturation)."""
    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {sorted(MATRICES)}, got {matrix!r}")
    crv, cbu, cgu, cgv = MATRICES[matrix]
    cgu, cgv = -cgu, -cgv
    cy, oy = 1 << 16, 0
    if not full_range:
        cy, oy = (cy * 255) // 219, 16 << 16
    else:
        crv, cbu, cgu, cgv = (_trunc_div(c * 224, 255) for c in (crv, cbu, cgu, cgv))
    return (_round16(oy * 8), _round16(cy * 8192), _round16(crv * 8192), _round16(cbu * 8192),
            _round16(cgu * 8192), _round16(cgv * 8192))


def yuv420_planes(frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views (copies where the input is not contiguous) of the Y ``[..., H, W]``, U and V ``[..., H/2, W/2]``
    planes of I420 frames ``[..., H * 3 // 2, W]``."""
    if frames.dim() < 2:
        raise ValueError(f"yuv420 frames are [..., H * 3 // 2, W], got shape {tuple(frames.shape)}")
    rows, w = int(frames.shape[-2]), int(frames.shape[-1])
    if rows % 3 or (rows * 2 // 3) % 2 or w % 2 or rows == 0:
        raise ValueError(f"yuv420 frames are [..., H * 3 // 2, W] with H and W even, got shape "
                         f"{tuple(frames.shape)}")
    h = rows * 2 // 3
    lead = tuple(frames.shape[:-2])
    # The chroma planes are split by area, not by rows: when H / 2 is odd, U ends half-way through a row.
    flat = frames.reshape(*lead, rows * w)
    quarter = h * w // 4
    y = flat[..., : h * w].reshape(*lead, h, w)
    u = flat[..., h * w : h * w + quarter].reshape(*lead, h // 2, w // 2)
    v = flat[..., h * w + quarter :].reshape(*lead, h // 2, w // 2)
    return y, u, v


def yuv420_to_rgb(planes, *, matrix: str = "bt601", full_range: bool = False, backend: str = "auto"):
    """RGB frames uint8 ``[..., H, W, 3]`` from I420 frames uint8 ``[..., H * 3 // 2, W]``.

    ``planes``: a torch tensor (the result is a tensor on the same device) or a numpy array (the result is numpy).
    ``matrix``: a key of :data:`MATRICES` (``"bt601"``: what swscale, and so mmfeed's RGB path, uses for untagged
    video); ``full_range``: whether luma spans 0..255 (JPEG range) rather than 16..235.
    ``backend``: ``"torch"`` (:func:`yuv420_to_rgb_torch`: a few vectorised integer ops on the tensor's device, the
    same numbers on every device), ``"swscale"`` (:func:`yuv420_to_rgb_swscale`: FFmpeg's converter frame by frame
    on the CPU, far faster there than torch ops) or ``"auto"``: swscale for numpy arrays and CPU tensors, torch
    elsewhere (an accelerator). On x86 both give the same bits.
    """
    if backend not in ("auto", "torch", "swscale"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'swscale', got {backend!r}")
    is_tensor = isinstance(planes, torch.Tensor)
    if not is_tensor and not isinstance(planes, np.ndarray):
        raise TypeError(f"yuv420_to_rgb takes a torch tensor or numpy array, got {type(planes).__name__}")
    on_cpu = not is_tensor or planes.device.type == "cpu"
    if backend == "swscale" or (backend == "auto" and on_cpu):
        if is_tensor and not on_cpu:
            raise ValueError(f"backend='swscale' converts on the CPU; got a tensor on {planes.device}")
        array = planes.numpy() if is_tensor else planes
        rgb = yuv420_to_rgb_swscale(array, matrix=matrix, full_range=full_range)
        return torch.from_numpy(rgb) if is_tensor else rgb
    if not is_tensor:
        return yuv420_to_rgb_torch(torch.from_numpy(np.ascontiguousarray(planes)), matrix=matrix,
                                   full_range=full_range).numpy()
    return yuv420_to_rgb_torch(planes, matrix=matrix, full_range=full_range)


def yuv420_to_rgb_torch(planes: torch.Tensor, *, matrix: str = "bt601", full_range: bool = False) -> torch.Tensor:
    """:func:`yuv420_to_rgb` in torch ops on the tensor's device: swscale's x86 arithmetic (module docstring),
    no loop over frames."""
    if planes.dtype != torch.uint8:
        raise TypeError(f"yuv420 frames must be uint8, got {planes.dtype}")
    return _planes_to_rgb(*yuv420_planes(planes), matrix=matrix, full_range=full_range)


def nv12_to_rgb_torch(frames: torch.Tensor, *, matrix: str = "bt601", full_range: bool = False) -> torch.Tensor:
    """RGB frames uint8 ``[..., H, W, 3]`` from NV12 frames uint8 ``[..., H * 3 // 2, W]`` (the luma plane, then
    one plane of interleaved U, V pairs ``[H / 2, W / 2, 2]``: what NVDEC decodes to), with the same arithmetic as
    :func:`yuv420_to_rgb_torch`: the same pixels as swscale's rgb24 of the same samples."""
    if frames.dtype != torch.uint8:
        raise TypeError(f"nv12 frames must be uint8, got {frames.dtype}")
    rows, w = int(frames.shape[-2]), int(frames.shape[-1])
    if frames.dim() < 2 or rows % 3 or (rows * 2 // 3) % 2 or w % 2 or rows == 0:
        raise ValueError(f"nv12 frames are [..., H * 3 // 2, W] with H and W even, got shape {tuple(frames.shape)}")
    h = rows * 2 // 3
    uv = frames[..., h:, :].reshape(*frames.shape[:-2], h // 2, w // 2, 2)
    return _planes_to_rgb(frames[..., :h, :], uv[..., 0], uv[..., 1], matrix=matrix, full_range=full_range)


def _planes_to_rgb(y: torch.Tensor, u: torch.Tensor, v: torch.Tensor, *, matrix: str,
                   full_range: bool) -> torch.Tensor:
    """RGB ``[..., H, W, 3]`` from a luma plane ``[..., H, W]`` and chroma planes ``[..., H/2, W/2]``."""
    y_offset, cy, crv, cbu, cgu, cgv = swscale_coefficients(matrix, bool(full_range))
    *lead, h, w = y.shape
    # int32 throughout: every product fits (8 * 255 * 2**15 < 2**31) and >> is an arithmetic (floor) shift, as
    # the high half of the 16-bit multiply is. The chroma terms are computed once per 2x2 block and broadcast
    # over it: luma is viewed as [..., H/2, 2, W/2, 2], so no upsampled copy is made.
    luma = ((y.to(torch.int32) * (8 * cy) - y_offset * cy) >> 16).reshape(*lead, h // 2, 2, w // 2, 2)
    u8 = u.to(torch.int32) * 8 - 1024
    v8 = v.to(torch.int32) * 8 - 1024
    red = ((v8 * crv) >> 16)[..., :, None, :, None]
    green = (((u8 * cgu) >> 16) + ((v8 * cgv) >> 16))[..., :, None, :, None]
    blue = ((u8 * cbu) >> 16)[..., :, None, :, None]
    rgb = torch.stack([luma + red, luma + green, luma + blue], dim=-1).clamp_(0, 255).to(torch.uint8)
    return rgb.reshape(*lead, h, w, 3)


_SWS_COLORSPACE = {"bt601": "ITU601", "bt709": "ITU709", "fcc": "FCC", "smpte240m": "SMPTE240M", "bt2020": "BT2020"}


def yuv420_to_rgb_swscale(planes: np.ndarray, *, matrix: str = "bt601", full_range: bool = False) -> np.ndarray:
    """:func:`yuv420_to_rgb` on the CPU by FFmpeg's own converter (through PyAV, one frame at a time, one
    thread): the numbers of the RGB decode path, whatever the CPU."""
    import av
    from av.video.reformatter import VideoReformatter

    if matrix not in MATRICES:
        raise ValueError(f"matrix must be one of {sorted(MATRICES)}, got {matrix!r}")
    planes = np.asarray(planes)
    if planes.dtype != np.uint8:
        raise TypeError(f"yuv420 frames must be uint8, got {planes.dtype}")
    if planes.ndim < 2:
        raise ValueError(f"yuv420 frames are [..., H * 3 // 2, W], got shape {planes.shape}")
    rows, w = planes.shape[-2:]
    h = rows * 2 // 3
    frame_step_shape(h, w, "yuv420")
    if rows % 3:
        raise ValueError(f"yuv420 frames are [..., H * 3 // 2, W] with H and W even, got shape {planes.shape}")
    from mmfeed.codecs._sws import one_thread

    flat = planes.reshape(-1, rows * w)
    out = np.empty((len(flat), h, w, 3), dtype=np.uint8)
    reformatter = VideoReformatter()
    space, color_range = _SWS_COLORSPACE[matrix], "JPEG" if full_range else "MPEG"
    # One frame whose planes are refilled for every input (a fresh from_ndarray frame costs 85 us at 96x128, the
    # refill and the conversion 14 us).
    frame = av.VideoFrame(w, h, "yuv420p")
    shapes, starts = [(h, w), (h // 2, w // 2), (h // 2, w // 2)], [0, h * w, h * w * 5 // 4, h * w * 3 // 2]
    views = [np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:ph, :pw] for p, (ph, pw) in zip(frame.planes, shapes)]
    for k in range(len(flat)):
        for view, a, b in zip(views, starts, starts[1:]):
            view[...] = flat[k, a:b].reshape(view.shape)
        out[k] = reformatter.reformat(frame, format="rgb24", src_colorspace=space, src_color_range=color_range,
                                      **one_thread()).to_ndarray()
    return out.reshape(*planes.shape[:-2], h, w, 3)
