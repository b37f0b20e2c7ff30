"""RLDS datasets (Open X-Embodiment, DROID, Bridge: what TFDS writes) as an :class:`EpisodeSource`, without
TensorFlow.

One record of a split is one episode. Opening reads ``dataset_info.json`` and ``features.json``
(:mod:`.metadata`) and the sidecar index (:mod:`.index`: built by one scan of every shard the first time, then
kept in the cache). From a local shard, a worker reads only what a request asks for: the keys of its features
and its own pictures, each a range read checked against the CRC-32C the index keeps (:mod:`.ranges`); from a
remote one, and for :meth:`RldsSource.episode`, it reads the episode's whole record (both CRCs checked:
:mod:`.tfrecord`). Either way mmfeed's own ``tf.train.Example`` decoder (:mod:`.example`) decodes it and the
worker delivers the steps a request asks for::

    >>> ds = open_dataset("gs-mirror/bridge/1.0.0", fps=5)                              # doctest: +SKIP
    >>> ds.features["observation.image"], ds.task(0, 3)                                 # doctest: +SKIP

Features are the step features under their path below ``steps`` with "." between levels
(``observation.image``, ``action``, ``is_first``), each in features.json's dtype (float64 where it says so, though
the records hold float32; bools as bool), and the episode's own features above the steps
(``episode_metadata.file_path``) delivered with every step. Pictures (``Image``: JPEG or PNG, told by their magic
bytes, not by what features.json declares) are video features: uint8 ``[H, W, 3]`` frames decoded in the
workers, resized by ``frame_size`` (JPEGs shrink inside the decoder, by DCT scaling, where the size allows),
channels swapped with ``bgr=True``. Text is a numpy object array of str; ``task_key``'s text (default
``language_instruction``) is each step's task. Sequences of unknown length within a step (ragged) are no feature
(a batch cannot stack them) but are in :meth:`RldsSource.episode`, an object array of one array per step.

RLDS records no control rate: ``fps=`` gives it, and windows (whose spans are in seconds) need it. Without it an
Open X-Embodiment dataset takes its published control frequency (:mod:`.rates`, by the name in dataset_info.json);
any other dataset opens, reads whole episodes and steps, and anything that asks for a rate fails saying to pass
``fps=``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmfeed.codecs.colour import frame_step_shape
from mmfeed.loaders.clock import record_stage, stage
from mmfeed.loaders.formats.rlds.example import ExampleError, Values, parse_example, parse_feature
from mmfeed.loaders.formats.rlds.index import record_index
from mmfeed.loaders.formats.rlds.metadata import Leaf, decode_leaf, locate, read_leaves, read_split
from mmfeed.loaders.formats.rlds.pictures import SLOT_PHASE, PictureError, decode_picture, decode_pictures
from mmfeed.loaders.formats.rlds.ranges import RecordRanges
from mmfeed.loaders.formats.rlds.rates import published_rate
from mmfeed.loaders.formats.rlds.tfrecord import TFRecordError, crc32c, framed_size, split_record
from mmfeed.loaders.sources.base import LRU, EpisodeRequest, EpisodeSource, Feature, WindowArrays
from mmfeed.loaders.sources.consistency import Verdict, settle
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.stores.frame_store import Segment, stored, take
from mmfeed.loaders.transport.errors import SampleError
from mmfeed.loaders.transport.files import is_url
from mmfeed.loaders.transport.tar import stat_file

__all__ = ["RldsSource"]

log = logging.getLogger(__name__)


class RldsSource(EpisodeSource):
    """The episodes of one split of an RLDS dataset, in file order (shard by shard, record by record: TFDS's
    order with ``shuffle_files=False``).

    path: the version directory (``.../bridge/1.0.0``, holding ``dataset_info.json``) or the dataset directory
        above it (its highest version), local or an fsspec URL.
    options: how it is read (:class:`~mmfeed.loaders.sources.options.ReadOptions`: split, fps, task_key, bgr,
        frame_size, frame_format, cache_episodes, errors, max_frame_pixels), or its fields as keyword arguments.
    """

    FORMAT = "RLDS"
    one_frame_shape = True  # a camera's frames are one size in every episode (info / features.json)
    READ_OPTIONS = ("split", "fps", "task_key", "bgr", "frame_size", "frame_format", "cache_episodes", "errors",
                    "max_frame_pixels", "cache", "cache_bytes")
    """The :class:`~mmfeed.loaders.sources.options.ReadOptions` this format reads."""

    def __init__(self, path: str | os.PathLike, options: ReadOptions | None = None, **kwargs: Any) -> None:
        options = ReadOptions.of(options, **kwargs)
        options.refuse_others(self.READ_OPTIONS, self.FORMAT, os.fspath(path))
        self.options = options
        if options.bgr and options.frame_format != "rgb24":
            raise ValueError(f"{os.fspath(path)}: bgr=True swaps the channels of RGB frames; it cannot be combined "
                             f"with frame_format={options.frame_format!r} (drop one of them)")
        files = locate(os.fspath(path))
        if files is None:
            raise FileNotFoundError(f"{os.fspath(path)}: not an RLDS dataset (no dataset_info.json and features.json "
                                    "there, nor in a version folder X.Y.Z below it)")
        self.files = files
        self.root = files.root
        self.split = options.split or "train"
        base, cut = split_slice(self.split)
        self.dataset_name, self._shards, counts = read_split(files, base)
        self.name = f"{self.root}[{self.split}]"
        self._leaves = read_leaves(files)
        cameras = [leaf.name for leaf in self._leaves if leaf.kind == "image"]
        for leaf in self._leaves:
            if leaf.kind == "image":
                options.check_frame_pixels(files.where("features.json"), leaf.name, *leaf.shape[:2])
        self._sizes = options.frame_sizes(cameras, [leaf.name for leaf in self._leaves], self.root)
        texts = [leaf.name for leaf in self._leaves if leaf.level == "step" and leaf.kind == "text"]
        if "task_key" in options.given() and options.task_key not in texts:
            raise ValueError(f"{self.root}: task_key={options.task_key!r} names no text feature of the steps; they "
                             f"are {texts}")
        index = record_index(files, base, self._shards, counts, self._leaves, options.task_key)
        chosen = np.arange(len(index.steps))[cut.slice(len(index.steps))]
        if not len(chosen):
            raise ValueError(f"{self.name}: the split slice {self.split!r} holds no episode of the "
                             f"{len(index.steps)} in split {base!r}")
        kept, self.skipped = settle(_verdict([index.reasons[k] for k in chosen.tolist()]), options.errors, self.name)
        starts = np.concatenate([[0], np.cumsum(index.steps)])
        keep = chosen[kept] if kept is not None else chosen
        self._shard_of = index.shard_of[keep].astype(np.int64)
        first = np.searchsorted(index.shard_of, index.shard_of)  # each shard's first record (shard_of ascends)
        self._record = (np.arange(len(index.shard_of)) - first)[keep]  # the record's number in its shard
        self._offset = index.offset[keep]
        self._length = index.length[keep]
        self._lengths = index.steps[keep].astype(np.int64)
        self._task_flat = index.task_flat.astype(np.int32, copy=False)  # every step's task, episodes back to back
        self._task_start = starts[keep].astype(np.int64)
        self.tasks = list(index.tasks) or [""]
        self._episode_tasks = _episode_tasks(self._task_flat, starts[:-1], index.steps)[keep]
        fps = options.fps if options.fps is not None else published_rate(self.dataset_name)
        if options.fps is None and fps is not None:
            log.info("%s: no fps= given; using %g Hz, the published control frequency of the Open X-Embodiment "
                     "dataset %r (fps= overrides it)", self.name, fps, self.dataset_name)
        self._known_fps = fps
        self._fps = np.full(len(keep), np.nan if fps is None else float(fps), np.float64)
        rate = float("nan") if fps is None else float(fps)
        self._steps = {leaf.name: leaf for leaf in self._leaves if leaf.kind != "ragged"}
        self._ragged = [leaf for leaf in self._leaves if leaf.kind == "ragged"]
        self.features = {name: self._feature(leaf, rate) for name, leaf in self._steps.items()}
        self._frames = dict.fromkeys(self.features, self._lengths)
        self.stats = index.stats
        self._records = LRU(options.cache_episodes)  # episode -> parsed record
        self._key_of = {key: k for k, key in enumerate(index.keys)}
        self._key_span, self._key_crc = index.key_span[keep], index.key_crc[keep]
        self._picture_at = index.pictures  # camera -> [start, stop, crc] of every step of the index's episodes
        self._camera_of = {camera: c for c, camera in enumerate(index.pictures)}
        self._ranges = None if is_url(self.root) else RecordRanges([files.where(s) for s in self._shards],
                                                                    self.describe)
        self._parts = LRU(256)  # episode -> {key: Values} of the keys read alone (a few rows each)
        self._store = options.frame_store()  # decoded pictures, one segment per camera of an episode (cache=)
        self._stamps: dict[int, tuple] = {}  # shard -> its size and mtime (etag), once per process
        crc32c(b"")  # the compiled CRC kernel loaded now, in this process: forked workers inherit it

    def _feature(self, leaf, rate: float) -> Feature:
        if leaf.kind == "image":
            h, w = self._sizes.get(leaf.name) or leaf.shape[:2]
            try:
                shape = frame_step_shape(h, w, self.options.frame_format)
            except ValueError as err:
                raise ValueError(f"{self.root} feature {leaf.name!r}: {err}; give an even frame_size") from err
            return Feature("video", "uint8", shape, rate, frame_format=self.options.frame_format)
        if leaf.kind == "text":
            return Feature("text", "object", (), rate)
        return Feature("array", leaf.dtype, leaf.shape, rate)

    @property
    def task_feature(self) -> str | None:
        """The step text feature that is each step's task (``task_key``), None where the steps have none."""
        leaf = self._steps.get(self.options.task_key)
        return leaf.name if leaf is not None and leaf.kind == "text" and leaf.level == "step" else None

    @property
    def episode_features(self) -> list[str]:
        """The features that hold one value per episode (``episode_metadata.*``), delivered with every step."""
        return [name for name, leaf in self._steps.items() if leaf.level == "episode"]

    @property
    def ragged_features(self) -> list[str]:
        """The ragged sequences within a step: not among ``features`` (a batch cannot stack them), read by
        :meth:`episode`."""
        return [leaf.name for leaf in self._ragged]

    @property
    def shards(self) -> list[str]:
        """The split's shards, paths relative to the version directory, in order."""
        return list(self._shards)

    # -- rates: RLDS records none ----------------------------------------------------------------------------
    def _need_fps(self) -> None:
        if self._known_fps is None:
            raise ValueError(f"{self.name}: RLDS records no control rate; pass fps= (steps per second, e.g. "
                             "open_dataset(path, fps=10); --fps on the command line) to read windows or anything timed")

    @property
    def fps(self) -> np.ndarray:
        """Control-clock rate of each episode (``fps=``, or an OXE dataset's published rate); a ValueError saying to
        pass ``fps=`` where neither is known."""
        self._need_fps()
        return self._fps

    def rates(self, feature: str) -> np.ndarray:
        self._check_feature(feature)
        self._need_fps()
        return self._fps

    # -- reading ---------------------------------------------------------------------------------------------
    def step_tasks(self, episode: int) -> np.ndarray:
        """The task id of every step of ``episode``, int64 ``[T]`` (``task_key``'s text, from the index)."""
        e = self._check_episode(episode)
        n = int(self._lengths[e])
        if not self._task_flat.size:  # no task_key text in the dataset: one empty task
            return np.zeros(n, np.int64)
        start = int(self._task_start[e])
        return self._task_flat[start:start + n].astype(np.int64)

    def describe(self, episode: int) -> str:
        """The shard and record of an episode, for error messages."""
        return (f"{self.files.where(self._shards[self._shard_of[episode]])} record {int(self._record[episode])} "
                f"(byte {int(self._offset[episode])})")

    def frame_shape(self, episode: int, feature: str) -> tuple[int, int] | None:
        f = self.features.get(feature)
        return f.frame_size if f is not None else None

    def record_bytes(self, episode: int) -> bytes:
        """The payload of an episode's record (a serialized ``tf.train.Example``), both CRCs checked."""
        framed = self._framed(episode)
        return framed[12:len(framed) - 4]

    def _framed(self, episode: int) -> bytes:
        """The whole framed record of ``episode`` (one read), both CRCs checked."""
        e = self._check_episode(episode)
        relative = self._shards[self._shard_of[e]]
        with stage("read"):
            with self.files.open(relative) as f:
                f.seek(int(self._offset[e]))
                framed = f.read(framed_size(int(self._length[e])))
        try:
            split_record(framed, self.describe(e))
        except TFRecordError as err:
            raise SampleError(str(err)) from err
        return framed

    def _parsed(self, episode: int) -> dict:
        parsed = self._records.get(episode)
        if parsed is None:
            framed = self._framed(episode)
            try:
                parsed = parse_example(framed, 12, len(framed) - 4)  # the payload, read in place
            except ExampleError as err:
                raise SampleError(f"{self.describe(episode)}: not a tf.train.Example ({err})") from err
            self._records.put(episode, parsed)
        return parsed

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested steps of each request, their pictures decoded in this process. From a local shard each
        feature's key and each picture is read alone (kept for the next requests of the episode, but pictures);
        from a remote one each episode's record is read once (kept for the next requests of the episode)."""
        return self._read(requests, ranged=self._ranges is not None)

    def _read(self, requests: Sequence[EpisodeRequest], ranged: bool) -> list[dict[str, np.ndarray]]:
        self._check_requests(requests)
        out: list[dict[str, np.ndarray]] = [{} for _ in requests]
        clock, read_s = time.perf_counter, 0.0  # ranged reads, one stage a call
        pictures: list[tuple] = []  # (request, feature, steps, into) of pictures read by range, all at once below
        for r, request in enumerate(requests):
            e = request.episode
            steps = int(self._lengths[e])
            where = _Where(self.describe, e)  # named only where an error is raised
            for feature, idx in request.indices.items():
                idx = np.asarray(idx, dtype=np.int64).reshape(-1)
                leaf = self._steps[feature]
                into = request.out.get(feature) if request.out else None
                if leaf.kind == "image" and self._store is not None:
                    value = self._stored_pictures(e, feature, idx, into)
                    if value is not None:  # from the store: no record read, no decode
                        out[r][feature] = value
                        continue
                if leaf.kind == "image" and ranged:
                    pictures.append((r, feature, idx, into))
                    continue
                start = clock()
                try:  # a whole record's read is its own stage
                    if ranged and leaf.level == "step":
                        value = self._step_values(e, leaf, steps, where)[idx]
                    else:
                        value = decode_leaf(leaf, self._parts_of(e, leaf) if ranged else self._parsed(e), steps,
                                            where, picks=idx)
                except ValueError as err:
                    raise SampleError(str(err)) from err
                if ranged:
                    read_s += clock() - start
                if leaf.kind == "image":
                    with stage("decode"):
                        value = self._pictures(e, feature, value, into)
                elif leaf.level == "episode":
                    value = np.repeat(np.asarray(value)[None], len(idx), axis=0) if leaf.kind != "text" else \
                        np.array([value] * len(idx), dtype=object)
                if into is not None and leaf.kind != "image":
                    into[...] = value
                    value = into
                out[r][feature] = value
        if pictures:
            start = clock()
            buffer, spans = self._gather([(requests[r].episode, feature, idx) for r, feature, idx, _ in pictures])
            read_s += clock() - start
            with stage("decode"):
                view, k = memoryview(buffer), 0
                for r, feature, idx, into in pictures:
                    n = len(idx)
                    blobs = [view[a:b] for a, b in spans[k:k + n].tolist()]
                    out[r][feature] = self._pictures(requests[r].episode, feature, blobs, into)
                    k += n
        if read_s:
            record_stage("read", read_s)
        return out

    def read_windows(self, windows: WindowArrays, buffer: Callable[..., np.ndarray]
                     ) -> dict[str, np.ndarray] | None:
        """A batch of windows in one call (see :meth:`EpisodeSource.read_windows`), from a local split read by
        range: each step feature gathered from its episodes' decoded arrays, every picture of the batch read in
        one pass (:meth:`_gather`) and decoded straight into the batch's buffer. Remote splits, the frame store,
        text and per-episode features are read request by request."""
        if self._ranges is None or self._store is not None or not len(windows.episodes) \
                or not self._windows_in_range(windows):
            return None
        for feature in windows.indices:
            leaf = self._steps[feature]
            if leaf.level != "step" or leaf.kind == "text" or leaf.kind != "image" \
                    and np.dtype(self.features[feature].dtype).kind not in "biuf":
                return None
        ids, out, start = windows.episodes, {}, time.perf_counter()
        cameras = {f: idx for f, idx in windows.indices.items() if self._steps[f].kind == "image"}
        for feature, idx in windows.indices.items():
            if feature not in cameras:
                out[feature] = self._step_window(ids, self._steps[feature], idx)
        if cameras:
            data, spans = self._gather_windows(ids, cameras)
        record_stage("read", time.perf_counter() - start)
        with stage("decode"):
            k = 0
            for feature, idx in cameras.items():
                into, (batch, n) = buffer(feature, phase=SLOT_PHASE), idx.shape
                if not into.flags.c_contiguous:  # decoded through a flat view of it
                    return None
                f = self.features[feature]
                try:
                    decode_pictures(data, spans[k:k + batch * n], into.reshape(batch * n, *f.shape),
                                    self._steps[feature].shape[:2], self._sizes.get(feature), f.frame_format,
                                    self.options.bgr, self.options.max_frame_pixels)
                except PictureError as err:
                    sample, picture = divmod(err.index, n)
                    raise SampleError(f"{self.describe(int(ids[sample]))} feature {feature!r}: picture {picture} of "
                                      f"the request: {err.reason}") from err
                out[feature] = into
                k += batch * n
        return out

    def _step_window(self, episodes: np.ndarray, leaf: Leaf, idx: np.ndarray) -> np.ndarray:
        """A step feature's values at ``idx`` (``[B, n]`` steps) of each of ``episodes``: ``[B, n, ...]``."""
        lengths, key, values, ids = self._lengths, (leaf.name,), [], episodes.tolist()
        for e, parts in zip(ids, self._parts.get_many(ids)):  # the values earlier batches decoded
            value = None if parts is None else parts.get(key)
            values.append(value if value is not None else
                          self._step_values(e, leaf, int(lengths[e]), _Where(self.describe, e)))
        first = np.zeros(len(values), np.int64)
        np.cumsum([len(v) for v in values[:-1]], out=first[1:])
        return np.concatenate(values)[first[:, None] + idx]

    def _gather_windows(self, episodes: np.ndarray, cameras: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The encoded pictures of a batch's windows (camera -> ``[B, n]`` steps of ``episodes``), back to back
        camera by camera, sample by sample: :meth:`_gather`'s buffer and spans, built from the arrays; the buffer
        is the thread's scratch, good until its next batch is read."""
        owners, tables, blocks = [], [], []
        for feature, idx in cameras.items():
            owner = np.repeat(episodes, idx.shape[1])
            owners.append(owner)
            tables.append(self._picture_rows(feature, owner, idx.reshape(-1)))
            blocks.append((feature, idx.shape[1], len(owner)))

        def name(k: int) -> str:
            for feature, n, size in blocks:
                if k < size:
                    return f"feature {feature!r} picture {k % n} of the request"
                k -= size
            raise IndexError(k)

        return self._read_pieces(np.concatenate(owners), np.concatenate(tables), name, scratch=True)

    def _picture_rows(self, feature: str, owner: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Where the pictures of camera ``feature`` at ``steps`` of episodes ``owner`` lie in their records, with
        their CRC-32C: int64 ``[n, 3]`` (start, stop, crc) from the index."""
        return self._picture_at[feature][self._task_start[owner] + steps]

    def _read_pieces(self, owner: np.ndarray, table: np.ndarray, name: Callable[[int], str], scratch: bool = False
                     ) -> tuple[np.ndarray, np.ndarray]:
        """The pictures ``table`` (:meth:`_picture_rows`) of episodes ``owner`` read by range, back to back
        (``scratch``: into the thread's scratch buffer, see :meth:`RecordRanges.gather`)."""
        pieces = np.column_stack([owner, self._shard_of[owner], self._offset[owner], table])
        return self._ranges.gather(pieces, name, scratch)

    def _gather(self, pictures: list[tuple[int, str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """The encoded pictures of ``pictures`` (episode, camera, steps), back to back in their order: one buffer
        and each picture's ``[start, stop)`` in it, read by range in as few reads as they allow, checked."""
        episodes = np.array([e for e, _, _ in pictures], np.int64)
        counts = np.array([len(idx) for _, _, idx in pictures], np.int64)
        steps = np.concatenate([idx for _, _, idx in pictures])
        owner = np.repeat(episodes, counts)
        table = np.empty((len(steps), 3), np.int64)
        cameras = np.repeat(np.array([self._camera_of[f] for _, f, _ in pictures], np.int64), counts)
        for feature, c in self._camera_of.items():
            mine = cameras == c
            if mine.any():
                table[mine] = self._picture_rows(feature, owner[mine], steps[mine])
        first = np.cumsum(counts) - counts  # each request's first picture

        def name(k: int) -> str:
            p = int(np.searchsorted(first, k, side="right")) - 1
            return f"feature {pictures[p][1]!r} picture {k - int(first[p])} of the request"

        return self._read_pieces(owner, table, name)

    def _key_values(self, episode: int, key: str) -> Values:
        """One key of an episode's record, read alone by its byte range and checked against its CRC-32C."""
        k = self._key_of[key]
        start, stop = (int(v) for v in self._key_span[episode, k])
        data = self._ranges.checked(episode, int(self._shard_of[episode]), int(self._offset[episode]), start, stop,
                                    int(self._key_crc[episode, k]), f"key {key!r}")
        try:
            return parse_feature(data)
        except ExampleError as err:
            raise SampleError(f"{self.describe(episode)}: key {key!r} is no tf.train.Feature ({err})") from err

    def _parts_of(self, episode: int, leaf: Leaf) -> dict[str, Values]:
        """The keys of ``episode`` read alone so far, ``leaf``'s among them."""
        parts = self._parts.get(episode)
        if parts is None:
            parts = {}
            self._parts.put(episode, parts)
        if leaf.key not in parts:
            parts[leaf.key] = self._key_values(episode, leaf.key)
        return parts

    def _step_values(self, episode: int, leaf: Leaf, steps: int, where: Any) -> np.ndarray:
        """Every step's value of a step feature of ``episode`` (not a camera), decoded once and kept with the
        episode's keys."""
        parts = self._parts_of(episode, leaf)
        values = parts.get((leaf.name,))  # decoded arrays beside the keys' lists, under a key no record key is
        if values is None:
            values = parts[(leaf.name,)] = decode_leaf(leaf, parts, steps, where)
        return values

    def _picture_bytes(self, episode: int, feature: str, idx: np.ndarray) -> list[memoryview]:
        """The encoded pictures ``idx`` (steps inside the episode) of one camera of ``episode``, read alone (each
        checked)."""
        idx = np.asarray(idx, np.int64)
        buffer, spans = self._gather([(episode, feature, idx)])
        return [memoryview(buffer)[a:b] for a, b in spans.tolist()]

    def episode(self, index: int) -> dict:
        """The whole episode (every feature, pictures decoded; its record read whole), ``task``, ``fps`` (None
        without a rate) and each ragged feature as an object array of one array per step."""
        index = self._check_episode(index)
        request = EpisodeRequest(index, {f: np.arange(self._lengths[index], dtype=np.int64) for f in self.features})
        data = self._read([request], ranged=False)[0]  # every byte of the record wanted: one read, its CRC
        parsed = self._parsed(index)
        for leaf in self._ragged:
            data[leaf.name] = decode_leaf(leaf, parsed, int(self._lengths[index]), self.describe(index))
        return {**data, "task": self.task(index), "fps": None if self._known_fps is None else self._known_fps}

    def _segment(self, episode: int, feature: str) -> Segment:
        """The frame store's key of one camera of one episode: its shard (path, size and mtime or etag), the
        record's place in it, and how its pictures are delivered."""
        shard = int(self._shard_of[episode])
        if shard not in self._stamps:
            self._stamps[shard] = tuple(stat_file(self.files.where(self._shards[shard])))
        f = self.features[feature]
        return Segment(identity=("rlds", self.files.where(self._shards[shard]), self._stamps[shard],
                                 int(self._offset[episode]), int(self._length[episode]), feature,
                                 self._sizes.get(feature), f.frame_format, bool(self.options.bgr)),
                       frames=int(self._lengths[episode]), shape=tuple(f.shape))

    def _stored_pictures(self, episode: int, feature: str, idx: np.ndarray, into: np.ndarray | None
                         ) -> np.ndarray | None:
        """Pictures ``idx`` of one camera of ``episode`` from the frame store, the whole camera's pictures decoded
        into it first where it lacks them; None where the store cannot hold them (another process is filling the
        segment, or it is larger than the budget): then they are decoded as asked."""
        segment = self._segment(episode, feature)
        frames = stored(self._store, segment, idx, into)
        if frames is not None:
            return frames
        steps = int(self._lengths[episode])

        def decode(out: np.ndarray) -> None:
            leaf = self._steps[feature]
            try:
                parsed = {leaf.key: self._key_values(episode, leaf.key)} if self._ranges is not None else \
                    self._parsed(episode)  # the camera's pictures alone, or the whole record
                blobs = decode_leaf(leaf, parsed, steps, self.describe(episode),
                                    picks=np.arange(steps, dtype=np.int64))
            except ValueError as err:
                raise SampleError(str(err)) from err
            self._pictures(episode, feature, blobs, out)

        with stage("decode"):
            whole = self._store.fill(segment, decode)
        return None if whole is None else take(whole, idx, into)

    def _pictures(self, episode: int, feature: str, blobs: list, into: np.ndarray | None) -> np.ndarray:
        f = self.features[feature]
        out = into if into is not None else np.empty((len(blobs), *f.shape), np.uint8)
        size = self._sizes.get(feature)
        declared = self._steps[feature].shape[:2]
        for i, blob in enumerate(blobs):
            try:
                decode_picture(blob, size, declared, f.frame_format, self.options.bgr, self.options.max_frame_pixels,
                               out=out[i])
            except ValueError as err:
                raise SampleError(f"{self.describe(episode)} feature {feature!r}: picture {i} of the request: "
                                  f"{err}") from err
        return out


@dataclass(frozen=True)
class _Cut:
    """A split's slice: bounds as episode counts or percents (None: open)."""

    start: float | None = None
    stop: float | None = None
    percent: bool = False

    def slice(self, n: int) -> slice:
        def bound(value: float | None) -> int | None:
            if value is None:
                return None
            return int(round(value * n / 100)) if self.percent else int(value)

        return slice(bound(self.start), bound(self.stop))


_SLICE = re.compile(r"^([^\[\]]+)(?:\[(-?\d+)?(%)?:(-?\d+)?(%)?\])?$")


def split_slice(split: str) -> tuple[str, _Cut]:
    """``(split name, slice)`` of a TFDS split string: ``"train"``, ``"train[:90%]"``, ``"train[10:20]"``,
    ``"val[-5:]"`` (both bounds counts or both percents, rounded to the nearest episode as TFDS does).

    >>> split_slice("train[:90%]")[1].slice(10), split_slice("val[2:-1]")[1].slice(10)
    (slice(None, 9, None), slice(2, -1, None))
    """
    match = _SLICE.match(split)
    if match is None:
        raise ValueError(f"split {split!r}: give a split's name, or one sliced as TFDS does: 'train[:90%]', "
                         "'train[10:20]'")
    name, start, first_pct, stop, second_pct = match.groups()
    if "[" not in split:
        return name, _Cut()
    if (first_pct and start is None) or (second_pct and stop is None):
        raise ValueError(f"split {split!r}: a '%' follows a number")
    percent = bool(first_pct or second_pct)
    if percent and ((start is not None and not first_pct) or (stop is not None and not second_pct)):
        raise ValueError(f"split {split!r}: both bounds are percents or neither is")
    if percent and any(v is not None and abs(int(v)) > 100 for v in (start, stop)):
        raise ValueError(f"split {split!r}: a percent is between -100 and 100")
    return name, _Cut(None if start is None else int(start), None if stop is None else int(stop), percent)


def _episode_tasks(flat: np.ndarray, starts: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """int64 ``[E]``: each episode's task where all its steps share one, -1 where it changes, 0 for an episode of
    no steps or a dataset without tasks (vectorized: the min and max of each episode's run of task ids)."""
    out = np.zeros(len(steps), np.int64)
    full = steps > 0
    if not flat.size or not full.any():
        return out
    at = starts[full]
    low, high = np.minimum.reduceat(flat, at), np.maximum.reduceat(flat, at)
    out[full] = np.where(low == high, low, -1)
    return out


class _Where:
    """An episode's place, for error messages: formatted only where one is raised."""

    __slots__ = ("describe", "episode")

    def __init__(self, describe, episode: int) -> None:
        self.describe, self.episode = describe, episode

    def __str__(self) -> str:
        return self.describe(self.episode)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _verdict(reasons: list[str]) -> Verdict:
    bad = np.array([bool(r) for r in reasons], dtype=bool)
    return Verdict(bad, lambda k: reasons[k], lambda k: (k, reasons[k].split(": ", 1)[0]))
