"""``mmfeed.DataLoader``: torch's DataLoader, wrapped, plus device prefetch, step timing and exact resume.

Given only torch's arguments it yields exactly the batches ``torch.utils.data.DataLoader`` yields (it holds a torch
loader and lets it do all the loading). These additions, keyword-only, after torch's:

* ``device="cuda", prefetch=2``: batches arrive on the device, copied on a side stream ``prefetch`` batches ahead
  (:class:`~mmfeed.loaders.loop.prefetch.DevicePrefetcher`). ``device="cpu"`` moves nothing but still receives the
  batches in a background thread ``prefetch`` batches ahead. ``device=None`` (default): no thread, torch's
  iterator as it is (``prefetch`` is then unused).
* ``timer=True`` (or a :class:`~mmfeed.loaders.observe.timing.StepTimer`): per-step wait / copy / compute and worker
  stage times in ``loader.timer``. The collate function is then wrapped in
  :class:`~mmfeed.loaders.observe.timing.TimedCollate`; the loop still receives the collated batch itself, same type.
* ``worker_mode="thread"``: the ``num_workers`` load batches in threads of the training process instead of
  worker processes (:mod:`mmfeed.loaders.loop.threads`): no dataset copies, no pickling, no shared-memory hand-off;
  FFmpeg decodes with the GIL released. Same batches, same order, same resume; map-style datasets only.
* ``recycle_buffers=True`` (default; planned datasets with workers, without ``pin_memory``): workers write the
  decoded frames of later batches into the shared memory of earlier ones once the loop holds no tensor of them
  any more (:mod:`mmfeed.loaders.loop.shm`), which spares the page faults of fresh shared memory in both processes.
  Set it False if batch tensors are handed on to other processes that may still read them.
* ``state_dict()`` / ``load_state_dict(sd)``: exact mid-epoch resume. For map-style datasets the state is
  self-contained: epoch, batches handed out, and what fixed the epoch's order (the shuffle seed drawn from torch's
  default RNG, or the state of ``generator`` at the moment the sampler drew from it, exactly as torch's
  RandomSampler draws). A new loader built with the same dataset and batching arguments, with or without the
  original generator and with any ``num_workers``, continues with exactly the batches that remained; skipped
  batches are skipped as indices, never loaded.
* Epochs chain over a planned dataset with ``num_workers > 0``, ``persistent_workers=True`` (and ``in_order``):
  ONE torch iterator serves every epoch and its sampler runs on from one epoch's plan into the next, so the next
  epoch's first batches load in the workers (and wait in the prefetch queue) while the loop finishes this one,
  instead of the workers draining at each epoch's end. Each ``iter(loader)`` still yields exactly one epoch, the
  same batches, and ``state_dict()`` is everywhere what it is unchained. Leaving an epoch before its end
  (``iter(loader)`` after a ``break``, dropping the iterator, ``load_state_dict``, an error) drops the chain and
  starts afresh (torch resets its workers). Between epochs, and after the last, the workers load the next epoch's
  first batches (``prefetch_factor * num_workers``, plus ``prefetch``); dropping the loader stops them. The
  sampler then runs ahead of the loop: move to another epoch with ``load_state_dict``, not ``sampler.set_epoch``.
  Set ``loader.chain_epochs = False`` to drain at each epoch's end, as every other loader does, as torch's does.

Resume covers the default samplers (``shuffle=True/False``), SequentialSampler, DistributedSampler (its epoch is
saved), plain lists/ranges of indices, and any sampler or batch_sampler with ``state_dict()`` /
``load_state_dict()`` (snapshotted at the start of each epoch; a deterministic sampler may return ``{}``). Other
samplers raise a TypeError from ``state_dict()``. Iterable datasets resume through their own ``state_dict()`` /
``load_state_dict()`` with ``num_workers=0`` (the state after the last batch handed out is kept); with workers
the dataset copies live in other processes and ``state_dict()`` raises a ValueError. Not part of the state:
torch's global RNG (without a generator, epochs after the resumed one draw their seeds from it, as torch does:
restore it or pass a generator, whose state the loader does carry) and the per-worker seeds of the resumed epoch
(random augmentation inside workers is not replayed). One iterator at a time is tracked: ``iter(loader)`` again
closes the previous iterator's prefetch thread (unless the chain of epochs it belongs to goes on).

Example::

    >>> import torch
    >>> ds = torch.arange(10)
    >>> a = DataLoader(ds, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(0))
    >>> it = iter(a); first = next(it)
    >>> b = DataLoader(ds, batch_size=3, shuffle=True)
    >>> b.load_state_dict(a.state_dict())
    >>> [x.tolist() for x in b] == [x.tolist() for x in it]
    True
"""

