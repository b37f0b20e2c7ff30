"""One read-options object for every format: how a dataset's bytes become arrays.

:func:`mmfeed.loaders.open_dataset` builds one :class:`ReadOptions` from its keyword arguments, checks every
value once, and hands it to each dataset it opens; a format reads the fields it has (each source class lists
them in ``READ_OPTIONS``). An option set for a dataset whose format does not have it is refused with a message
naming the option, the formats that take it and the fix; in a mixture, an option applies to the datasets whose
format has it, and is refused only when none does::

    >>> ReadOptions(frame_size=(224, 224)).given()
    ['frame_size']
    >>> ReadOptions(frame_format="yuv420", backend="decord")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    ValueError: backend 'decord' cannot deliver frame_format='yuv420' (decord only gives RGB); use backend='pyav' or
    'auto'
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from mmfeed.codecs.demux import MAX_FRAME_PIXELS
from mmfeed.codecs.video import DecodeOptions
from mmfeed.loaders.sources.consistency import ERROR_CHOICES
from mmfeed.loaders.stores.frame_store import FrameStore

__all__ = ["FrameSize", "ReadOptions", "device_of"]

FrameSize = tuple[int, int] | Mapping[str, tuple[int, int]] | None


@dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How datasets are read; each field names the formats that have it.

    backend: the video backend of :mod:`mmfeed.codecs` ("auto" is PyAV; AV1, and video read from object storage,
        always decode with PyAV). Every format.
    frame_size: ``(height, width)`` for every camera, ``{feature: (height, width)}`` for some, or None: frames are
        resized inside the decoder and the features report that size. Every format.
    frame_format: ``"rgb24"`` (uint8 ``[H, W, 3]``) or ``"yuv420"`` (I420 planes ``[H * 3 // 2, W]``, half the
        bytes, converted on the device by :func:`mmfeed.codecs.colour.yuv420_to_rgb`; PyAV only). Every format.
    decoder_threads: FFmpeg threads per open video (default 1). More can pay only for long sequential reads
        (whole-episode chunks) with fewer decoding processes than cores; for windows each seek refills the
        threads' frame pipeline (2 threads measured 0.93x at 1 worker, 0.56x at 2 on 2 cores). Every format.
    tolerance_s: how far a decoded frame's timestamp may be from the one asked (LeRobot's default 1e-4 s).
        LeRobot v3 directories, whose videos are addressed by time.
    cache_episodes: how many episodes' member bytes a worker keeps (consecutive samples of one episode reuse
        them). Webdataset shards.
    check_index: refuse an index whose shards changed size or mtime since indexing. Webdataset shards.
    cache: a local directory keeping decoded frames (at the delivered size and format) for later reads, shared by
        every process that names it; see :mod:`mmfeed.loaders.stores.frame_store`. LeRobot v3 directories,
        webdataset shards and RLDS datasets (each camera of an episode decoded whole into it at its first read).
    cache_bytes: the most bytes of decoded frames ``cache`` holds (least recently used segments go first;
        default half the free space there). With ``cache``.
    device: ``"cuda"`` or ``"cuda:N"``: decode with NVDEC, through PyAV's bundled FFmpeg (``backend="pyav"`` or
        ``"auto"``: frames equal the CPU path's, :mod:`mmfeed.codecs._nvdec`) or torchcodec's CUDA build
        (``backend="torchcodec"``), and deliver video features as torch uint8 tensors on that GPU (same layout as
        CPU frames). Checked when the dataset is opened: without CUDA (or torchcodec's CUDA build, for that
        backend) the error says which and how to get it.
        Decode in the training process (``num_workers=0`` or ``worker_mode="thread"``; a worker process refuses),
        through ``read_many``/``episode``/``windows()``; the packed loader's host payloads and ``cache`` refuse
        device frames, and ``pin_memory`` must stay off. Every format.
    errors: what an episode whose metadata disagrees with the data does when the dataset opens
        (:mod:`~mmfeed.loaders.sources.consistency`: row ranges, lengths, rates, frame counts): ``"raise"`` (the
        default) refuses the dataset with an error naming the file, the episode and both values; ``"skip"``
        leaves the episode out, listed in the source's ``skipped`` and counted in a warning. Rows that disagree
        (found as a data file is read) fail their samples, which ``ErrorPolicy(on_error="skip")`` skips. Every
        format.
    max_frame_pixels: the largest frame area (height x width) a video or image feature may have, default
        4096x4096 (16.7 MP); None lifts it. A dataset whose metadata declares larger frames is refused when it
        opens (before ``features`` or a loader sizes anything by them), and a video whose stream header does when
        it is first read, before any frame of it is decoded: a tiny file can declare frames of gigabytes. Every
        format.
    fps: the control rate of datasets whose files record none, in steps per second: HDF5 and Zarr demonstrations
        (robomimic, LIBERO, ACT/ALOHA, diffusion_policy's ReplayBuffer: required) and RLDS datasets (windows and
        rates in seconds need it). HDF5, Zarr and RLDS.
    layout: which layout of a format to read, where it has several: HDF5 ``"robomimic"`` (also LIBERO's) or
        ``"aloha"`` (ACT/ALOHA, one file per episode), Zarr ``"replay_buffer"``; None detects it. HDF5 and Zarr.
    split: the episodes of one split: an RLDS split (``"train"``, the default there, ``"val"``, ...) or a slice of
        one as TFDS writes it (``"train[:90%]"``, ``"train[10:20]"``); the name of a robomimic ``mask/<split>``
        list (``"train"``, ``"valid"``, ...; None reads every episode). RLDS and HDF5 (robomimic layout).
    task_key: the step text feature that is each step's task (default ``"language_instruction"``; a dataset
        without it has no tasks). RLDS datasets.
    bgr: the dataset stores its pictures as BGR (some Open X-Embodiment datasets do): channels are swapped to RGB
        after decoding. RLDS datasets.
    """

    backend: str = "auto"
    frame_size: FrameSize = None
    frame_format: str = "rgb24"
    decoder_threads: int = 1
    tolerance_s: float = 1e-4
    cache_episodes: int = 8
    check_index: bool = True
    cache: str | os.PathLike | None = None
    cache_bytes: int | None = None
    device: str | None = None
    errors: str = "raise"
    max_frame_pixels: int | None = MAX_FRAME_PIXELS
    fps: float | None = None
    layout: str | None = None
    split: str | None = None
    task_key: str = "language_instruction"
    bgr: bool = False

    def __post_init__(self) -> None:
        if self.device is not None and self.cache is not None:
            raise ValueError(f"device={self.device!r} leaves frames on the GPU, but cache= keeps decoded frames in "
                             "host files; drop one of them")
        # an unknown backend or frame format (or decord asked for yuv420), or a device this machine cannot decode
        # onto, fails now, not at the first read
        checked = DecodeOptions(backend=self.backend, frame_format=self.frame_format, threads=self.decoder_threads,
                                device=self.device, max_frame_pixels=self.max_frame_pixels)
        object.__setattr__(self, "device", checked.device)
        if self.frame_size is not None:
            sizes = self.frame_size.values() if isinstance(self.frame_size, Mapping) else [self.frame_size]
            for size in sizes:
                if size is not None:
                    DecodeOptions(size=tuple(size))  # (H, W), ints >= 2
        if isinstance(self.cache_episodes, bool) or not isinstance(self.cache_episodes, int) \
                or self.cache_episodes < 1:
            raise ValueError(f"cache_episodes must be an int >= 1, got {self.cache_episodes!r}")
        if isinstance(self.tolerance_s, bool) or not isinstance(self.tolerance_s, (int, float)) \
                or not self.tolerance_s >= 0:
            raise ValueError(f"tolerance_s must be a number of seconds >= 0, got {self.tolerance_s!r}")
        if self.cache is not None and not isinstance(self.cache, (str, os.PathLike)):
            raise TypeError(f"cache must be a directory path (str or os.PathLike), got {type(self.cache).__name__}")
        if self.cache_bytes is not None:
            if isinstance(self.cache_bytes, bool) or not isinstance(self.cache_bytes, int) or self.cache_bytes < 1:
                raise ValueError(f"cache_bytes must be an int >= 1 (bytes of decoded frames), got {self.cache_bytes!r}")
            if self.cache is None:
                raise ValueError("cache_bytes is the budget of a frame cache: give cache=DIR as well")
        if self.errors not in ERROR_CHOICES:
            raise ValueError(f"errors must be 'raise' or 'skip' (what an episode whose metadata disagrees with the "
                             f"data does when the dataset opens), got {self.errors!r}")
        if not isinstance(self.task_key, str) or not self.task_key:
            raise ValueError(f"task_key must name a text feature of the steps, got {self.task_key!r}")
        if not isinstance(self.bgr, bool):
            raise ValueError(f"bgr must be True or False, got {self.bgr!r}")
        if not isinstance(self.check_index, bool):
            raise ValueError(f"check_index must be True or False, got {self.check_index!r}")
        if self.fps is not None and (isinstance(self.fps, bool) or not isinstance(self.fps, (int, float))
                                     or not (0 < self.fps < float("inf"))):
            raise ValueError(f"fps must be the control rate in steps per second (a finite number > 0), got "
                             f"{self.fps!r}")
        for name in ("layout", "split"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string (or None), got {value!r}")

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def of(cls, options: ReadOptions | None = None, **kwargs: Any) -> ReadOptions:
        """``options`` (default: the defaults) with ``kwargs`` set; an unknown name is a ValueError listing the
        options."""
        unknown = sorted(set(kwargs) - set(cls.names()))
        if unknown:
            raise ValueError(f"no format takes option {unknown[0]!r}; the options are {cls.names()} (each applies to "
                             "the datasets whose format takes it)")
        return replace(options or cls(), **kwargs)

    def given(self) -> list[str]:
        """The options set to other than their default, in field order."""
        default = ReadOptions()
        return [n for n in self.names() if getattr(self, n) != getattr(default, n)]

    def frame_store(self) -> FrameStore | None:
        """The decoded-frame store ``cache`` names (None without one)."""
        return None if self.cache is None else FrameStore(self.cache, self.cache_bytes)

    def decode(self, size: tuple[int, int] | None = None) -> DecodeOptions:
        """The decoder's options for frames resized to ``size`` (None: as stored)."""
        return DecodeOptions(backend=self.backend, size=size, frame_format=self.frame_format,
                             threads=self.decoder_threads, device=self.device, max_frame_pixels=self.max_frame_pixels)

    def check_frame_pixels(self, where: str, feature: str, height: int, width: int) -> None:
        """Raise ValueError naming ``where`` and ``feature`` when the frames a dataset's metadata declares for it
        exceed ``max_frame_pixels``."""
        limit = self.max_frame_pixels
        if limit is not None and int(height) * int(width) > limit:
            raise ValueError(f"{where}: feature {feature!r} declares frames of {int(height)}x{int(width)} "
                             f"({int(height) * int(width) / 1e6:.1f} MP), more than max_frame_pixels={limit} "
                             f"({limit / 1e6:.1f} MP); pass a larger max_frame_pixels= to open it")

    def frame_sizes(self, cameras: Collection[str], features: Collection[str], where: str
                    ) -> dict[str, tuple[int, int] | None]:
        """The size each camera is decoded at (None: as stored), checking that ``frame_size`` names cameras only;
        ``features`` are all the dataset's, for the message."""
        cameras = list(cameras)
        if not isinstance(self.frame_size, Mapping):
            size = None if self.frame_size is None else tuple(self.frame_size)
            return dict.fromkeys(cameras, size)
        for name in self.frame_size:
            if name not in cameras:
                what = "is not a video or image feature" if name in features else "is not a feature"
                raise ValueError(f"{where}: frame_size names {name!r}, which {what}; cameras are {cameras}")
        return {c: None if self.frame_size.get(c) is None else tuple(self.frame_size[c]) for c in cameras}

    def refuse_others(self, allowed: Collection[str], format_name: str, where: str) -> None:
        """Raise ValueError when an option this format does not have is set (see the module docstring)."""
        for name in self.given():
            if name not in allowed:
                raise ValueError(f"{where}: option {name!r} does not apply to {format_name} (they read "
                                 f"{sorted(allowed)}); drop {name}=")

    def restricted(self, allowed: Collection[str]) -> ReadOptions:
        """These options with the ones outside ``allowed`` at their defaults (a mixture's options, for one of its
        datasets)."""
        default = ReadOptions()
        return replace(self, **{n: getattr(default, n) for n in self.given() if n not in allowed})


def device_of(source: Any) -> str | None:
    """The GPU a source (or any dataset of a mixture, renamed or not) decodes its frames onto, or None: for the
    readers that lay frames out in host memory (the packed loader's payloads) to refuse device frames up front."""
    options = getattr(source, "options", None)
    if isinstance(options, ReadOptions) and options.device is not None:
        return options.device
    inner = list(getattr(source, "sources", None) or []) + [getattr(source, "source", None)]
    return next((d for d in map(device_of, (s for s in inner if s is not None)) if d is not None), None)
