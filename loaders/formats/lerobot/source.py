"""LeRobot v3 directories as an :class:`EpisodeSource`: every feature of ``meta/info.json`` under its own name.

A LeRobot v3.0 dataset keeps its episode index in ``meta/episodes/chunk-XXX/file-XXX.parquet`` (length, the
episode's row range in the data files, its tasks and, per camera, which video file holds it and from what
timestamp), per-frame rows in ``data/chunk-XXX/file-XXX.parquet`` and the episodes of each camera back to back in
``videos/<key>/chunk-XXX/file-XXX.mp4``: frame ``j`` of an episode is at ``from_timestamp + j / fps`` in its file.
Planning reads only the metadata (never the per-episode ``stats/...`` columns); workers read the rows and decode
the frames a batch asks for, one decode pass per video file for all the frames of the batch.

The directory may be local or at any fsspec URL (``s3://bucket/ds``, ``gs://...``, ``https://host/ds``): the
metadata is read once when the dataset opens, data files and videos by byte range through the process's bounded
block cache, every remote read retried (:mod:`mmfeed.loaders.transport.files`). Every layout LeRobot writes or
converts reads the same: ``meta/episodes`` in any number of files and row groups (LeRobot flushes every ten
episodes), task lists as plain or dictionary-encoded strings in list or large_list columns, data and videos over
many files and chunks.

Kinds follow the declared dtypes: ``video`` and ``image`` (PNG or JPEG bytes in the parquet) are uint8
``[H, W, 3]`` frames (kind "video"), ``string`` is text (numpy object arrays of str), ``language`` (LeRobot's
per-frame ``language_persistent`` and ``language_events``: a list of message rows per frame) is text too, each
frame's rows as JSON, and every numeric dtype is an array of that dtype. Text columns the data files hold that
info.json does not declare (read from the first data file's schema) are text features too. LeRobot declares a
number per step as shape ``[1]`` and stores it as a scalar column; it is read as shape ``()``. With
``frame_format="yuv420"`` frames come as I420 planes ``[H * 3 // 2, W]`` instead (:mod:`mmfeed.codecs.colour`).

LeRobot v2.x directories (v2.0, v2.1: a data file and a video per episode, JSON-lines metadata, what LeRobot 0.3
writes and many Hub datasets still are) read the same, without conversion: their ``meta/episodes.jsonl`` becomes
the same episode columns (:mod:`~mmfeed.loaders.formats.lerobot.v21`), each episode its own data file and video.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.colour import frame_step_shape
from mmfeed.codecs.demux import FramesTooLarge, pixel_limit, check_frame_pixels, frames_of
from mmfeed.codecs.demux import IMAGE_FORMATS, input_options
from mmfeed.codecs.errors import DecodeError
from mmfeed.loaders.clock import stage
from mmfeed.loaders.sources.base import LRU, EpisodeRequest, EpisodeSource, Feature
from mmfeed.loaders.sources.requests import WindowArrays
from mmfeed.loaders.heap import release_free_heap
from mmfeed.loaders.formats.lerobot.metadata import (check_info, file_codes, lerobot_episodes, lerobot_rows,
                                                     parquet_rows)
from mmfeed.loaders.formats.lerobot.v21 import (PATH_FIELDS, aggregate_stats, episode_stats, is_v2,
                                                read_episodes as read_v2_episodes, read_tasks as read_v2_tasks)
from mmfeed.loaders.sources.consistency import settle
from mmfeed.loaders.transport.confine import PathTemplate, UnsafePathError, shorten
from mmfeed.loaders.transport.errors import SampleError, decode_with_context, reason_of
from mmfeed.loaders.transport.files import DatasetFiles, RemoteFile, is_url
from mmfeed.loaders.stores.frame_store import Segment, decode_stored, stored
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.sources.readers import ReaderCaches
from mmfeed.loaders.stores import derived
from mmfeed.loaders.stores.index_arrays import numpy_of, reading_pool
from mmfeed.loaders.stores.parquet_children import read_columns
from mmfeed.loaders.stores.parquet_direct import DirectRead, direct_ready, read_direct
from mmfeed.loaders.transport.tar import stat_file
from mmfeed.loaders.stores.stats import step_shaped
from mmfeed.packing.bins import split_rows
from mmfeed.packing.windows import check_stream_frames

__all__ = ["LeRobotSource", "is_lerobot_dir"]

_FRAMES = ("video", "image")
_EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index",
                    "dataset_to_index")
_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp")
_SEGMENT_END = "to_timestamp"  # where an episode's segment of a video ends (read where every file has it)


def is_lerobot_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a directory or an fsspec URL) looks like a LeRobot dataset root: it has
    ``meta/info.json``. A URL naming a file (``.tar``, ``.parquet``) or a pattern is not asked."""
    spec = os.fspath(path)
    if is_url(spec) and (spec.endswith((".tar", ".parquet")) or any(c in spec for c in "{*?[")):
        return False
    return DatasetFiles(spec).exists("meta/info.json")