from __future__ import annotations

import collections
import copy
import gc
import inspect
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler
from torch.utils.data import DataLoader as TorchDataLoader

from mmfeed.loaders.planned.dataset import PlannedDataset, PlanSampler
from mmfeed.loaders.loop.prefetch import DevicePrefetcher, _resolve_device
from mmfeed.loaders.loop.resume import ChainedIndex, ResumableIndex, ShuffleSampler
from mmfeed.loaders.loop.shm import ReleaseTracker, enable_pool
from mmfeed.loaders.loop.threads import ThreadedBatches
from mmfeed.loaders.clock import TimedCollate
from mmfeed.loaders.observe.timing import StepTimer

__all__ = ["DataLoader"]

_STATE_VERSION = 1
WORKER_MODES = ("process", "thread")
"""``worker_mode`` values: worker processes (torch's), or threads of this process (:mod:`mmfeed.loaders.loop.threads`)."""
_TORCH_PARAMS = frozenset(inspect.signature(TorchDataLoader.__init__).parameters) - {"self"}


class _WorkerInit:
    """worker_init_fn of mmfeed's worker processes: watch the parent (:func:`_exit_with_parent`), turn the
    worker's payload pool on where the loader recycles buffers (``per_key``), then run the user's."""

    def __init__(self, per_key: int | None, inner: Any) -> None:
        self.per_key, self.inner = per_key, inner

    def __call__(self, worker_id: int) -> None:
        _exit_with_parent()
        if self.per_key is not None:
            enable_pool(self.per_key)
        if self.inner is not None:
            self.inner(worker_id)


PARENT_POLL_S = 0.5


def _exit_with_parent() -> None:
    """End this worker process within :data:`PARENT_POLL_S` of its parent's death (a training process killed
    with SIGKILL, by the OOM killer say). torch's worker loop notices a dead parent too, but then exits through
    multiprocessing's finalizers, which join the result queue's feeder thread: a feeder blocked on a full result
    pipe (batches pickled by value) never returns, because the workers hold that pipe's read end themselves, and
    the worker lives on for ever. A daemon thread ends the process with ``os._exit`` once the process that forked
    it is gone (its pid changes: the training process under fork and spawn, the fork server under forkserver,
    which ends with the training process) or multiprocessing's parent sentinel says the training process is."""
    import multiprocessing
    import threading

    forked_by = os.getppid()
    parent = multiprocessing.parent_process()

    def watch() -> None:
        while os.getppid() == forked_by and (parent is None or parent.is_alive()):
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="mmfeed-parent-watch", daemon=True).start()


def _recycle(source: Iterator[Any], tracker: ReleaseTracker) -> Iterator[Any]:
    for item in source:
        tracker.watch(item)
        yield item


def _prefetcher(loader: DataLoader, source: Iterator[Any]) -> DevicePrefetcher | None:
    """The prefetcher the loader's batches pass through: a thread ``prefetch`` ahead with ``device``, a
    synchronous pass-through for timing (and TimedBatch unwrapping) with only a timer, else none."""
    if loader.device is not None:
        return DevicePrefetcher(source, loader.device, depth=loader.prefetch, timer=loader.timer)
    if loader.timer is not None:
        return DevicePrefetcher(source, "cpu", depth=0, timer=loader.timer)
    return None


def _start_torch_iterator(loader: TorchDataLoader) -> Iterator[Any]:
    """``iter(loader)``; when that forks new worker processes, the garbage of this process is collected first.
    A forked worker inherits every unreachable object; its own collector would then tear down, say, a video
    decoder built here, which can wait forever on threads that exist only in this process. Collected here, such
    objects go where they were made."""
    if loader.num_workers > 0 and (not loader.persistent_workers or getattr(loader, "_iterator", None) is None):
        gc.collect()
    return iter(loader)


