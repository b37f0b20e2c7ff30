"""One worker's stream in streaming mode (see :mod:`mmfeed.loaders.streaming.dataset`): the running state, the batch
generator over the stages, and its snapshot and restore.

A stream is given what it reads and how (:class:`StreamSetup`: the shards, the ``Packing``, the
:class:`~mmfeed.loaders.sources.options.ReadOptions`, the packer's window), never the dataset that made it. Each
episode read from a shard becomes an in-memory :class:`~mmfeed.loaders.formats.webdataset.source.WebDatasetSource`
and an :class:`~mmfeed.loaders.planned.items.EpisodeItems` of its samples; a batch's rows are collated over a
:class:`~mmfeed.loaders.sources.concat.ConcatSource` of the episodes they hold by the planned loader's collation
(:func:`~mmfeed.loaders.planned.collate.collate_batch`), told how the stream names its documents
(:class:`~mmfeed.loaders.planned.reads.DocumentNames`: push ids, episode numbers, the stream's name, the episodes it
skipped).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from mmfeed.loaders.formats.webdataset.source import WebDatasetSource
from mmfeed.loaders.planned.collate import collate_batch, samples_of
from mmfeed.loaders.planned.config import Packing
from mmfeed.loaders.planned.errors import ErrorCounter
from mmfeed.loaders.planned.items import EpisodeItems
from mmfeed.loaders.planned.reads import DocumentNames
from mmfeed.loaders.sources.concat import ConcatSource
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.transport.tar import iter_shard
from mmfeed.packing import OnlinePacker, PackedBatch

log = logging.getLogger(__name__)

EPISODE_STRIDE = 1_000_000
"""``metadata["episode"] = shard * EPISODE_STRIDE + position in the shard``; a shard holds fewer episodes."""

STATE_VERSION = 2


def read_shards(urls: Sequence[str], shards: Sequence[int], *, start: tuple[int, int] = (0, 0)
                ) -> Iterator[tuple[int, int, int, str, dict[str, bytes]]]:
    """Stage 1: ``(slot, shard, position, key, members)`` of every episode of ``shards`` (indices into ``urls``)
    in order, from slot ``start[0]`` and, in that shard, position ``start[1]`` on."""
    first_slot, first_position = start
    for slot in range(first_slot, len(shards)):
        shard = int(shards[slot])
        skip = first_position if slot == first_slot else 0
        for position, (key, members) in _positions(urls[shard], lambda p, skip=skip: p >= skip):
            if position >= EPISODE_STRIDE:
                raise ValueError(f"{urls[shard]} holds more than {EPISODE_STRIDE} episodes; split it into smaller "
                                 "shards")
            yield slot, shard, position, key, members


def _positions(url: str, select) -> Iterator[tuple[int, tuple[str, dict[str, bytes]]]]:
    """``(position, (key, members))`` of the episodes of one shard whose position ``select`` keeps."""
    chosen: list[int] = []

    def keep(p: int) -> bool:
        if select(p):
            chosen.append(p)  # iter_shard yields this episode before it asks about the next
            return True
        return False

    for key, members, _ in iter_shard(url, select=keep):
        yield chosen[-1], (key, members)


def new_stats() -> dict:
    keys = ("episodes", "samples", "oversize", "skipped_episodes", "rows", "batches", "tokens", "episodes_held",
            "episodes_held_max")
    return dict.fromkeys(keys, 0)


@dataclass(frozen=True, eq=False)
class StreamSetup:
    """What a stream reads and how, from the dataset that starts it.

    urls: every shard of the dataset (a shard's number is its place here); name: the dataset's name, for logs and
    ``metadata["source"]``; packing: layout, window, plan, static shapes, error policy, transform and seed;
    options: how an episode's bytes are read (:class:`~mmfeed.loaders.sources.options.ReadOptions`);
    window_items, max_delay: the online packer's buffer; identity: what a saved state must agree with.
    """

    urls: list[str]
    name: str
    packing: Packing
    options: ReadOptions
    window_items: int
    max_delay: int | None
    identity: dict


@dataclass(eq=False)
class _Episode:
    """One episode held in memory: its source, its samples and how many of them are still out."""

    number: int
    items: EpisodeItems
    refs: int = 0


class Stream:
    """One worker's pass over its ``shards`` (numbers of ``setup.urls``), at most ``quota`` batches; ``epoch``: the
    dataset's one-element epoch tensor (shared memory: it reads the epoch ``set_epoch`` gave last)."""

    def __init__(self, setup: StreamSetup, shards: list[int], quota: int | None, epoch: torch.Tensor) -> None:
        self.setup, self.shards, self.quota, self._epoch = setup, shards, quota, epoch
        self.packer = OnlinePacker(setup.packing.plan.capacity, window=setup.window_items, max_delay=setup.max_delay)
        self.counter = ErrorCounter(setup.packing.errors)
        self.samples: dict[int, tuple[_Episode, int]] = {}  # push id -> (episode, sample index in its items)
        self.episodes: dict[int, _Episode] = {}  # episode number -> episode still referenced
        self.pending: list[list[int]] = []  # rows emitted by the packer, not yet batched
        self.failures: list[dict] = []  # episodes skipped under the error policy, for the next batch
        self.slot, self.done_in_shard, self.count = 0, 0, 0
        self.stats = new_stats()

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    # -- the generator ------------------------------------------------------------------------------------------
    def batches(self):
        rows_per_batch = self.setup.packing.plan.rows_per_batch
        if self._capped():
            return
        for slot, shard, position, key, members in read_shards(self.setup.urls, self.shards,
                                                               start=(self.slot, self.done_in_shard)):
            if slot != self.slot:
                self.slot, self.done_in_shard = slot, 0
            self._push(self._load(shard, position, key, members))
            self.done_in_shard = position + 1
            while len(self.pending) >= rows_per_batch:
                yield self._take(rows_per_batch)
                if self._capped():
                    return
        self.slot, self.done_in_shard = len(self.shards), 0
        self.pending.extend(self.packer.flush())
        self.stats["rows"] = self.packer.rows_emitted
        while self.pending and not self._capped():
            yield self._take(rows_per_batch)
        if not self.pending:
            log.info("%s: stream done: %s", self.setup.name, self.stats)

    def _capped(self) -> bool:
        if self.quota is not None and self.count >= self.quota:
            log.info("%s: stopped at steps_per_epoch after %d batches; %d samples buffered", self.setup.name,
                     self.count, self.packer.pending)
            return True
        return False

    # -- stage 2: an episode, its source and samples --------------------------------------------------------------
    def _load(self, shard: int, position: int, key: str, members: dict[str, bytes]) -> _Episode | None:
        """The episode as an in-memory source cut into samples; None when it cannot be read and the error policy
        skips it (counted, and listed in the next batch's errors)."""
        urls, p = self.setup.urls, self.setup.packing
        number = shard * EPISODE_STRIDE + position
        try:
            source = WebDatasetSource.from_memory(urls[shard], [(key, members)], self.setup.options)
            items = EpisodeItems(source, layout=p.layout, window=p.window, stride=p.stride, max_length=p.max_length,
                                 capacity=p.plan.capacity, long_episodes=p.long_episodes, tokenizer=p.tokenizer)
        except MemoryError:
            raise
        except Exception as err:
            if self.counter.policy.on_error == "raise":
                raise
            record = {"sample": -1, "episode": number, "source": f"{urls[shard]} key {key!r}",
                      "reason": f"{type(err).__name__}: {err}"}
            self.failures.append(record)
            self.stats["skipped_episodes"] += 1
            self.counter.failed(record)
            return None
        if not len(items):
            log.warning("%s key %r has no steps; skipped", urls[shard], key)
        return _Episode(number, items)

    # -- stage 3: the online packer -------------------------------------------------------------------------------
    def _push(self, ep: _Episode | None) -> None:
        if ep is None or not len(ep.items):
            return
        tokens = ep.items.table.tokens
        first, before = self.packer.pushed, self.packer.num_oversize
        self.episodes[ep.number] = ep
        for i in range(len(tokens)):
            self.samples[first + i] = (ep, i)
        ep.refs = len(tokens)
        self.pending.extend(row.tolist() for row in self.packer.push_many(tokens))
        oversize = self.packer.oversize_ids[before:]
        if oversize:
            longest = max(int(tokens[s - first]) for s in oversize)
            log.warning("%s: %d sample(s) of episode %d are longer than capacity %d (up to %d tokens): skipped and "
                        "counted in stats['oversize']", self.setup.name, len(oversize), ep.number, self.packer.capacity,
                        longest)
            self.stats["oversize"] += len(oversize)
            self._release(oversize)
        self.stats["episodes"] += 1
        self.stats["samples"] += len(tokens)
        self.stats["rows"] = self.packer.rows_emitted
        self.stats["episodes_held_max"] = max(self.stats["episodes_held_max"], len(self.episodes))
        self.stats["episodes_held"] = len(self.episodes)

    # -- stage 4: collation ---------------------------------------------------------------------------------------
    def _take(self, rows_per_batch: int) -> PackedBatch:
        rows, self.pending = self.pending[:rows_per_batch], self.pending[rows_per_batch:]
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
        """The rows' samples collated over the episodes they hold by the planned loader's collation, which names
        the documents as the stream does: push ids, episode numbers, the stream's name (no datasets: the episodes
        of one batch are no mixture) and, after the batch's own, the episodes skipped since the last batch."""
        p = self.setup.packing
        ids = np.array([s for row in rows for s in row], dtype=np.int64)
        held: dict[int, int] = {}  # episode number -> its index in this batch's source
        episodes: list[_Episode] = []
        local_episode, which = np.zeros(len(ids), np.int64), np.zeros(len(ids), np.int64)
        for j, s in enumerate(ids.tolist()):
            ep, i = self.samples[s]
            if ep.number not in held:
                held[ep.number] = len(episodes)
                episodes.append(ep)
            local_episode[j], which[j] = held[ep.number], i
        source = ConcatSource([ep.items.source for ep in episodes]) if len(episodes) > 1 else episodes[0].items.source
        first = [ep.items for ep in episodes]
        start = np.array([first[e].table.locate([i])[1][0] for e, i in zip(local_episode, which)], dtype=np.int64)
        length = np.array([first[e].table.lengths([i])[0] for e, i in zip(local_episode, which)], dtype=np.int64)
        items = EpisodeItems.of_samples(source, local_episode, start, None if p.window is not None else length,
                                        layout=p.layout, window=p.window, tokenizer=p.tokenizer)
        bounds = np.cumsum([0] + [len(row) for row in rows])
        local_rows = [np.arange(a, b, dtype=np.int64) for a, b in zip(bounds[:-1], bounds[1:])]
        number = np.array([ep.number for ep in episodes], dtype=np.int64)[local_episode]
        names = DocumentNames(sample=ids, episode=number, source=self.setup.name, errors=self.failures)
        reads = replace(items.reads(samples_of(local_rows)), names=names)
        # a stream's cheapest sample is not known ahead: static shapes bound a batch at one token a document
        most = p.plan.most_documents(1) if p.static_shapes else None
        batch = collate_batch(reads, local_rows, p.plan.capacity, num_rows=p.plan.rows_per_batch if p.static_shapes
                              else None, static_shapes=p.static_shapes, max_documents=most, errors=self.counter,
                              epoch=self.epoch, seed=p.seed, transform=p.transform)
        self.failures = []
        if len(batch.metadata["sample"]) != len(ids):
            # Samples that failed in collation (skipped under the error policy): this stream has always listed
            # every sample of the rows here, the failed ones too; kept so that its batches stay as they were.
            batch.metadata["sample"] = torch.from_numpy(ids)
            batch.metadata["episode"] = torch.from_numpy(number)
        return batch

    # -- resume ---------------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"version": STATE_VERSION, "epoch": self.epoch, **self.setup.identity,
                "slot": self.slot, "done_in_shard": self.done_in_shard, "batches": self.count,
                "packer": self.packer.state_dict(), "pending": [list(row) for row in self.pending],
                "samples": [[s, ep.number, i] for s, (ep, i) in sorted(self.samples.items())],
                "stats": dict(self.stats)}

    def restore(self, state: dict) -> None:
        """Continue from ``state``: re-read the episodes its buffered samples come from."""
        self.slot, self.done_in_shard, self.count = (int(state[k]) for k in ("slot", "done_in_shard", "batches"))
        self.packer.load_state_dict(state["packer"])
        self.pending = [list(row) for row in state["pending"]]
        self.stats = dict(state["stats"])
        wanted: dict[int, set[int]] = {}
        for _, number, _ in state["samples"]:
            wanted.setdefault(number // EPISODE_STRIDE, set()).add(number % EPISODE_STRIDE)
        for shard, positions in sorted(wanted.items()):
            for position, (key, members) in _positions(self.setup.urls[shard], positions.__contains__):
                ep = self._load(shard, position, key, members)
                if ep is not None:
                    self.episodes[ep.number] = ep
        for s, number, i in state["samples"]:
            if number not in self.episodes:
                raise ValueError(f"state refers to episode {number} ({self.setup.urls[number // EPISODE_STRIDE]}, "
                                 f"position {number % EPISODE_STRIDE}), which the shard no longer holds")
            ep = self.episodes[number]
            self.samples[int(s)] = (ep, int(i))
            ep.refs += 1