class LeRobotSource(EpisodeSource):
    """The episodes of a LeRobot v3 (or v2.x) directory, every feature at the dataset's fps.

    root: the dataset directory (holding ``meta/``, ``data/`` and, with videos, ``videos/``), local or an fsspec
        URL.
    options: how it is read (:class:`~mmfeed.loaders.sources.options.ReadOptions`: backend, frame_size,
        frame_format, decoder_threads, tolerance_s, cache, cache_bytes), or its fields as keyword arguments.
    """

    FORMAT = "LeRobot v3"
    one_frame_shape = True  # a camera's frames are one size in every episode (info / features.json)
    READ_OPTIONS = ("backend", "frame_size", "frame_format", "decoder_threads", "tolerance_s", "cache", "cache_bytes",
                    "device", "max_frame_pixels", "errors")
    """The :class:`~mmfeed.loaders.sources.options.ReadOptions` this format reads."""

    def __init__(self, root: str | os.PathLike, options: ReadOptions | None = None, **kwargs: Any) -> None:
        options = ReadOptions.of(options, **kwargs)
        options.refuse_others(self.READ_OPTIONS, self.FORMAT, os.fspath(root))
        self.options, self.frame_format = options, options.frame_format
        self.files = DatasetFiles(root)
        self.root = self.name = self.files.root
        self.tolerance_s = float(options.tolerance_s)
        self.info = self.files.read_json("meta/info.json")
        where = self.files.where("meta/info.json")
        check_info(self.info, where)  # every field the reader uses has its JSON type, before it is used
        version = str(self.info.get("codebase_version", ""))
        if not version.startswith(("v3", "v2")):
            raise ValueError(f"{self.root}: meta/info.json has codebase_version {shorten(version)}; mmfeed reads "
                             "LeRobot v3.x and v2.x")
        self.version = version
        v2 = is_v2(self.info)  # a file per episode, JSON-lines metadata (lerobot.v21)
        if v2 and not self.files.exists("meta/episodes.jsonl"):
            raise ValueError(f"{where}: codebase_version {shorten(version)} but no meta/episodes.jsonl, where a "
                             "LeRobot v2.x dataset lists its episodes")
        for field in ("fps", "features", "data_path"):
            if field not in self.info:
                raise ValueError(f"{where}: missing field {field!r}")
        specs: dict[str, dict] = self.info["features"]
        fps = float(self.info["fps"])
        self._video_keys = [k for k, s in specs.items() if s.get("dtype") == "video"]
        if self._video_keys and not self.info.get("video_path"):
            raise ValueError(f"{where}: video features but no 'video_path'")
        self._fields = PATH_FIELDS if v2 else ("chunk_index", "file_index")  # a path's (chunk, file) fields
        self._data_path = PathTemplate(self.info["data_path"], self._fields, where=where, field="data_path")
        self._video_path = PathTemplate(self.info["video_path"], ("video_key", *self._fields),
                                        where=where, field="video_path") if self._video_keys else None
        cameras = [k for k, s in specs.items() if s.get("dtype") in _FRAMES]
        self._sizes = options.frame_sizes(cameras, list(specs), self.root)
        self._declared = {k: _declared_size(k, specs[k], self.root) for k in cameras}  # stored (height, width)
        for k, (h, w) in self._declared.items():
            options.check_frame_pixels(where, k, h, w)
        self.features = {k: _feature(k, s, fps, self._sizes.get(k), self.root, self.frame_format)
                         for k, s in specs.items()}
        if v2:
            self.tasks = read_v2_tasks(self.files)
            self._meta, self._episode_tasks, sources = read_v2_episodes(self.files, self.info, self._video_keys,
                                                                         self.tasks)
        else:
            self.tasks = _read_tasks(self.files)
            self._meta, self._episode_tasks, sources = _read_episodes(self.files, self.info, self._video_keys,
                                                                      self.tasks)
        self._video_columns = {f: tuple(self._meta[f"videos/{f}/{c}"] for c in _VIDEO_COLUMNS)
                               for f in self._video_keys}
        self._check_paths(where)
        self.skipped = self._check_episodes(sources, options.errors)  # metadata against the data files' rows
        self._lengths = self._meta["length"].astype(np.int64)
        self._fps = np.full(len(self._lengths), fps, dtype=np.float64)
        self._frames = self._segment_frames(fps)
        self._specs = dict(specs)  # info.json's features, and the text columns the data holds undeclared
        for name, spec in self._undeclared_text().items():
            self._specs[name] = spec
            self.features[name] = _feature(name, spec, fps, None, self.root)
        raw = {}
        if self.files.exists("meta/stats.json"):
            raw = _read_stats(self.files)
        elif v2:  # v2.1: the episodes' statistics, aggregated as LeRobot aggregates them
            raw = {f: {k: np.asarray(v, dtype=np.float64) for k, v in st.items()}
                   for f, st in aggregate_stats(episode_stats(self.files)).items()}
        self.stats = step_shaped(raw, {k: f.shape for k, f in self.features.items() if f.kind == "array"})
        self._data_cache = LRU(2)  # path -> the non-video columns of one data file
        self._videos = ReaderCaches()  # the decoders, by output frame size
        self._videos_at: dict[tuple[str, int, int], str | RemoteFile] = {}  # (feature, chunk, file) -> what opens
        self._store = options.frame_store()

    def step_tasks(self, episode: int) -> np.ndarray:
        """The task id of every step of ``episode``, int64 ``[T]`` (read from its rows where the task changes)."""
        e = self._check_episode(episode)
        if self._episode_tasks[e] >= 0:
            return super().step_tasks(e)
        steps = np.arange(self._lengths[e], dtype=np.int64)
        return self._rows(e, "task_index", steps).astype(np.int64, copy=False)

    def frame_shape(self, episode: int, feature: str) -> tuple[int, int] | None:
        """``(height, width)`` of a video feature's decoded pictures (in either frame format), else None."""
        f = self.features.get(feature)
        return f.frame_size if f is not None else None

    def describe(self, episode: int) -> str:
        """The root and the episode's ``episode_index``, for error messages."""
        return f"{self.root} episode {int(self._meta['episode_index'][episode])}"

    def episode(self, index: int) -> dict:
        """The whole episode (see :meth:`EpisodeSource.episode`) plus its ``episode_index`` in the dataset: an int,
        unless the dataset has a feature of that name (LeRobot writes one), whose per-step array it then stays."""
        data = super().episode(index)
        data.setdefault("episode_index", int(self._meta["episode_index"][index]))
        return data

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested frames of each request: rows of the data files, then every video frame of the batch in
        one decode call per frame size, so that each video file is decoded once per batch."""
        out: list[dict[str, np.ndarray]] = [{} for _ in requests]
        videos: dict[tuple[int, int] | None, list[tuple]] = {}  # size -> (r, feature, request, where, segment, idx)
        rows: dict[str, list[tuple[int, int, np.ndarray]]] = {}  # feature -> (r, episode, idx) of its data rows
        with stage("read"):
            self._check_requests(requests)
            for r, request in enumerate(requests):
                e = request.episode
                for feature, idx in request.indices.items():
                    idx = np.asarray(idx, dtype=np.int64)
                    into = request.out.get(feature) if request.out else None
                    if feature in self._video_keys:
                        segment = None
                        if self._store is not None:
                            segment = self._segment(e, feature)
                            frames = stored(self._store, segment, idx, into)
                            if frames is not None:
                                out[r][feature] = frames  # no decode
                                continue
                        path, times = self._frame_times(e, feature, idx)
                        frame_request = FrameRequest(path, timestamps=times, tolerance_s=self.tolerance_s, out=into)
                        videos.setdefault(self._sizes[feature], []).append(
                            (r, feature, frame_request, _Where(self, e, feature, path), segment, idx))
                    else:
                        rows.setdefault(feature, []).append((r, e, idx))
            for feature, wanted in rows.items():
                for (r, _, _), values in zip(wanted, self._rows_many(feature, wanted)):
                    out[r][feature] = values
        with stage("decode"):
            for r, request in enumerate(requests):
                for feature, rows in list(out[r].items()):
                    if self._specs[feature]["dtype"] == "image":
                        into = request.out.get(feature) if request.out else None
                        out[r][feature] = self._decode_images(request.episode, feature, rows, into)
            for size, items in videos.items():
                cache = self._readers(size)
                for r, feature, frame_request, where, *_ in items:
                    self._check_stream(cache, feature, frame_request.path, where)
                decoded = decode_stored(self._store, cache, [i[2] for i in items], [i[3] for i in items],
                                        [i[4] for i in items], [i[5] for i in items],
                                        lambda k, into: self._whole(requests[items[k][0]].episode, items[k][1], into))
                for (r, feature, *_), frames in zip(items, decoded):
                    out[r][feature] = frames
        return out

    def read_windows(self, windows: WindowArrays, buffer: Callable[[str], np.ndarray]
                     ) -> dict[str, np.ndarray] | None:
        """A batch of windows in one call (see :meth:`EpisodeSource.read_windows`): each array feature one gather
        per data file, each camera's frames one request per video file for a run of samples in it (decoded
        straight into the batch's buffer). Videos through the frame store, image and text features, and anything
        out of range are read request by request."""
        if self._store is not None or not len(windows.episodes) or not self._windows_in_range(windows):
            return None
        for feature in windows.indices:
            spec = self.features[feature]
            if not (feature in self._video_keys or spec.kind == "array" and self._specs[feature]["dtype"] != "image"
                    and np.dtype(spec.dtype).kind in "biuf"):
                return None
        episodes, out = windows.episodes, {}
        with stage("read"):
            for feature, idx in windows.indices.items():
                if feature not in self._video_keys:
                    out[feature] = self._rows_window(feature, episodes, idx)
                    if out[feature] is None:
                        return None
        with stage("decode"):
            for feature, idx in windows.indices.items():
                if feature in self._video_keys:
                    out[feature] = self._frames_window(feature, episodes, idx, buffer(feature))
        return out

    def _rows_window(self, feature: str, episodes: np.ndarray, idx: np.ndarray) -> np.ndarray | None:
        """Rows ``idx`` (``[B, n]``) of an array feature for each sample's episode, ``[B, n, *shape]``: one gather
        per data file (None where a file's rows disagree with meta/episodes: the request path names them)."""
        want = self._meta["dataset_from_index"][episodes].astype(np.int64)[:, None] + idx
        got = None
        for members in self._by_data_file(episodes):
            e0 = int(episodes[members[0]])
            relative = self.data_file(e0)
            columns = self._data_file(relative, f"{self.describe(e0)} feature {feature!r}")
            values = columns.get(feature)
            if self._bad_rows.get(relative) or values is None or isinstance(values, Exception):
                return None
            at = _positions(columns["index"], want[members].reshape(-1))
            if at is None or (got is not None and values.dtype != got.dtype):
                return None
            if got is None:
                got = np.empty((*idx.shape, *values.shape[1:]), values.dtype)
            got[members] = values[at].reshape(len(members), idx.shape[1], *values.shape[1:])
        return got

    def _readers(self, size: tuple[int, int] | None) -> VideoReaderCache:
        """The decoders of the cameras whose frames come out at ``size`` (None: as stored)."""
        return self._videos.get(size, self.options.decode, lambda: [
            self.features[k].frame_size for k in self._video_keys
            if self._sizes.get(k) is None and self.features[k].frame_size is not None])

    def _frames_window(self, feature: str, episodes: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Frames ``idx`` (``[B, n]``) of a camera for each sample's episode, decoded into ``out`` (``[B, n, ...]``):
        one request per video file for each run of consecutive samples in it."""
        chunk, number, start = self._video_columns[feature]
        times = start[episodes].astype(np.float64)[:, None] + idx.astype(np.float64) / self._fps[episodes][:, None]
        files = chunk[episodes].astype(np.int64) << 32 | number[episodes].astype(np.int64)
        cuts = [0, *np.flatnonzero(files[1:] != files[:-1]) + 1, len(files)]
        cache = self._readers(self._sizes[feature])
        requests, where = [], []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            e0 = int(episodes[lo])
            path = self._video(e0, feature)
            place = _Where(self, e0, feature, path)
            self._check_stream(cache, feature, path, place)
            frames = out[lo:hi]
            requests.append(FrameRequest(path, timestamps=times[lo:hi].reshape(-1), tolerance_s=self.tolerance_s,
                                         out=frames.reshape(-1, *frames.shape[2:])))
            where.append(place)
        decode_with_context(cache, requests, where)
        return out

    def episode_arrays(self, episodes: Sequence[int], features: Sequence[str]) -> dict[str, np.ndarray]:
        """Every row of ``features`` (data-file columns, not videos) over ``episodes``, back to back: each run of
        episodes in one data file is one gather from that file's columns, so a pass over a million episodes costs
        per file, not per episode."""
        episodes = np.asarray(episodes, dtype=np.int64)
        videos = [f for f in features if f in self._video_keys]
        if videos:
            raise ValueError(f"{self.root}: episode_arrays reads data-file columns; {videos} are videos")
        parts: dict[str, list[np.ndarray]] = {f: [] for f in features}
        files = [self.data_file(int(e)) for e in episodes]
        cuts = [0, *(k for k in range(1, len(files)) if files[k] != files[k - 1]), len(files)]
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            run, relative = episodes[lo:hi], files[lo]
            where = f"{self.describe(int(run[0]))}..{int(self._meta['episode_index'][run[-1]])}"
            columns = self._data_file(relative, where)
            self._refuse_bad_rows(relative, run.tolist(), self.describe)
            lengths = self._lengths[run]
            first = self._meta["dataset_from_index"][run].astype(np.int64)
            want = np.repeat(first - np.cumsum(lengths) + lengths, lengths) + np.arange(int(lengths.sum()))
            rows = _positions(columns["index"], want)
            if rows is None:
                raise ValueError(f"{where}: rows of these episodes are missing from data file "
                                 f"{self.files.where(relative)}")
            for f in features:
                values = columns.get(f)
                if values is None or isinstance(values, Exception):
                    raise ValueError(f"{where} feature {f!r}: data file {self.files.where(relative)} has no usable "
                                     f"column {f!r}: {values}")
                parts[f].append(values[rows])
        return {f: np.concatenate(p) if p else np.zeros((0, *self.features[f].shape), np.dtype(self.features[f].dtype))
                for f, p in parts.items()}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_segments", None)  # each worker stamps the videos it reads itself
        state.pop("_streams_checked", None)  # and checks them itself
        state["_videos_at"] = {}
        return state

    # -- internals -------------------------------------------------------------------------------------------
    def _undeclared_text(self) -> dict[str, dict]:
        """Text columns of the data files that meta/info.json does not declare (LeRobot's per-frame language
        columns written beside the declared ones, string columns added by a tool), from the first data file's
        schema: ``{name: spec}``, dtype "string" for plain strings and "language" for lists or structs (delivered
        as JSON text). A column named ``task`` is left out: ``task`` is the task text of ``task_index``."""
        if not len(self._lengths):
            return {}
        try:
            schema = self.files.parquet(self.data_file(0)).schema_arrow
        except (OSError, ValueError, pa.ArrowException):
            return {}  # reading it fails later, naming the episode
        out = {}
        for field in schema:
            if field.name in self.info["features"] or field.name == "task" or field.name.startswith("__"):
                continue
            kind = _text_kind(field.type)
            if kind is not None:
                out[field.name] = {"dtype": kind, "shape": [1], "names": None}
        return out

    def video_file(self, episode: int, feature: str) -> str:
        """The video file (relative to the root) holding ``episode`` of the video ``feature``."""
        chunk, file = self._fields
        return self._video_path.fill(**{
            "video_key": feature, chunk: int(self._meta[f"videos/{feature}/chunk_index"][episode]),
            file: int(self._meta[f"videos/{feature}/file_index"][episode])})

    def data_file(self, episode: int) -> str:
        """The data parquet file (relative to the root) holding the rows of ``episode``."""
        chunk, file = self._fields
        return self._data_path.fill(**{chunk: int(self._meta["data/chunk_index"][episode]),
                                       file: int(self._meta["data/file_index"][episode])})

    def _check_paths(self, where: str) -> None:
        """Every data and video file meta/episodes names lies inside the dataset (refused at open, naming info.json,
        the field and the path): each distinct (chunk, file) pair filled and checked once, the pairs found
        vectorized (a million episodes in a few files cost a few checks)."""
        checks = [("data_path", self._data_path, None, self._meta["data/chunk_index"], self._meta["data/file_index"])]
        checks += [("video_path", self._video_path, f, *self._video_columns[f][:2]) for f in self._video_keys]
        for field, template, feature, chunk, number in checks:
            for c, n in _distinct_pairs(chunk, number):
                values = {self._fields[0]: c, self._fields[1]: n, **({"video_key": feature} if feature else {})}
                relative = template.fill(**values)
                reason = self.files.outside(relative)
                if reason is not None:
                    of = f"feature {feature!r}, " if feature else ""
                    raise UnsafePathError(f"{where}: {field} {shorten(template.text)} names {shorten(relative)} ({of}"
                                          f"chunk {c}, file {n}), outside the dataset ({reason}); a dataset's files "
                                          "must lie inside its directory")

    def _check_episodes(self, sources: tuple[np.ndarray, list[str]], errors: str) -> list[dict]:
        """meta/episodes against the data (:func:`~mmfeed.loaders.sources.consistency.lerobot_episodes`: lengths,
        row ranges contiguous and inside the rows each data file's parquet footer counts, segment times), then
        keep each episode's data file (a code) for the row checks of :meth:`_data_file`. Under ``errors="skip"``
        the episodes that disagree are left out and returned as records; otherwise the first is a ValueError."""
        codes, first = file_codes(self._meta["data/chunk_index"], self._meta["data/file_index"])
        names = [self.data_file(int(e)) for e in first]
        rows = parquet_rows(self.files, names)
        videos = {f: (file_codes(chunk, number)[0], start, self._meta.get(f"videos/{f}/{_SEGMENT_END}"))
                  for f, (chunk, number, start) in self._video_columns.items()}
        verdict = lerobot_episodes(self._meta, sources[0], sources[1], codes, rows,
                                   [self.files.where(n) for n in names], videos, float(self.info["fps"]),
                                   self.tolerance_s, lambda e, f: self.files.where(self.video_file(e, f)))
        keep, skipped = settle(verdict, errors, self.root)
        if keep is not None:
            self._meta = {c: v[keep] for c, v in self._meta.items()}
            self._episode_tasks, codes = self._episode_tasks[keep], codes[keep]
            self._video_columns = {f: tuple(self._meta[f"videos/{f}/{c}"] for c in _VIDEO_COLUMNS)
                                   for f in self._video_keys}
        self._file_code = {n: c for c, n in enumerate(names)}  # data file -> code
        self._file_of = codes
        self._bad_rows: dict[str, dict[int, str]] = {}  # data file -> {episode: why its rows disagree}
        return skipped

    def _episodes_in(self, relative: str) -> np.ndarray:
        """The episodes (positions) whose rows meta/episodes places in the data file ``relative``, in order."""
        code = self._file_code.get(relative)
        if code is None:
            return np.zeros(0, np.int64)
        return np.flatnonzero(self._file_of == code)

    def _refuse_bad_rows(self, relative: str, episodes: Sequence[int], where: Any) -> None:
        """A :class:`SampleError` naming the first of ``episodes`` whose rows in data file ``relative`` disagree
        with meta/episodes (checked when the file was read: :func:`~mmfeed.loaders.sources.consistency.lerobot_rows`);
        ``where(e)`` is how the error names the episode (and feature)."""
        bad = self._bad_rows.get(relative)
        if bad:
            for e in episodes:
                if int(e) in bad:
                    raise SampleError(f"{where(int(e))}: {bad[int(e)]}")

    def _segment_frames(self, fps: float) -> dict[str, np.ndarray]:
        """Frames each camera's segment of a video holds per episode (``to_timestamp - from_timestamp`` at the
        fps), for the cameras where a segment holds fewer than its episode's steps: a recording that ended a frame
        early. Such a camera's missing frames are padding, read as its last frame; without this the next
        episode's first frame, which follows in the file, would be read as this episode's last. A segment more
        than one frame short is an error naming the episode and the camera."""
        out = {}
        for feature in self._video_keys:
            end = self._meta.get(f"videos/{feature}/{_SEGMENT_END}")
            if end is None:
                continue
            frames = np.rint((end - self._meta[f"videos/{feature}/from_timestamp"]) * fps).astype(np.int64)
            short = np.flatnonzero(frames < self._lengths)
            if not len(short):
                continue
            for e in short.tolist():
                check_stream_frames(int(frames[e]), length=int(self._lengths[e]), fps=fps, rate=fps,
                                    where=f"{self.describe(e)} feature {feature!r} ({self.video_file(e, feature)})")
            out[feature] = np.minimum(frames, self._lengths)
        return out

    def _frame_times(self, episode: int, feature: str, idx: np.ndarray) -> tuple[str | RemoteFile, np.ndarray]:
        """What the decoder opens for the episode's ``feature`` (a path, or a remote file) and the times in it of
        frames ``idx``."""
        start = float(self._video_columns[feature][2][episode])
        return self._video(episode, feature), start + idx.astype(np.float64) / float(self._fps[episode])

    def _video(self, episode: int, feature: str) -> str | RemoteFile:
        """What the decoder opens for the episode's ``feature``: a path, or a remote file (one per video file and
        process: formatting and joining its path costs more than a request's frame times)."""
        chunk, number, _ = self._video_columns[feature]
        at = (feature, int(chunk[episode]), int(number[episode]))
        video = self._videos_at.get(at)
        if video is None:
            video = self._videos_at[at] = self.files.video(self.video_file(episode, feature))
        return video

    def _segment(self, episode: int, feature: str) -> Segment | None:
        """The frame store's key of the episode's stretch of a camera's video (None without a store); the video's
        stamp (a local file's size and mtime, a remote one's size) is taken once per process."""
        if self._store is None:
            return None
        memo = self.__dict__.setdefault("_segments", {})
        segment = memo.get((episode, feature))
        if segment is None:
            video = self._video(episode, feature)
            if isinstance(video, RemoteFile):
                identity = video.key
            else:
                st = os.stat(video)
                identity = (os.path.abspath(video), st.st_size, st.st_mtime_ns)
            segment = memo[episode, feature] = Segment(
                identity=(identity, float(self._meta[f"videos/{feature}/from_timestamp"][episode]),
                          float(self._fps[episode]), self.tolerance_s, self._sizes[feature], self.frame_format,
                          self.options.backend),
                frames=int(self.frames(feature)[episode]), shape=tuple(self.features[feature].shape))
        return segment

    def _check_stream(self, cache: VideoReaderCache, feature: str, video: str | RemoteFile, where: _Where) -> None:
        """Once per video file and process (before anything of it is decoded): its stream header declares frames of
        the size meta/info.json does, and no larger than ``max_frame_pixels`` (the probe refuses those unopened)."""
        checked = self.__dict__.setdefault("_streams_checked", set())
        key = (feature, video if isinstance(video, str) else video.key)
        if key in checked:
            return
        h, w = self._declared[feature]
        try:
            info = cache.info(video)
        except FramesTooLarge as err:
            raise SampleError(f"{where}: {reason_of(err)} (meta/info.json declares {h}x{w})") from err
        except DecodeError as err:
            raise SampleError(f"{where}: {reason_of(err)}") from err
        if (info.height, info.width) != (h, w):
            raise SampleError(f"{where}: the video's frames are {info.height}x{info.width} but meta/info.json declares "
                              f"{h}x{w}")
        checked.add(key)

    def _whole(self, episode: int, feature: str, out: np.ndarray) -> FrameRequest:
        """The request for every frame of the episode's stretch of a camera's video, decoded into ``out``."""
        path, times = self._frame_times(episode, feature, np.arange(len(out), dtype=np.int64))
        return FrameRequest(path, timestamps=times, tolerance_s=self.tolerance_s, out=out)

    def _rows(self, episode: int, feature: str, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of ``feature`` in the episode's data file (image features: their encoded bytes)."""
        relative = self.data_file(episode)
        path = self.files.where(relative)
        where = f"{self.describe(episode)} feature {feature!r}"
        columns = self._data_file(relative, where)
        self._refuse_bad_rows(relative, [episode], lambda e: where)
        if feature not in columns:
            raise ValueError(f"{where}: data file {path} has no column {feature!r}")
        want = int(self._meta["dataset_from_index"][episode]) + idx
        rows = _positions(columns["index"], want)
        if rows is None:
            raise ValueError(f"{where}: rows {int(want.min())}..{int(want.max())} of the episode are missing from "
                             f"data file {path}")
        values = columns[feature]
        if isinstance(values, Exception):
            raise ValueError(f"{where}: cannot read column {feature!r} of data file {path}: {values}") from values
        return values[rows]

    def _rows_many(self, feature: str, wanted: Sequence[tuple[int, int, np.ndarray]]) -> list[np.ndarray]:
        """:meth:`_rows` of many ``(_, episode, idx)`` at once: one gather per data file and feature for a whole
        batch instead of one per sample (which costs more than the gather once samples are many and small). Any
        problem is raised by :meth:`_rows` of the request it concerns, so errors read the same."""
        episodes = np.fromiter((w[1] for w in wanted), np.int64, len(wanted))
        idx = [w[2] for w in wanted]
        got: list[np.ndarray | None] = [None] * len(wanted)
        first = self._meta["dataset_from_index"]
        for members in self._by_data_file(episodes):  # errors raise in the order the batch names the files
            e0 = int(episodes[members[0]])
            relative = self.data_file(e0)
            columns = self._data_file(relative, f"{self.describe(e0)} feature {feature!r}")
            if self._bad_rows.get(relative):  # rows that disagree with meta/episodes: the request's episode named
                self._refuse_bad_rows(relative, episodes[members].tolist(),
                                      lambda e: f"{self.describe(e)} feature {feature!r}")
            values = columns.get(feature)
            parts = [idx[k] for k in members.tolist()]
            cuts = np.zeros(len(parts) + 1, np.int64)
            np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)), out=cuts[1:])
            want = np.repeat(first[episodes[members]].astype(np.int64), np.diff(cuts)) + np.concatenate(parts)
            at = _positions(columns["index"], want)
            if values is None or isinstance(values, Exception) or at is None:
                for k in members.tolist():  # raises, naming the request's episode
                    self._rows(int(episodes[k]), feature, idx[k])
            for k, part in zip(members.tolist(), split_rows(values[at], cuts)):
                got[k] = part
        return got  # type: ignore[return-value]

    def _by_data_file(self, episodes: np.ndarray) -> list[np.ndarray]:
        """The positions in ``episodes`` grouped by the data file holding each episode's rows, the files in the
        order ``episodes`` first names them."""
        codes = self._file_of[episodes]
        if len(codes) and (codes == codes[0]).all():  # the usual batch: one data file
            return [np.arange(len(codes))]
        _, seen, inverse = np.unique(codes, return_index=True, return_inverse=True)
        return [np.flatnonzero(inverse == g) for g in np.argsort(seen, kind="stable")]

    def _data_file(self, relative: str, where: str) -> dict[str, object]:
        """Every non-video column of one data file, sorted by ``index`` (the last two files stay cached)."""
        cached = self._data_cache.get(relative)
        if cached is not None:
            return cached
        path = self.files.where(relative)
        if not self.files.exists(relative):
            raise FileNotFoundError(f"{where}: data file {path} named by meta/episodes does not exist")
        try:
            parquet = self.files.parquet(relative)
            stored = parquet.schema_arrow.names
            names = [k for k in self.features if k not in self._video_keys and k in stored]
            table = parquet.read(columns=list(dict.fromkeys(["index", *names, *(
                ["episode_index"] if "episode_index" in stored else [])])))
            if not pa.types.is_integer(table["index"].type) or table["index"].null_count:
                raise ValueError(f"column 'index' holds {table['index'].type} with {table['index'].null_count} "
                                 "empty values; expected integers, one per row")
        except (OSError, ValueError, pa.ArrowException) as err:
            reason = " ".join(str(err).split()).removeprefix(f"{path}: ")  # the file is named once
            raise ValueError(f"{where}: cannot read data file {path}: {reason}") from err
        order = np.argsort(table["index"].to_numpy(), kind="stable")
        columns: dict[str, object] = {"index": table["index"].to_numpy()[order]}
        widths: dict[str, np.ndarray] = {}  # feature -> values in each row (sorted), where some row has not its width
        for name in names:
            try:
                values, counts = self._column(name, table[name].combine_chunks())
                columns[name] = values[order]
                if counts is not None:
                    widths[name] = counts[order]
            except (ValueError, pa.ArrowException) as err:
                columns[name] = err  # raised when the feature is asked for, so other features still read
        self._bad_rows[relative] = self._check_rows(relative, path, columns["index"], table, order, widths)
        self._data_cache.put(relative, columns)
        return columns

    def _check_rows(self, relative: str, path: str, index: np.ndarray, table: pa.Table, order: np.ndarray,
                    widths: Mapping[str, np.ndarray]) -> dict[int, str]:
        """``{episode: why}`` for the episodes of data file ``relative`` whose rows there disagree with meta/episodes
        (:func:`~mmfeed.loaders.sources.consistency.lerobot_rows`: every row of its range there once, each carrying its
        episode_index) or hold a number of values other than info.json's shape declares (``widths``); read as the
        file is."""
        episodes = self._episodes_in(relative)
        lo = self._meta["dataset_from_index"][episodes].astype(np.int64)
        hi = self._meta["dataset_to_index"][episodes].astype(np.int64)
        ids = self._meta["episode_index"][episodes].astype(np.int64)
        column = None
        if "episode_index" in table.column_names:
            raw = table["episode_index"]
            if not pa.types.is_integer(raw.type) or raw.null_count:
                return {int(e): f"data file {path}: column 'episode_index' holds {raw.type} with {raw.null_count} "
                                f"empty values; expected the episode_index of every row" for e in episodes}
            column = raw.to_numpy()[order]
        bad = lerobot_rows(index, column, lo, hi, ids, path)
        for name, counts in widths.items():
            declared = list(self._specs[name].get("shape") or [1])
            rows = np.flatnonzero(counts != int(np.prod(declared)))
            owner = np.searchsorted(lo, index[rows], "right") - 1
            inside = (owner >= 0) & (index[rows] < hi[np.maximum(owner, 0)])
            for k in np.unique(owner[inside]).tolist():
                r = int(rows[inside][owner[inside] == k][0])
                bad.setdefault(k, f"data file {path}: column {name!r} holds {int(counts[r])} values in row "
                                  f"{int(index[r])} of episode {int(ids[k])}, but meta/info.json declares shape "
                                  f"{declared} ({int(np.prod(declared))} values)")
        return {int(episodes[k]): why for k, why in bad.items()}

    def _column(self, name: str, array: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
        """One parquet column as numpy ``[rows, *shape]`` in the feature's dtype (images: ``[rows]`` of bytes), and,
        where some rows of a list column hold another number of values than info.json's shape declares, the values
        in each row (those rows read as zeros; their episodes are refused). Every row wrong is a ValueError."""
        feature, spec = self.features[name], self._specs[name]
        dtype = spec["dtype"]
        if dtype == "image":
            return (array.field("bytes") if pa.types.is_struct(array.type) else array).to_numpy(
                zero_copy_only=False), None
        if dtype in _TEXT:
            return _texts(array), None
        values, rows = array, len(array)
        counts = None
        if (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)) and len(feature.shape) <= 1:
            counts = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) \
                or pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        flat = values.to_numpy(zero_copy_only=False)
        width = int(np.prod(feature.shape))
        declared = f"meta/info.json declares shape {list(spec.get('shape') or [1])} ({width} values)"
        if counts is not None and rows and (counts != width).any():
            good = counts == width
            if not good.any():
                raise ValueError(f"{int(counts[0])} values per row, but {declared}")
            out = np.zeros((rows, width), dtype=feature.dtype)
            starts = np.cumsum(counts) - counts
            out[good] = flat[starts[good][:, None] + np.arange(width)]
            return out.reshape(rows, *feature.shape), counts
        if flat.size != rows * width:
            raise ValueError(f"{flat.size} values in {rows} rows ({flat.size / max(rows, 1):g} per row), but "
                             f"{declared}")
        return flat.astype(feature.dtype, copy=False).reshape(rows, *feature.shape), None

    def _decode_images(self, episode: int, feature: str, encoded: np.ndarray, into: np.ndarray | None) -> np.ndarray:
        """PNG or JPEG bytes as uint8 ``[n, H, W, 3]`` (resized to the feature's size; yuv420: ``[n, H * 3 // 2,
        W]``), with PyAV."""
        import av

        f = self.features[feature]
        (h, w), fmt = f.frame_size, "rgb24" if f.frame_format == "rgb24" else "yuv420p"
        out = into if into is not None else np.empty((len(encoded), *f.shape), dtype=np.uint8)
        for i, data in enumerate(encoded):
            try:
                if data is None:
                    raise ValueError("the row holds no image bytes")
                limit = self.options.max_frame_pixels  # FFmpeg refuses larger pictures; the header is checked too
                with av.open(io.BytesIO(data), options=pixel_limit(limit),
                             container_options=input_options(IMAGE_FORMATS, path=False)) as container:
                    stream = container.streams.video[0]
                    check_frame_pixels(f"image {i}", stream.codec_context.height, stream.codec_context.width, limit)
                    frame = next(frames_of(container, stream))  # frames_of: no packet buffer left behind
                out[i] = frame.reformat(width=w, height=h, format=fmt).to_ndarray()
            except (av.error.FFmpegError, StopIteration, ValueError) as err:
                why = reason_of(err) if isinstance(err, FramesTooLarge) else err
                raise SampleError(f"{self.describe(episode)} feature {feature!r}: image {i} of the request cannot "
                                  f"be decoded: {why}") from err
        return out


