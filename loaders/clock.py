"""The worker-side stage clock: where a batch's time goes while it is built.

Datasets, sources and collate functions mark their stages with ``with stage("decode"):`` or
``record_stage("read", seconds)``. The times go into an accumulator private to the calling thread (a torch worker
process runs the dataset and the collate function in its one thread; with ``num_workers=0`` they run in the thread
that pulls batches). :class:`TimedCollate` wraps a collate function, times it as the ``"collate"`` stage and
drains the accumulator into a :class:`TimedBatch` (the batch plus its stage seconds), which crosses the worker
queue with the batch; the loop side (:mod:`mmfeed.loaders.observe.timing`) reads it. A leaf: it imports nothing
of mmfeed, so every source and every stage of loading can use it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["TimedBatch", "TimedCollate", "drain_spans", "drain_stages", "record_stage", "stage"]

# One accumulator per thread, by design: the worker-side API must be callable from any dataset code without
# passing an object around, and a thread-local keeps concurrent producers (a prefetch thread, the loop) apart.
_local = threading.local()
_MAX_SPANS = 4096  # spans kept per batch for the trace (stage seconds are always complete)


def _accumulator() -> dict[str, float]:
    acc = getattr(_local, "stages", None)
    # A forked worker inherits its parent's thread state: start it from zero, so that stage seconds the parent
    # recorded (say, loading in-process before) are never charged to the worker's first batch.
    if acc is None or getattr(_local, "pid", None) != os.getpid():
        acc = _local.stages = {}
        _local.spans = []
        _local.pid = os.getpid()
    return acc


def record_stage(name: str, seconds: float, *, end: float | None = None) -> None:
    """Add ``seconds`` to stage ``name`` of the batch being built in this thread (worker process); the stage is
    taken to have ended at ``end`` (``time.perf_counter()``; default now) for the trace."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"stage name must be a non-empty string, got {name!r}")
    seconds = float(seconds)
    if not seconds >= 0.0:
        raise ValueError(f"stage {name!r}: seconds must be >= 0, got {seconds!r}")
    acc = _accumulator()
    acc[name] = acc.get(name, 0.0) + seconds
    spans = _local.spans
    if len(spans) < _MAX_SPANS:
        stop = time.perf_counter() if end is None else float(end)
        spans.append((name, stop - seconds, stop))


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the body as stage ``name`` (read, decode, pack, ...); stages should not nest (both would count).

    >>> _ = drain_stages()  # what this thread timed before
    >>> with stage("decode"):
    ...     pass
    >>> sorted(drain_stages())
    ['decode']
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        stop = time.perf_counter()
        record_stage(name, stop - start, end=stop)


def drain_stages() -> dict[str, float]:
    """Return and clear the stage seconds accumulated in this thread since the last drain (and its spans)."""
    acc = _accumulator()
    out = dict(acc)
    acc.clear()
    _local.spans = []
    return out


def drain_spans() -> tuple[dict[str, float], list[tuple[str, float, float]]]:
    """Return and clear this thread's stage seconds and its ``(stage, start, end)`` spans (perf_counter)."""
    acc = _accumulator()
    spans, _local.spans = _local.spans, []
    out = dict(acc)
    acc.clear()
    return out, spans


def _worker_id() -> int | None:
    info = torch.utils.data.get_worker_info()
    return None if info is None else int(info.id)


class TimedBatch:
    """A batch with the worker stage seconds spent on it; unwrapped by the loader before the loop sees it.

    ``spans`` are the stages' ``(name, start, end)`` on the machine's monotonic clock (``time.perf_counter``,
    shared by the processes of one host), ``worker`` the torch worker id that built it (None: in the loop's
    process).
    """

    __slots__ = ("batch", "spans", "stages", "worker")

    def __init__(self, batch: Any, stages: Mapping[str, float], spans: list[tuple[str, float, float]] | None = None,
                 worker: int | None = None) -> None:
        self.batch = batch
        self.stages = dict(stages)
        self.spans = list(spans or ())
        self.worker = worker

    def pin_memory(self) -> TimedBatch:
        """Pin the inner batch (torch's pin-memory thread calls this)."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return TimedBatch(pin_memory(self.batch), self.stages, self.spans, self.worker)

    def __repr__(self) -> str:
        return f"TimedBatch({type(self.batch).__name__}, stages={self.stages}, worker={self.worker})"


class TimedCollate:
    """Wrap ``collate_fn``: time it as stage ``"collate"`` and return a :class:`TimedBatch` with all stages.

    Picklable (a plain class), so it works with every multiprocessing start method.
    """

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        if not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {collate_fn!r}")
        self.collate_fn = collate_fn

    def __call__(self, samples: Any) -> TimedBatch:
        with stage("collate"):
            batch = self.collate_fn(samples)
        stages, spans = drain_spans()
        return TimedBatch(batch, stages, spans, _worker_id())