class _Chain:
    """Epoch after epoch of batches from one torch iterator (persistent workers), through the loader's recycling
    and prefetcher: the stream runs on across epoch ends. ``pass_`` is the epoch (pass of the chained index) the
    loop is in, ``taken`` the batches of it handed out so far. Holds no reference to the loader."""

    def __init__(self, loader: DataLoader) -> None:
        source = _start_torch_iterator(loader._loader)  # torch's persistent iterator, started or reset
        self.lengths = loader._chained_index.lengths  # the list of the index pass torch now runs
        if loader._recycler is not None:
            source = _recycle(source, loader._recycler)
        self.prefetcher = _prefetcher(loader, source)
        self.source: Iterator[Any] = self.prefetcher if self.prefetcher is not None else source
        self.pass_, self.taken, self.closed = 0, 0, False

    def length(self, k: int) -> int | None:
        """Batches of pass ``k``; None while that pass has not begun."""
        return self.lengths[k] if k < len(self.lengths) else None

    def complete(self) -> bool:
        """Every batch of the loop's epoch is handed out: the stream's next batch is the next epoch's first."""
        n = self.length(self.pass_)
        return n is not None and self.taken >= n

    def close(self) -> None:
        self.closed = True
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.source = iter(())


class _LoaderIter:
    """One epoch of an mmfeed DataLoader: torch's iterator, optionally through the prefetcher; counts batches.
    With ``chain``, the epoch is the chain's current pass: exactly its batches, then StopIteration, leaving the
    chain (torch's iterator and the prefetcher) running into the next epoch."""

    def __init__(self, loader: DataLoader, source: Iterator[Any] | None = None, chain: _Chain | None = None) -> None:
        self._loader = loader
        self._states: collections.deque[Any] | None = None
        self._prefetcher: DevicePrefetcher | None = None
        self._chain = chain
        self._finished = False
        if chain is not None:
            self._pass = chain.pass_
            self._source: Iterator[Any] = iter(())
            return
        assert source is not None
        if loader._recycler is not None:
            source = _recycle(source, loader._recycler)
        if loader._tap_dataset_state:
            self._states = collections.deque()
            source = self._tap(source)
        self._prefetcher = _prefetcher(loader, source)
        self._source = self._prefetcher if self._prefetcher is not None else source

    def _tap(self, source: Iterator[Any]) -> Iterator[Any]:
        dataset = self._loader.dataset
        for item in source:
            self._states.append(copy.deepcopy(dataset.state_dict()))
            yield item

    def __iter__(self) -> _LoaderIter:
        return self

    def __next__(self) -> Any:
        if self._chain is not None:
            return self._next_chained(self._chain)
        try:
            batch = next(self._source)
        except StopIteration:
            self._source = iter(())  # let torch's iterator (and its workers) go now
            if self._loader._is_active(self):
                self._loader._epoch_ended()
            raise
        if self._loader._is_active(self):
            self._loader._yielded += 1
            self._loader._count_errors(batch)
            if self._states is not None:
                self._loader._dataset_state = self._states.popleft()
        return batch

    def _next_chained(self, chain: _Chain) -> Any:
        loader = self._loader
        if self._finished or chain.closed or chain.pass_ != self._pass:  # over, or left for a newer iterator
            raise StopIteration
        if chain.complete():
            self._finished = True
            if loader.timer is not None:  # as a prefetcher that runs out: the last step ends as it asks for more
                loader.timer.request()
                loader.timer.exhausted()
            if loader._is_active(self):
                loader._epoch_ended()
            raise StopIteration
        try:
            batch = next(chain.source)
        except BaseException as exc:  # an error, or the end after a pass of no items (this epoch had none)
            self._finished, active = True, loader._is_active(self)
            loader._drop_chain(chain)  # the next iter(loader) starts afresh
            if active and isinstance(exc, StopIteration):
                loader._epoch_ended()
            raise
        chain.taken += 1
        if loader._is_active(self):
            loader._yielded += 1
            loader._count_errors(batch)
        return batch

    def __len__(self) -> int:
        n = self._chain.length(self._pass) if self._chain is not None else None
        return n if n is not None else len(self._loader)

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the prefetch thread, if any, and let torch's iterator (and its workers) go. A chained epoch left
        before its end drops the chain; one handed out to its end leaves it running into the next epoch."""
        chain = getattr(self, "_chain", None)
        if chain is not None:
            if not self._finished and chain.pass_ == self._pass and not chain.closed and not chain.complete():
                self._loader._drop_chain(chain)
            self._finished = True
            return
        prefetcher = getattr(self, "_prefetcher", None)
        if prefetcher is not None:
            prefetcher.close()
        self._source = iter(())


def _is_planned(dataset: Any) -> bool:
    """A dataset whose items are ``(epoch, step)`` batches of an epoch plan."""
    return isinstance(dataset, PlannedDataset)


def _packed_dataset(source: Any, packing: Any) -> PlannedDataset:
    """The planned dataset ``packing`` (a :class:`~mmfeed.loaders.planned.config.Packing`) makes of ``source`` (an
    open source, or paths for :func:`~mmfeed.loaders.open.open_dataset`) for this process's rank."""
    from mmfeed.loaders.loop.dist import dist_info
    from mmfeed.loaders.open import open_dataset
    from mmfeed.loaders.planned.config import Packing
    from mmfeed.loaders.sources.base import EpisodeSource

    if not isinstance(packing, Packing):
        raise TypeError(f"packing must be an mmfeed.loaders.Packing, got {type(packing).__name__}")
    if not isinstance(source, EpisodeSource):
        try:
            source = open_dataset(source)
        except TypeError:
            raise TypeError(f"packing needs an episode source, a path or a list of them (open_dataset), got "
                            f"{type(source).__name__}") from None
    where = dist_info()
    return packing.dataset(source, rank=where.rank, world_size=where.world_size)