class _Where:
    """How an error names a request's video: the episode, feature and file, written out only when one is raised."""

    __slots__ = ("source", "episode", "feature", "path")

    def __init__(self, source: LeRobotSource, episode: int, feature: str, path: Any) -> None:
        self.source, self.episode, self.feature, self.path = source, episode, feature, path

    def __str__(self) -> str:
        return f"{self.source.describe(self.episode)} feature {self.feature!r} ({self.path})"


_TEXT = ("string", "language")
"""Feature dtypes read as text: LeRobot's ``string`` and its per-frame ``language`` columns (lists of messages)."""


def _text_kind(kind: pa.DataType) -> str | None:
    """"string" for an Arrow type of plain text, "language" for lists or structs (of text, messages, ...), None for
    anything else."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_struct(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
        inner = kind
        while pa.types.is_list(inner) or pa.types.is_large_list(inner):
            inner = inner.value_type
        if pa.types.is_struct(inner) or pa.types.is_string(inner) or pa.types.is_large_string(inner):
            return "language"
    return None


def _texts(array: pa.Array) -> np.ndarray:
    """A text column as numpy object ``[rows]`` of str: plain strings as they are (an empty row ""), lists and
    structs (LeRobot's language rows: ``[{"role", "content", "style", ...}]``) as their JSON text (an empty row
    ``"[]"``)."""
    import json

    kind = array.type.value_type if pa.types.is_dictionary(array.type) else array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        values = array.to_numpy(zero_copy_only=False).astype(object)
        values[pc.is_null(array).to_numpy(zero_copy_only=False)] = ""
        return values
    if _text_kind(kind) is None:
        raise ValueError(f"the column holds {kind}; a text feature holds strings, or lists of messages (structs)")
    out = np.empty(len(array), dtype=object)
    out[:] = [("[]" if v is None else json.dumps(v, ensure_ascii=False, default=str)) for v in array.to_pylist()]
    return out


def _distinct_pairs(chunk: np.ndarray, number: np.ndarray) -> list[tuple[int, int]]:
    """The distinct ``(chunk, file)`` pairs of two per-episode columns, from the runs of equal pairs (vectorized)."""
    chunk, number = np.asarray(chunk, dtype=np.int64), np.asarray(number, dtype=np.int64)
    if not len(chunk):
        return []
    starts = np.flatnonzero(np.concatenate([[True], (chunk[1:] != chunk[:-1]) | (number[1:] != number[:-1])]))
    pairs = np.unique(np.stack([chunk[starts], number[starts]], axis=1), axis=0)
    return [(int(c), int(n)) for c, n in pairs.tolist()]


def _positions(index: np.ndarray, want: np.ndarray) -> np.ndarray | None:
    """Where the global frame indices ``want`` lie in a data file's sorted ``index`` column; None when any of them
    is missing from it."""
    rows = np.searchsorted(index, want)
    if rows.size and not np.array_equal(index[np.minimum(rows, len(index) - 1)], want):
        return None
    return rows


def _declared_size(name: str, spec: Mapping, root: str) -> tuple[int, int]:
    """``(height, width)`` of the frames one video or image entry of info.json's ``features`` declares."""
    shape = tuple(int(s) for s in spec.get("shape") or ())
    if len(shape) != 3:
        raise ValueError(f"{root}: feature {name!r} ({spec.get('dtype')}) has shape {list(shape)}; expected [H, W, 3]")
    channels_first = list(spec.get("names") or [])[:1] == ["channels"]
    h, w = shape[1:3] if channels_first else shape[:2]
    return h, w


