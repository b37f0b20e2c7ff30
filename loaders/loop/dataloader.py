"""``mmfeed.DataLoader``: torch's DataLoader, subclassed, plus device prefetch, step timing and exact resume.

It is a ``torch.utils.data.DataLoader`` (``isinstance`` holds, ``DataLoader[T]`` annotates, every attribute of
torch's is there and assigning one behaves as torch's does), and given only torch's arguments it yields exactly the
batches torch's yields: it holds a torch loader and lets it do all the loading. These additions, keyword-only,
after torch's:

* ``device="cuda", prefetch=2``: batches arrive on the device, copied on a side stream ``prefetch`` batches ahead
  (:class:`~mmfeed.loaders.loop.prefetch.DevicePrefetcher`). ``device="cpu"`` moves nothing but still receives the
  batches in a background thread ``prefetch`` batches ahead. ``device=None`` (default): no thread, torch's
  iterator as it is (``prefetch`` is then unused).
* ``device_transform=fn`` (with a ``device``, over a planned dataset): ``fn(batch, samples) -> batch`` runs on
  each PackedBatch after it reaches the device, in the prefetcher (on CUDA on the copy's side stream, before the
  event the loop waits on), timed as the ``transform`` phase; ``samples`` holds one generator per document, seeded
  from ``(seed, epoch, sample id)`` as worker transforms are, so a resumed run replays it. Batched ops:
  :mod:`mmfeed.loaders.planned.device_transforms`.
* ``timer=True`` (or a :class:`~mmfeed.loaders.observe.timing.StepTimer`): per-step wait / copy / compute and worker
  stage times in ``loader.timer``. The collate function is then wrapped in
  :class:`~mmfeed.loaders.clock.TimedCollate`; the loop still receives the collated batch itself, same type.
* ``worker_mode="thread"``: the ``num_workers`` load batches in threads of the training process instead of
  worker processes (:mod:`mmfeed.loaders.loop.threads`): no dataset copies, no pickling, no shared-memory hand-off;
  FFmpeg decodes with the GIL released. Same batches, same order, same resume; map-style datasets only.
* ``recycle_buffers=True`` (default; planned datasets with workers, without ``pin_memory``): workers write the
  decoded frames of later batches into the shared memory of earlier ones once the loop holds no tensor of them
  any more (:mod:`mmfeed.loaders.shm`), which spares the page faults of fresh shared memory in both processes;
  each buffer's file descriptor crosses to the training process once, later batches name it. Set it False if
  batch tensors are handed on to other processes that may still read them.
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

import inspect
import warnings
from typing import Any, TypeVar

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler
from torch.utils.data import DataLoader as TorchDataLoader

from mmfeed.loaders.clock import TimedCollate
from mmfeed.loaders.loop.epoch_iter import LoaderIter
from mmfeed.loaders.loop.epochs import Epochs, Feed
from mmfeed.loaders.loop.prefetch import _resolve_device
from mmfeed.loaders.loop.resume import ChainedIndex, EpochCursor, ResumableIndex, ShuffleSampler
from mmfeed.loaders.loop.workers import WorkerInit, direct_queues
from mmfeed.loaders.shm import ReleaseTracker
from mmfeed.loaders.observe.timing import StepTimer
from mmfeed.loaders.planned.dataset import PlannedDataset, PlanSampler
from mmfeed.loaders.sources.base import EpisodeSource

__all__ = ["DataLoader"]

WORKER_MODES = ("process", "thread")
"""``worker_mode`` values: worker processes (torch's), or threads of this process
(:mod:`mmfeed.loaders.loop.threads`)."""
_TORCH_PARAMS = frozenset(inspect.signature(TorchDataLoader.__init__).parameters) - {"self"}
_T_co = TypeVar("_T_co", covariant=True)
_TORCH_SETTINGS = frozenset({"num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                             "multiprocessing_context", "generator", "prefetch_factor", "pin_memory_device",
                             "in_order"})
"""What torch lets a user set on a DataLoader after construction and reads when it starts loading."""


def _check_worker_mode(loader: Any, worker_mode: str) -> str:
    if worker_mode not in WORKER_MODES:
        raise ValueError(f"worker_mode must be one of {list(WORKER_MODES)}, got {worker_mode!r}")
    return worker_mode


def _check_prefetch(loader: Any, prefetch: int) -> int:
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
        raise ValueError(f"prefetch must be an int >= 0 (batches ahead on the device), got {prefetch!r}")
    return prefetch


def _as_timer(loader: Any, timer: StepTimer | bool | None) -> StepTimer | None:
    if timer is True:
        timer = StepTimer(num_workers=loader.num_workers)
    elif timer is False:
        timer = None
    elif timer is not None and not isinstance(timer, StepTimer):
        raise TypeError(f"timer must be None, True or a StepTimer, got {type(timer).__name__}")
    if timer is not None and timer.num_workers is None:
        timer.num_workers = loader.num_workers
    return timer


def _as_device(loader: Any, device: Any) -> torch.device | None:
    device = None if device is None else _resolve_device(device)
    if device is None and loader.__dict__.get("device_transform") is not None:
        raise ValueError("device_transform runs on each batch after the copy to the device: keep a device "
                         "(device='cuda' or 'cpu'), or set device_transform = None first")
    return device


def _check_device_transform(loader: Any, fn: Any) -> Any:
    """``fn(batch, samples) -> batch`` for a planned dataset's batches with a device, or None."""
    if fn is None:
        return None
    if not callable(fn):
        raise TypeError(f"device_transform must be a callable fn(batch, samples) -> batch (e.g. DeviceCompose(...) "
                        f"of mmfeed.loaders.planned.device_transforms), got {type(fn).__name__}")
    if not _is_planned(loader.dataset):
        raise ValueError(f"device_transform seeds each sample of a PackedBatch from (seed, epoch, sample id): it "
                         f"needs a planned dataset (packing=Packing(...) or a PlannedDataset), got "
                         f"{type(loader.dataset).__name__}")
    if loader.__dict__.get("device") is None:
        raise ValueError("device_transform runs on each batch after the copy to the device: give device='cuda' "
                         "(or device='cpu', where it runs in the prefetch thread)")
    return fn


_SETTINGS = {"worker_mode": _check_worker_mode, "prefetch": _check_prefetch, "timer": _as_timer,
             "device": _as_device, "recycle_buffers": lambda loader, value: bool(value),
             "device_transform": _check_device_transform}
"""mmfeed's own keywords that may be set after construction too, each checked as the constructor checks it."""
_REBUILT = _TORCH_SETTINGS | {"timer", "worker_mode", "recycle_buffers", "device_transform"}
"""Settings whose change rebuilds the torch loader that does the loading, at the next ``iter(loader)``."""



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


class DataLoader(TorchDataLoader[_T_co]):
    """torch.utils.data.DataLoader with the same arguments, plus ``device``, ``prefetch``, ``timer`` and
    ``packing``: a subclass of it (``isinstance(loader, torch.utils.data.DataLoader)``, ``DataLoader[T]``) that has
    every attribute torch's has, set as torch sets them, and lets a torch loader it holds do the loading.

    ``packing=Packing(layout=..., window=..., plan=PlanConfig(capacity=8192, rows_per_batch=4))`` over an episode
    source (or a path, or a list of them for a mixture, see :func:`~mmfeed.loaders.open.open_dataset`) plans the
    epoch for this rank and yields :class:`~mmfeed.packing.PackedBatch` objects; so does passing a
    :class:`~mmfeed.loaders.planned.dataset.PlannedDataset` directly. Each ``iter(loader)`` runs the next epoch of the
    plan, and ``state_dict()`` resumes mid-epoch by step, with any ``num_workers``. With workers and
    ``persistent_workers=True`` its epochs chain: the next epoch's first batches load while the loop finishes this
    one (see the module docstring; ``chain_epochs = False`` on the loader or a subclass drains them as torch does).

    Setting attributes after construction behaves as torch's: ``batch_size``, ``batch_sampler``, ``sampler``,
    ``drop_last``, ``dataset`` and ``persistent_workers`` raise a ValueError; the rest (``num_workers``,
    ``collate_fn``, ``pin_memory``, ``timeout``, ``worker_init_fn``, ``multiprocessing_context``, ``generator``,
    ``prefetch_factor``, ``pin_memory_device``, ``in_order``, and mmfeed's ``device``, ``prefetch``, ``timer``,
    ``worker_mode``, ``recycle_buffers``) take effect at the next ``iter(loader)``, which then builds the torch loader
    that does the loading afresh (with persistent workers, new workers start; torch's own keeps the ones it has).
    See the module docstring for resume and timing.
    """

    chain_epochs = True

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, num_workers: int = 0, collate_fn: Any = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Any = None,
                 multiprocessing_context: Any = None, generator: torch.Generator | None = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = "",
                 in_order: bool = True, device: Any = None, prefetch: int = 2,
                 timer: StepTimer | bool | None = None, packing: Any = None, recycle_buffers: bool = True,
                 worker_mode: str = "process", device_transform: Any = None) -> None:
        object.__setattr__(self, "_building", True)  # until the end: attributes are set here, not by a user
        worker_mode = _check_worker_mode(self, worker_mode)
        if packing is not None:
            dataset = _packed_dataset(dataset, packing)
        elif isinstance(dataset, EpisodeSource):  # torch would fail at the first batch: 'not subscriptable'
            raise TypeError(f"DataLoader got {type(dataset).__name__} {dataset.name!r}, a dataset of whole episodes "
                            "(what open_dataset returns), which has no samples to batch; give ds.windows(WindowSpec"
                            "(...)) (a map-style dataset of LeRobot-shaped samples) or packing=Packing(...) (packed "
                            "batches planned from the episodes)")
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
        # torch validates the arguments and sets its attributes as for a loader of its own (no RNG is drawn and no
        # worker starts here)
        with warnings.catch_warnings():
            if worker_mode == "thread":  # threads are no processes: torch's advice on process counts is moot
                warnings.filterwarnings("ignore", message="This DataLoader will create")
            super().__init__(**args)
        self.prefetch = _check_prefetch(self, prefetch)
        self.timer = _as_timer(self, timer)
        self.device = _as_device(self, device)
        self.device_transform = _check_device_transform(self, device_transform)
        self.worker_mode, self.recycle_buffers = worker_mode, bool(recycle_buffers)
        self._iterable = isinstance(dataset, IterableDataset)
        # the one owner of where the loop stands: cursor, index, plan sampler, chain of epochs, active iterator
        self._epochs = Epochs(iterable=self._iterable,
                              plan_sampler=self.sampler if isinstance(self.sampler, PlanSampler) else None)
        self._args = args  # what the torch loader that does the loading is built from, with the settings below
        self._order = self._make_order(self, args)
        self._build()
        self._building = False

    def __setattr__(self, name: str, value: Any) -> None:
        """As torch's: ValueError for the attributes that fix the batches; a setting the loading reads takes
        effect at the next ``iter(loader)`` (see the class docstring)."""
        if self.__dict__.get("_building", True):
            object.__setattr__(self, name, value)
            return
        check = _SETTINGS.get(name)
        if check is not None:
            value = check(self, value)
        super().__setattr__(name, value)  # torch's refuses batch_size, batch_sampler, sampler, drop_last, ...
        if name in _REBUILT:
            object.__setattr__(self, "_stale", True)

    @property
    def cursor(self) -> EpochCursor:
        """Where the loop stands: epoch, batches handed out, a loaded state (see :class:`EpochCursor`)."""
        return self._epochs.cursor

    @property
    def stats(self) -> dict[str, Any]:
        """Samples skipped under an ErrorPolicy of "skip"/"warn": ``skipped_samples`` (how many) and ``errors``
        ((source, episode, reason) of each)."""
        return self._epochs.stats

    @stats.setter
    def stats(self, value: dict[str, Any]) -> None:
        self._epochs.stats = value

    @property
    def _loader(self) -> TorchDataLoader:
        """The torch loader that does the loading."""
        return self._epochs.feed.loader

    @property
    def _recycler(self) -> ReleaseTracker | None:
        return self._epochs.feed.recycler

    @property
    def _chain(self) -> Any:
        """The chain of epochs in flight (:class:`~mmfeed.loaders.loop.epoch_iter.Chain`), or None."""
        return self._epochs.chain

    def _build(self) -> None:
        """Build the torch loader that does the loading (``self._loader``) from the arguments and the current
        settings: the order (:meth:`_make_order`), worker processes or threads, the recycled buffers, the worker
        start-up, the timed collate function and the chain of epochs."""
        workers = self.num_workers
        threads = self.worker_mode == "thread" and workers > 0
        if threads and self._iterable:
            raise ValueError("worker_mode='thread' loads map-style datasets (an iterable dataset's copies in "
                             "threads would share one iterator); use worker processes")
        args = {**self._args, **{k: getattr(self, k) for k in _TORCH_SETTINGS if k in self._args}, **self._order}
        if workers == 0:  # as torch's own iterator does with these when there are no workers
            args.update(prefetch_factor=None, persistent_workers=False, multiprocessing_context=None)
        if self.timer is not None:
            args["collate_fn"] = TimedCollate(self.collate_fn)
        depth = workers * (self.prefetch_factor or 2)
        thread_opts = None
        if threads:  # torch's loader only samples and collates here: the threads call it in this process
            thread_opts = {"worker_init_fn": self.worker_init_fn, "pin_memory": self.pin_memory,
                           "timeout": self.timeout, "depth": depth}
            args.update(num_workers=0, prefetch_factor=None, persistent_workers=False, worker_init_fn=None,
                        multiprocessing_context=None, pin_memory=False, timeout=0)
        recycler: ReleaseTracker | None = None
        if self.recycle_buffers and _is_planned(self.dataset) and workers > 0 and not self.pin_memory \
                and not threads:
            per_key = (self.prefetch_factor or 2) + 4  # in flight, held by the loop and its prefetcher, spare
            args["worker_init_fn"] = WorkerInit(per_key, self.worker_init_fn)
            args["multiprocessing_context"] = direct_queues(args.get("multiprocessing_context"))  # small messages
            recycler = ReleaseTracker(stale_after=8 * workers * per_key)
        elif workers > 0 and not threads:
            args["worker_init_fn"] = WorkerInit(None, self.worker_init_fn)
        # epochs chain (one torch iterator for all of them): planned datasets with persistent workers, in order
        chained: ChainedIndex | None = None
        epochs = self._epochs
        index, sampler = epochs.index, epochs.plan_sampler
        if (sampler is not None and args["persistent_workers"] and getattr(self, "in_order", True)
                and not threads and index is not None and index.target is sampler
                and args.get("sampler") is index):
            chained = args["sampler"] = ChainedIndex(index)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="This DataLoader will create")  # said when this one was made
            torch_loader = TorchDataLoader(**args)
        tap = self._iterable and workers == 0 and callable(getattr(self.dataset, "state_dict", None))
        epochs.feed = Feed(torch_loader, recycler=recycler, threads=thread_opts, chained_index=chained,
                           tap_dataset=tap)
        self._stale = False

    # -- the extension point ---------------------------------------------------------------------------------
    def _make_order(self, spec: TorchDataLoader, args: dict[str, Any]) -> dict[str, Any]:
        """Turn the arguments into the sampling arguments of the torch loader that does the loading (``spec``:
        torch's reading of them, this loader as torch's ``__init__`` left it).

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
            index = ResumableIndex(inner, None if user_batches is not None else spec.batch_size)
            out.update(batch_size=1, batch_sampler=index)
        else:
            index = ResumableIndex(base, 1)
            out.update(batch_size=None, batch_sampler=None, sampler=index)
        self._epochs.index = index
        return out

    # -- iteration -------------------------------------------------------------------------------------------
    def __iter__(self) -> LoaderIter:
        """The next epoch's iterator (or a loaded state's): see :meth:`Epochs.begin`."""
        return self._epochs.begin(self, self._build if self._stale else None)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        epochs = self.__dict__.get("_epochs")
        if name.startswith("__") or epochs is None or epochs.feed is None:
            raise AttributeError(name)
        return getattr(epochs.feed.loader, name)

    # -- resume ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: epoch, batches handed out, and what fixed this epoch's order (see module doc)."""
        return self._epochs.state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next ``iter(loader)``."""
        self._epochs.load_state_dict(self, state, self._adopt_generator)

    def _adopt_generator(self, generator: torch.Generator) -> None:
        """The generator a loaded shuffle state restored: the loader's (and its torch loader's) from now on, as
        torch's would be, without rebuilding the torch loader."""
        object.__setattr__(self, "generator", generator)
        self._loader.generator = generator
