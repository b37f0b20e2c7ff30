"""Where an mmfeed DataLoader stands in its epochs, and how it resumes from there.

:class:`EpochCursor` is the one record of the loop's position: the epoch, the batches of it handed out, whether it
ran out, what fixed its order, and a loaded state waiting for the next ``iter(loader)``; only the loader's
:class:`~mmfeed.loaders.loop.epochs.Epochs` moves it (the chain of epochs and the index read it), and the loader's
``state_dict()`` is its dict form. What fixes an epoch's order comes from the index sampler torch iterates
(:class:`ResumableIndex`), which wraps whichever sampler or batch sampler the loader has and knows how that kind
of order source resumes (see :func:`order_kind`): our :class:`ShuffleSampler` draws from the same RNG in the same
order as torch's RandomSampler (so a loader given only torch's arguments yields torch's batches) and remembers its
seed; a sampler with ``state_dict()`` / ``load_state_dict()`` (a planned dataset's ``PlanSampler``) is asked for
its state; a DistributedSampler for its epoch. :class:`ChainedIndex` runs the index pass after pass, for a loader
whose epochs follow one another in one torch iterator. Everything resumes through ``state_dict()`` /
``load_state_dict()``.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler

__all__ = ["ChainedIndex", "EpochCursor", "ResumableIndex", "ShuffleSampler", "order_kind", "order_target"]


class EpochCursor:
    """Where the loop stands in its loader's epochs.

    epoch: the epoch the loop is in (-1 before the first); batches: the batches of it handed out (those a resumed
    epoch skipped included); done: it ran out (or none began); order: what fixed its order, the index's state at
    its start (:meth:`ResumableIndex.state_dict`); dataset: an iterable dataset's own state after the last batch
    handed out; pending: a loaded state that the next ``iter(loader)`` continues from. A batch handed out counts in
    ``batches``; an epoch that runs out sets ``done``.
    """

    def __init__(self) -> None:
        self.epoch, self.batches, self.done = -1, 0, True
        self.order: Any = None
        self.dataset: Any = None
        self.pending: dict[str, Any] | None = None

    def begin(self, epoch: int, batches: int = 0) -> None:
        """The loop enters ``epoch`` with ``batches`` of it already handed out (a resumed epoch's)."""
        self.epoch, self.batches, self.done = int(epoch), int(batches), False

    def __repr__(self) -> str:
        return (f"EpochCursor(epoch={self.epoch}, batches={self.batches}, done={self.done}"
                f"{', pending' if self.pending is not None else ''})")


class ShuffleSampler(RandomSampler):
    """torch's RandomSampler (no replacement, one pass), drawing from the same RNG in the same order, but
    remembering what fixed the order (``epoch_seed``: an int, or the generator's state) and able to restart an
    epoch from it with the first ``skip`` indices left out."""

    def __init__(self, data_source: Any, generator: torch.Generator | None) -> None:
        super().__init__(data_source, generator=generator)
        self.epoch_seed: int | torch.Tensor | None = None
        self._resume: tuple[int | torch.Tensor, int] | None = None

    def resume(self, seed: int | torch.Tensor, skip: int) -> None:
        self._resume = (seed, skip)

    def draw_early(self) -> int | torch.Tensor:
        """The seed this epoch will use, asked for before the sampler started: a generator's state now is the
        state the sampler will read (torch draws nothing from it in between); without a generator the seed is
        drawn now from torch's RNG, one draw as usual, and kept for the sampler."""
        if self._resume is not None:
            return self._resume[0]
        if self.generator is not None:
            return self.generator.get_state()
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        self._resume = (seed, 0)
        return seed

    def _generator_for(self, seed: int | torch.Tensor) -> torch.Generator:
        if isinstance(seed, int):
            g = torch.Generator()
            g.manual_seed(seed)
            return g
        if self.generator is None:  # resumed without the original generator: carry on with our own
            self.generator = torch.Generator()
        self.generator.set_state(seed)
        return self.generator

    def fast_forward(self, seed: int | torch.Tensor) -> None:
        """Leave the generator as a finished epoch started from ``seed`` leaves it."""
        g = self._generator_for(seed)
        n = len(self.data_source)
        torch.randperm(n, generator=g)
        torch.randperm(n, generator=g)

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        resume, self._resume = self._resume, None
        skip = 0
        if resume is not None:
            seed, skip = resume
        elif self.generator is None:  # the draw torch's RandomSampler makes
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        else:
            seed = self.generator.get_state()
        self.epoch_seed = seed
        g = self._generator_for(seed)
        yield from torch.randperm(n, generator=g)[skip:].tolist()
        # torch's RandomSampler draws a second, empty-sliced permutation after a full pass; so do we, so that the
        # generator's state matches torch's afterwards
        torch.randperm(n, generator=g)


def order_kind(source: Any) -> str:
    """How an order source resumes: 'shuffle' (ours), 'stateful', 'epoch' (DistributedSampler), 'fixed', or
    'none' (cannot)."""
    if isinstance(source, ShuffleSampler):
        return "shuffle"
    if callable(getattr(source, "state_dict", None)) and callable(getattr(source, "load_state_dict", None)):
        return "stateful"
    if isinstance(source, DistributedSampler):
        return "epoch"
    if type(source) is SequentialSampler or isinstance(source, (range, list, tuple)):
        return "fixed"
    if type(source) is BatchSampler:
        return order_kind(source.sampler)
    return "none"


def order_target(source: Any) -> Any:
    """The object that holds the order's state (a torch BatchSampler's sampler)."""
    return order_target(source.sampler) if type(source) is BatchSampler else source


class ResumableIndex:
    """The index sampler torch iterates: ``inner`` (a batch sampler or sampler), restartable from a saved order
    state with the first items left out. ``samples_per_item`` lets a skip go straight to our shuffle sampler
    (each item is a batch of that many indices) instead of iterating the skipped items. What fixed the current
    epoch's order is kept in the loader's cursor (:class:`EpochCursor`), which the loader's epochs write from what
    :meth:`begin` and :meth:`order` return."""

    def __init__(self, inner: Any, samples_per_item: int | None) -> None:
        self.inner = inner
        self.kind = order_kind(inner)
        self.target = order_target(inner)
        self.samples_per_item = samples_per_item if self.kind == "shuffle" else None
        self._skip = 0

    def __len__(self) -> int:
        return len(self.inner)

    def begin(self, order: dict[str, Any] | None = None, skip: int = 0) -> Any:
        """At ``iter(loader)``: restore ``order`` (a loaded state's, if given) and arrange for the first ``skip``
        items to be left out. Returns what fixes this epoch's order (:meth:`order`)."""
        state = None if order is None else order.get("state")
        if self.kind == "shuffle":
            self.target.epoch_seed = None  # drawn lazily, at the first index, exactly when torch draws it
            if state is not None:
                per = self.samples_per_item
                self.target.resume(state, skip * per if per else 0)
                skip = 0 if per else skip
        elif self.kind == "stateful":
            if state is not None:
                self.target.load_state_dict(copy.deepcopy(state))
        elif self.kind == "epoch":
            if state is not None:
                self.target.set_epoch(state)
        self._skip = skip
        return self.order()

    def order(self) -> Any:
        """What fixes the order of the epoch the source starts next, as the cursor keeps it: a stateful source's
        state, a DistributedSampler's epoch; None for the other kinds (a shuffle keeps its seed itself, drawn
        lazily; a fixed order needs nothing)."""
        if self.kind == "stateful":
            return copy.deepcopy(self.target.state_dict())
        if self.kind == "epoch":
            return self.target.epoch
        return None

    def state_dict(self, cursor: EpochCursor) -> dict[str, Any]:
        """What fixes the order of the cursor's epoch (a shuffle's seed, drawn now if the epoch began and its
        sampler has not drawn it yet)."""
        if self.kind == "shuffle":
            seed = self.target.epoch_seed
            if seed is None and not cursor.done:
                seed = self.target.draw_early()
            return {"kind": "shuffle", "state": seed.clone() if isinstance(seed, torch.Tensor) else seed}
        return {"kind": self.kind, "state": copy.deepcopy(cursor.order)}

    def load_state_dict(self, order: dict[str, Any]) -> None:
        """A loaded state whose epoch ran out: leave the order source as that finished epoch left it (an epoch in
        progress is restored by :meth:`begin` at the next ``iter(loader)``)."""
        state = order.get("state")
        if self.kind == "shuffle" and state is not None:
            self.target.epoch_seed = state
            if isinstance(state, torch.Tensor):
                self.target.fast_forward(state)
        elif self.kind == "stateful" and state is not None:
            self.target.load_state_dict(copy.deepcopy(state))
        elif self.kind == "epoch" and state is not None:
            self.target.set_epoch(state)

    def __iter__(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        it = iter(self.inner)
        yield from (itertools.islice(it, skip, None) if skip else it)


class ChainedIndex:
    """The index sampler torch iterates when epochs chain: ``index`` (a :class:`ResumableIndex`) for the epoch
    the chain begins with, its skip included, then pass after pass of the sampler inside it (a PlanSampler runs
    the next epoch at each pass), ending after a pass of no items, so that epochs of no steps never spin.

    Each ``iter()`` starts ``lengths``, the batches each pass's epoch has: ``first`` (the loader sets it) for the
    first pass, then each later one's, appended (by the thread that drives torch's iterator) before its first
    item. ``chain = False``: one pass, as ``index`` alone.
    """

    def __init__(self, index: ResumableIndex) -> None:
        self.index = index
        self.first = 0
        self.chain = True
        self.lengths: list[int] = []

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self) -> Iterator[Any]:
        lengths = self.lengths = [self.first]
        return self._passes(lengths)

    def _passes(self, lengths: list[int]) -> Iterator[Any]:
        n = 0
        for item in self.index:
            n += 1
            yield item
        while n and self.chain:
            lengths.append(len(self.index.inner))
            n = 0
            for item in self.index.inner:
                n += 1
                yield item
