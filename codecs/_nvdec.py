"""NVDEC through PyAV: ``backend="pyav", device="cuda"`` decodes on the GPU with the FFmpeg PyAV's wheel bundles.

PyAV's wheel (18 and later) ships an FFmpeg built with NVDEC, and ``av.open(..., hwaccel=HWAccel("cuda",
is_hw_owned=True))`` leaves each decoded frame on the GPU as NV12 (a luma plane and one plane of interleaved U, V
pairs), exported through DLPack without a copy to the host. So a plain ``pip install av`` beside a CUDA build of
torch is all GPU decode needs: no CUDA build of torchcodec, no FFmpeg of the system's.

Each batch of a file's frames is copied plane by plane into one NV12 tensor ``[N, H * 3 // 2, W]`` on the device,
then converted to RGB in one pass by :func:`mmfeed.codecs.colour.nv12_to_rgb_torch`, which does swscale's x86
arithmetic: since H.264, HEVC and AV1 decoders are bit-exact, the frames equal the CPU path's rgb24 frames
(``tests/test_gpu_decode.py`` checks it on a GPU). A ``size`` is applied after the conversion, on the device, as
the torchcodec path does (:func:`mmfeed.codecs._torchcodec.resize_on_device`).

FFmpeg's CUDA device is opened on torch's context of the device (:func:`open_on_device`), and FFmpeg copies each
decoded surface out on the legacy default stream; the copies into the batch's tensor run on torch's default stream
of the device (that same stream), and the caller's current stream then waits for them. Where NVDEC cannot decode
a stream (a codec or profile this GPU lacks), FFmpeg decodes it on the CPU instead; those frames are converted to
NV12 on the CPU and uploaded, so the pixels are the same, and the reader logs a warning once per file.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Any, Callable

__all__ = ["open_on_device", "pyav_cuda_error", "upload_nv12"]

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def pyav_cuda_error(device: str) -> str | None:
    """None when PyAV can decode onto ``device`` (``"cuda"`` or ``"cuda:N"``) in this process, else everything that
    is missing, each with its fix."""
    import av

    from mmfeed.codecs._torchcodec import device_error, torch_cuda_missing

    missing = torch_cuda_missing()
    try:
        from av.codec.hwaccel import hwdevices_available

        devices = hwdevices_available()
    except ImportError:
        devices = None
    if devices is None:
        missing.append(f"PyAV {av.__version__} has no hardware decoding (av.codec.hwaccel): install av>=14")
    elif "cuda" not in devices:
        missing.append(f"PyAV {av.__version__}'s FFmpeg is built without CUDA (its devices: {devices}): install "
                       "PyPI's av wheel, which bundles an FFmpeg with NVDEC")
    return device_error(device, missing)


def open_on_device(device: str, open_: Callable[[Any], Any]) -> Any:
    """``open_(hwaccel)`` with the ``av.open(hwaccel=...)`` setting that decodes on ``device`` and leaves the frames
    there, in torch's CUDA context of that device (its primary context), a software decoder where NVDEC cannot
    decode the stream.

    FFmpeg takes the primary context only with blocking synchronisation as its scheduling flag, and refuses one
    already made with other flags (``Operation not supported``), as torch makes it: the flag is set on it first
    (the driver changes an active primary context's flags since CUDA 11). Its one effect on torch is that a
    synchronising thread sleeps until the GPU is done instead of spinning."""
    import torch
    from av.codec.hwaccel import HWAccel

    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    cu, handle = _driver_device(index)
    flags, active = ctypes.c_uint(), ctypes.c_int()
    _check(cu.cuDevicePrimaryCtxGetState(handle, ctypes.byref(flags), ctypes.byref(active)),
           "cuDevicePrimaryCtxGetState")
    if flags.value != _SCHED_BLOCKING_SYNC:
        _check(cu.cuDevicePrimaryCtxSetFlags_v2(handle, _SCHED_BLOCKING_SYNC), "cuDevicePrimaryCtxSetFlags")
    return open_(HWAccel("cuda", device=str(index), allow_software_fallback=True, is_hw_owned=True,
                         options={"primary_ctx": "1"}))


_SCHED_BLOCKING_SYNC = 0x04
"""CU_CTX_SCHED_BLOCKING_SYNC: the only flag FFmpeg accepts on a primary context."""


@functools.lru_cache(maxsize=None)
def _driver_device(index: int) -> tuple[Any, Any]:
    """The CUDA driver library and its handle of device ``index``."""
    cu = ctypes.CDLL("libcuda.so.1")
    _check(cu.cuInit(0), "cuInit")
    handle = ctypes.c_int()
    _check(cu.cuDeviceGet(ctypes.byref(handle), index), "cuDeviceGet")
    return cu, handle


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"the CUDA driver's {call} failed with CUresult {result}")


def upload_nv12(frame: Any, out: Any) -> bool:
    """Copy one decoded frame into ``out``, its NV12 slot ``[H * 3 // 2, W]`` on the device; True when the frame
    was decoded by NVDEC (a device frame, copied device to device), False when FFmpeg decoded it on the CPU (then
    converted to NV12 there and uploaded). Runs on the current stream: see the module docstring."""
    import torch
    from torch.utils.dlpack import from_dlpack

    h, w = frame.height, frame.width
    if frame.format.name == "cuda":
        # PyAV exports a device plane only without a stream to synchronise with (its __dlpack__ refuses one, which
        # torch.from_dlpack always passes): take the capsule here
        luma = from_dlpack(frame.planes[0].__dlpack__())
        chroma = from_dlpack(frame.planes[1].__dlpack__())
        out[:h].copy_(luma)
        out[h:].view(h // 2, w // 2, 2).copy_(chroma)
        return True
    planes = frame.reformat(format="nv12").to_ndarray()
    out.copy_(torch.from_numpy(planes))
    return False
