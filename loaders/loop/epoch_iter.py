"""One epoch of an mmfeed DataLoader, as its loop sees it: :class:`LoaderIter`, what ``iter(loader)`` returns,
over torch's iterator (or a :class:`Chain` of epochs from one persistent torch iterator), through the loader's
buffer recycling and prefetcher. It tells the epochs' owner (:class:`~mmfeed.loaders.loop.epochs.Epochs`, seen
here as :class:`EpochOwner`) of each batch it hands out and of its epoch's end, so that the loader can say where it
is; of the loader it reads only public settings (:class:`LoaderSettings`)."""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from torch.utils.data import DataLoader as TorchDataLoader

from mmfeed.loaders.loop.prefetch import DevicePrefetcher
from mmfeed.loaders.planned.device_transforms import BatchTransform
from mmfeed.loaders.loop.resume import ChainedIndex, EpochCursor
from mmfeed.loaders.shm import ReleaseTracker
from mmfeed.loaders.loop.workers import start_torch_iterator

__all__ = ["Chain", "EpochOwner", "LoaderIter", "LoaderSettings"]


class LoaderSettings(Protocol):
    """What an epoch reads of its loader: public settings only (an mmfeed DataLoader)."""

    dataset: Any
    device: Any
    prefetch: int
    timer: Any
    device_transform: Any

    def __len__(self) -> int: ...


class EpochOwner(Protocol):
    """Who owns the epochs' position (:class:`~mmfeed.loaders.loop.epochs.Epochs`): the iterator reads its cursor
    and tells it of each batch handed out, of the epoch's end, and of a chain left early."""

    cursor: EpochCursor

    def handed_out(self, it: Any, batch: Any, states: collections.deque[Any] | None = None) -> None: ...

    def ended(self, it: Any) -> None: ...

    def drop(self, chain: Chain | None = None) -> None: ...


def _recycle(source: Iterator[Any], tracker: ReleaseTracker) -> Iterator[Any]:
    """``source``'s batches, each watched by ``tracker``; before each next batch is asked for, what the loop let go
    of is marked free (torch sends a worker its next batch's index as it hands over one: the worker then finds
    the buffers of the batch before last free, and needs no new one)."""
    source = iter(source)
    while True:
        tracker.sweep()
        try:
            item = next(source)
        except StopIteration:
            return
        tracker.note(item)
        yield item


def _device_step(loader: LoaderSettings, epoch_of: Callable[[int], int]) -> BatchTransform | None:
    """The loader's ``device_transform`` as the prefetcher runs it: seeded by the planned dataset's seed, the
    ``n``-th batch of the stream in epoch ``epoch_of(n)``, a payload entry priced by the items' token layout."""
    fn = getattr(loader, "device_transform", None)
    if fn is None:
        return None
    dataset = loader.dataset
    layout = getattr(getattr(dataset, "items", None), "layout", None)
    return BatchTransform(fn, dataset.seed, epoch_of, layout.tokens if layout is not None else None)


def _prefetcher(loader: LoaderSettings, source: Iterator[Any],
                epoch_of: Callable[[int], int] | None = None) -> DevicePrefetcher | None:
    """The prefetcher the loader's batches pass through: a thread ``prefetch`` ahead with ``device`` (and the
    device transform, its ``n``-th batch of epoch ``epoch_of(n)``), a synchronous pass-through for timing (and
    TimedBatch unwrapping) with only a timer, else none."""
    if loader.device is not None:
        step = _device_step(loader, epoch_of) if epoch_of is not None else None
        return DevicePrefetcher(source, loader.device, depth=loader.prefetch, timer=loader.timer, transform=step)
    if loader.timer is not None:
        return DevicePrefetcher(source, "cpu", depth=0, timer=loader.timer)
    return None


class Chain:
    """Epoch after epoch of batches from one torch iterator (persistent workers), through the loader's recycling
    and prefetcher: the stream runs on across epoch ends. Pass ``k`` of the chained index is epoch
    ``first_epoch + k`` (the first resumed after ``skipped`` batches); where the loop is, the cursor says.
    Holds no reference to the loader."""

    def __init__(self, torch_loader: TorchDataLoader, index: ChainedIndex, recycler: ReleaseTracker | None,
                 loader: LoaderSettings, cursor: EpochCursor) -> None:
        self.torch_iter = source = start_torch_iterator(torch_loader)  # torch's persistent iterator, started or reset
        self.lengths = index.lengths  # the list of the index pass torch now runs
        if recycler is not None:
            source = _recycle(source, recycler)
        self.prefetcher = _prefetcher(loader, source, self.epoch_of)
        self.source: Iterator[Any] = self.prefetcher if self.prefetcher is not None else source
        self.first_epoch, self.skipped, self.closed = cursor.epoch, cursor.batches, False

    def epoch_of(self, n: int) -> int:
        """The epoch of the ``n``-th batch (from 0) the chain's stream yields: the index runs ahead of the batches,
        so the passes up to it are known."""
        for k, length in enumerate(list(self.lengths)):
            if n < length:
                return self.first_epoch + k
            n -= length
        return self.first_epoch + len(self.lengths)
    def pass_of(self, cursor: EpochCursor) -> int:
        """The pass of the chained index that runs the cursor's epoch."""
        return cursor.epoch - self.first_epoch

    def length(self, k: int) -> int | None:
        """Batches the chained index yields in pass ``k`` (the first pass: what its epoch had left); None while that
        pass has not begun."""
        return self.lengths[k] if k < len(self.lengths) else None

    def complete(self, cursor: EpochCursor) -> bool:
        """Every batch of the cursor's epoch is handed out: the stream's next batch is the next epoch's first."""
        k = self.pass_of(cursor)
        n = self.length(k)
        return n is not None and cursor.batches - (self.skipped if k == 0 else 0) >= n

    def close(self) -> None:
        self.closed = True
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.source, self.torch_iter = iter(()), None