def _feature(name: str, spec: Mapping, fps: float, size: tuple[int, int] | None, root: str,
             frame_format: str = "rgb24") -> Feature:
    """The :class:`Feature` that one entry of info.json's ``features`` declares (frames in ``frame_format``)."""
    dtype, shape = spec.get("dtype"), tuple(int(s) for s in spec.get("shape") or ())
    if dtype in _FRAMES:
        h, w = size or _declared_size(name, spec, root)
        try:
            step = frame_step_shape(h, w, frame_format)
        except ValueError as err:
            raise ValueError(f"{root}: feature {name!r}: {err}; give an even frame_size") from err
        return Feature("video", "uint8", step, fps, frame_format=frame_format)
    if dtype in _TEXT:
        return Feature("text", "object", (), fps)
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as err:
        raise ValueError(f"{root}: feature {name!r} has dtype {dtype!r}, which mmfeed cannot read") from err
    if np_dtype.kind not in "biuf":
        raise ValueError(f"{root}: feature {name!r} has dtype {dtype!r}, which mmfeed cannot read")
    return Feature("array", np_dtype, () if shape == (1,) else shape, fps)


_EPISODE_FILE = re.compile(r"meta/episodes/chunk-(\d+)/file-(\d+)\.parquet")


def _episode_files(files: DatasetFiles, info: Mapping) -> list[str]:
    """The files of ``meta/episodes``, in (chunk, file) order. Where the store cannot list folders (plain HTTP),
    they are found in the order LeRobot writes them: file after file of a chunk, ``chunks_size`` files a chunk,
    until the next one does not exist."""
    found = files.glob("meta/episodes/chunk-*/file-*.parquet")
    if found is None:
        found, chunk, file, per_chunk = [], 0, 0, max(int(info.get("chunks_size") or 1000), 1)
        while files.exists(name := f"meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"):
            found.append(name)
            chunk, file = (chunk + 1, 0) if file + 1 >= per_chunk else (chunk, file + 1)
    numbered = [(tuple(int(g) for g in m.groups()), f) for f in found if (m := _EPISODE_FILE.fullmatch(f))]
    return [f for _, f in sorted(numbered)]


