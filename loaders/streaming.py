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

This module holds the settings, the shard assignment and the dataset; one worker's stream (tar reading, episode
decode, sample assembly, packing into batches, its snapshot) lives in :mod:`mmfeed.loaders.streaming_worker`.

>>> ds = StreamingPackedDataset("shards/", layout=TokenLayout(tokens_per_frame={"cam_high": 64}),  # doctest: +SKIP
...                             window=WindowSpec(offsets={"frames.cam_high": (0,), "action": (0, 1)}),
...                             capacity=4096, rows_per_batch=2)
>>> batch = next(iter(ds))                                                                        # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from mmfeed.codecs.text import ByteTokenizer
from mmfeed.loaders.layout import TokenLayout
from mmfeed.loaders.samples import SamplingConfig
from mmfeed.loaders.streaming_worker import _STATE_VERSION, EPISODE_STRIDE, _new_stats, _Stream
from mmfeed.loaders.webdataset import expand_shards
from mmfeed.loaders.windows import WindowSpec
from mmfeed.packing import PackedBatch

__all__ = ["EPISODE_STRIDE", "StreamConfig", "StreamingPackedDataset", "assign_shards", "shard_order"]

log = logging.getLogger(__name__)


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
