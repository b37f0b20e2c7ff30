"""Streaming mode: webdataset tars read front to back without an index, packed with the bounded online packer.

For data that cannot be indexed ahead of time (shards still being written, a store too large to index). It is a
chain of small stages, each a plain generator over the one before, over the same reader and the same
read/lay-out split as the planned loader:

1. :func:`read_shards`: a worker's shards in order, episode by episode, through the one tar reader
   (:func:`~mmfeed.loaders.transport.tar.iter_shard`);
2. each episode becomes an in-memory source (:meth:`WebDatasetSource.from_memory`, the reader indexed shards
   use) and is cut into samples exactly as the planned loader cuts them
   (:class:`~mmfeed.loaders.planned.items.EpisodeItems`: windows, or whole-episode chunks);
3. the samples' prices go into an :class:`~mmfeed.packing.OnlinePacker`, which emits full rows;
4. rows are collated by :func:`mmfeed.loaders.planned.collate.collate_batch` over the episodes they hold, under the
   same ``Packing`` (layout, static shapes, error policy, transform) as a planned dataset; the stream tells it how
   its documents are named (:class:`~mmfeed.loaders.planned.reads.DocumentNames`) rather than renaming them after.

Each worker's :class:`~mmfeed.loaders.streaming.worker.Stream` is given what it reads and how
(:class:`~mmfeed.loaders.streaming.worker.StreamSetup`: shards, ``Packing``, ``ReadOptions``, the packer's window),
never this dataset.

- **Memory is bounded.** An episode's member bytes (compressed video, arrays) are held while some sample of it is
  buffered by the packer (fewer than ``window_items``) or waits in a row for its batch, and dropped after.
- **Nothing is lost silently.** At the end of the stream the packer is flushed and the last rows go out in a
  final, possibly smaller, batch. Samples longer than the capacity are skipped, counted in ``stats`` and logged;
  an episode that cannot be read is raised (naming shard, key and member) or, under ``ErrorPolicy(on_error=
  "skip")``, skipped, counted and listed in the next batch's ``metadata["errors"]``.
- **Who reads what.** Shard ``i`` of the (optionally per-epoch shuffled) shard list goes to global worker
  ``i % (world_size * num_workers)``, global worker ``rank * num_workers + worker``. With uneven shards ranks may
  run different numbers of steps, which stalls a synchronous job at the epoch's end: that is why the indexed plan
  is the default. ``StreamConfig(steps_per_epoch=N)`` caps every rank at N steps.
- **Identity.** ``metadata["episode"]`` is ``shard * EPISODE_STRIDE + position`` (shard index in the expanded,
  unshuffled shard list; position of the episode in its tar), the same in every worker layout; with
  ``(episode, start_step)`` it names a sample globally. ``metadata["sample"]`` is the sample's push number in its
  worker's packer (unique within one worker's epoch).
- **Resume.** ``state_dict()`` / ``load_state_dict()`` capture the iteration running in this process (use
  ``num_workers=0``): shard cursor, packer state and buffered samples; the batches after a resume equal those of
  an uninterrupted run. With worker processes the state lives in the workers; resume there needs the indexed plan.

>>> ds = StreamingPackedDataset("shards/", packing=Packing(layout=layout, window=window))   # doctest: +SKIP
>>> batch = next(iter(DataLoader(ds, batch_size=None)))                                   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from mmfeed.loaders.formats.webdataset.source import WebDatasetSource, expand_shards
from mmfeed.loaders.planned.config import Packing
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.streaming.worker import (EPISODE_STRIDE, STATE_VERSION, Stream, StreamSetup, new_stats,
                                             read_shards)
from mmfeed.packing import PackedBatch

__all__ = ["EPISODE_STRIDE", "StreamConfig", "StreamingPackedDataset", "assign_shards", "read_shards",
           "shard_order"]

log = logging.getLogger(__name__)

@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """How the stream is buffered and cut (the capacity, rows per batch and static shapes come from
    ``Packing.plan`` and ``Packing.static_shapes``).

    window_items: most samples the online packer buffers (larger packs tighter, holds more episodes).
    max_delay: every sample is emitted at most this many pushes after its own (default ``4 * window_items``).
    shuffle_shards: permute the shard order each epoch, deterministically from ``(seed, epoch)``.
    steps_per_epoch: most batches each rank yields per epoch (None: until its shards end).
    """

    window_items: int = 1000
    max_delay: int | None = None
    shuffle_shards: bool = False
    steps_per_epoch: int | None = None

    def __post_init__(self) -> None:
        for name in ("window_items", "max_delay", "steps_per_epoch"):
            value = getattr(self, name)
            if value is None and name != "window_items":
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
    packing: layout, window (or whole-episode chunks), capacity and rows per batch (``plan``), static shapes,
        tokenizer, error policy, transform and seed, exactly as for the planned loader.
    config: the stream's own settings (:class:`StreamConfig`).
    rank, world_size: this process's place among the data-parallel ranks.
    options, ``**read_options``: how episodes are read, as for :func:`~mmfeed.loaders.open_dataset`: a
        :class:`~mmfeed.loaders.sources.options.ReadOptions` and/or its fields by name (``backend``,
        ``frame_size``, ``frame_format``, ``decoder_threads``, ``max_frame_pixels``, ...), checked now; an option
        webdataset shards do not read is refused.

    Use with ``DataLoader(ds, batch_size=None, num_workers=...)``; ``stats`` counts what this process's stream
    did (episodes, samples, oversize samples, skipped episodes, rows, batches, tokens, episodes held).
    """

    def __init__(self, shards: str | os.PathLike | Sequence[str | os.PathLike], *, packing: Packing,
                 config: StreamConfig | None = None, rank: int = 0, world_size: int = 1,
                 options: ReadOptions | None = None, **read_options: Any) -> None:
        if not isinstance(packing, Packing):
            raise TypeError(f"packing must be an mmfeed.loaders.Packing, got {type(packing).__name__}")
        if packing.plan.mode != "pack" or not packing.plan.capacity:
            raise ValueError("streaming packs rows online: give Packing(plan=PlanConfig(mode='pack', capacity=...))")
        if packing.weights is not None:
            raise ValueError("streaming reads its shards in order: weights need the indexed plan (open_dataset)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
        self.shards = [u if "://" in u else os.path.abspath(u) for u in expand_shards(shards)]
        self.name = str(shards) if not isinstance(shards, (list, tuple)) else str(self.shards[0])
        self.packing, self.config = packing, config or StreamConfig()
        self.rank, self.world_size = int(rank), int(world_size)
        # built and checked now (a bad backend, frame size or format fails here), as open_dataset does
        self.options = ReadOptions.of(options, **read_options)
        self.options.refuse_others(WebDatasetSource.READ_OPTIONS, WebDatasetSource.FORMAT, self.name)
        # The epoch lives in shared memory, so that set_epoch in the training process reaches persistent
        # DataLoader workers, which hold copies of this dataset made when they started.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._stream = None
        self._resume: dict | None = None

    @property
    def epoch(self) -> int:
        """The epoch whose shard order the next ``iter`` reads (see :meth:`set_epoch`)."""
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Read the shards in epoch ``epoch``'s order from the next ``iter`` on, in this process and in the
        DataLoader's workers, persistent ones included."""
        self._epoch[0] = int(epoch)

    @property
    def stats(self) -> dict:
        """Counters of the stream running (or last run) in this process; zeros before any."""
        return self._stream.stats if self._stream is not None else new_stats()

    def __iter__(self) -> Iterator[PackedBatch]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        resume, self._resume = self._resume, None
        if resume is not None and num_workers != 1:
            raise ValueError("a streaming state resumes only with num_workers=0 (it holds one worker's stream)")
        order = shard_order(len(self.shards), seed=self.packing.seed, epoch=self.epoch,
                            shuffle=self.config.shuffle_shards)
        mine = assign_shards(order, rank=self.rank, world_size=self.world_size, worker=worker,
                             num_workers=num_workers)
        if len(mine) == 0:
            log.warning("%s: worker %d of rank %d gets no shard (%d shards for %d workers in all); it yields "
                        "nothing", self.name, worker, self.rank, len(self.shards), self.world_size * num_workers)
        quota = None
        if self.config.steps_per_epoch is not None:
            n = self.config.steps_per_epoch
            quota = n // num_workers + (worker < n % num_workers)
        self._stream = Stream(self.setup(), mine.tolist(), quota, self._epoch)
        if resume is not None:
            self._stream.restore(resume)
        return self._stream.batches()

    @property
    def backend(self) -> str:
        return self.options.backend

    @property
    def frame_size(self) -> Any:
        return self.options.frame_size

    @property
    def frame_format(self) -> str:
        return self.options.frame_format

    def setup(self) -> StreamSetup:
        """What each worker's stream reads and how (:class:`~mmfeed.loaders.streaming.worker.StreamSetup`)."""
        return StreamSetup(urls=self.shards, name=self.name, packing=self.packing, options=self.options,
                           window_items=self.config.window_items, max_delay=self.config.max_delay,
                           identity=self.identity())

    def identity(self) -> dict:
        """What a saved state must agree with to resume on this dataset."""
        return {"num_shards": len(self.shards), "rank": self.rank, "world_size": self.world_size,
                "seed": self.packing.seed, "config": asdict(self.config), "capacity": self.packing.plan.capacity,
                "rows_per_batch": self.packing.plan.rows_per_batch}

    def state_dict(self) -> dict:
        """The state of this process's stream after the batches it has handed out (plain ints and lists)."""
        if self._stream is None:
            raise RuntimeError("no stream has run in this process: take the state from the loop that iterates "
                               "the dataset with num_workers=0 (with worker processes the state lives in them)")
        return self._stream.state()

    def load_state_dict(self, state: dict) -> None:
        """Resume from :meth:`state_dict` at the next ``iter`` (same shards and settings; num_workers=0)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not a StreamingPackedDataset state (version {STATE_VERSION}): {str(state)[:80]!r}")
        for key, value in self.identity().items():
            if state.get(key) != value:
                raise ValueError(f"state has {key}={state.get(key)!r}, this dataset {value!r}; build it alike")
        self.set_epoch(int(state["epoch"]))
        self._resume = state

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_stream"] = None  # each worker runs its own stream
        return state
