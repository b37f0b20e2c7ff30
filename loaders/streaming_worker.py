"""One worker's stream in streaming mode: the part of :mod:`mmfeed.loaders.streaming` that reads and assembles.

Holds the tar reader (a shard's episodes in tar order, as a stream), the decoded episodes with the frames their
samples need, the :class:`_Stream` that cuts samples, pushes them into the online packer and collates the rows it
emits into batches, and that stream's snapshot and restore. :class:`~mmfeed.loaders.streaming.StreamingPackedDataset`
builds one :class:`_Stream` per ``iter``; the behaviour is described in :mod:`mmfeed.loaders.streaming`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import torch

from mmfeed.codecs.arrays import load_npy
from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.loaders.collate import collate_rows
from mmfeed.loaders.index import camera_fields, parse_meta
from mmfeed.loaders.layout import FRAMES_PREFIX
from mmfeed.loaders.samples import SampleTable, build_samples
from mmfeed.loaders.sources import EpisodeRequest
from mmfeed.loaders.timing import stage
from mmfeed.loaders.windows import align_to_stream
from mmfeed.packing import OnlinePacker, PackedBatch

if TYPE_CHECKING:
    from mmfeed.loaders.streaming import StreamingPackedDataset

# Streaming mode logs under one name, whichever of its modules speaks.
log = logging.getLogger("mmfeed.loaders.streaming")

EPISODE_STRIDE = 1_000_000
"""``metadata["episode"] = shard * EPISODE_STRIDE + position in the shard``; a shard holds fewer episodes."""

_STATE_VERSION = 1


@dataclass(eq=False)
class _Episode:
    """One decoded episode: its arrays, the frames its samples need, its samples and how many are still out."""

    number: int
    key: str
    length: int
    fps: float
    task: str
    cameras: list[str]
    camera_fps: dict[str, float]
    proprio: np.ndarray
    action: np.ndarray
    frames: dict = field(default_factory=dict)  # camera -> (sorted frame ids, their frames, frames in the video)
    table: SampleTable | None = None
    refs: int = 0  # samples still buffered or pending


class _HeldSource:
    """The episodes of one batch as the part of the :class:`~mmfeed.loaders.sources.Source` protocol that
    ``collate_rows`` uses; reads the arrays and decoded frames they hold (frames aligned by time, as
    ``WebDatasetSource`` aligns them)."""

    def __init__(self, episodes: list[_Episode], name: str) -> None:
        self.name, self._episodes = name, episodes
        self.lengths = np.array([e.length for e in episodes], dtype=np.int64)
        self.fps = np.array([e.fps for e in episodes], dtype=np.float64)

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        out = []
        with stage("read"):
            for request in requests:
                ep, got = self._episodes[request.episode], {}
                for key, steps in request.steps.items():
                    steps = np.asarray(steps, dtype=np.int64)
                    if key in ("proprio", "action"):
                        got[key] = getattr(ep, key)[steps]
                        continue
                    camera = key[len(FRAMES_PREFIX) :]
                    ids, frames, total = ep.frames[camera]
                    wanted = align_to_stream(steps, fps=ep.fps, stream_fps=ep.camera_fps[camera], stream_length=total)
                    where = np.searchsorted(ids, wanted)
                    assert (ids[np.minimum(where, len(ids) - 1)] == wanted).all(), "frame needed but not decoded"
                    got[key] = frames[where]
                out.append(got)
        return out


def _shard_episodes(url: str, select: Callable[[int], bool] | None = None) -> Iterator[tuple[int, dict]]:
    """``(position, members)`` of each episode of one shard in tar order, read as a stream by webdataset.

    ``select(position)`` False skips an episode without extracting its members. Suffixes keep their case
    (camera names may have capitals).
    """
    from webdataset import gopen
    from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_expander

    positions: dict[str, int] = {}  # key -> position, numbered as keys first appear

    def keep(fname: str) -> bool:
        key, _ = base_plus_ext(fname)
        return key is not None and (select is None or select(positions.setdefault(key, len(positions))))

    stream = gopen(url, "rb")
    try:
        files = tar_file_expander([{"url": url, "stream": stream}], select_files=keep)
        for group in group_by_keys(files, lcase=False):
            yield positions[group["__key__"]], group
    finally:
        stream.close()


class _Stream:
    """One worker's pass over its shards: the running state, the batch generator and its snapshot."""

    def __init__(self, ds: StreamingPackedDataset, shards: list[int], quota: int | None) -> None:
        self.ds, self.shards, self.quota = ds, shards, quota
        cfg = ds.config
        self.packer = OnlinePacker(cfg.capacity, window=cfg.window_items, max_delay=cfg.max_delay)
        self.samples: dict[int, tuple[_Episode, int]] = {}  # push id -> (episode, sample index in its table)
        self.episodes: dict[int, _Episode] = {}  # episode number -> episode still referenced
        self.pending: list[list[int]] = []  # rows emitted by the packer, not yet batched
        self.slot, self.done_in_shard, self.count = 0, 0, 0
        self.cameras: list[str] | None = None  # priced cameras of chunk samples (the first episode's)
        self.layouts: dict = {}  # sample layouts shared by every batch's table
        self.stats = _new_stats()

    # -- the generator ------------------------------------------------------------------------------------------
    def batches(self) -> Iterator[PackedBatch]:
        rpb = self.ds.config.rows_per_batch
        while self.slot < len(self.shards):
            if self._capped():
                return
            shard = self.shards[self.slot]
            skip = self.done_in_shard
            with contextlib.closing(_shard_episodes(self.ds.shards[shard], lambda p: p >= skip)) as episodes:
                for position, members in episodes:
                    self._push(self._load(members, shard, position))
                    self.done_in_shard = position + 1
                    while len(self.pending) >= rpb:
                        yield self._take(rpb)
                        if self._capped():
                            return
            self.slot, self.done_in_shard = self.slot + 1, 0
        self.pending.extend(self.packer.flush())
        self.stats["rows"] = self.packer.rows_emitted
        while self.pending and not self._capped():
            yield self._take(rpb)
        if not self.pending:
            log.info("%s: stream done: %s", self.ds.name, self.stats)

    def _capped(self) -> bool:
        if self.quota is not None and self.count >= self.quota:
            log.info("%s: stopped at steps_per_epoch after %d batches; %d samples buffered and %d shard(s) unread",
                     self.ds.name, self.count, self.packer.pending, len(self.shards) - self.slot - 1)
            return True
        return False

    def _push(self, ep: _Episode) -> None:
        if ep.table is None or len(ep.table) == 0:
            return
        n = len(ep.table)
        first, before = self.packer.pushed, self.packer.num_oversize
        self.episodes[ep.number] = ep
        for i in range(n):
            self.samples[first + i] = (ep, i)
        ep.refs = n
        self.pending.extend(row.tolist() for row in self.packer.push_many(ep.table.tokens))
        oversize = self.packer.oversize_ids[before:]
        if oversize:
            longest = max(int(ep.table.tokens[s - first]) for s in oversize)
            log.warning("%s: %d sample(s) of episode %r are longer than capacity %d (up to %d tokens): skipped and "
                        "counted in stats['oversize']", self.ds.name, len(oversize), ep.key, self.packer.capacity,
                        longest)
            self.stats["oversize"] += len(oversize)
            self._release(oversize)
        self.stats["episodes"] += 1
        self.stats["samples"] += n
        self.stats["rows"] = self.packer.rows_emitted
        self.stats["episodes_held_max"] = max(self.stats["episodes_held_max"], len(self.episodes))
        self.stats["episodes_held"] = len(self.episodes)

    def _take(self, rpb: int) -> PackedBatch:
        rows, self.pending = self.pending[:rpb], self.pending[rpb:]
        batch = self._collate(rows)
        self._release([s for row in rows for s in row])
        self.count += 1
        self.stats["batches"] = self.count
        self.stats["tokens"] += int((batch.document_ids >= 0).sum())
        return batch

    def _release(self, ids: list[int]) -> None:
        for s in ids:
            ep, _ = self.samples.pop(s)
            ep.refs -= 1
            if ep.refs == 0:
                del self.episodes[ep.number]
        self.stats["episodes_held"] = len(self.episodes)

    def _collate(self, rows: list[list[int]]) -> PackedBatch:
        ds, cfg = self.ds, self.ds.config
        ids = np.array([s for row in rows for s in row], dtype=np.int64)
        local: dict[int, int] = {}  # episode number -> its index in this batch's source
        held: list[_Episode] = []
        episode, start, length, tokens = (np.zeros(len(ids), np.int64) for _ in range(4))
        for j, s in enumerate(ids.tolist()):
            ep, i = self.samples[s]
            episode[j] = local.setdefault(ep.number, len(held))
            if episode[j] == len(held):
                held.append(ep)
            start[j], length[j], tokens[j] = ep.table.start[i], ep.table.length[i], ep.table.tokens[i]
        table = SampleTable(episode, start, length, tokens, [ep.table.text[0] for ep in held], ds.sampling,
                            ds.layout, self.cameras or [], _layouts=self.layouts)
        bounds = np.cumsum([0] + [len(row) for row in rows])
        local_rows = [np.arange(a, b, dtype=np.int64) for a, b in zip(bounds[:-1], bounds[1:])]
        batch = collate_rows(table, _HeldSource(held, ds.name), local_rows, cfg.capacity,
                             num_rows=cfg.rows_per_batch if cfg.static_shapes else None,
                             static_shapes=cfg.static_shapes)
        batch.metadata["sample"] = torch.from_numpy(ids)
        batch.metadata["episode"] = torch.tensor([held[e].number for e in episode.tolist()], dtype=torch.int64)
        return batch

    # -- one episode ----------------------------------------------------------------------------------------------
    def _load(self, members: dict, shard: int, position: int, *, count: bool = True) -> _Episode:
        """Decode an episode's arrays, cut its samples and decode the frames they need (and no other)."""
        ds = self.ds
        url, key = ds.shards[shard], members["__key__"]
        if position >= EPISODE_STRIDE:
            raise ValueError(f"{url} holds more than {EPISODE_STRIDE} episodes; split it into smaller shards")
        if "meta.json" not in members:
            raise ValueError(f"episode {key!r} in shard {url!r} has no {key}.meta.json member; every episode needs one")
        meta = parse_meta(url, key, members["meta.json"])
        cameras, rates = camera_fields(url, key, meta, set(members))
        length = int(meta["length"])
        arrays = {}
        for name in ("proprio", "action"):
            if f"{name}.npy" not in members:
                raise ValueError(f"episode {key!r} in shard {url!r} has no {key}.{name}.npy member")
            arrays[name] = load_npy(members[f"{name}.npy"], key=f"{url} member {key}.{name}.npy",
                                    expect_dtype=np.float32, expect_shape=(length, None))
        ep = _Episode(shard * EPISODE_STRIDE + position, key, length, float(meta["fps"]), str(meta["task"]),
                      cameras, dict(zip(cameras, rates)), arrays["proprio"], arrays["action"])
        if length < 1:
            log.warning("%s: episode %r has no steps; skipped", url, key)
            return ep
        priced = [c for c in cameras if c in ds.layout.tokens_per_frame]
        if ds.sampling.window is None:
            if self.cameras is None:
                self.cameras = priced
            elif priced != self.cameras:
                raise ValueError(f"episode {key!r} in {url!r} has priced cameras {priced}, the stream's first "
                                 f"episode {self.cameras}: episode chunks need the same cameras in every episode")
        index = SimpleNamespace(lengths=np.array([length]), cameras=cameras, task=lambda e: ep.task)  # one episode
        ep.table = build_samples(index, ds.sampling, ds.layout, ds.tokenizer)
        self._decode_frames(ep, members, url, count)
        return ep

    def _decode_frames(self, ep: _Episode, members: dict, url: str, count: bool) -> None:
        table, window = ep.table, self.ds.sampling.window
        if window is not None:
            idx, _ = window.indices(table.start, ep.length)
            needed = {k[len(FRAMES_PREFIX) :]: np.unique(v) for k, v in idx.items() if k.startswith(FRAMES_PREFIX)}
        else:
            needed = {c: np.arange(ep.length, dtype=np.int64) for c in self.cameras}  # chunks cover the episode
        if not needed:
            return
        with VideoReaderCache(max_open=len(needed) + 1, backend=self.ds.backend) as cache:
            requests, cameras = [], []
            for camera, steps in needed.items():
                if f"{camera}.mp4" not in members:
                    raise ValueError(f"episode {ep.key!r} in shard {url!r} has no camera {camera!r} (no "
                                     f"{ep.key}.{camera}.mp4 member); it has {ep.cameras}")
                data = members[f"{camera}.mp4"]
                total = cache.reader(data).info.num_frames
                ids = np.unique(align_to_stream(steps, fps=ep.fps, stream_fps=ep.camera_fps[camera],
                                                stream_length=total))
                requests.append(FrameRequest(data, indices=ids))
                cameras.append((camera, ids, total))
            with stage("decode"):
                decoded = cache.decode_batch(requests)
        for (camera, ids, total), frames in zip(cameras, decoded):
            ep.frames[camera] = (ids, frames, total)
            if count:
                self.stats["frames_decoded"] += len(ids)

    # -- resume ---------------------------------------------------------------------------------------------------
    def state(self) -> dict:
        ds = self.ds
        return {
            "version": _STATE_VERSION, "epoch": ds.epoch, "num_shards": len(ds.shards), "rank": ds.rank,
            "world_size": ds.world_size, "seed": ds.seed, "config": asdict(ds.config),
            "slot": self.slot, "done_in_shard": self.done_in_shard, "batches": self.count,
            "packer": self.packer.state_dict(), "pending": [list(row) for row in self.pending],
            "samples": [[s, ep.number, i] for s, (ep, i) in sorted(self.samples.items())],
            "cameras": self.cameras, "stats": dict(self.stats),
        }

    def restore(self, state: dict) -> None:
        """Continue from ``state``: re-read the episodes its buffered samples come from, decode what they need."""
        self.slot, self.done_in_shard, self.count = (int(state[k]) for k in ("slot", "done_in_shard", "batches"))
        self.packer.load_state_dict(state["packer"])
        self.pending = [list(row) for row in state["pending"]]
        self.cameras = state["cameras"]
        self.stats = dict(state["stats"])
        wanted: dict[int, set[int]] = {}
        for _, number, _ in state["samples"]:
            wanted.setdefault(number // EPISODE_STRIDE, set()).add(number % EPISODE_STRIDE)
        for shard, positions in sorted(wanted.items()):
            with contextlib.closing(_shard_episodes(self.ds.shards[shard], positions.__contains__)) as episodes:
                for position, members in episodes:
                    ep = self._load(members, shard, position, count=False)
                    self.episodes[ep.number] = ep
        for s, number, i in state["samples"]:
            if number not in self.episodes:
                raise ValueError(f"state refers to episode {number} ({self.ds.shards[number // EPISODE_STRIDE]}, "
                                 f"position {number % EPISODE_STRIDE}), which the shard no longer holds")
            ep = self.episodes[number]
            self.samples[int(s)] = (ep, int(i))
            ep.refs += 1


def _new_stats() -> dict:
    keys = ("episodes", "samples", "oversize", "rows", "batches", "tokens", "frames_decoded", "episodes_held",
            "episodes_held_max")
    return dict.fromkeys(keys, 0)
