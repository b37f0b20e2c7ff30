"""The one owner of an mmfeed DataLoader's epochs: :class:`Epochs`.

Where the loop stands (the :class:`~mmfeed.loaders.loop.resume.EpochCursor`), the index torch iterates
(:class:`~mmfeed.loaders.loop.resume.ResumableIndex`, and a planned dataset's
:class:`~mmfeed.loaders.planned.dataset.PlanSampler` inside it), the chain of epochs from one persistent torch
iterator (:class:`~mmfeed.loaders.loop.epoch_iter.Chain`) and the iterator the loop holds
(:class:`~mmfeed.loaders.loop.epoch_iter.LoaderIter`) are kept here, and moved by a few verbs:

* :meth:`Epochs.begin`: ``iter(loader)``, the next epoch (or a loaded one), going on in the chain when it can;
* :meth:`Epochs.handed_out` / :meth:`Epochs.ended`: the iterator tells of a batch handed out, of its epoch's end;
* :meth:`Epochs.drop`: a chain left before its epoch's end (the next epoch starts afresh);
* :meth:`Epochs.state_dict` / :meth:`Epochs.load_state_dict`: the loader's state, saved and loaded.

The DataLoader builds the torch loader that does the loading (a :class:`Feed`) and passes itself, for its public
settings, to each verb that reads them; this object keeps no reference to the loader, so that dropping the loader
lets its workers go.
"""

from __future__ import annotations

import collections
import copy
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader as TorchDataLoader

from mmfeed.loaders.loop.epoch_iter import Chain, LoaderIter
from mmfeed.loaders.loop.resume import ChainedIndex, EpochCursor, ResumableIndex
from mmfeed.loaders.shm import ReleaseTracker
from mmfeed.loaders.loop.threads import ThreadedBatches
from mmfeed.loaders.loop.workers import start_torch_iterator

__all__ = ["STATE_VERSION", "Epochs", "Feed", "Loader"]

STATE_VERSION = 1
"""The version of a loader's ``state_dict()``."""


@dataclass
class Feed:
    """The torch loader that does the loading, as the DataLoader last built it, and what its batches pass through.

    threads: the options of :class:`~mmfeed.loaders.loop.threads.ThreadedBatches` (``depth`` included) when the
    workers are threads; chained_index: the index torch iterates when epochs chain; tap_dataset: an iterable
    dataset's own state is kept after each batch (it resumes through it)."""

    loader: TorchDataLoader
    recycler: ReleaseTracker | None = None
    threads: dict[str, Any] | None = None
    chained_index: ChainedIndex | None = None
    tap_dataset: bool = False


class Loader(Protocol):
    """What :class:`Epochs` reads of its loader (an mmfeed DataLoader): public settings only."""

    dataset: Any
    batch_size: int | None
    drop_last: bool
    num_workers: int
    device: Any
    prefetch: int
    timer: Any
    chain_epochs: bool

    def __len__(self) -> int: ...


