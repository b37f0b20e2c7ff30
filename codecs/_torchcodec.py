"""torchcodec backend (optional): ``torchcodec.decoders.VideoDecoder`` in exact seek mode, ``get_frames_at``.

torchcodec is never imported by mmfeed unless ``backend="torchcodec"`` is asked for; ``"auto"`` never picks it
(it is an optional package whose native libraries need FFmpeg at load time, so it cannot be assumed to load).

Loading it. torchcodec 0.13 (the build for torch 2.13) links against FFmpeg's shared libraries under their
standard sonames (``libavcodec.so.62``... for FFmpeg 8). PyAV's wheel bundles FFmpeg 8 in ``site-packages/av.libs``
under mangled names (``libavcodec-5e6b81c2.so.62.28.102``), so a folder of symlinks with the standard names is
enough; the folder also links PyAV's other bundled libraries under their own names, which the FFmpeg libraries
find through their ``$ORIGIN`` rpath (resolved against the link's folder). The dynamic loader reads
``LD_LIBRARY_PATH`` only when a process starts, so set it before python runs::

    pip install torchcodec==0.13.0
    python -m mmfeed.codecs._torchcodec link ~/.cache/mmfeed/ffmpeg   # prints the export line below
    export LD_LIBRARY_PATH=~/.cache/mmfeed/ffmpeg${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

The loader recognises a symlinked file that is already loaded (same inode), so a process that imports both PyAV
and torchcodec holds one copy of FFmpeg. :func:`torchcodec_error` says why torchcodec does not load, if it does not.

Frames: at the native size they are bit-identical to PyAV's rgb24 frames (both convert with swscale from the same
decoder output). A ``size`` is applied inside torchcodec (``torchcodec.transforms.Resize``: bilinear with
antialiasing, after the RGB conversion), so resized frames are close to but not identical with PyAV's, which
scales while converting from YUV (measured on mmfeed's test patterns, H.264 and AV1, 48x64 and 240x320 scaled
down and up: at most 20 levels apart, 2-5 on average; the burned-in frame index still reads back).

GPU decode (``device="cuda"`` or ``"cuda:N"``). torchcodec's ``VideoDecoder(device=...)`` decodes with NVDEC and
converts YUV to RGB on the GPU; the frames stay there, as torch uint8 tensors ``[N, H, W, 3]`` (the CPU path's
layout). H.264 and HEVC decode on every NVDEC generation, AV1 from Ampere on; where the hardware cannot decode a
stream torchcodec falls back to decoding on the CPU (the frames still arrive on the device) and the reader logs a
warning once per file. It needs a CUDA build of torch and a CUDA build of torchcodec (PyPI's torchcodec is the CPU
build, ``+cpu``; the CUDA builds come from PyTorch's index), plus the FFmpeg link above::

    pip install torchcodec==0.13.0 --index-url https://download.pytorch.org/whl/cu128   # beside a CUDA torch 2.13

:func:`cuda_decode_error` says which of these is missing. The colour conversion is NVDEC's/NPP's, not swscale's,
so GPU frames are close to the CPU path's, not bit-identical (see ``tests/test_gpu_decode.py`` for the bound).
A ``size`` is applied on the GPU after the decode (:func:`resize_on_device`: bilinear with antialiasing, as
torchcodec's Resize): torchcodec 0.13's NVDEC path takes no decoder transforms.
The CUDA context belongs to the process that made it: a DataLoader worker process cannot decode onto the GPU
(a forked one cannot initialise CUDA at all; a spawned one would have to hand device tensors to the training
process, which mmfeed's workers do through host shared memory). Decode in the training process: ``num_workers=0``,
or ``worker_mode="thread"`` (decoding threads of the training process, one decoder per thread); a reader opened
inside a worker process raises a DecodeError saying so (:func:`device_refusal`). Past the decode, device frames
stay device tensors: the windows view hands them on as they are, torch's default collate stacks them on the GPU,
and ``DataLoader(device=..., prefetch=...)`` leaves tensors already on the device where they are (its pinning
skips them, the copy is a no-op) while it copies the rest of the batch; ``pin_memory=True`` fails on them (torch
pins CPU tensors only), so leave it off. Host-memory paths refuse them: the packed loader's shared payloads and
``cache=`` (ValueError when the dataset or plan is made), and a host array given as a request's output.

Frame identity: torchcodec's exact mode scans the file and numbers frames in presentation order, as
:func:`mmfeed.codecs.demux.probe` does; the reader checks that both count the same frames, and that every
decoded frame's presentation time is the one the demux index gives its index.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Callable

import numpy as np

from mmfeed.codecs._decord import each_in_chunks
from mmfeed.codecs.demux import VideoInfo, VideoSource
from mmfeed.codecs.errors import DecodeError

if TYPE_CHECKING:
    import torch

__all__ = ["TorchCodecReader", "check_device", "cuda_decode_error", "device_error", "device_refusal",
           "link_pyav_ffmpeg", "resize_on_device", "torch_cuda_missing", "torchcodec_available", "torchcodec_error",
           "torchcodec_has_cuda"]

log = logging.getLogger(__name__)

FFMPEG_LIBRARIES = ("avutil", "avcodec", "avformat", "avdevice", "avfilter", "swscale", "swresample")
"""The FFmpeg libraries torchcodec links against (``ldd libtorchcodec_core8.so``)."""

_MANGLED = re.compile(r"^lib(?P<name>[A-Za-z0-9_]+)-[0-9a-f]{8}\.so\.(?P<major>\d+)(\.\d+)*$")


@functools.lru_cache(maxsize=1)
def torchcodec_error() -> str | None:
    """None when ``torchcodec.decoders`` imports, else why not (not installed, or its native libraries do not
    load, with the loader's own message for FFmpeg 8 and the recipe of this module's docstring)."""
    if importlib.util.find_spec("torchcodec") is None:
        return "torchcodec is not installed (pip install torchcodec==0.13.0 for torch 2.13)"
    try:
        import torchcodec.decoders  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        text = str(exc)
        found = re.search(r"FFmpeg version 8:.*?(OSError: [^\n]*)", text, re.S)
        detail = found.group(1) if found else text.strip().splitlines()[-1] if text.strip() else repr(exc)
        return (f"torchcodec is installed but does not load ({type(exc).__name__}; FFmpeg 8: {detail}); link "
                "PyAV's FFmpeg with 'python -m mmfeed.codecs._torchcodec link DIR' and start python with DIR on "
                "LD_LIBRARY_PATH")
    return None


def torchcodec_available() -> bool:
    """Whether ``backend="torchcodec"`` can open videos in this process."""
    return torchcodec_error() is None


_DEVICE = re.compile(r"^cuda(:(?P<index>\d+))?$")

CUDA_TORCHCODEC = "pip install torchcodec==0.13.0 --index-url https://download.pytorch.org/whl/cu128"
"""The install line for a CUDA build of torchcodec 0.13 (for a CUDA build of torch 2.13)."""


def check_device(device: object) -> str:
    """``device`` as the string torchcodec takes (``"cuda"`` or ``"cuda:N"``; a ``torch.device`` of type cuda
    too); ValueError for anything else, CPU included (CPU frames are the default: leave ``device`` unset)."""
    text = str(device) if type(device).__name__ == "device" else device
    if not isinstance(text, str) or _DEVICE.match(text) is None:
        raise ValueError(f"device must be 'cuda' or 'cuda:N' (frames decoded by NVDEC, left on that GPU), got "
                         f"{device!r}; leave device unset for CPU frames")
    return text


def torchcodec_has_cuda() -> bool:
    """Whether the installed torchcodec is a CUDA build, read without loading it: the local label of the version
    its install wrote (``torchcodec/version.py``: ``0.13.0+cpu`` from PyPI, ``+cu128`` from PyTorch's CUDA index),
    else whether its core library holds the CUDA device interface (compiled in only with CUDA)."""
    spec = importlib.util.find_spec("torchcodec")
    if spec is None or not spec.origin:
        return False
    folder = os.path.dirname(spec.origin)
    try:
        with open(os.path.join(folder, "version.py")) as f:
            found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read())
    except OSError:
        found = None
    local = found.group(1).partition("+")[2] if found else ""
    if local:
        return local.startswith("cu")
    for name in sorted(os.listdir(folder)):
        if name.startswith("libtorchcodec_core") and name.endswith(".so"):
            with open(os.path.join(folder, name), "rb") as f:
                if b"CudaDeviceInterface" in f.read():
                    return True
    return False


def _torchcodec_version() -> str:
    """The installed torchcodec's version as its metadata gives it."""
    try:
        return importlib.metadata.version("torchcodec")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


@functools.lru_cache(maxsize=None)
def cuda_decode_error(device: str = "cuda") -> str | None:
    """None when torchcodec can decode onto ``device`` in this process, else everything that is missing, each with
    its fix: a CUDA device visible to torch, torchcodec installed and loading, torchcodec built with CUDA, the
    device index in range."""
    missing = torch_cuda_missing()
    if importlib.util.find_spec("torchcodec") is None:
        missing.append(f"torchcodec is not installed: {CUDA_TORCHCODEC}")
    else:
        if not torchcodec_has_cuda():
            missing.append(f"torchcodec {_torchcodec_version()} is built without CUDA (PyPI's "
                           f"wheel is the CPU build): {CUDA_TORCHCODEC}")
        reason = torchcodec_error()
        if reason is not None:
            missing.append(reason)
    return device_error(device, missing)


def torch_cuda_missing() -> list[str]:
    """``[]`` when torch sees a CUDA device, else the one line saying it does not and what GPU decode needs."""
    import torch

    if torch.cuda.is_available():
        return []
    build = "a CPU build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
    return [f"CUDA is not available to torch ({build}, {torch.cuda.device_count()} devices visible): GPU decode "
            "needs a CUDA build of torch on a machine with an NVIDIA GPU"]


def device_error(device: str, missing: list[str]) -> str | None:
    """None when nothing is ``missing`` to decode onto ``device`` and its index is in range, else one message
    of everything missing, ending with the way out."""
    if not missing:
        import torch

        index = _DEVICE.match(device).group("index")
        if index is not None and int(index) >= torch.cuda.device_count():
            missing = [f"{device} does not exist: torch sees {torch.cuda.device_count()} CUDA devices"]
    if not missing:
        return None
    return "; ".join(missing) + "; leave device unset to decode on the CPU"


def device_refusal() -> str | None:
    """Why this process cannot decode onto a GPU although the machine can (None when it can): a DataLoader worker
    process (torch's worker info is set), or a process forked after CUDA was initialised."""
    import torch
    import torch.utils.data

    if torch.utils.data.get_worker_info() is not None:
        where = "a DataLoader worker process"
    elif torch.cuda._is_in_bad_fork():
        where = "a process forked after CUDA was initialised"
    else:
        return None
    return (f"device= decodes onto the GPU in the process that owns the CUDA context, not in {where}; use "
            "num_workers=0 or worker_mode='thread' (decoding threads of the training process)")


def link_pyav_ffmpeg(folder: str | os.PathLike) -> dict[str, str]:
    """Fill ``folder`` with symlinks to the libraries PyAV's wheel bundles (``site-packages/av.libs``): each under
    its own file name, and each FFmpeg library also under its standard soname (``libavcodec.so.62``). Returns
    ``{standard soname: target}``; raises FileNotFoundError when PyAV has no bundled ``av.libs``."""
    spec = importlib.util.find_spec("av")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("PyAV is not installed")
    libs = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "av.libs")
    if not os.path.isdir(libs):
        raise FileNotFoundError(f"PyAV bundles no shared libraries here ({libs} does not exist)")
    os.makedirs(folder, exist_ok=True)
    standard: dict[str, str] = {}
    for name in sorted(os.listdir(libs)):
        target = os.path.join(libs, name)
        _symlink(target, os.path.join(folder, name))
        found = _MANGLED.match(name)
        if found and found.group("name") in FFMPEG_LIBRARIES:
            soname = f"lib{found.group('name')}.so.{found.group('major')}"
            _symlink(target, os.path.join(folder, soname))
            standard[soname] = target
    missing = sorted(set(FFMPEG_LIBRARIES) - {s[3:].split(".so")[0] for s in standard})
    if missing:
        log.warning("%s holds no %s; torchcodec will not load from %s", libs, ", ".join(missing), folder)
    return standard


