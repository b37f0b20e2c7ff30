"""Device prefetch: pin and copy batches to the GPU ahead of the step that needs them.

:class:`DevicePrefetcher` wraps any iterable of batches. A background thread pulls batches from it, pins their
host memory and, on CUDA, issues non-blocking copies on a dedicated stream, up to ``depth`` batches ahead of the
loop. Handing a batch over, it makes the loop's current stream wait on the copy's event and calls
``record_stream`` on every device tensor, so the caching allocator never reuses a buffer the loop still reads.

Batches may be tensors, dicts, lists, tuples and namedtuples of them (nested), or any object with
``to(device, non_blocking=True)`` / ``pin_memory()`` methods (a :class:`~mmfeed.PackedBatch`). On a CPU device it
moves nothing (a pass-through, still ``depth`` batches ahead in the thread) and records the same wait times;
``depth=0`` reads synchronously in the caller's thread. Errors raised by the source are re-raised in the loop with
their original traceback. Example::

    >>> import torch
    >>> batches = [torch.arange(3) + i for i in range(4)]
    >>> [int(b[0]) for b in DevicePrefetcher(batches, "cpu")]
    [0, 1, 2, 3]
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import logging
import queue
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from mmfeed.loaders.clock import TimedBatch
from mmfeed.loaders.observe.flops import useful_fraction
from mmfeed.loaders.observe.timing import StepTimer

__all__ = ["DevicePrefetcher", "move_to", "pin", "walk_tensors"]

logger = logging.getLogger(__name__)

_END = object()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _put(q: queue.Queue[Any], stop: threading.Event, obj: Any) -> bool:
    while not stop.is_set():
        try:
            q.put(obj, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _produce(ref: weakref.ref[DevicePrefetcher], source: Iterator[Any], q: queue.Queue[Any],
             stop: threading.Event) -> None:
    """The prefetch thread. It holds the prefetcher only weakly, so dropping the prefetcher stops it."""
    pf = ref()
    if pf is None:
        return
    if pf._cuda:
        torch.cuda.set_device(pf.device)
    del pf
    try:
        for item in source:
            pf = ref()
            if pf is None or stop.is_set():
                return
            prepared = pf._prepare(item)
            del pf
            if not _put(q, stop, prepared):
                return
        _put(q, stop, _END)
    except BaseException as exc:  # forwarded to the consumer, which re-raises it
        _put(q, stop, _Failure(exc))


def _rebuild(obj: Any, fn: Any) -> Any:
    """Apply ``fn`` to the tensors of a nested container, keeping container types."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (str, bytes)):
        return obj
    if isinstance(obj, cabc.Mapping):
        items = {k: _rebuild(v, fn) for k, v in obj.items()}
        try:
            return type(obj)(items)
        except TypeError:
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_rebuild(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rebuild(v, fn) for v in obj)
    return obj


def pin(obj: Any) -> Any:
    """Pinned-memory copy of a batch (objects with ``pin_memory()`` pin themselves); tensors already pinned or
    on a device are left as they are."""
    if not isinstance(obj, torch.Tensor) and callable(getattr(obj, "pin_memory", None)):
        return obj.pin_memory()

    def one(t: torch.Tensor) -> torch.Tensor:
        return t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory()

    return _rebuild(obj, one)