class DataLoader:
    """torch.utils.data.DataLoader with the same arguments, plus ``device``, ``prefetch``, ``timer`` and
    ``packing``.

    ``packing=Packing(layout=..., window=..., plan=PlanConfig(capacity=8192, rows_per_batch=4))`` over an episode
    source (or a path, or a list of them for a mixture, see :func:`~mmfeed.loaders.open.open_dataset`) plans the
    epoch for this rank and yields :class:`~mmfeed.packing.PackedBatch` objects; so does passing a
    :class:`~mmfeed.loaders.planned.dataset.PlannedDataset` directly. Each ``iter(loader)`` runs the next epoch of the plan, and
    ``state_dict()`` resumes mid-epoch by step, with any ``num_workers``. With workers and
    ``persistent_workers=True`` its epochs chain: the next epoch's first batches load while the loop finishes this
    one (see the module docstring; ``chain_epochs = False`` on the loader or a subclass drains them as torch does).

    See the module docstring for resume and timing. Attributes not set here (``pin_memory``, ``timeout``,
    ``prefetch_factor``, ...) read through to the torch loader that does the loading.
    """

    chain_epochs = True

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int = 0, collate_fn: Any = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Any = None,
                 multiprocessing_context: Any = None, generator: torch.Generator | None = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True, device: Any = None, prefetch: int = 2,
                 timer: StepTimer | bool | None = None, packing: Any = None, recycle_buffers: bool = True,
                 worker_mode: str = "process") -> None:
        if worker_mode not in WORKER_MODES:
            raise ValueError(f"worker_mode must be one of {list(WORKER_MODES)}, got {worker_mode!r}")
        if packing is not None:
            dataset = _packed_dataset(dataset, packing)
        if _is_planned(dataset):
            if batch_size not in (None, 1) or shuffle or sampler is not None or batch_sampler is not None:
                raise ValueError("a planned dataset makes its own batches: leave batch_size, shuffle, sampler and "
                                 "batch_sampler unset (set capacity and rows per batch in the plan)")
            batch_size, sampler = None, PlanSampler(dataset)
        args = dict(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                    batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                    pin_memory=pin_memory, drop_last=drop_last, timeout=timeout, worker_init_fn=worker_init_fn,
                    multiprocessing_context=multiprocessing_context, generator=generator,
                    prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                    pin_memory_device=pin_memory_device, in_order=in_order)
        if not in_order and "in_order" not in _TORCH_PARAMS:
            raise TypeError("in_order=False needs torch >= 2.6; upgrade torch or leave in_order=True")
        args = {k: v for k, v in args.items() if k in _TORCH_PARAMS}
        # torch validates the arguments and fills in the defaults (no RNG is drawn and no worker starts here)
        with warnings.catch_warnings():
            if worker_mode == "thread":  # threads are no processes: torch's advice on process counts is moot
                warnings.filterwarnings("ignore", message="This DataLoader will create")
            spec = TorchDataLoader(**args)
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0 (batches ahead on the device), got {prefetch!r}")
        if timer is True:
            timer = StepTimer(num_workers=num_workers)
        elif timer is False:
            timer = None
        elif timer is not None and not isinstance(timer, StepTimer):
            raise TypeError(f"timer must be None, True or a StepTimer, got {type(timer).__name__}")
        if timer is not None and timer.num_workers is None:
            timer.num_workers = num_workers
        self.dataset = dataset
        self.num_workers = num_workers
        self.generator = generator
        self.device = None if device is None else _resolve_device(device)
        self.prefetch = prefetch
        self.timer = timer
        self.batch_size = spec.batch_size
        self.drop_last = spec.drop_last
        self.collate_fn = spec.collate_fn
        self.sampler, self.batch_sampler = spec.sampler, spec.batch_sampler  # _make_order may replace them
        self._iterable = isinstance(dataset, IterableDataset)
        self._index: ResumableIndex | None = None
        torch_args = {**args, **self._make_order(spec, args)}
        if timer is not None:
            torch_args["collate_fn"] = TimedCollate(spec.collate_fn)
        self.worker_mode = worker_mode
        threads = worker_mode == "thread" and num_workers > 0
        if threads:
            if self._iterable:
                raise ValueError("worker_mode='thread' loads map-style datasets (an iterable dataset's copies in "
                                 "threads would share one iterator); use worker processes")
            # torch's loader only samples and collates here: the threads call it in this process
            self._threads = {"worker_init_fn": worker_init_fn, "pin_memory": pin_memory, "timeout": timeout,
                             "depth": num_workers * (spec.prefetch_factor or 2)}
            torch_args.update(num_workers=0, prefetch_factor=None, persistent_workers=False, worker_init_fn=None,
                              multiprocessing_context=None, pin_memory=False, timeout=0)
        else:
            self._threads = None
        self._recycler: ReleaseTracker | None = None
        if recycle_buffers and _is_planned(dataset) and num_workers > 0 and not pin_memory and not threads:
            per_key = (spec.prefetch_factor or 2) + 4  # in flight, held by the loop and its prefetcher, spare
            torch_args["worker_init_fn"] = _WorkerInit(per_key, worker_init_fn)
            self._recycler = ReleaseTracker(stale_after=8 * num_workers * per_key)
        elif num_workers > 0 and not threads:
            torch_args["worker_init_fn"] = _WorkerInit(None, worker_init_fn)
        # epochs chain (one torch iterator for all of them): planned datasets with persistent workers, in order
        self._plan_sampler = self.sampler if isinstance(self.sampler, PlanSampler) else None
        self._chained_index: ChainedIndex | None = None
        if (self._plan_sampler is not None and num_workers > 0 and persistent_workers and in_order and not threads
                and self._index is not None and self._index.target is self._plan_sampler
                and torch_args.get("sampler") is self._index):
            self._chained_index = torch_args["sampler"] = ChainedIndex(self._index)
        self._chain: _Chain | None = None
        self._loader = TorchDataLoader(**torch_args)
        self._tap_dataset_state = (self._iterable and num_workers == 0
                                   and callable(getattr(dataset, "state_dict", None)))
        self._epoch = -1          # index of the current epoch; -1 before the first
        self._yielded = 0         # batches of the current epoch handed to the loop
        self._done = True         # the current epoch ran out (or none started)
        self._pending: dict[str, Any] | None = None  # a loaded state to continue from at the next iter()
        self._dataset_state: Any = None
        self._active: weakref.ref[_LoaderIter] | None = None  # weak: dropping the iterator frees its workers
        # samples skipped under an ErrorPolicy of "skip"/"warn": how many, and (source, episode, reason) of each
        self.stats: dict[str, Any] = {"skipped_samples": 0, "errors": []}

    # -- the extension point ---------------------------------------------------------------------------------
    def _make_order(self, spec: TorchDataLoader, args: dict[str, Any]) -> dict[str, Any]:
        """Turn the arguments into the sampling arguments of the torch loader that does the loading.

        This is the one place that decides which indices each batch holds. Map-style datasets get a
        :class:`ResumableIndex` around the batch sampler (or the sampler, without auto-batching), so that resume
        can restart the order and skip batches as indices. Planning/packing keywords plug in here: a plan becomes
        a batch_sampler with ``state_dict()`` / ``load_state_dict()`` (its seed, epoch and cursor) wrapped the same
        way, and the packing collate function replaces ``collate_fn``.
        """
        if self._iterable:
            return {}
        user_sampler, user_batches = args.get("sampler"), args.get("batch_sampler")
        base = spec.sampler
        if user_sampler is None and user_batches is None and type(spec.sampler) is RandomSampler:  # shuffle=True
            base = ShuffleSampler(self.dataset, args.get("generator"))
        self.sampler = base
        out: dict[str, Any] = dict(shuffle=None, sampler=None, drop_last=False)
        if spec.batch_sampler is not None:  # auto-collation
            inner = user_batches if user_batches is not None else BatchSampler(base, spec.batch_size, spec.drop_last)
            self.batch_sampler = inner
            self._index = ResumableIndex(inner, None if user_batches is not None else spec.batch_size)
            out.update(batch_size=1, batch_sampler=self._index)
        else:
            self._index = ResumableIndex(base, 1)
            out.update(batch_size=None, batch_sampler=None, sampler=self._index)
        return out

    # -- iteration -------------------------------------------------------------------------------------------
    def __iter__(self) -> _LoaderIter:
        chain = self._chain
        if chain is not None and self._pending is None and self.chain_epochs and not chain.closed \
                and chain.complete() and chain.length(chain.pass_):
            # the loop handed out the whole of the chain's epoch: the next one is already in flight
            self._index.epoch_state = self._state_after_epoch()
            self._epoch, self._yielded = self._epoch + 1, 0
            chain.pass_, chain.taken = chain.pass_ + 1, 0
        else:
            chain = self._start()
        self._done = False
        if self.timer is not None:
            self.timer.begin_epoch()
        if chain is not None:
            it = _LoaderIter(self, chain=chain)
        else:
            if self._recycler is not None and not self._loader.persistent_workers:
                self._recycler.clear()  # new workers, new pools
            if self._threads is not None:
                opts = dict(self._threads)
                source = ThreadedBatches(self._loader, self.num_workers, opts.pop("depth"), **opts)
            else:
                source = _start_torch_iterator(self._loader)
            it = _LoaderIter(self, source)
        self._active = weakref.ref(it)
        return it

    def _start(self) -> _Chain | None:
        """Begin the next epoch (or the loaded one) afresh; the chain that runs it, when epochs chain."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._drop_chain()
        pending, self._pending = self._pending, None
        skip = 0
        if pending is not None:
            self._epoch, self._yielded = pending["epoch"], pending["batches"]
            skip = pending["batches"]
            if self._index is not None:
                self._index.begin_epoch(pending["order"], skip)
        else:
            self._epoch, self._yielded = self._epoch + 1, 0
            if self._index is not None:
                self._index.begin_epoch()
                if self._plan_sampler is not None and self._index.target is self._plan_sampler:
                    # where this epoch's pass starts, not where an unfinished earlier pass stopped
                    self._index.epoch_state = self._plan_sampler.next_state()
        if self._chained_index is None:
            return None
        self._chained_index.chain = bool(self.chain_epochs)
        if not self.chain_epochs:
            return None
        self._chained_index.first = max(len(self._plan_sampler) - skip, 0)
        len(self.dataset)  # the plan state_dict() counts, made now: later, other threads plan other epochs
        self._chain = _Chain(self)
        return self._chain

    def _state_after_epoch(self) -> Any:
        """The plan sampler's state once the loop's epoch is over (what its pass leaves, unchained)."""
        state = self._index.epoch_state
        if state is None or self._done:  # an ended epoch's state already is what it left
            return copy.deepcopy(state)
        return self._plan_sampler.state_at(int(state["epoch"]) + 1)

    def _drop_chain(self, chain: _Chain | None = None) -> None:
        """Close the chain (or only ``chain``) and put the plan sampler, ahead of the loop, where the loop's epoch
        leaves it."""
        current = self._chain
        if chain is not None and chain is not current:
            chain.close()
            return
        if current is None:
            return
        self._chain = None
        current.close()  # joins the prefetch thread: nothing else moves the sampler now
        after = self._state_after_epoch()
        if after is not None:
            self._plan_sampler.load_state_dict(after)

    def _count_errors(self, batch: Any) -> None:
        """Samples the error policy skipped in the workers, carried back in the batch's metadata."""
        metadata = getattr(batch, "metadata", None)
        errors = metadata.get("errors") if isinstance(metadata, dict) else None
        if errors:
            self.stats["skipped_samples"] += len(errors)
            self.stats["errors"].extend(errors)

    def _is_active(self, it: _LoaderIter) -> bool:
        return self._active is not None and self._active() is it

    def _epoch_ended(self) -> None:
        if self._chained_index is not None and self._chained_index.chain:  # the sampler ran ahead of the loop
            self._index.epoch_state = self._state_after_epoch()
        elif self._index is not None:
            self._index.end_epoch()
        self._done = True
        if self._recycler is not None and not self._loader.persistent_workers:
            self._recycler.clear()  # the workers are gone: let their buffers go with them

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_loader" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_loader"], name)

    # -- resume ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: epoch, batches handed out, and what fixed this epoch's order (see module doc)."""
        if self._pending is not None:
            return copy.deepcopy(self._pending)
        state: dict[str, Any] = {"version": _STATE_VERSION, "epoch": self._epoch, "batches": self._yielded,
                                 "done": self._done, "batch_size": self.batch_size, "drop_last": self.drop_last,
                                 "order": None}
        if self._iterable:
            if not callable(getattr(self.dataset, "state_dict", None)):
                raise TypeError(f"cannot resume {type(self.dataset).__name__}: an iterable dataset needs its own "
                                "state_dict()/load_state_dict() for mmfeed.DataLoader to resume it")
            if self.num_workers > 0:
                raise ValueError("cannot resume an iterable dataset with num_workers > 0: its copies live in the "
                                 "worker processes; use num_workers=0 or a map-style dataset")
            if self._dataset_state is None:
                self._dataset_state = copy.deepcopy(self.dataset.state_dict())
            state["dataset"] = copy.deepcopy(self._dataset_state)
            return state
        assert self._index is not None
        if self._index.kind == "none":
            raise TypeError(f"cannot resume with sampler {type(self._index.target).__name__}: give it "
                            "state_dict()/load_state_dict() (a deterministic sampler may return {}), or use "
                            "shuffle=True instead of passing a RandomSampler")
        state["dataset_len"] = len(self.dataset)
        state["order"] = self._index.snapshot(in_progress=not self._done)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next ``iter(loader)``."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(f"not an mmfeed.DataLoader state (version {_STATE_VERSION}): {state!r:.200}")
        self._drop_chain()  # the batches in flight belong to where the loop was
        reshard = getattr(self.dataset, "reshard_state", None)
        if callable(reshard):  # a planned dataset: a state saved at another world size re-plans what is left
            state = reshard(state)
        for key in ("batch_size", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state was saved with {key}={state[key]!r} but this loader has "
                                 f"{key}={getattr(self, key)!r}; build the loader with the same batching arguments")
        if self._iterable:
            self.dataset.load_state_dict(copy.deepcopy(state["dataset"]))
            self._dataset_state = copy.deepcopy(state["dataset"])
        elif state.get("dataset_len") != len(self.dataset):
            raise ValueError(f"state was saved for a dataset of {state.get('dataset_len')} samples, this one has "
                             f"{len(self.dataset)}; resume with the same dataset")
        order = state.get("order") or {}
        if self._index is not None and order.get("kind") != self._index.kind:
            raise ValueError(f"state was saved with a {order.get('kind')!r} order but this loader's sampler gives "
                             f"a {self._index.kind!r} order; build the loader with the same sampling arguments")
        if self._index is not None and order.get("kind") == "shuffle" and isinstance(order.get("state"),
                                                                                   torch.Tensor):
            # the order came from a generator: restore it into yours, or into one of ours if you gave none, so
            # that later epochs (and torch's worker seeds) draw from it as they would have
            if self._index.target.generator is None:
                self._index.target.generator = torch.Generator()
            self._loader.generator = self._index.target.generator
        if state["done"]:  # the epoch ran out: the next iter() starts a fresh epoch
            self._epoch, self._yielded, self._done, self._pending = state["epoch"], state["batches"], True, None
            if self._index is not None:
                self._index.load_finished(order)
            return
        self._pending = copy.deepcopy(state)
