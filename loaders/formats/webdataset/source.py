"""Webdataset shards (format v2, and v1 shards) as an :class:`~mmfeed.loaders.sources.base.EpisodeSource`.

The index (:mod:`mmfeed.loaders.stores.index`) gives every episode's length, rates, frame counts, task and
stats, and where each feature's member lies in its shard. Planning uses the index alone; a worker reads exactly
the members a batch needs (one seek and read each, a range request for URLs), keeps the last few episodes'
bytes, loads npy members whole and decodes each needed group of pictures once for every frame the batch wants::

    >>> src = WebDatasetSource("shards/")                                      # doctest: +SKIP
    >>> [out] = src.read_many([EpisodeRequest(0, {"observation.state": np.arange(4),
    ...                                           "observation.images.cam_high": np.array([0, 15])})])  # doctest: +SKIP

Shards without an index (or beside a version 1 index) are indexed in memory when opened, with a log line
suggesting ``mmfeed index`` to make that a one-time cost.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from mmfeed.codecs.arrays import MAX_HEADER_BYTES, load_npy
from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.colour import frame_step_shape
from mmfeed.codecs.errors import DecodeError
from mmfeed.loaders.clock import stage
from mmfeed.loaders.sources.base import LRU, EpisodeRequest, EpisodeSource, Feature
from mmfeed.loaders.formats.webdataset.metadata import index_episodes
from mmfeed.loaders.sources.consistency import settle
from mmfeed.loaders.transport.errors import SampleError, reason_of
from mmfeed.loaders.transport.confine import check_shards
from mmfeed.loaders.stores.frame_store import Segment, decode_stored, stored
from mmfeed.loaders.stores.index import (
    INDEX_FILENAME,
    INDEX_VERSION,
    build_index,
    dataset_stats,
    default_index_path,
    index_version,
    memory_table,
    resolve_shard,
)
from mmfeed.loaders.stores.index_arrays import IndexArrays, derive, index_arrays, stale
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.sources.readers import ReaderCaches
from mmfeed.loaders.transport.tar import read_member, stat_file

__all__ = ["WebDatasetSource", "expand_shards"]

log = logging.getLogger(__name__)



def expand_shards(spec: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Shard paths from a directory (its ``*.tar``), a brace pattern (``shard-{000000..000009}.tar``), a glob,
    a URL or a list of any of these, in sorted order within each pattern.

    >>> expand_shards("s3://bucket/shard-{000000..000002}.tar")[-1]
    's3://bucket/shard-000002.tar'
    """
    import braceexpand

    if isinstance(spec, (list, tuple)):
        return [s for item in spec for s in expand_shards(item)]
    spec = os.fspath(spec)
    if "://" in spec and not spec.startswith("file://"):
        return list(braceexpand.braceexpand(spec))
    spec = spec.removeprefix("file://")
    if os.path.isdir(spec):
        shards = sorted(glob.glob(os.path.join(spec, "*.tar")))
        if not shards:
            raise FileNotFoundError(f"{spec}: directory holds no .tar shards (webdataset shards are uncompressed "
                                    "*.tar files; nor is it a LeRobot v3 directory, which holds meta/info.json)")
        return shards
    shards = []
    for pattern in braceexpand.braceexpand(spec):
        shards.extend(sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern])
    missing = [s for s in shards if not os.path.exists(s)]
    if missing or not shards:
        raise FileNotFoundError(f"{spec}: no such shard(s): {missing[:3] or [spec]}")
    return shards