def _symlink(target: str, link: str) -> None:
    if os.path.islink(link) or os.path.exists(link):
        if os.path.realpath(link) == os.path.realpath(target):
            return
        os.remove(link)
    os.symlink(target, link)


def resize_on_device(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` torch frames resized to ``size`` where they are (bilinear with antialiasing, as
    torchcodec's Resize on the CPU), rounded back to uint8 ``[N, h, w, 3]``, contiguous."""
    import torch
    import torch.nn.functional as F

    if len(frames) == 0:
        return frames.new_zeros((0, *size, 3))
    planar = frames.permute(0, 3, 1, 2).float()
    scaled = F.interpolate(planar, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
    return scaled.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


class TorchCodecReader:
    """Random access into one video with torchcodec; ``decode`` hands sorted indices to ``get_frames_at``."""

    name = "torchcodec"

    def __init__(
        self, source: VideoSource, info: VideoInfo, *, threads: int = 1, size: tuple[int, int] | None = None,
        device: str | None = None,
    ) -> None:
        self.info = info
        self._size = tuple(size) if size is not None else None
        self.device = None if device is None else check_device(device)
        reason = torchcodec_error() if device is None else cuda_decode_error(self.device) or device_refusal()
        if reason is not None:
            fix = "; use backend='pyav'" if device is None else ""
            what = "backend 'torchcodec'" if device is None else f"device={self.device!r}"
            raise DecodeError(f"{info.path}: {what} is unavailable: {reason}{fix}", path=info.path)
        from torchcodec.decoders import VideoDecoder

        if isinstance(source, (bytearray, memoryview)):
            target = bytes(source)
        elif isinstance(source, bytes):
            target = source
        else:
            target = os.fspath(source)
        transforms = None
        # torchcodec 0.13 applies decoder transforms on the CPU path only (its NVDEC interface has none yet): device
        # frames are resized here, on the GPU, after the decode (see resize_on_device)
        self._resize_after = self.device is not None and self._size is not None \
            and self._size != (info.height, info.width)
        if self._size is not None and self._size != (info.height, info.width) and not self._resize_after:
            from torchcodec.transforms import Resize

            transforms = [Resize(self._size)]
        try:
            self._decoder = VideoDecoder(target, stream_index=info.stream_index, dimension_order="NHWC",
                                         num_ffmpeg_threads=int(threads), seek_mode="exact", transforms=transforms,
                                         **({} if self.device is None else {"device": self.device}))
        except (RuntimeError, ValueError) as exc:
            raise DecodeError(f"{info.path}: torchcodec cannot open the file: {exc}", path=info.path) from exc
        n = len(self._decoder)
        if n != info.num_frames:
            self._decoder = None
            raise DecodeError(
                f"{info.path}: torchcodec counts {n} frames but the file's packets hold {info.num_frames}; use "
                "backend='pyav'",
                path=info.path, num_frames=info.num_frames, duration=info.duration,
            )
        # Half the smallest gap between frames: a decoded frame's time must lie this close to its index's time.
        gaps = np.diff(info.timestamps)
        self._time_tolerance = float(gaps.min()) / 2 if len(gaps) and gaps.min() > 0 else 1e-3
        self._fallback_checked = self.device is None

    @property
    def out_shape(self) -> tuple[int, int]:
        """(height, width) of the frames this reader returns."""
        return self._size if self._size is not None else (self.info.height, self.info.width)

    def decode(self, indices: np.ndarray) -> np.ndarray:
        """Frames at the sorted, unique, in-range ``indices`` as uint8 ``[N, H, W, 3]``: a numpy array, or with a
        ``device`` a torch tensor on that GPU."""
        h, w = self.out_shape
        if len(indices) == 0:
            if self.device is not None:
                import torch

                return torch.zeros((0, h, w, 3), dtype=torch.uint8, device=self.device)
            return np.zeros((0, h, w, 3), dtype=np.uint8)
        wanted = [int(i) for i in indices]
        try:
            batch = self._decoder.get_frames_at(wanted)
        except (RuntimeError, IndexError, ValueError) as exc:
            raise self._failure(wanted, exc) from exc
        times = batch.pts_seconds.cpu().numpy()
        off = np.abs(times - self.info.timestamps[indices]) > self._time_tolerance
        if off.any():
            k = int(np.flatnonzero(off)[0])
            raise DecodeError(
                f"{self.info.path}: torchcodec returned the frame at {times[k]:.6f} s for frame {wanted[k]}, which "
                f"the demux index places at {self.info.timestamps[wanted[k]]:.6f} s; use backend='pyav'",
                path=self.info.path, index=wanted[k], num_frames=self.info.num_frames, duration=self.info.duration,
            )
        decoded = (self.info.height, self.info.width) if self._resize_after else (h, w)
        if tuple(batch.data.shape[1:]) != (*decoded, 3):
            raise DecodeError(f"{self.info.path}: torchcodec returned frames of shape {tuple(batch.data.shape[1:])}, "
                              f"expected {(*decoded, 3)}", path=self.info.path, index=wanted[0])
        if self.device is not None:
            self._warn_on_fallback()
            return resize_on_device(batch.data, (h, w)) if self._resize_after else batch.data.contiguous()
        return np.ascontiguousarray(batch.data.numpy(), dtype=np.uint8)

    def _warn_on_fallback(self) -> None:
        """Log once per file when torchcodec decoded it on the CPU instead of NVDEC (a codec or profile the GPU
        cannot decode, or no NVCUVID library): the frames are right, but the decode cost stays on the CPU."""
        if self._fallback_checked:
            return
        self._fallback_checked = True
        status = getattr(self._decoder, "cpu_fallback", None)
        if status is not None and bool(status):
            log.warning("%s: torchcodec decodes this %s video on the CPU, not with NVDEC (%s); frames are still "
                        "delivered on %s", self.info.path, self.info.codec, status, self.device)

    def decode_each(self, indices: np.ndarray, sink: Callable[[int, np.ndarray], None],
                    into: Callable[[int], np.ndarray | None] | None = None, chunk: int = 32) -> None:
        """Call ``sink(k, frame)`` for each of the sorted, unique ``indices``, in order (``frame``: ``[H, W, 3]``
        uint8, valid only during the call); decoded ``chunk`` frames at a time to bound memory. ``into`` is not
        used: every frame goes through ``sink``."""
        each_in_chunks(self.decode, indices, sink, chunk)

    def close(self) -> None:
        """Drop the decoder (torchcodec closes the file when it is freed)."""
        self._decoder = None

    def _failure(self, wanted: list[int], exc: Exception) -> DecodeError:
        """The DecodeError for a failed ``get_frames_at(wanted)``, naming the first frame that fails on its own."""
        bad = wanted[0]
        if len(wanted) > 1:
            for i in wanted:
                try:
                    self._decoder.get_frames_at([i])
                except (RuntimeError, IndexError, ValueError) as one:
                    bad, exc = i, one
                    break
        return DecodeError(
            f"{self.info.path}: torchcodec failed decoding frame {bad}: {exc}; the video has {self.info.num_frames} "
            f"frames ({self.info.duration:.3f} s)",
            path=self.info.path, index=bad, num_frames=self.info.num_frames, duration=self.info.duration,
        )


def main(argv: list[str] | None = None) -> int:
    """``link DIR``: link PyAV's FFmpeg into DIR and print the LD_LIBRARY_PATH line; ``check``: say whether
    torchcodec loads in this process."""
    parser = argparse.ArgumentParser(prog="python -m mmfeed.codecs._torchcodec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    link = sub.add_parser("link", help="symlink PyAV's bundled FFmpeg under its standard sonames into DIR")
    link.add_argument("dir")
    sub.add_parser("check", help="exit 0 when torchcodec loads, else print why and exit 1")
    args = parser.parse_args(argv)
    if args.command == "link":
        folder = os.path.abspath(os.path.expanduser(args.dir))
        try:
            standard = link_pyav_ffmpeg(folder)
        except FileNotFoundError as exc:
            print(exc, file=sys.stderr)
            return 1
        for soname, target in standard.items():
            print(f"# {soname} -> {target}")
        print(f"export LD_LIBRARY_PATH={folder}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
        return 0
    reason = torchcodec_error()
    if reason is None:
        import torchcodec

        print(f"torchcodec {torchcodec.__version__} loads")
        return 0
    print(reason)
    return 1


if __name__ == "__main__":
    sys.exit(main())