EPISODES_VERSION = 1
"""The version of what :func:`_read_episodes` derives (part of its per-node cache key)."""

CACHE_MIN_BYTES = 1 << 20
"""meta/episodes files smaller than this in all are read at every open; larger ones are derived once per node and
mapped after (:mod:`mmfeed.loaders.stores.derived`)."""

CHILDREN_MIN_BYTES = 64 << 20
"""Local meta/episodes files this large in all (about 90k episodes in LeRobot's layout) are read from their bytes
by :mod:`mmfeed.loaders.stores.parquet_direct` where its compiled kernels are in numba's cache, else (or where a
file is outside what it reads) in child processes (:mod:`mmfeed.loaders.stores.parquet_children`): their footers
are parsed side by side and what the parse leaves stays out of this process. Smaller ones are read here, in
threads."""


def _read_episodes(files: DatasetFiles, info: Mapping, video_keys: Sequence[str], tasks: Sequence[str]
                   ) -> tuple[dict[str, np.ndarray], np.ndarray, tuple[np.ndarray, list[str]]]:
    """The columns of meta/episodes planning and reads need, sorted by episode_index, each episode's task id
    (-1 where it lists several, or none: its rows then say), and which file each episode's row came from (an
    index into the files' paths, given beside it, for messages). Any number of files and row groups, task lists
    as list or large_list of plain or dictionary-encoded strings; the per-episode stats columns are never read.
    Whether the rows agree with the data is :func:`~mmfeed.loaders.formats.lerobot.metadata.lerobot_episodes`' to
    say.

    LeRobot flushes meta/episodes every ten episodes, so a million episodes carry footers of 100k row groups that
    pyarrow parses in seconds: large local files (:data:`CHILDREN_MIN_BYTES`) are read from their bytes by compiled
    kernels where numba's cache holds them (:mod:`~mmfeed.loaders.stores.parquet_direct`, a file at a time in
    threads); the files that declines, or all, in child processes, which parse their footers side by side and keep
    what the parse leaves (:mod:`~mmfeed.loaders.stores.parquet_children`); small ones, or those where a child
    fails, in parallel threads through Arrow's jemalloc pool, which gives its pages back after, the C heap the
    parsed footers leave then given back to the system (``malloc_trim``). What is derived is kept once per node
    (:mod:`~mmfeed.loaders.stores.derived`, keyed by every file's size and mtime) for every later open to map."""
    paths = _episode_files(files, info)
    if not paths:
        raise FileNotFoundError(f"{files.root}: no meta/episodes/chunk-*/file-*.parquet files")
    stamps = [(p, *stat_file(files.where(p))) for p in paths]
    key = None
    if sum(size for _, size, _ in stamps) >= CACHE_MIN_BYTES:
        key = derived.key_of("lerobot-episodes", EPISODES_VERSION, files.root, stamps, list(video_keys),
                             hashlib.sha1("\0".join(tasks).encode()).hexdigest())
        hit = derived.load(key)
        if hit is not None:
            arrays, extra = hit
            task, came = arrays.pop("__task__"), arrays.pop("__source__")
            return arrays, task, (came, extra["sources"])
    wanted = [*_EPISODE_COLUMNS, *(f"videos/{k}/{c}" for k in video_keys for c in _VIDEO_COLUMNS)]
    ends = [f"videos/{k}/{_SEGMENT_END}" for k in video_keys]
    lookup = _large_strings(tasks)
    read: list = [None] * len(paths)  # each file's columns and task ids, as they are read
    large = not files.remote and sum(size for _, size, _ in stamps) >= CHILDREN_MIN_BYTES
    side_by_side = max(1, min(len(paths), os.cpu_count() or 1, 4))  # files read at once, whichever way
    if large and direct_ready():
        with ThreadPoolExecutor(side_by_side) as pool:
            direct = list(pool.map(lambda p: read_direct(files.local_path(p), [*wanted, *ends], ["tasks"]), paths))
        texts = {t: k for k, t in reversed(list(enumerate(tasks)))}
        read = [None if d is None else _direct_columns(d, files.where(p), wanted, ends, texts)
                for d, p in zip(direct, paths)]
    rest = [k for k, r in enumerate(read) if r is None]  # what the bytes reader declined (or all): pyarrow reads
    tables = read_columns([files.local_path(paths[k]) for k in rest], [*wanted, *ends, "tasks"],
                          processes=min(side_by_side, len(rest))) if rest and large else None
    if tables is not None:
        for k, table in zip(rest, tables):
            read[k] = _episode_columns(table, files.where(paths[k]), wanted, ends, lookup)
    elif rest:
        try:
            with reading_pool(), ThreadPoolExecutor(min(side_by_side, len(rest))) as pool:
                got = list(pool.map(lambda k: _read_episode_file(files, paths[k], wanted, ends, lookup), rest))
        finally:  # the parsed footers are freed into glibc's heap, which keeps them (a GB at a million episodes)
            release_free_heap()
        for k, columns in zip(rest, got):
            read[k] = columns
    kept = [c for c in ends if all(c in columns for columns, _ in read)]  # ends kept only where every file has them
    meta = {c: np.concatenate([columns[c] for columns, _ in read]) for c in [*wanted, *kept]}
    task = np.concatenate([t for _, t in read])
    came = np.concatenate([np.full(len(t), k, dtype=np.int32) for k, (_, t) in enumerate(read)])
    order = meta["episode_index"]
    if (np.diff(order) < 0).any():
        order = np.argsort(order, kind="stable")
        meta, task, came = {c: v[order] for c, v in meta.items()}, task[order], came[order]
    sources = [files.where(p) for p in paths]
    if key is not None:
        derived.save(key, {**meta, "__task__": task, "__source__": came}, {"sources": sources})
    return meta, task, (came, sources)


