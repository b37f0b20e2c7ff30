"""What :func:`mmfeed.loaders.convert` reads: one reader per kind of source, each giving episode ``i`` as
the keyword arguments of :func:`~mmfeed.loaders.conversion.writer.episode_sample`, every video already as mp4 bytes.

- LeRobot v3 (a directory, or an fsspec URL read in place by byte range): arrays through
  ``LeRobotSource.read_many``, per-step tasks through ``step_tasks``; each camera's frames decoded (resized
  by ``frame_size`` inside the decoder) and encoded, or under ``codec="copy"`` the episode's packets remuxed out of
  the concatenated file (:func:`remux_episode`: the same compressed bytes, so the same decoded pixels).
- webdataset shards (v1 or v2): arrays read, videos decoded and encoded, or under ``copy`` kept byte for byte.
- HDF5 and Zarr demonstrations and RLDS datasets (any other format ``open_dataset`` detects), opened with the
  job's read options (``fps``, ``layout``, ``split``): arrays read, pictures encoded; RLDS's task text as the
  per-step task, its per-episode texts into meta.json, other texts and ragged features left out (logged).
- ``module:function`` (or a callable): a generator of episode dicts (:func:`normalize_episode`), iterated by the
  driver; its frames are encoded by the workers.

Decoding always uses PyAV, so the output does not depend on which backends a machine has.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.demux import VideoSource, open_container, packets_of, probe
from mmfeed.codecs.encode import CODECS, encode_video
from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.loaders.formats.lerobot.source import LeRobotSource

__all__ = ["open_reader", "normalize_episode", "iter_generator", "remux_episode", "source_kind"]

log = logging.getLogger(__name__)

_RAW_TO_MP4 = 50.0
"""Raw frame bytes per encoded byte assumed when sizing shards by --shard-size-mb before encoding (an estimate)."""


def source_kind(src: Any) -> str:
    """"lerobot", "shards", "dataset" (any other format ``open_dataset`` detects: HDF5, Zarr, RLDS) or "generator"
    for a convert SRC (path, URL, ``module:function`` or callable)."""
    if callable(src):
        return "generator"
    spec = os.fspath(src)
    if ":" in spec and "://" not in spec and not os.path.exists(spec) and not spec[1:3] == ":\\":
        return "generator"
    from mmfeed.loaders.open import format_of

    name = format_of(spec)
    return "lerobot" if name == "lerobot" else "shards" if name in (None, "webdataset") else "dataset"


def open_reader(job) -> Any:
    """The reader of ``job``'s source (cached per process: workers open it once)."""
    key = repr(job)
    reader = _OPEN.get(key)
    if reader is None:
        reader = {"lerobot": LeRobotReader, "shards": ShardReader, "dataset": DatasetReader,
                  "generator": GeneratorReader}[job.kind](job)
        _OPEN.clear()
        _OPEN[key] = reader
    return reader


_OPEN: dict[str, Any] = {}


class _Reader:
    """What the readers share: frames to mp4 with the job's codec, and timing of reads and encodes."""

    def __init__(self, job) -> None:
        self.job = job
        self.seconds = {"read": 0.0, "encode": 0.0}

    def encode(self, frames: np.ndarray, fps: float, source_codec: str | None = None) -> bytes:
        codec = self.job.codec
        if codec == "copy":  # a re-encode under copy keeps the source's codec where mmfeed has its encoder
            codec = source_codec if source_codec in CODECS else "h264"
        start = time.perf_counter()
        data = encode_video(frames, fps=fps, codec=codec, gop=self.job.gop or 30, crf=self.job.crf)
        self.seconds["encode"] += time.perf_counter() - start
        return data

    def reencode(self, feature: str) -> bool:
        """Whether a video feature must be decoded and encoded (not copied)."""
        size = self.job.frame_size
        resized = isinstance(size, Mapping) and feature in size or size is not None and not isinstance(size, Mapping)
        return self.job.codec != "copy" or self.job.gop is not None or resized


