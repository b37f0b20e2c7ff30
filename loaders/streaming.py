"""Streaming mode: webdataset tars read in order without an index, packed with the bounded online packer.

For data that cannot be indexed ahead of time. Each worker reads its shards front to back as tar streams
(webdataset's tar reader; local paths or any URL ``webdataset.gopen`` opens), decodes one episode at a time, cuts
it into samples exactly as :func:`~mmfeed.loaders.samples.build_samples` does, prices them with the token layout
and pushes them into an :class:`~mmfeed.packing.OnlinePacker`. Rows the packer emits are collated with
:func:`~mmfeed.loaders.collate.collate_rows`, so every :class:`PackedBatch` has the structure of the planned
:class:`~mmfeed.loaders.dataset.PackedEpisodeDataset`'s: same modalities, data keys and metadata keys.

- **Memory is bounded.** Only the frames some sample needs are decoded (the union over an episode's samples, one
  batch decode per video), and an episode's arrays are dropped once all of its samples were emitted: held are
  only the episodes of the packer's buffered samples (fewer than ``window_items``), of the rows waiting for a
  batch (fewer than ``rows_per_batch``) and the one being pushed.
- **Nothing is lost silently.** At the end of the stream the packer is flushed and the last under-filled rows go
  out in a final, possibly smaller, batch. Samples longer than ``capacity`` are skipped, counted in ``stats``
  and logged.
- **Who reads what.** Shard ``i`` of the (optionally per-epoch shuffled) shard list goes to global worker
  ``i % (world_size * num_workers)``, global worker ``rank * num_workers + worker``. With uneven shards, ranks may
  run different numbers of steps, which stalls a synchronous job at the epoch's end: that is why the indexed plan
  is the default. ``StreamConfig(steps_per_epoch=N)`` caps every rank at N steps (choose N no larger than the
  smallest rank's count; samples after the cap are not read that epoch).
- **Identity.** ``metadata["episode"]`` is ``shard * EPISODE_STRIDE + position`` (shard index in the expanded,
  unshuffled shard list; position of the episode in its tar), the same in every worker layout; with
  ``(episode, start_step)`` it names a sample globally. ``metadata["sample"]`` is the sample's push number in its
  worker's packer (unique within one worker's epoch).
- **Resume.** ``state_dict()`` / ``load_state_dict()`` capture the iteration running in this process (use
  ``num_workers=0``): shard cursor, packer state and buffered samples; the batches after a resume equal those of
  an uninterrupted run. With worker processes the state lives in the workers and cannot be taken from the main
  process; resume there needs the indexed plan.

>>> ds = StreamingPackedDataset("shards/", layout=TokenLayout(tokens_per_frame={"cam_high": 64}),  # doctest: +SKIP
...                             window=WindowSpec(offsets={"frames.cam_high": (0,), "action": (0, 1)}),
...                             capacity=4096, rows_per_batch=2)
>>> batch = next(iter(ds))                                                                        # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

from mmfeed.codecs.arrays import load_npy
from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.text import ByteTokenizer
from mmfeed.loaders.collate import collate_rows
from mmfeed.loaders.index import camera_fields, parse_meta
from mmfeed.loaders.layout import FRAMES_PREFIX, TokenLayout
from mmfeed.loaders.samples import SampleTable, SamplingConfig, build_samples
from mmfeed.loaders.sources import EpisodeRequest
from mmfeed.loaders.timing import stage
from mmfeed.loaders.webdataset import expand_shards
from mmfeed.loaders.windows import WindowSpec, align_to_stream
from mmfeed.packing import OnlinePacker, PackedBatch

__all__ = ["EPISODE_STRIDE", "StreamConfig", "StreamingPackedDataset", "assign_shards", "shard_order"]

log = logging.getLogger(__name__)

EPISODE_STRIDE = 1_000_000
"""``metadata["episode"] = shard * EPISODE_STRIDE + position in the shard``; a shard holds fewer episodes."""

_STATE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """How the stream is packed and batched.

    capacity: tokens per row.
    rows_per_batch: rows of every batch but possibly the last of a worker's stream.
    window_items: most samples the online packer buffers (larger packs tighter, holds more episodes).
    max_delay: every sample is emitted at most this many pushes after its own (default ``4 * window_items``).
    shuffle_shards: permute the shard order each epoch, deterministically from ``(seed, epoch)``.
    steps_per_epoch: most batches each rank yields per epoch (None: until its shards end).
    static_shapes: pad every payload to what ``rows_per_batch`` full rows could hold (fixed tensor shapes).
    """

    capacity: int = 8192
    rows_per_batch: int = 1
    window_items: int = 1000
    max_delay: int | None = None
    shuffle_shards: bool = False
    steps_per_epoch: int | None = None
    static_shapes: bool = False

    def __post_init__(self) -> None:
        for name in ("capacity", "rows_per_batch", "window_items", "max_delay", "steps_per_epoch"):
            value = getattr(self, name)
            if value is None and name in ("max_delay", "steps_per_epoch"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"StreamConfig.{name} must be an integer >= 1, got {value!r}")


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Shard indices in reading order for one epoch: ``0..n-1``, or a permutation drawn from ``(seed, epoch)``."""
    order = np.arange(num_shards, dtype=np.int64)
    if shuffle:
        np.random.default_rng([int(seed), int(epoch)]).shuffle(order)
    return order


