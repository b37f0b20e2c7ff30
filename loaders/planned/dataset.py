"""The one planned dataset: an epoch plan over any kind of items, one item per step of one rank's plan.

:class:`PlannedDataset` is a map-style torch Dataset whose item ``(epoch, step)`` is the PackedBatch of that step
for this rank. What it plans over is an item kind (:mod:`mmfeed.loaders.planned.items`: episode windows, whole-episode
chunks, a mixture of datasets, a map-style dataset's records), which prices samples and reads them; everything
else is written once here: the plan and its cache, rank handling, the error policy, pickling and resume. The
plan is recomputed from the index in each process that needs it (a pure function of ``(seed, epoch)``), so
torch's worker processes, persistent or not, need no shared state, and :class:`PlanSampler` resumes mid-epoch by
starting at a step instead of replaying data.

Elastic resume: a loader state saved at one world size continues at another. The samples the job consumed are a
pure function of ``(seed, epoch, world size, steps done)``, so they are recomputed from the old plan, and the rest
of the epoch is every other sample planned afresh for the new world size
(:func:`~mmfeed.packing.plan.plan_remainder`); such a step is the item ``(epoch, step, done)``, ``done`` the
earlier ``(world_size, steps)`` segments. :meth:`PlannedDataset.reshard_state` rewrites a saved
``mmfeed.DataLoader`` state for this dataset's world size (one state, e.g. rank 0's, serves every new rank).

    >>> import torch
    >>> docs = [torch.arange(n) for n in (5, 3, 7, 2)]
    >>> ds = PlannedDataset.records(docs, lengths=[5, 3, 7, 2], plan=PlanConfig(capacity=8))
    >>> b = ds[0, 0]
    >>> b.capacity, int(b.cu_seqlens[-1]) == len(b.data["text"])
    (8, True)
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mmfeed.loaders.heap import epoch_began
from mmfeed.loaders.planned.collate import collate_batch, samples_of
from mmfeed.loaders.planned.errors import ErrorCounter, ErrorPolicy
from mmfeed.loaders.planned.reads import Items
from mmfeed.packing import PackedBatch
from mmfeed.packing.classes import ClassPlan
from mmfeed.packing.epoch import PLAN_VERSION, EpochPlan, plan_for
from mmfeed.packing.plan import Plan, PlanConfig
from mmfeed.packing.uniform import UniformPlan

__all__ = ["PLAN_VERSION", "PlanSampler", "PlannedDataset"]

log = logging.getLogger(__name__)


class PlannedDataset(torch.utils.data.Dataset):
    """Packed batches of one rank, planned from ``items`` (see :mod:`mmfeed.loaders.planned.items`).

    plan: capacity, rows per batch, mode, ... (:class:`~mmfeed.packing.plan.PlanConfig`).
    seed, rank, world_size: the plan is a pure function of these and the epoch.
    static_shapes: every batch tensor, ``cu_seqlens`` included, has one shape for the whole epoch.
    errors: what a sample that cannot be loaded does (:class:`~mmfeed.loaders.planned.errors.ErrorPolicy`; default
        raise).
    transform: ``fn(sample: dict, generator) -> dict`` run on each sample after it is read, the generator seeded
        from ``(seed, epoch, sample id)``; it may change values, not the first dimension of any array (frames, or
        a record's tokens), since tokens are planned before reading.
    refuse_unfit: a capacity (pack mode; the token budget in bucket mode) below the price of every sample, whose
        epochs would have no step, is a ValueError naming the capacity that fits; samples dearer than the capacity
        beside others that fit are left out of the plan by design (``Plan.dropped``) and counted in a warning.
        False plans such empty epochs, as ``mmfeed inspect`` does to forecast them.
    """

    def __init__(self, items: Items, *, plan: PlanConfig | None = None, seed: int = 0, rank: int = 0,
                 world_size: int = 1, static_shapes: bool = False, errors: ErrorPolicy | None = None,
                 transform: Callable | None = None, refuse_unfit: bool = True) -> None:
        for name, value in (("seed", seed), ("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be a callable fn(sample, generator) -> dict, got {transform!r}")
        self.items = items
        self.config = plan or PlanConfig()
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.static_shapes = bool(static_shapes)
        self.errors = errors or ErrorPolicy()
        self.transform = transform
        self._counter = ErrorCounter(self.errors)  # consecutive failures in this process
        self._plan: tuple[Any, EpochPlan] | None = None
        self._plan_lock = threading.Lock()
        self._num_steps: dict[Any, int] = {}
        self._max_documents = None
        # The epoch a plain index reads, in shared memory so that set_epoch reaches the DataLoader's workers,
        # persistent ones included, which hold copies of this dataset made when they started.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        if self.config.capacity and len(items):
            if refuse_unfit and self.config.mode != "fixed":
                _check_fit(items.table, self.config.capacity, self.config.mode)
            self._max_documents = self.config.most_documents(items.table.min_price)

    @classmethod
    def records(cls, dataset: Any, lengths: Any, **kwargs: Any) -> PlannedDataset:
        """Packed batches of a map-style dataset's samples priced ``lengths`` (an array, or a function
        ``index -> int``), e.g. token sequences for language-model packing; ``kwargs`` as for the constructor, each
        meaning what it means for episode samples (``transform`` gets a record's tensors and its ``index``). See
        :class:`~mmfeed.loaders.planned.records.RecordItems` for what a sample may be.

        Records carry their own token ids, planned from ``lengths`` before anything is read, so ``tokenizer`` (the
        task text's encoder of episode samples) is refused."""
        from mmfeed.loaders.planned.records import RecordItems

        if "tokenizer" in kwargs:
            raise ValueError("PlannedDataset.records takes no tokenizer: records carry their own token ids, whose "
                             "lengths are planned before anything is read (a tokenizer encodes the task text of "
                             "episode samples, Packing(tokenizer=...)); tokenize the texts in the dataset and pass "
                             "the ids' lengths")
        return cls(RecordItems(dataset, lengths), **kwargs)

    @property
    def source(self) -> Any:
        """The episode source of episode items (None for records)."""
        return getattr(self.items, "source", None)

    def plan(self, epoch: int, done: tuple[tuple[int, int], ...] = ()) -> Plan | UniformPlan | ClassPlan:
        """The whole epoch's plan (all ranks), cached for the last epoch asked; with ``done`` (earlier segments
        ``(world_size, steps)`` of an elastic resume) the plan of the rest of that epoch. Its sample ids are
        positions in :meth:`epoch_samples` (the identity unless the items draw samples by weight). Which planner
        makes it, and why, is :meth:`planned`'s ``planner`` and ``reason`` (:func:`~mmfeed.packing.epoch.plan_for`
        states the rule)."""
        return self.planned(epoch, done).plan

    def planned(self, epoch: int, done: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
        """The plan of ``epoch`` with the planner that made it and why (:class:`~mmfeed.packing.epoch.EpochPlan`),
        cached for the last epoch asked."""
        key = (int(epoch), tuple((int(w), int(k)) for w, k in done))
        cached = self._plan  # read once: a chained loader plans the next epoch from its prefetch thread
        if cached is not None and cached[0] == key:
            return cached[1]
        with self._plan_lock:
            cached = self._plan
            if cached is None or cached[0] != key:
                cached = self._plan = (key, plan_for(self.items.table, self.config, seed=self.seed, epoch=key[0],
                                                     world_size=self.world_size, done=key[1]))
        return cached[1]

    def epoch_samples(self, epoch: int) -> np.ndarray | None:
        """The sample ids the plan of ``epoch`` positions refer to; None: position = sample id."""
        return self.planned(epoch).drawn

    def num_steps(self, epoch: int = 0, done: tuple[tuple[int, int], ...] = ()) -> int:
        """Steps of this epoch (the same on every rank); with ``done``, of the rest of it."""
        key = (int(epoch), tuple((int(w), int(k)) for w, k in done))
        if key not in self._num_steps:
            self._num_steps[key] = self.plan(*key).num_steps
        return self._num_steps[key]

    def batch_samples(self, epoch: int, step: int, done: tuple = ()) -> list[np.ndarray]:
        """The sample ids of each row of this rank's batch at ``step``."""
        planned = self.planned(epoch, done)
        if not 0 <= step < planned.plan.num_steps:
            raise IndexError(f"step {step} out of range: epoch {epoch} has {planned.plan.num_steps} steps"
                             + (f" after the segments {list(done)}" if done else ""))
        return planned.samples(planned.plan.batch_rows(self.rank, int(step)))

    @property
    def epoch(self) -> int:
        """The epoch a plain index reads (see :meth:`set_epoch`)."""
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """From now on ``dataset[i]`` is step ``i`` of epoch ``epoch``'s plan and ``len(dataset)`` that epoch's
        steps, in this process and in the DataLoader's workers. mmfeed's DataLoader names the epoch in every index
        (its :class:`PlanSampler`); this is for loaders that index ``0..len-1`` and call ``set_epoch`` between
        epochs, as the loader Hugging Face Accelerate's ``prepare`` rebuilds from mmfeed's does, so that each of
        its epochs runs its own plan instead of replaying the first."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._epoch[0] = int(epoch)

    def __len__(self) -> int:
        return self.num_steps(self.epoch)

    def __getitem__(self, key: tuple[int, int] | tuple[int, int, tuple] | int) -> PackedBatch:
        if isinstance(key, tuple):
            epoch, step, done = key if len(key) == 3 else (*key, ())
        else:
            epoch, step, done = self.epoch, key, ()
        epoch_began(int(epoch))  # a worker gives back the free heap of its last epoch
        rows = self.batch_samples(int(epoch), int(step), done)
        plan = self.plan(int(epoch), done)
        num_rows = plan.max_rows if self.static_shapes else None
        return collate_batch(self.items.reads(samples_of(rows)), rows, plan.capacity, num_rows=num_rows,
                             static_shapes=self.static_shapes, max_documents=self._max_documents,
                             errors=self._counter, epoch=int(epoch), seed=self.seed, transform=self.transform)

    def reshard_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A ``mmfeed.DataLoader`` state saved at any world size, rewritten to resume on this dataset's.

        At the same world size the state comes back unchanged. Otherwise the steps the saved loader ran in its
        epoch become a done segment ``(old world size, steps)``: the resumed loader runs the plan of the samples
        not yet consumed, for this world size, from its first step. No sample of the epoch is lost or repeated.
        The state is the same on every rank, so any rank's saved state resumes every new rank::

            loader.load_state_dict(loader.dataset.reshard_state(torch.load("loader.pt")))

        Raises ValueError when the state was saved with another plan seed or plan version.
        """
        order = state.get("order") if isinstance(state, dict) else None
        if not isinstance(order, dict) or order.get("kind") != "stateful" or not isinstance(order.get("state"), dict):
            return copy.deepcopy(state)
        saved = order["state"]
        version = saved.get("plan_version", 1)
        if version != PLAN_VERSION:
            raise ValueError(f"the state was saved by plan version {version}, this mmfeed plans with version "
                             f"{PLAN_VERSION}: the order of samples changed, so its cursor cannot be resumed; start "
                             "the epoch afresh (or resume with the mmfeed that saved it)")
        if int(saved.get("seed", 0)) != self.seed:
            raise ValueError(f"the state was saved with plan seed {saved.get('seed', 0)}, this dataset has seed "
                             f"{self.seed}; build it with seed={saved.get('seed', 0)}")
        old_world = int(saved.get("world_size", 1))
        if old_world == self.world_size:
            return copy.deepcopy(state)
        out = copy.deepcopy(state)
        sampler = out["order"]["state"]
        if not out.get("done"):  # mid-epoch: what this epoch ran so far becomes a segment of it
            sampler["done"] = [*map(list, sampler.get("done", [])), [old_world, int(out["batches"])]]
            out["batches"] = 0
        sampler.pop("world_size", None)
        if self.world_size != 1:
            sampler["world_size"] = self.world_size
        out["dataset_len"] = len(self)
        return out

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_plan"] = None  # workers recompute it: cheaper to send the index
        del state["_plan_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._plan_lock = threading.Lock()


def _check_fit(table: Any, capacity: int, mode: str) -> None:
    """ValueError when no sample of ``table`` fits ``capacity`` tokens; a warning counting those that do not when
    some do (the plan leaves them out). From the prices' runs where the table has them: nothing per sample."""
    price = table.uniform_price
    runs = table.price_runs if price is None else None
    if price is not None:
        cheapest = dearest = price
        over = len(table) if price > capacity else 0
    elif runs is not None:
        prices = runs[1][runs[0] > 0]
        cheapest, dearest = int(prices.min()), int(prices.max())
        over = int(runs[0][runs[1] > capacity].sum())
    else:
        tokens = table.tokens
        cheapest, dearest = int(tokens.min()), int(tokens.max())
        over = int((tokens > capacity).sum())
    what = "capacity" if mode == "pack" else "token budget (capacity)"
    if cheapest > capacity:
        span = f"{cheapest} to {dearest}" if dearest > cheapest else f"{cheapest}"
        also = f" ({cheapest} fits the cheapest)" if dearest > cheapest else ""
        raise ValueError(f"PlanConfig(capacity={capacity}): every sample costs more than the {what} ({span} "
                         f"tokens), so every epoch would be empty; give capacity >= {dearest}{also}, or price the "
                         "samples lower (fewer frames, fewer tokens per frame)")
    if over:
        log.warning("%d of %d samples cost more than the %s of %d tokens (up to %d): the plan leaves them out of "
                    "every epoch (Plan.dropped); capacity >= %d keeps them", over, len(table), what, capacity,
                    dearest, dearest)


class PlanSampler(torch.utils.data.Sampler):
    """Yields ``(epoch, step)`` for every step of one epoch of a planned dataset, from ``start`` on.

    Each pass runs the next epoch (the first pass runs ``epoch``), so successive ``iter(loader)`` calls walk
    through epochs 0, 1, 2, ... with fresh plans. ``state_dict()`` is where the sampler stands (:meth:`state_of`
    its position: ``{"epoch", "plan_version"}`` plus ``"start"`` (the next step, mid-epoch), ``"world_size"`` and
    ``"seed"`` of the plan and ``"done"``, the earlier ``[world_size, steps]`` segments of an elastically resumed
    epoch, each left out at its default: step 0, world size 1, seed 0, no segments). In such an epoch the items are
    ``(epoch, step, done)``. ``mmfeed.DataLoader`` keeps the state the loop's epoch began from in its cursor and
    counts the batches handed out itself (when its epochs chain, this sampler runs ahead of the loop into the next
    epoch).
    """

    def __init__(self, dataset: PlannedDataset, *, epoch: int = 0, start: int = 0) -> None:
        self.dataset, self.epoch, self.start = dataset, int(epoch), int(start)
        self.done: tuple[tuple[int, int], ...] = ()
        self._running: tuple[int, int, tuple] | None = None  # (epoch, next step, done) while a pass runs

    def set_epoch(self, epoch: int, start: int = 0, done: tuple[tuple[int, int], ...] = ()) -> None:
        """The next pass runs ``epoch`` from step ``start``, after the segments ``done``."""
        self.epoch, self.start = int(epoch), int(start)
        self.done = tuple((int(w), int(k)) for w, k in done)
        self._running = None

    def state_dict(self) -> dict:
        """Where the sampler stands: inside a pass, the step after the last one it yielded; else where its next
        pass starts."""
        if self._running is not None:
            return self.state_of(*self._running)
        return self.state_of(self.epoch, self.start, self.done)

    def state_of(self, epoch: int, start: int = 0, done: tuple[tuple[int, int], ...] = ()) -> dict:
        """The state of this sampler standing at step ``start`` of ``epoch`` after the segments ``done``."""
        state: dict[str, Any] = {"epoch": int(epoch), "plan_version": PLAN_VERSION}
        if start:
            state["start"] = int(start)
        if self.dataset.world_size != 1:
            state["world_size"] = self.dataset.world_size
        if self.dataset.seed != 0:
            state["seed"] = self.dataset.seed
        if done:
            state["done"] = [[int(w), int(k)] for w, k in done]
        return state

    def load_state_dict(self, state: dict) -> None:
        version = state.get("plan_version", 1)
        if version != PLAN_VERSION:
            raise ValueError(f"the sampler state was saved by plan version {version}; this mmfeed plans with "
                             f"version {PLAN_VERSION} (the order changed): start the epoch afresh")
        world, seed = int(state.get("world_size", 1)), int(state.get("seed", 0))
        if world != self.dataset.world_size or seed != self.dataset.seed:
            raise ValueError(f"the sampler state was saved at world size {world} with seed {seed}, this dataset "
                             f"runs at world size {self.dataset.world_size} with seed {self.dataset.seed}; pass "
                             "the loader state through dataset.reshard_state(state) before load_state_dict")
        self.set_epoch(int(state["epoch"]), start=int(state.get("start", 0)), done=state.get("done", ()))

    def _steps(self) -> int:
        return self.dataset.num_steps(self.epoch, self.done)

    def __len__(self) -> int:
        return max(self._steps() - self.start, 0)

    def __iter__(self):
        epoch, start, done, total = self.epoch, self.start, self.done, self._steps()
        self.epoch, self.start, self.done = epoch + 1, 0, ()
        for step in range(start, total):
            self._running = (epoch, step + 1, done) if step + 1 < total else None
            yield (epoch, step, done) if done else (epoch, step)
        self._running = None