class _SourceReader(_Reader):
    """A reader over an open :class:`~mmfeed.loaders.sources.base.EpisodeSource`."""

    source: Any

    def __len__(self) -> int:
        return len(self.source)

    def _check(self) -> None:
        text = [f for f, spec in self.source.features.items() if spec.kind == "text"]
        if text:
            raise ValueError(f"{self.job.src}: features {text} hold text per step; shards hold numeric arrays and "
                             "videos only, so they cannot be converted (drop them from the source)")
        self.videos = [f for f, spec in self.source.features.items() if spec.kind == "video"]
        self.arrays = [f for f in self.source.features if f not in self.videos]

    def tasks(self, e: int) -> str | list[str]:
        if self.source.episode_tasks[e] >= 0:
            return self.source.task(e)
        return [self.source.tasks[t] if t >= 0 else "" for t in self.source.step_tasks(e)]

    def read_arrays(self, e: int) -> dict[str, np.ndarray]:
        return self.read_frames(e, self.arrays)

    def read_frames(self, e: int, features: list[str]) -> dict[str, np.ndarray]:
        request = {f: np.arange(self.source.frames(f)[e], dtype=np.int64) for f in features}
        return self.source.read_many([EpisodeRequest(e, request)])[0] if request else {}

    def rates(self, e: int) -> dict[str, float]:
        fps, length = float(self.source.fps[e]), int(self.source.lengths[e])
        return {f: float(self.source.rates(f)[e]) for f in self.source.features
                if float(self.source.rates(f)[e]) != fps or int(self.source.frames(f)[e]) != length}

    def estimate(self, e: int) -> float:
        """Bytes episode ``e`` is expected to take in a shard (arrays exactly, videos from the source's bytes)."""
        total = 0.0
        for f in self.arrays:
            spec = self.source.features[f]
            total += 128 + int(self.source.frames(f)[e]) * np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape))
        for f in self.videos:
            stored, scale = self.video_bytes(e, f), 1.0
            if self.reencode(f) and self.job.frame_size is not None:
                h, w, _ = self.source.features[f].shape
                sh, sw = self.stored_shape[f]
                scale = h * w / max(1, sh * sw)
            total += stored * scale
        return total


class LeRobotReader(_SourceReader):
    """Episodes of a LeRobot v3 directory (or fsspec URL)."""

    def __init__(self, job) -> None:
        super().__init__(job)
        self.source = LeRobotSource(job.src.removeprefix("file://"), frame_size=job.frame_size, backend="pyav")
        self._check()
        self.stored_shape = {f: _stored(self.source.info["features"][f]) for f in self.videos}
        self._files: dict[str, tuple[int, int]] = {}  # video file -> (bytes, frames of the episodes it holds)

    def key(self, e: int) -> str:
        return f"episode_{int(self.source._meta['episode_index'][e]):06d}"

    def describe(self, e: int) -> str:
        files = [self.source.files.where(self._video_path(e, f)) for f in [None, *self.videos]]
        return f"{self.source.describe(e)} (files {', '.join(dict.fromkeys(files))})"

    def read(self, e: int) -> dict[str, Any]:
        start = time.perf_counter()
        features: dict[str, Any] = self.read_arrays(e)
        copied = {}
        for f in self.videos:
            if not self.reencode(f) and self.source.info["features"][f]["dtype"] == "video":
                path, times = self.source._frame_times(e, f, np.zeros(1, np.int64))
                copied[f] = remux_episode(path, float(times[0]), int(self.source.lengths[e]),
                                          float(self.source.fps[e]))
                if copied[f] is None:
                    log.warning("%s feature %r: the episode's packets cannot be copied exactly (no keyframe at its "
                                "start or a frame count that differs); re-encoding it", self.source.describe(e), f)
        decode = [f for f in self.videos if copied.get(f) is None]
        frames = self.read_frames(e, decode)
        self.seconds["read"] += time.perf_counter() - start
        for f in self.videos:
            if copied.get(f) is not None:
                features[f] = copied[f]
            else:
                codec = self.source.info["features"][f].get("info", {}).get("video.codec")
                features[f] = self.encode(frames[f], float(self.source.fps[e]), _short(codec))
        return {"features": {f: features[f] for f in self.source.features}, "fps": float(self.source.fps[e]),
                "rates": {}, "task": self.tasks(e), "key": self.key(e)}

    def video_bytes(self, e: int, f: str) -> float:
        path = self._video_path(e, f)
        if path not in self._files:
            meta, video = self.source._meta, self.source.info["features"][f]["dtype"] == "video"
            columns = [f"videos/{f}/chunk_index", f"videos/{f}/file_index"] if video else \
                ["data/chunk_index", "data/file_index"]
            same = (meta[columns[0]] == meta[columns[0]][e]) & (meta[columns[1]] == meta[columns[1]][e])
            self._files[path] = (self.source.files.size(path), int(self.source.lengths[same].sum()))
        size, frames = self._files[path]
        return size * int(self.source.lengths[e]) / max(1, frames)

    def _video_path(self, e: int, f: str | None) -> str:
        """The file (relative to the root) holding episode ``e`` of video feature ``f`` (image features and None:
        the data file)."""
        if f is None or self.source.info["features"][f]["dtype"] != "video":
            return self.source.data_file(e)
        return self.source.video_file(e, f)