class WebDatasetSource(EpisodeSource):
    """Episodes in webdataset shards, every member a feature under its own name.

    path: a directory of shards, a brace pattern, a glob, a URL pattern, a list of them, or an index file.
    options: how it is read (:class:`~mmfeed.loaders.sources.options.ReadOptions`: backend, frame_size,
        frame_format, decoder_threads, cache_episodes, check_index, cache, cache_bytes), or its fields as keyword
        arguments.
    """

    FORMAT = "webdataset shards"
    READ_OPTIONS = ("backend", "frame_size", "frame_format", "decoder_threads", "cache_episodes", "check_index",
                    "cache", "cache_bytes", "device", "max_frame_pixels", "errors")
    """The :class:`~mmfeed.loaders.sources.options.ReadOptions` this format reads."""

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike], options: ReadOptions | None = None,
                 **kwargs: Any) -> None:
        options = ReadOptions.of(options, **kwargs)
        options.refuse_others(self.READ_OPTIONS, self.FORMAT, str(path))
        self._set_options(options, options.cache_episodes)
        arrays, index_path, indexed = _open_index(path, options.check_index)
        self._from_arrays(arrays, index_path, str(index_path if indexed else path), options)

    @classmethod
    def from_memory(cls, name: str, episodes: Sequence[tuple[str, Mapping[str, bytes]]],
                    options: ReadOptions | None = None, **kwargs: Any) -> WebDatasetSource:
        """The episodes ``(key, {member name after the key: bytes})`` held in memory (a stream's, as
        :func:`~mmfeed.loaders.transport.tar.iter_shard` yields them), read exactly as indexed shards are."""
        self = cls.__new__(cls)
        options = ReadOptions.of(options, **kwargs)
        self._set_options(options, max(1, len(episodes)))
        kept = self._from_arrays(IndexArrays(derive(memory_table(name, episodes))), name, name, options)
        self._held = [dict(members) for k, (_, members) in enumerate(episodes) if kept is None or kept[k]]
        return self

    def _set_options(self, options: ReadOptions, cache_episodes: int) -> None:
        self.options = options
        self.backend, self.frame_format, self.decoder_threads = options.backend, options.frame_format, \
            options.decoder_threads
        self.cache_episodes = cache_episodes
        self._store = options.frame_store()

    def _from_arrays(self, arrays: IndexArrays, index_path: str, name: str, options: ReadOptions
                     ) -> np.ndarray | None:
        """Bind the index ``arrays``; returns which episodes were kept (None: all, else ``errors="skip"`` left out
        those whose lengths, rates or frame counts are impossible:
        :func:`~mmfeed.loaders.sources.consistency.index_episodes`)."""
        self.name = name
        self._held: list[dict[str, bytes]] | None = None
        if len(arrays) == 0:
            raise ValueError(f"{self.name}: the shards hold no episodes")
        self._index = arrays
        self._shards = [resolve_shard(index_path, s) for s in arrays.shards]
        kept, self.skipped = settle(index_episodes(arrays, self._shards, self.name), options.errors, self.name)
        if kept is not None:
            self._index = arrays = arrays.select(kept)
        self.tasks = list(arrays.tasks)
        videos = [f for f, c in arrays.features.items() if c["kind"] == "video"]
        for f in videos:
            options.check_frame_pixels(self.name, f, *arrays.features[f]["shape"][:2])
        _check_members(arrays, self._shards, self.name, options.check_index)
        self._sizes = options.frame_sizes(videos, list(arrays.features), self.name)
        self._bind()
        self.features = {f: self._feature(f, c) for f, c in arrays.features.items()}
        self.stats = dataset_stats(pa.table({}).replace_schema_metadata({"mmfeed": arrays.metadata}))
        self._bytes = LRU(self.cache_episodes * len(self.features))  # (episode, feature) -> member bytes
        self._arrays = LRU(self.cache_episodes * len(self.features))  # (episode, feature) -> decoded array
        self._videos = ReaderCaches()  # the decoders, by output frame size
        self._checked: set[tuple[int, str]] = set()
        self._lock = threading.Lock()  # guards _checked: one source may serve loaders in several threads
        return kept

    def _feature(self, name: str, column: Mapping) -> Feature:
        """The Feature of one index column: video frames at their decode size, in the source's frame format."""
        if column["kind"] != "video":
            return Feature(column["kind"], column["dtype"], column["shape"], float(column["fps"][0]))
        h, w = self._sizes.get(name) or tuple(column["shape"][:2])
        try:
            shape = frame_step_shape(h, w, self.frame_format)
        except ValueError as err:
            raise ValueError(f"{self.name} feature {name!r}: {err}; give an even frame_size") from err
        return Feature("video", column["dtype"], shape, float(column["fps"][0]), frame_format=self.frame_format)

    def frame_shape(self, episode: int, feature: str) -> tuple[int, int] | None:
        """``(height, width)`` of a video feature's decoded pictures (in either frame format), else None."""
        f = self.features.get(feature)
        return f.frame_size if f is not None else None

    def episode_id(self, episode: int) -> str:
        """The webdataset key of ``episode``."""
        return self._ids[self._check_episode(episode)].as_py()

    def step_tasks(self, episode: int) -> np.ndarray:
        """The task id of every step of ``episode``, int64 ``[T]`` (from the index's task runs where it changes)."""
        e = self._check_episode(episode)
        if e not in self._task_runs:
            return super().step_tasks(e)
        starts, ids = self._task_runs[e]
        return ids[np.searchsorted(starts, np.arange(self._lengths[e]), side="right") - 1]

    def member_bytes(self, episode: int, feature: str) -> bytes:
        """The stored bytes of one feature's member (an mp4 as it is in the shard, or the npy file)."""
        self._check_feature(feature)
        return self._member(self._check_episode(episode), feature)

    def describe(self, episode: int) -> str:
        """Where an episode lives, for error messages: its shard and key."""
        return f"{self._shards[self._shard_of[episode]]} key {self._ids[episode].as_py()!r}"

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested frames of each request: npy members loaded whole (per episode) and indexed, every video
        request of the batch decoded in one pass per frame size (each GOP once)."""
        out: list[dict[str, np.ndarray]] = [{} for _ in requests]
        videos: dict[tuple[int, int] | None, list[tuple]] = {}  # size -> (request, r, feature, where, segment, idx)
        self._check_requests(requests)
        for r, request in enumerate(requests):
            e = request.episode
            for feature, idx in request.indices.items():
                idx = np.asarray(idx, dtype=np.int64)
                if self.features[feature].kind != "video":
                    out[r][feature] = self._array(e, feature)[idx]
                    continue
                given = request.out.get(feature) if request.out else None
                segment = self._segment(e, feature)
                frames = stored(self._store, segment, idx, given)
                if frames is not None:
                    out[r][feature] = frames  # no member read, no decode
                    continue
                data = self._member(e, feature)
                where = f"{self.describe(e)} feature {feature!r}"
                self._check_video(e, feature, data, where)
                videos.setdefault(self._sizes.get(feature), []).append(
                    (FrameRequest(data, indices=idx, out=given), r, feature, where, segment, idx))
        for size, batch in videos.items():
            with stage("decode"):
                decoded = decode_stored(self._store, self._cache(size), [b[0] for b in batch], [b[3] for b in batch],
                                        [b[4] for b in batch], [b[5] for b in batch],
                                        lambda k, into: FrameRequest(batch[k][0].path, indices=np.arange(len(into)),
                                                                     out=into))
            for (_, r, feature, *_), frames in zip(batch, decoded):
                out[r][feature] = frames
        return out

    def episode(self, index: int) -> dict:
        """The whole episode (every feature, videos decoded), ``task``, ``fps`` and ``episode_id``."""
        return {**super().episode(index), "episode_id": self._ids[index].as_py()}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        for key in _BOUND:  # views of the index arrays: rebound from them (a mapped index travels as its path)
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._bind()

    def _bind(self) -> None:
        """Attributes that are views of the index arrays (numpy over mapped pages, Arrow strings)."""
        arrays = self._index
        self._shard_of = arrays.shard_of
        self._ids = arrays.ids
        self._lengths = np.asarray(arrays.lengths, dtype=np.int64)
        self._fps = np.asarray(arrays.fps, dtype=np.float64)
        self._episode_tasks = np.asarray(arrays.task_of, dtype=np.int64)
        self._task_runs = arrays.runs
        columns = arrays.features
        self._stored_shape = {f: c["shape"] for f, c in columns.items()}
        self._rates = {f: np.asarray(c["fps"], dtype=np.float64) for f, c in columns.items()}
        self._frames = {f: np.asarray(c["frames"], dtype=np.int64) for f, c in columns.items()}
        self._members = {f: (np.asarray(c["offset"], dtype=np.int64), np.asarray(c["size"], dtype=np.int64))
                         for f, c in columns.items()}
        self._member_names = {f: c["member"] for f, c in columns.items()}

    # -- internals -------------------------------------------------------------------------------------------
    def _segment(self, episode: int, feature: str) -> Segment | None:
        """The frame store's key of one episode's video member (None without a store, or for episodes held in
        memory): the shard with the size and mtime the index recorded, and where the member lies in it."""
        if self._store is None or self._held is not None:
            return None
        shard = self._shard_of[episode]
        offsets, sizes = self._members[feature]
        size = self._sizes.get(feature)
        stamp = tuple(self._index.shard_stamps[shard])
        if None in stamp:  # indexed in memory: the shard's stamp now (once per process)
            stamp = self.__dict__.setdefault("_stamps", {}).get(shard) or self._stamps.setdefault(
                shard, stat_file(self._shards[shard]))
        return Segment(identity=(self._shards[shard], stamp, int(offsets[episode]),
                                 int(sizes[episode]), size, self.frame_format, self.backend),
                       frames=int(self._frames[feature][episode]), shape=tuple(self.features[feature].shape))

    def _member(self, episode: int, feature: str) -> bytes:
        if self._held is not None:
            return self._held[episode][self._member_names[feature][episode].as_py()]
        key = (episode, feature)
        data = self._bytes.get(key)
        if data is not None:
            return data
        offsets, sizes = self._members[feature]
        with stage("read"):
            data = read_member(self._shards[self._shard_of[episode]], offsets[episode], sizes[episode], member=True)
        self._bytes.put(key, data)
        return data

    def _array(self, episode: int, feature: str) -> np.ndarray:
        """An array member decoded once and kept beside the member bytes (consecutive samples of an episode read
        the same arrays); callers index it, which copies, so the kept array is never changed."""
        key = (episode, feature)
        array = self._arrays.get(key)
        if array is not None:
            return array
        f = self.features[feature]
        array = load_npy(self._member(episode, feature), key=f"{self.describe(episode)} feature {feature!r}",
                         expect_dtype=f.dtype, expect_shape=(int(self._frames[feature][episode]), *f.shape))
        self._arrays.put(key, array)
        return array

    def _cache(self, size: tuple[int, int] | None) -> VideoReaderCache:
        """The decoder cache of one frame size (it keeps one decoder per thread)."""
        return self._videos.get(size, self.options.decode, lambda: [
            self._stored_shape[f] for f, feat in self.features.items()
            if feat.kind == "video" and self._sizes.get(f) is None])

    def _check_video(self, episode: int, feature: str, data: bytes, where: str) -> None:
        """Once per video: it opens, has the frame size and at least the frames the index promises. Its reader
        stays open in the cache, so the batch decode does not probe it again."""
        if (episode, feature) in self._checked:
            return
        cache = self._cache(self._sizes.get(feature))
        promised, stored = int(self._frames[feature][episode]), self._stored_shape[feature]
        with stage("decode"):
            try:
                info = cache.info(data)  # the stream header, nothing decoded (frames past max_frame_pixels refused)
                if info.num_frames < promised or (info.height, info.width) != stored[:2]:
                    raise SampleError(f"{where}: the video holds {info.num_frames} frames of {info.height}x"
                                      f"{info.width} but the index promises {promised} of {stored[0]}x{stored[1]}; "
                                      "rebuild it with `mmfeed index`")
                cache.reader(data, info)
            except DecodeError as err:
                raise SampleError(f"{where}: {reason_of(err)}") from err
        self._checked.add((episode, feature))


def _check_members(arrays: IndexArrays, shards: Sequence[str], name: str, sized: bool) -> None:
    """Every npy member's size is at most what its feature's dtype, step shape and frame count take, plus a
    header of at most :data:`~mmfeed.codecs.arrays.MAX_HEADER_BYTES`, and, where ``sized`` (``check_index``: the
    shards still have the sizes the index recorded), every member lies inside its shard's bytes: a reader never
    asks for more bytes than a shard or an array can hold (without ``check_index``,
    :func:`~mmfeed.loaders.transport.tar.read_member` compares each read with the shard's size). Vectorized over the
    episodes; ValueError naming the index, the shard and key, the feature and the limit."""
    recorded = np.array([np.nan if size is None or not sized else size for size, _ in arrays.shard_stamps],
                        np.float64)
    shard_size = recorded[np.asarray(arrays.shard_of, np.int64)]
    for feature, column in arrays.features.items():
        offsets, sizes = (np.asarray(column[k], np.int64) for k in ("offset", "size"))
        bad = (offsets < 0) | (sizes < 0) | (offsets.astype(np.float64) + sizes > shard_size)  # NaN: unknown size
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            where = f"{shards[arrays.shard_of[e]]} key {arrays.ids[e].as_py()!r}"
            raise ValueError(f"{name}: feature {feature!r} of {where}: the index places its member at bytes "
                             f"{int(offsets[e])}..{int(offsets[e]) + int(sizes[e])}, outside the shard's "
                             f"{shard_size[e]:.0f} bytes; "
                             "rebuild the index with `mmfeed index`")
        if column["kind"] != "array":
            continue
        per_frame = float(np.prod(column["shape"], dtype=object) * np.dtype(column["dtype"]).itemsize)
        need = np.asarray(column["frames"], np.float64) * per_frame  # floats: a lying frame count cannot overflow
        bad = ~(sizes - need <= 12 + MAX_HEADER_BYTES)  # longer than the .npy header and the array (shorter ones
        # are read, and called truncated, as a sample's error)
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            where = f"{shards[arrays.shard_of[e]]} key {arrays.ids[e].as_py()!r}"
            raise ValueError(f"{name}: feature {feature!r} of {where}: the index gives its .npy member {sizes[e]} "
                             f"bytes, but {int(column['frames'][e])} frames of {column['dtype']} "
                             f"{list(column['shape'])} take {need[e]:.0f} bytes and a header of at most "
                             f"{12 + MAX_HEADER_BYTES}; rebuild the index with `mmfeed index`")


def _open_index(path, check_index: bool) -> tuple[IndexArrays, str, bool]:
    """The index arrays of ``path``, the path it is (or would be) stored at, and whether it was read from there."""
    index_path = _index_path(path)
    try:
        if index_path is not None and os.path.isdir(os.fspath(path)) and index_version(index_path) == 1:
            log.warning("%s is a version 1 index: indexing the shards in memory instead; rebuild it with `mmfeed "
                        "index`", index_path)
            index_path = None
        arrays = index_arrays(index_path) if index_path is not None else None
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        # a torn or overwritten file, which the reader's words do not name (pyarrow's IO errors are plain OSError);
        # a missing file, a refused credential or a failing store (OSError's subclasses) say what they are
        if isinstance(err, OSError) and type(err) is not OSError:
            raise
        shards = os.path.dirname(index_path) or "."
        raise ValueError(f"{index_path}: not a readable index (corrupt or not parquet: {' '.join(str(err).split())}); "
                         f"rebuild it with `mmfeed index {shards}`") from err
    if index_path is not None:
        check_shards(index_path, arrays.shards)  # before anything stats or reads one: none outside the index's folder
        changed = stale(index_path, arrays) if check_index else []
        if changed:
            raise ValueError(f"{index_path} is out of date with its shards (changed or missing: {changed[:5]}); "
                             "rebuild it with `mmfeed index`")
        return arrays, index_path, True
    shards = expand_shards(path)
    log.info("indexing %d shard(s) in memory (no version %d %s beside them); `mmfeed index` makes this a one-time "
             "cost", len(shards), INDEX_VERSION, INDEX_FILENAME)
    return IndexArrays(derive(build_index(shards))), default_index_path(shards), False


def _index_path(path) -> str | None:
    """The index file for ``path``: the path itself if it is one, else ``<dir>/mmfeed-index.parquet`` if present."""
    if isinstance(path, (list, tuple)):
        return None
    path = os.fspath(path)
    if path.endswith(".parquet") and ("://" in path or os.path.isfile(path)):
        return path
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, INDEX_FILENAME)):
        return os.path.join(path, INDEX_FILENAME)
    return None


# attributes of a source that are views of its index arrays (rebound after unpickling)
_BOUND = ("_shard_of", "_ids", "_lengths", "_fps", "_episode_tasks", "_task_runs", "_stored_shape", "_rates",
          "_frames", "_members", "_member_names")