def assign_shards(order: np.ndarray, *, rank: int, world_size: int, worker: int, num_workers: int) -> np.ndarray:
    """The shards of one worker: entry ``i`` of ``order`` goes to global worker ``i % (world_size * num_workers)``,
    where worker ``w`` of rank ``r`` is global worker ``r * num_workers + w``. Every shard goes to exactly one."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is not in range for num_workers {num_workers}")
    order = np.asarray(order, dtype=np.int64)
    return order[rank * num_workers + worker :: world_size * num_workers]


class StreamingPackedDataset(torch.utils.data.IterableDataset):
    """Packed batches from webdataset shards read in order, without an index (see the module docstring).

    shards: shard paths or URLs: a list, a brace pattern, a glob or a directory of ``*.tar``.
    layout: token prices and layout of the modalities.
    window: per-key offsets of windowed samples (with ``stride``); None for whole-episode chunks of at most
        ``max_length`` steps (None: whole episodes).
    capacity, rows_per_batch: as in :class:`StreamConfig`; or pass ``config`` for every stream setting.
    tokenizer: ``encode(str) -> int32 ids`` for the task text (default: UTF-8 bytes).
    seed: shard shuffle seed (with ``StreamConfig.shuffle_shards``); ``set_epoch`` picks the epoch.
    rank, world_size: this process's place among the data-parallel ranks.
    backend: video backend for ``mmfeed.codecs``.

    Use with ``DataLoader(ds, batch_size=None, num_workers=...)``; ``stats`` counts what this process's stream
    did (episodes, samples, oversize samples, rows, batches, tokens, frames decoded, episodes held).
    """

    def __init__(
        self,
        shards: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        layout: TokenLayout,
        window: WindowSpec | None = None,
        stride: int = 1,
        max_length: int | None = None,
        capacity: int = 8192,
        rows_per_batch: int = 1,
        config: StreamConfig | None = None,
        tokenizer=None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        backend: str = "auto",
    ) -> None:
        if not isinstance(layout, TokenLayout):
            raise TypeError(f"layout must be a TokenLayout, got {type(layout).__name__}")
        if window is not None and max_length is not None:
            raise ValueError("give window (windowed samples) or max_length (episode chunks), not both")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
        if window is not None:
            for key in window.offsets:
                layout.key_tokens(key)  # every window key must be priced
        self.shards = expand_shards(shards)
        self.name = str(shards) if not isinstance(shards, (list, tuple)) else str(self.shards[0])
        self.layout = layout
        self.sampling = SamplingConfig(window=window, stride=stride, max_length=max_length)
        self.config = config or StreamConfig(capacity=capacity, rows_per_batch=rows_per_batch)
        self.tokenizer = tokenizer or ByteTokenizer()
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.backend = backend
        # The epoch lives in shared memory, so that set_epoch in the training process reaches persistent
        # DataLoader workers, which hold copies of this dataset made when they started.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._stream: _Stream | None = None
        self._resume: dict | None = None

    @property
    def epoch(self) -> int:
        """The epoch whose shard order the next ``iter`` reads (see :meth:`set_epoch`)."""
        return int(self._epoch[0])

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read the shards in epoch ``epoch``'s order from the next ``iter`` on, in this process and in the
        DataLoader's workers, persistent ones included."""
        self.epoch = int(epoch)

    @property
    def stats(self) -> dict:
        """Counters of the stream running (or last run) in this process; zeros before any."""
        return self._stream.stats if self._stream is not None else _new_stats()

    def __iter__(self) -> Iterator[PackedBatch]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        resume, self._resume = self._resume, None
        if resume is not None and num_workers != 1:
            raise ValueError("a streaming state resumes only with num_workers=0 (it holds one worker's stream)")
        order = shard_order(len(self.shards), seed=self.seed, epoch=self.epoch, shuffle=self.config.shuffle_shards)
        mine = assign_shards(order, rank=self.rank, world_size=self.world_size, worker=worker,
                             num_workers=num_workers)
        if len(mine) == 0:
            log.warning("%s: worker %d of rank %d gets no shard (%d shards for %d workers in all); it yields "
                        "nothing", self.name, worker, self.rank, len(self.shards), self.world_size * num_workers)
        quota = None
        if self.config.steps_per_epoch is not None:
            n = self.config.steps_per_epoch
            quota = n // num_workers + (worker < n % num_workers)
        self._stream = _Stream(self, mine.tolist(), quota)
        if resume is not None:
            self._stream.restore(resume)
        return self._stream.batches()

    def state_dict(self) -> dict:
        """The state of this process's stream after the batches it has handed out (plain ints and lists)."""
        if self._stream is None:
            raise RuntimeError("no stream has run in this process: take the state from the loop that iterates "
                               "the dataset with num_workers=0 (with worker processes the state lives in them)")
        return self._stream.state()

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` at the next ``iter`` (same shards and settings; num_workers=0)."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not a StreamingPackedDataset state (version {_STATE_VERSION}): {str(state)[:80]!r}")
        mine = {"num_shards": len(self.shards), "rank": self.rank, "world_size": self.world_size,
                "seed": self.seed, "config": asdict(self.config)}
        for key, value in mine.items():
            if state[key] != value:
                raise ValueError(f"state has {key}={state[key]!r}, this dataset {value!r}; build it alike")
        self.epoch = int(state["epoch"])
        self._resume = state

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_stream"] = None  # each worker runs its own stream
        return state


# ---------------------------------------------------------------------------------------------------------------


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