class ShardReader(_SourceReader):
    """Episodes of webdataset shards (re-shard, transcode)."""

    def __init__(self, job) -> None:
        super().__init__(job)
        from mmfeed.loaders.formats.webdataset.source import WebDatasetSource

        self.source = WebDatasetSource(job.src, frame_size=job.frame_size, backend="pyav")
        self._check()
        self.stored_shape = dict(self.source._stored_shape)

    def key(self, e: int) -> str:
        return self.source.episode_id(e)

    def describe(self, e: int) -> str:
        return self.source.describe(e)

    def read(self, e: int) -> dict[str, Any]:
        start = time.perf_counter()
        features: dict[str, Any] = self.read_arrays(e)
        copied = {f: self.source.member_bytes(e, f) for f in self.videos if not self.reencode(f)}
        frames = self.read_frames(e, [f for f in self.videos if f not in copied])
        self.seconds["read"] += time.perf_counter() - start
        rates = self.rates(e)
        for f in self.videos:
            if f in copied:
                features[f] = copied[f]
            else:
                codec = probe(self.source.member_bytes(e, f)).codec if self.job.codec == "copy" else None
                features[f] = self.encode(frames[f], rates.get(f, float(self.source.fps[e])), _short(codec))
        return {"features": {f: features[f] for f in self.source.features}, "fps": float(self.source.fps[e]),
                "rates": rates, "task": self.tasks(e), "key": self.key(e)}

    def video_bytes(self, e: int, f: str) -> float:
        return float(self.source._members[f][1][e])