class LoaderIter:
    """One epoch of an mmfeed DataLoader: torch's iterator, optionally through the prefetcher; tells ``epochs`` of
    each batch. With ``chain``, the epoch is the chain's current pass: exactly its batches, then StopIteration,
    leaving the chain (torch's iterator and the prefetcher) running into the next epoch. ``recycler`` watches the
    batches' shared memory; ``tap``: after each batch, the (iterable) dataset's own state is kept for the cursor."""

    def __init__(self, loader: LoaderSettings, epochs: EpochOwner, source: Iterator[Any] | None = None,
                 chain: Chain | None = None, *, recycler: ReleaseTracker | None = None, tap: bool = False) -> None:
        self._settings = loader
        self._epochs = epochs
        self._states: collections.deque[Any] | None = None
        self._prefetcher: DevicePrefetcher | None = None
        self._chain = chain
        self._finished = False
        # the iterator torch's loader made (or the threads' batches): what it has can be read through this one
        self._torch_iter = chain.torch_iter if chain is not None else source
        self._epoch = epochs.cursor.epoch  # the epoch this iterator hands out
        if chain is not None:
            self._source: Iterator[Any] = iter(())
            return
        assert source is not None
        if recycler is not None:
            source = _recycle(source, recycler)
        if tap:
            self._states = collections.deque()
            source = self._tap(source)
        epoch = self._epoch
        self._prefetcher = _prefetcher(loader, source, lambda n: epoch)
        self._source = self._prefetcher if self._prefetcher is not None else source

    def _tap(self, source: Iterator[Any]) -> Iterator[Any]:
        dataset = self._settings.dataset
        for item in source:
            self._states.append(copy.deepcopy(dataset.state_dict()))
            yield item

    def __iter__(self) -> LoaderIter:
        return self

    def __getattr__(self, name: str) -> Any:
        """What the iterator of torch's loader has (``_workers``, ``_shutdown_workers``, ...), for code that reaches
        into torch's iterator; until this iterator is closed."""
        inner = self.__dict__.get("_torch_iter")
        if inner is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(inner, name)

    def __next__(self) -> Any:
        if self._chain is not None:
            return self._next_chained(self._chain)
        try:
            batch = next(self._source)
        except StopIteration:
            self._source = iter(())  # let torch's iterator (and its workers) go now
            self._epochs.ended(self)
            raise
        self._epochs.handed_out(self, batch, self._states)
        return batch

    def _next_chained(self, chain: Chain) -> Any:
        epochs, timer = self._epochs, self._settings.timer
        if self._finished or chain.closed or epochs.cursor.epoch != self._epoch:  # over, or left for a newer one
            raise StopIteration
        if chain.complete(epochs.cursor):
            self._finished = True
            if timer is not None:  # as a prefetcher that runs out: the last step ends as it asks for more
                timer.request()
                timer.exhausted()
            epochs.ended(self)
            raise StopIteration
        try:
            batch = next(chain.source)
        except BaseException as exc:  # an error, or the end after a pass of no items (this epoch had none)
            self._finished = True
            epochs.drop(chain)  # the next iter(loader) starts afresh
            if isinstance(exc, StopIteration):
                epochs.ended(self)
            raise
        epochs.handed_out(self, batch)
        return batch

    def __len__(self) -> int:
        chain = self._chain
        n = chain.length(self._epoch - chain.first_epoch) if chain is not None else None
        return n if n is not None else len(self._settings)

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the prefetch thread, if any, and let torch's iterator (and its workers) go. A chained epoch left
        before its end drops the chain; one handed out to its end leaves it running into the next epoch."""
        self.__dict__["_torch_iter"] = None
        chain = self.__dict__.get("_chain")
        if chain is not None:
            cursor = self._epochs.cursor
            if not self._finished and cursor.epoch == self._epoch and not chain.closed and not chain.complete(cursor):
                self._epochs.drop(chain)
            self._finished = True
            return
        prefetcher = self.__dict__.get("_prefetcher")
        if prefetcher is not None:
            prefetcher.close()
        self._source = iter(())