def move_to(obj: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """Copy a batch to ``device`` (objects with a ``to`` method move themselves)."""
    if not isinstance(obj, torch.Tensor) and callable(getattr(obj, "to", None)):
        return obj.to(device, non_blocking=non_blocking)
    return _rebuild(obj, lambda t: t.to(device, non_blocking=non_blocking))


def walk_tensors(obj: Any, _seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Every tensor reachable from a batch: containers, dataclass fields and plain attributes."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return
    elif isinstance(obj, cabc.Mapping):
        for v in obj.values():
            yield from walk_tensors(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from walk_tensors(v, seen)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        names = list(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            slots = getattr(cls, "__slots__", ())
            names.extend([slots] if isinstance(slots, str) else slots)
        for name in names:
            if hasattr(obj, name):
                yield from walk_tensors(getattr(obj, name), seen)


def _resolve_device(device: Any) -> torch.device:
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as exc:
        raise ValueError(f"device must be a torch.device or a string like 'cuda' or 'cpu', got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available; pass device='cpu' or None")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class DevicePrefetcher:
    """Iterate ``iterable`` with each batch already on ``device``, ``depth`` batches ahead.

    Args:
        iterable: any iterable of batches (see the module docstring for the accepted types).
        device: target device; ``"cuda"`` uses a side stream and events, ``"cpu"`` moves nothing.
        depth: batches prepared ahead of the loop (>= 0; 0 reads synchronously, no thread).
        pin_memory: pin host memory before a CUDA copy (ignored on CPU).
        timer: a :class:`~mmfeed.loaders.observe.timing.StepTimer` to record wait, copy and compute times in.
        transform: run on each batch after the copy, in the prefetch thread (on CUDA on the side stream, before the
            event the loop waits on), timed as the ``transform`` phase: an object with ``prepare(host_batch)``
            (called before the copy, on the batch as it came) and ``__call__(batch, prepared) -> batch``
            (:class:`~mmfeed.loaders.planned.device_transforms.BatchTransform`), or None.

    :class:`~mmfeed.loaders.clock.TimedBatch` items are unwrapped (their stage seconds go to ``timer``).
    Use it as an iterator once; ``close()`` (or exhaustion, or an error) stops the thread.
    """

    def __init__(self, iterable: Iterable[Any], device: Any, *, depth: int = 2, pin_memory: bool = True,
                 timer: StepTimer | None = None, transform: Any = None) -> None:
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise ValueError(f"depth must be an int >= 0, got {depth!r}")
        if timer is not None and not isinstance(timer, StepTimer):
            raise TypeError(f"timer must be a StepTimer or None, got {type(timer).__name__}")
        self.device = _resolve_device(device)
        self.depth = depth
        self.pin_memory = bool(pin_memory)
        self.timer = timer
        if transform is not None and not (callable(transform) and callable(getattr(transform, "prepare", None))):
            raise TypeError(f"transform must have prepare(host_batch) and __call__(batch, prepared) (a "
                            f"BatchTransform), got {type(transform).__name__}")
        self.transform = transform
        self._cuda = self.device.type == "cuda"
        self._source = iter(iterable)
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self._thread: threading.Thread | None = None
        self._done = False
        self._stream = torch.cuda.Stream(self.device) if self._cuda else None

    # -- producer -------------------------------------------------------------------------------------------
    def _prepare(self, item: Any) -> tuple[Any, dict[str, Any] | None, Any, Any]:
        info = None
        if isinstance(item, TimedBatch):
            item, info = item.batch, {"stages": item.stages, "spans": item.spans, "worker": item.worker}
        if self.timer is not None:  # the non-padding share, read on the host before any copy
            info = {**(info or {}), "useful": useful_fraction(item)}
        transform = self.transform
        prepared = transform.prepare(item) if transform is not None else None
        if not self._cuda:
            if transform is not None:
                began = time.perf_counter()
                item = transform(item, prepared)
                if self.timer is not None:
                    info["transform"] = time.perf_counter() - began
            return item, info, None, None
        if self.pin_memory:
            item = pin(item)
        timed = self.timer is not None
        with torch.cuda.stream(self._stream):
            start = torch.cuda.Event(enable_timing=True) if timed else None
            if start is not None:
                start.record(self._stream)
            item = move_to(item, self.device, non_blocking=True)
            copied = None
            if transform is not None:
                if timed:
                    copied = torch.cuda.Event(enable_timing=True)
                    copied.record(self._stream)
                item = transform(item, prepared)
            ready = torch.cuda.Event(enable_timing=timed)
            ready.record(self._stream)
        if timed and copied is not None:
            info["transform"] = (copied, ready)
            return item, info, ready, (start, copied)
        return item, info, ready, (start, ready) if timed else None

    # -- consumer -------------------------------------------------------------------------------------------
    def __iter__(self) -> DevicePrefetcher:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self.timer is not None:
            self.timer.request()
        if self.depth == 0:
            try:
                got = self._prepare(next(self._source))
            except StopIteration:
                self._finish()
                raise
        else:
            if self._thread is None:
                self._thread = threading.Thread(target=_produce, name="mmfeed-prefetch", daemon=True,
                                                args=(weakref.ref(self), self._source, self._queue, self._stop))
                self._thread.start()
            got = self._queue.get()
            if got is _END:
                self._finish()
                raise StopIteration
            if isinstance(got, _Failure):
                self._finish()
                raise got.exc
        item, info, ready, copy_events = got
        if ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready)
            for t in walk_tensors(item):
                if t.device.type == "cuda":
                    t.record_stream(current)
        if self.timer is not None:
            info = info or {}
            self.timer.deliver(info.get("stages"), copy_events, cuda=self._cuda, useful=info.get("useful"),
                               spans=info.get("spans"), worker=info.get("worker"), transform=info.get("transform"))
        return item

    def _finish(self) -> None:
        self._done = True
        if self.timer is not None:
            self.timer.exhausted()
        self._join()
        self._source = iter(())  # drop the source now (a torch iterator shuts its workers down)

    def _join(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return
        deadline = time.monotonic() + 30.0
        while thread.is_alive() and time.monotonic() < deadline:
            try:  # unblock a producer waiting on a full queue
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)
        if thread.is_alive():
            logger.warning("prefetch thread still inside the source after 30 s; leaving it (daemon)")

    def close(self) -> None:
        """Stop the background thread and drop the batches prepared ahead; safe to call twice."""
        self._done = True
        self._join()
        source, self._source = self._source, iter(())
        close = getattr(source, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # a source that cannot close is no reason to fail shutdown
                logger.debug("closing the prefetch source failed", exc_info=True)

    def __enter__(self) -> DevicePrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_thread", None) is not None:
            self._stop.set()