class DatasetReader(_SourceReader):
    """Episodes of the other formats ``open_dataset`` reads (HDF5, Zarr, RLDS), opened with the job's read options
    (``fps``, ``layout``, ``split``): arrays read, pictures encoded (resized first by ``frame_size``).

    Text is carried where shards can hold it: the source's task feature (RLDS ``language_instruction``, its
    ``task_feature``) as the shards' per-step task, the episode's own texts (its ``episode_features`` that are text,
    RLDS ``episode_metadata.*``) in the episode's meta.json under ``"text"``. Other per-step texts and ragged
    features (``ragged_features``) have no place in shards: they are left out, and a warning names them."""

    def __init__(self, job) -> None:
        _Reader.__init__(self, job)
        from mmfeed.loaders.open import open_each

        self.source = open_each([job.src], **dict(job.options))[0]
        self.source.fps  # a source without a rate fails now (RLDS without fps=), before DST is written
        self._check()
        self.stored_shape = {f: tuple(self.source.features[f].shape) for f in self.videos}

    def _check(self) -> None:
        features = self.source.features
        text = [f for f, spec in features.items() if spec.kind == "text"]
        task = getattr(self.source, "task_feature", None)
        per_episode = set(getattr(self.source, "episode_features", ()))
        self.texts = [f for f in text if f in per_episode]
        left = [f for f in text if f != task and f not in per_episode]
        ragged = list(getattr(self.source, "ragged_features", ()))
        if left or ragged:
            log.warning("%s: %s left out of the shards, which hold numeric arrays, videos, a task per step and "
                        "texts per episode only", self.job.src,
                        "; ".join(part for part in (left and f"per-step text features {left}",
                                                    ragged and f"ragged features {ragged}") if part))
        self.videos = [f for f, spec in features.items() if spec.kind == "video"]
        self.arrays = [f for f in features if f not in self.videos and f not in text]

    def key(self, e: int) -> str:
        return f"episode_{e:06d}"

    def describe(self, e: int) -> str:
        return self.source.describe(e)

    def read(self, e: int) -> dict[str, Any]:
        start = time.perf_counter()
        features: dict[str, Any] = self.read_arrays(e)
        frames = self.read_frames(e, self.videos)
        text = {}
        if self.texts and int(self.source.lengths[e]):
            first = self.source.read_many([EpisodeRequest(e, {f: np.zeros(1, np.int64) for f in self.texts})])[0]
            text = {f: str(first[f][0]) for f in self.texts}
        for f in self.videos:
            size = _size_of(self.job.frame_size, f)
            if size is not None and tuple(frames[f].shape[1:3]) != size:
                frames[f] = _resize(frames[f], size)
        self.seconds["read"] += time.perf_counter() - start
        rates = self.rates(e)
        for f in self.videos:
            features[f] = self.encode(frames[f], rates.get(f, float(self.source.fps[e])))
        return {"features": {f: features[f] for f in self.source.features if f in features},
                "fps": float(self.source.fps[e]), "rates": rates, "task": self.tasks(e), "key": self.key(e),
                "text": text}

    def video_bytes(self, e: int, f: str) -> float:
        return int(self.source.frames(f)[e]) * float(np.prod(self.stored_shape[f])) / _RAW_TO_MP4


class GeneratorReader(_Reader):
    """Episodes a user's generator made; the driver hands them over normalized (:func:`normalize_episode`)."""

    def describe(self, item: Mapping) -> str:
        return f"{self.job.src} episode {item['index']} (key {item['key']!r})"

    def read(self, item: Mapping) -> dict[str, Any]:
        features = {}
        for name, value in item["features"].items():
            rate = float(item["rates"].get(name, item["fps"]))
            if isinstance(value, (bytes, bytearray, memoryview)):
                if self.reencode(name):
                    start = time.perf_counter()
                    frames = _decode_all(bytes(value), _size_of(self.job.frame_size, name))
                    self.seconds["read"] += time.perf_counter() - start
                    value = self.encode(frames, rate, _short(probe(bytes(value)).codec))
                features[name] = bytes(value)
            elif _is_frames(value):
                size = _size_of(self.job.frame_size, name)
                if size is not None and tuple(value.shape[1:3]) != size:
                    start = time.perf_counter()
                    value = _resize(value, size)
                    self.seconds["read"] += time.perf_counter() - start
                features[name] = self.encode(value, rate)
            else:
                features[name] = value
        return {"features": features, "fps": item["fps"], "rates": item["rates"], "task": item["task"],
                "key": item["key"]}


def iter_generator(src: Any) -> Iterator[Any]:
    """The episodes of ``module:function`` (imported, called without arguments) or of a callable."""
    function = src
    if not callable(src):
        module, _, name = os.fspath(src).partition(":")
        try:
            function = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"{src}: cannot import {name!r} from module {module!r} ({err}); SRC names a generator "
                             "of episodes as module:function, the module on sys.path") from err
    return iter(function())