def _large_strings(texts: Sequence[str]) -> pa.Array:
    """``texts`` as an Arrow large_string array, built from its buffers: ``pa.array`` of Python strings imports
    pandas (half a second) to ask whether they are a pandas object."""
    encoded = [t.encode("utf-8") for t in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))


def _read_episode_file(files: DatasetFiles, relative: str, wanted: Sequence[str], ends: Sequence[str],
                       lookup: pa.Array) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One meta/episodes file's ``wanted`` columns and those of ``ends`` it has (numpy), and its episodes' task
    ids; ValueError naming the file for a missing, empty or mistyped column."""
    where = files.where(relative)
    parquet = files.parquet(relative)
    present = set(parquet.schema_arrow.names)
    columns = [c for c in (*wanted, *ends, "tasks") if c in present]  # a missing one is named after the read
    try:
        table = parquet.read(columns=columns)
    except pa.ArrowNotImplementedError:  # a list of dictionary strings over several row groups, which the
        # file reader cannot return as one array: read it row group by row group
        table = pq.read_table(files.open(relative), columns=columns)
    return _episode_columns(table, where, wanted, ends, lookup)


def _episode_columns(table: pa.Table, where: str, wanted: Sequence[str], ends: Sequence[str], lookup: pa.Array
                     ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """:func:`_read_episode_file` of a meta/episodes file's columns already read (``table``: those of ``wanted``,
    ``ends`` and ``tasks`` it has); ``where`` names the file."""
    present = table.column_names
    missing = [c for c in wanted if c not in present]
    if missing:
        raise ValueError(f"{where}: meta/episodes has no columns {missing}")
    has = [c for c in ends if c in present]
    out = {}
    for c in [*wanted, *has]:
        if table[c].null_count:
            raise ValueError(f"{where}: column {c!r} has {table[c].null_count} empty values")
        kind = table[c].type
        if not (pa.types.is_integer(kind) or c.endswith("timestamp") and pa.types.is_floating(kind)):
            raise ValueError(f"{where}: column {c!r} holds {kind}; expected "
                             f"{'seconds (numbers)' if c.endswith('timestamp') else 'integers'}")
        out[c] = numpy_of(table[c])
    if "tasks" in present:
        task = _episode_task_ids(table["tasks"], lookup, table["episode_index"], where)
    else:
        task = np.full(table.num_rows, -1, dtype=np.int64)
    return out, task


def _direct_columns(read: DirectRead, where: str, wanted: Sequence[str], ends: Sequence[str],
                    texts: Mapping[str, int]) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """:func:`_episode_columns` of a file read from its bytes (``texts``: each task's id); None where a wanted
    column is missing or of another kind (pyarrow then reads the file, and its error names the column)."""
    for c in [*wanted, *ends]:
        values = read.numbers.get(c)
        if values is None and c in wanted or values is not None and not (
                values.dtype.kind == "i" or c.endswith("timestamp") and values.dtype.kind == "f"):
            return None
    out = {c: read.numbers[c] for c in [*wanted, *ends] if c in read.numbers}
    lists = read.lists.get("tasks")
    if lists is None:
        return out, np.full(read.rows, -1, dtype=np.int64)
    ids = np.array([texts.get(t, -1) for t in lists.entry_texts()], dtype=np.int64)[lists.elements]
    return out, _single_task_ids(lists.counts, ids, where, lambda row: out["episode_index"][row],
                                 lambda k: lists.texts()[k])


def _episode_task_ids(column: pa.ChunkedArray, lookup: pa.Array, episodes: pa.ChunkedArray, where: str) -> np.ndarray:
    """The task id of each episode whose ``tasks`` list holds one text, -1 where it holds several or none; a text
    missing from tasks.parquet is an error naming the episode. Chunk by chunk (row groups), whatever the list
    and string types and encoding."""
    out, seen = [], 0
    try:  # one chunk: LeRobot's row groups of ten episodes are 100k chunks at a million episodes
        column = pa.chunked_array([column.combine_chunks()])
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # dictionaries that differ between row groups, say
        pass
    for chunk in column.chunks:
        kind = chunk.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            counts = numpy_of(pc.list_value_length(chunk), fill=0).astype(np.int64)
            values = pc.list_flatten(chunk)
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind):
            counts, values = numpy_of(chunk.is_valid()).astype(np.int64), chunk.drop_null()
        else:
            raise ValueError(f"{where}: column 'tasks' is {kind}; expected a list of task texts")
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        values = values.cast(pa.large_string())
        ids = numpy_of(pc.index_in(values, value_set=lookup), fill=-1)
        out.append(_single_task_ids(counts, ids, where, lambda row, at=seen: episodes[at + row].as_py(),
                                    lambda k, texts=values: texts[k].as_py()))
        seen += len(counts)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _single_task_ids(counts: np.ndarray, ids: np.ndarray, where: str, episode_of: Callable[[int], object],
                     text_of: Callable[[int], str]) -> np.ndarray:
    """Each row's task id where its list holds one text, -1 where it holds several or none, from each row's
    count of texts and every text's id, row after row (-1: not in tasks.parquet, an error naming the row's
    episode, ``episode_of(row)``, and the text, ``text_of(k)``)."""
    if (ids < 0).any():
        k = int(np.flatnonzero(ids < 0)[0])
        row = int(np.searchsorted(np.cumsum(counts), k, side="right"))
        raise ValueError(f"{where} episode {episode_of(row)}: task {text_of(k)!r} is not in meta/tasks.parquet")
    task = np.full(len(counts), -1, dtype=np.int64)
    single = counts == 1
    task[single] = ids[(np.cumsum(counts) - counts)[single]]
    return task


def _read_stats(files: DatasetFiles) -> dict[str, dict[str, np.ndarray]]:
    """meta/stats.json as float64 arrays per feature and statistic; a value that is no number or nested list of
    numbers is a ValueError naming the file, the feature and the statistic."""
    where = files.where("meta/stats.json")
    raw = files.read_json("meta/stats.json")
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a JSON object {{feature: {{statistic: values}}}}, got "
                         f"{type(raw).__name__}")
    out = {}
    for feature, stats in raw.items():
        if not isinstance(stats, dict):
            continue
        for name, value in stats.items():
            try:
                out.setdefault(feature, {})[name] = np.asarray(value, dtype=np.float64)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{where}: feature {feature!r} statistic {name!r} is not numbers (or nested lists "
                                 f"of them of one shape): {' '.join(str(err).split())[:80]}") from err
    return out


def _read_tasks(files: DatasetFiles) -> list[str]:
    """Task texts ordered by task_index. LeRobot writes a pandas frame indexed by the text, which parquet keeps as
    a column named ``task`` (a named index) or ``__index_level_0__`` (an unnamed one)."""
    path = files.where("meta/tasks.parquet")
    if not files.exists("meta/tasks.parquet"):
        raise FileNotFoundError(f"{path} does not exist; a LeRobot v3 dataset lists its tasks there")
    table = files.parquet("meta/tasks.parquet").read()
    text = next((c for c in ("task", "__index_level_0__") if c in table.column_names), None)
    if text is None or "task_index" not in table.column_names:
        raise ValueError(f"{path}: expected columns task_index and task (or the index __index_level_0__), got "
                         f"{table.column_names}")
    ids = numpy_of(table["task_index"].combine_chunks())  # to_numpy would import pandas (0.5 s of a warm open)
    if sorted(ids.tolist()) != list(range(len(ids))):
        raise ValueError(f"{path}: task_index must number the tasks 0..{len(ids) - 1}, got {sorted(ids.tolist())}")
    texts = table[text].to_pylist()
    return [str(texts[i]) for i in np.argsort(ids)]