class Epochs:
    """Where an mmfeed DataLoader's loop stands in its epochs, and everything that moves with it.

    ``cursor`` (the position: epoch, batches handed out, what fixed the epoch's order, a loaded state),
    ``index`` (the index torch iterates; None for an iterable dataset), ``plan_sampler`` (a planned dataset's
    sampler, inside ``index``), ``feed`` (the torch loader and its wrappers, set by the DataLoader), ``chain``
    (epochs from one persistent torch iterator, while they chain) and ``stats`` (samples the error policy
    skipped). The iterator the loop holds is tracked weakly: dropping it frees its workers.
    """

    def __init__(self, *, iterable: bool, plan_sampler: Any = None) -> None:
        self.cursor = EpochCursor()
        self.index: ResumableIndex | None = None
        self.plan_sampler = plan_sampler
        self.iterable = iterable
        self.feed: Feed | None = None
        self.chain: Chain | None = None
        # samples skipped under an ErrorPolicy of "skip"/"warn": how many, and (source, episode, reason) of each
        self.stats: dict[str, Any] = {"skipped_samples": 0, "errors": []}
        self._active: weakref.ref[LoaderIter] | None = None

    # -- the loop ----------------------------------------------------------------------------------------------
    def begin(self, loader: Loader, rebuild: Callable[[], None] | None = None) -> LoaderIter:
        """``iter(loader)``: the iterator of the next epoch (or of a loaded state's). When the chain has handed out
        the whole of its epoch, the next one is already in flight and goes on; else the epoch starts afresh, after
        ``rebuild`` (the loader's settings changed: it builds a new :attr:`feed`)."""
        chain, cursor = self.chain, self.cursor
        if chain is not None and cursor.pending is None and loader.chain_epochs and rebuild is None \
                and not chain.closed and chain.complete(cursor) and chain.length(chain.pass_of(cursor)):
            # the loop handed out the whole of the chain's epoch: the next one is already in flight
            cursor.order = self._state_after_epoch()
            cursor.begin(cursor.epoch + 1)
        else:
            chain = self._start(loader, rebuild)
        if loader.timer is not None:
            loader.timer.begin_epoch()
        feed = self.feed
        assert feed is not None
        if chain is not None:
            it = LoaderIter(loader, self, chain=chain)
        else:
            if feed.recycler is not None and not feed.loader.persistent_workers:
                feed.recycler.clear()  # new workers, new pools
            if feed.threads is not None:
                opts = dict(feed.threads)
                source = ThreadedBatches(feed.loader, loader.num_workers, opts.pop("depth"), **opts)
            else:
                source = start_torch_iterator(feed.loader)
            it = LoaderIter(loader, self, source, recycler=feed.recycler, tap=feed.tap_dataset)
        self._active = weakref.ref(it)
        return it

    def _start(self, loader: Loader, rebuild: Callable[[], None] | None) -> Chain | None:
        """Begin the next epoch (or the loaded one) afresh; the chain that runs it, when epochs chain."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self.drop()
        if rebuild is not None:  # settings changed since the torch loader was built
            rebuild()
        cursor, index, sampler = self.cursor, self.index, self.plan_sampler
        pending, cursor.pending = cursor.pending, None
        if pending is not None:
            cursor.begin(pending["epoch"], pending["batches"])
            if index is not None:
                cursor.order = index.begin(pending["order"], pending["batches"])
        else:
            cursor.begin(cursor.epoch + 1)
            if index is not None:
                cursor.order = index.begin()
                if sampler is not None and index.target is sampler:
                    # where this epoch's pass starts, not where an unfinished earlier pass stopped
                    cursor.order = sampler.state_of(sampler.epoch, sampler.start, sampler.done)
        assert self.feed is not None
        chained = self.feed.chained_index
        if chained is None:
            return None
        chained.chain = bool(loader.chain_epochs)
        if not loader.chain_epochs:
            return None
        chained.first = max(len(sampler) - cursor.batches, 0)  # what the resumed epoch has left
        len(loader.dataset)  # the plan state_dict() counts, made now: later, other threads plan other epochs
        self.chain = Chain(self.feed.loader, chained, self.feed.recycler, loader, cursor)
        return self.chain

    def _is_active(self, it: LoaderIter) -> bool:
        return self._active is not None and self._active() is it

    def handed_out(self, it: LoaderIter, batch: Any, states: collections.deque[Any] | None = None) -> None:
        """``it`` handed out ``batch``: when it is the loop's iterator, the cursor counts it, the stats count the
        samples the workers' error policy skipped, and ``states`` gives the dataset's state after it."""
        if not self._is_active(it):
            return
        self.cursor.batches += 1
        metadata = getattr(batch, "metadata", None)
        errors = metadata.get("errors") if isinstance(metadata, dict) else None
        if errors:
            self.stats["skipped_samples"] += len(errors)
            self.stats["errors"].extend(errors)
        if states is not None:
            self.cursor.dataset = states.popleft()

    def ended(self, it: LoaderIter) -> None:
        """``it`` ran out: when it is the loop's iterator, its epoch is over."""
        if not self._is_active(it):
            return
        feed = self.feed
        assert feed is not None
        chained = feed.chained_index
        if chained is not None and chained.chain:  # the sampler ran ahead of the loop
            self.cursor.order = self._state_after_epoch()
        elif self.index is not None and self.index.kind == "stateful":
            self.cursor.order = self.index.order()  # where the source's next epoch starts
        self.cursor.done = True
        if feed.recycler is not None and not feed.loader.persistent_workers:
            feed.recycler.clear()  # the workers are gone: let their buffers go with them

    def drop(self, chain: Chain | None = None) -> None:
        """Close the chain (or only ``chain``) and put the plan sampler, ahead of the loop, where the loop's epoch
        leaves it."""
        current = self.chain
        if chain is not None and chain is not current:
            chain.close()
            return
        if current is None:
            return
        self.chain = None
        current.close()  # joins the prefetch thread: nothing else moves the sampler now
        after = self._state_after_epoch()
        if after is not None:
            self.plan_sampler.load_state_dict(after)

    def _state_after_epoch(self) -> Any:
        """The plan sampler's state once the loop's epoch is over (what its pass leaves, unchained)."""
        state = self.cursor.order
        if state is None or self.cursor.done:  # an ended epoch's state already is what it left
            return copy.deepcopy(state)
        return self.plan_sampler.state_of(int(state["epoch"]) + 1)

    # -- resume ------------------------------------------------------------------------------------------------
    def state_dict(self, loader: Loader) -> dict[str, Any]:
        """Where the loop is: epoch, batches handed out, and what fixed this epoch's order."""
        cursor = self.cursor
        if cursor.pending is not None:
            return copy.deepcopy(cursor.pending)
        state: dict[str, Any] = {"version": STATE_VERSION, "epoch": cursor.epoch, "batches": cursor.batches,
                                 "done": cursor.done, "batch_size": loader.batch_size, "drop_last": loader.drop_last,
                                 "order": None}
        dataset = loader.dataset
        if self.iterable:
            if not callable(getattr(dataset, "state_dict", None)):
                raise TypeError(f"cannot resume {type(dataset).__name__}: an iterable dataset needs its own "
                                "state_dict()/load_state_dict() for mmfeed.DataLoader to resume it")
            if loader.num_workers > 0:
                raise ValueError("cannot resume an iterable dataset with num_workers > 0: its copies live in the "
                                 "worker processes; use num_workers=0 or a map-style dataset")
            if cursor.dataset is None:
                cursor.dataset = copy.deepcopy(dataset.state_dict())
            state["dataset"] = copy.deepcopy(cursor.dataset)
            return state
        assert self.index is not None
        if self.index.kind == "none":
            raise TypeError(f"cannot resume with sampler {type(self.index.target).__name__}: give it "
                            "state_dict()/load_state_dict() (a deterministic sampler may return {}), or use "
                            "shuffle=True instead of passing a RandomSampler")
        state["dataset_len"] = len(dataset)
        state["order"] = self.index.state_dict(cursor)
        return state

    def load_state_dict(self, loader: Loader, state: dict[str, Any],
                        adopt_generator: Callable[[torch.Generator], None]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next :meth:`begin`. A shuffle whose order came
        from a generator restores it into the loader's (or a new one, which ``adopt_generator`` gives the loader)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an mmfeed.DataLoader state (version {STATE_VERSION}): {state!r:.200}")
        self.drop()  # the batches in flight belong to where the loop was
        dataset = loader.dataset
        reshard = getattr(dataset, "reshard_state", None)
        if callable(reshard):  # a planned dataset: a state saved at another world size re-plans what is left
            state = reshard(state)
        for key in ("batch_size", "drop_last"):
            if state[key] != getattr(loader, key):
                raise ValueError(f"state was saved with {key}={state[key]!r} but this loader has "
                                 f"{key}={getattr(loader, key)!r}; build the loader with the same batching arguments")
        cursor, index = self.cursor, self.index
        if self.iterable:
            dataset.load_state_dict(copy.deepcopy(state["dataset"]))
            cursor.dataset = copy.deepcopy(state["dataset"])
        elif state.get("dataset_len") != len(dataset):
            raise ValueError(f"state was saved for a dataset of {state.get('dataset_len')} samples, this one has "
                             f"{len(dataset)}; resume with the same dataset")
        order = state.get("order") or {}
        if index is not None and order.get("kind") != index.kind:
            raise ValueError(f"state was saved with a {order.get('kind')!r} order but this loader's sampler gives "
                             f"a {index.kind!r} order; build the loader with the same sampling arguments")
        if index is not None and order.get("kind") == "shuffle" and isinstance(order.get("state"), torch.Tensor):
            # the order came from a generator: restore it into yours, or into one of ours if you gave none, so
            # that later epochs (and torch's worker seeds) draw from it as they would have
            if index.target.generator is None:
                index.target.generator = torch.Generator()
            adopt_generator(index.target.generator)  # the loader's, as torch's would be
        if state["done"]:  # the epoch ran out: the next iter() starts a fresh epoch
            cursor.begin(state["epoch"], state["batches"])
            cursor.done, cursor.pending = True, None
            if index is not None:
                index.load_state_dict(order)
                if index.kind in ("stateful", "epoch") and order.get("state") is not None:
                    cursor.order = copy.deepcopy(order["state"])
            return
        cursor.pending = copy.deepcopy(state)