def normalize_episode(episode: Any, index: int) -> dict[str, Any]:
    """A generated episode as ``{"features", "fps", "rates", "task", "key", "index"}``: either the keyword form of
    ``ShardWriter.write`` (``{"features": {...}, "fps", "rates", "task", "key"}``) or a flat dict of features
    beside ``fps``, ``rates``, ``task`` and ``key`` (as ``ArraySource`` takes)."""
    if not isinstance(episode, Mapping):
        raise ValueError(f"generated episode {index} is a {type(episode).__name__}; yield dicts {{'features': "
                         "{name: array}, 'fps': ..., 'rates': {...}, 'task': ...}")
    if "features" in episode:
        features = episode["features"]
    else:
        features = {k: v for k, v in episode.items() if k not in ("fps", "rates", "task", "key", "length")}
    if "fps" not in episode:
        raise ValueError(f"generated episode {index} has no 'fps' (the rate of its control clock)")
    task = episode.get("task", "")
    return {"features": dict(features), "fps": float(episode["fps"]), "rates": dict(episode.get("rates") or {}),
            "task": task if isinstance(task, str) else [str(t) for t in task],
            "key": str(episode.get("key") or f"episode_{index:06d}"), "index": index}


def estimate_generated(item: Mapping) -> float:
    """Bytes a normalized generated episode is expected to take (frames at ``_RAW_TO_MP4`` : 1)."""
    total = 0.0
    for value in item["features"].values():
        if isinstance(value, (bytes, bytearray, memoryview)):
            total += len(value)
        else:
            value = np.asarray(value)
            total += value.nbytes / _RAW_TO_MP4 if _is_frames(value) else value.nbytes + 128
    return total


def remux_episode(path: VideoSource, start_s: float, count: int, fps: float) -> bytes | None:
    """The ``count`` frames from ``start_s`` seconds of the video at ``path`` (a file, or a remote file read by
    range) as an mp4 of their very packets
    (stream copy, timestamps from 0), or None when that is not an exact copy: the first packet is not a keyframe,
    or the packets in the span are not ``count`` frames."""
    import io

    import av

    tolerance = 0.5 / fps
    end = start_s + (count - 1) / fps
    with open_container(path) as container:
        stream = container.streams.video[0]
        base = stream.time_base
        container.seek(max(0, int(start_s / base)), stream=stream, backward=True, any_frame=False)
        packets = []
        for packet in packets_of(container, stream):  # closed at the break: PyAV's own would leak its buffer
            if packet.dts is None or packet.pts is None:
                continue
            if float(packet.dts * base) > end + tolerance:
                break
            if start_s - tolerance <= float(packet.pts * base) <= end + tolerance:
                packets.append(packet)
        if len(packets) != count or not packets[0].is_keyframe:
            return None
        shift = min(p.dts for p in packets)
        buffer = io.BytesIO()
        with av.open(buffer, mode="w", format="mp4") as out:
            copy = out.add_stream_from_template(stream, opaque=True)
            copy.time_base = base
            for packet in packets:
                packet.pts -= shift
                packet.dts -= shift
                packet.stream = copy
                out.mux(packet)
    data = buffer.getvalue()
    return data if probe(data).num_frames == count else None


def _decode_all(data: bytes, size: tuple[int, int] | None) -> np.ndarray:
    info = probe(data)
    with VideoReaderCache(max_open=1, backend="pyav", size=size) as cache:
        return cache.decode_batch([FrameRequest(data, indices=np.arange(info.num_frames))])[0]


def _resize(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 ``[T, H, W, 3]`` frames scaled to ``size`` (height, width) by FFmpeg's scaler, as decoders resize."""
    import av

    h, w = size
    return np.stack([av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
                     .reformat(width=w, height=h, format="rgb24").to_ndarray() for f in frames])


def _is_frames(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 4 and value.shape[-1] == 3


def _size_of(frame_size: Any, feature: str) -> tuple[int, int] | None:
    if isinstance(frame_size, Mapping):
        return tuple(frame_size[feature]) if feature in frame_size else None
    return None if frame_size is None else tuple(frame_size)


def _short(codec: str | None) -> str | None:
    """mmfeed's short name of a decoder's codec name ("libdav1d" / "av1" -> "av1")."""
    if codec is None:
        return None
    codec = codec.lower()
    return next((short for short in CODECS if short in codec or (short == "av1" and "dav1d" in codec)),
                "hevc" if "265" in codec else codec)


def _stored(spec: Mapping) -> tuple[int, int]:
    shape = list(spec.get("shape") or [0, 0, 3])
    return (shape[1], shape[2]) if list(spec.get("names") or [])[:1] == ["channels"] else (shape[0], shape[1])

