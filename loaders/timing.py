"""Step-time decomposition: where every millisecond of a training step goes.

Two halves:

* **Worker side.** Datasets and collate functions mark their stages with ``with stage("decode"):`` or
  ``record_stage("read", seconds)``. The times go into an accumulator private to the calling thread (a torch
  worker process runs the dataset and the collate function in its one thread; with ``num_workers=0`` they run in
  the thread that pulls batches). :class:`TimedCollate` wraps a collate function, times it as the ``"collate"``
  stage and drains the accumulator into a :class:`TimedBatch` (the batch plus its stage seconds), which crosses
  the worker queue with the batch. mmfeed's loader and :class:`~mmfeed.loaders.DevicePrefetcher` unwrap it in
  the main process, so the training loop always receives the batch itself, of its own type.
* **Loop side.** :class:`StepTimer` records, per step, the data wait (time the loop blocked on ``next``), the
  host-to-device copy (CUDA events), the compute time (from handing a batch over to asking for the next; CUDA
  events as well on a GPU) and the worker stages of that batch, and turns them into a report with the stall
  fraction and the bottleneck named in plain words.

Example::

    >>> timer = StepTimer()
    >>> timer.record(wait_s=0.01, compute_s=0.09, stages={"decode": 0.2})
    >>> round(timer.report()["stall_fraction"], 3)
    0.1
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

__all__ = ["StepTimer", "TimedBatch", "TimedCollate", "drain_stages", "record_stage", "stage"]

logger = logging.getLogger(__name__)

# One accumulator per thread, by design: the worker-side API must be callable from any dataset code without
# passing an object around, and a thread-local keeps concurrent producers (a prefetch thread, the loop) apart.
_local = threading.local()


def _accumulator() -> dict[str, float]:
    acc = getattr(_local, "stages", None)
    # A forked worker inherits its parent's thread state: start it from zero, so that stage seconds the parent
    # recorded (say, loading in-process before) are never charged to the worker's first batch.
    if acc is None or getattr(_local, "pid", None) != os.getpid():
        acc = _local.stages = {}
        _local.pid = os.getpid()
    return acc


def record_stage(name: str, seconds: float) -> None:
    """Add ``seconds`` to stage ``name`` of the batch being built in this thread (worker process)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"stage name must be a non-empty string, got {name!r}")
    seconds = float(seconds)
    if not seconds >= 0.0:
        raise ValueError(f"stage {name!r}: seconds must be >= 0, got {seconds!r}")
    acc = _accumulator()
    acc[name] = acc.get(name, 0.0) + seconds


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the body as stage ``name`` (read, decode, pack, ...); stages should not nest (both would count).

    >>> with stage("decode"):
    ...     pass
    >>> sorted(drain_stages())
    ['decode']
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        record_stage(name, time.perf_counter() - start)


def drain_stages() -> dict[str, float]:
    """Return and clear the stage seconds accumulated in this thread since the last drain."""
    acc = _accumulator()
    out = dict(acc)
    acc.clear()
    return out


class TimedBatch:
    """A batch with the worker stage seconds spent on it; unwrapped by the loader before the loop sees it."""

    __slots__ = ("batch", "stages")

    def __init__(self, batch: Any, stages: Mapping[str, float]) -> None:
        self.batch = batch
        self.stages = dict(stages)

    def pin_memory(self) -> TimedBatch:
        """Pin the inner batch (torch's pin-memory thread calls this)."""
        from torch.utils.data._utils.pin_memory import pin_memory

        return TimedBatch(pin_memory(self.batch), self.stages)

    def __repr__(self) -> str:
        return f"TimedBatch({type(self.batch).__name__}, stages={self.stages})"


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
        return TimedBatch(batch, drain_stages())


# stage name (lower case, substring match) -> advice when that stage is the bottleneck
_ADVICE = {
    "read": "faster storage (local SSD, larger reads, fewer small files) or more workers to overlap I/O",
    "fetch": "faster storage (local SSD, larger reads, fewer small files) or more workers to overlap I/O",
    "open": "faster storage (local SSD, larger reads, fewer small files) or more workers to overlap I/O",
    "decode": "more workers, or a lower decode resolution / fewer frames per sample",
    "pack": "more workers, or a cheaper packing algorithm",
    "collate": "more workers, or a cheaper collate (build tensors in the dataset, avoid Python loops)",
}


def _advice(stage_name: str) -> str:
    low = stage_name.lower()
    for key, text in _ADVICE.items():
        if key in low:
            return text
    return "more workers, or make this stage cheaper"


def diagnose(stall_fraction: float, compute_s: float, copy_s: float | None, stages: Mapping[str, float],
             num_workers: int | None, threshold: float = 0.05) -> dict[str, Any]:
    """Name the bottleneck and a recommendation from per-step means (seconds); a pure function.

    ``stages`` holds the mean worker seconds per batch of each stage; ``num_workers`` divides them into the
    pipeline's per-batch load time (None or 0 counts as one process).
    """
    if stall_fraction <= threshold:
        return {"stage": "compute", "recommendation":
                f"input is not the bottleneck (stall {stall_fraction:.1%} <= {threshold:.0%}); speed up the model"}
    if not stages:
        return {"stage": "unknown", "recommendation":
                f"the loop waits (stall {stall_fraction:.1%}) but no worker stage times were recorded: time the "
                "dataset with stage(...) and mmfeed.DataLoader(timer=True); meanwhile try more workers or a "
                "deeper prefetch"}
    workers = max(int(num_workers or 1), 1)
    load_s = sum(stages.values()) / workers
    if copy_s is not None and copy_s > max(load_s, compute_s):
        return {"stage": "copy", "recommendation":
                "host-to-device copy dominates: pin memory, use a deeper prefetch, or send smaller dtypes (uint8)"}
    if load_s >= compute_s:
        top = max(stages, key=stages.get)
        need = int(np.ceil(sum(stages.values()) / max(compute_s, 1e-9)))
        return {"stage": top, "recommendation":
                f"stage '{top}' is the bottleneck ({stages[top] * 1e3:.1f} ms per batch): {_advice(top)}; about "
                f"{need} workers would keep up with a {compute_s * 1e3:.1f} ms step"}
    return {"stage": "prefetch", "recommendation":
            "the workers keep up on average but the loop still waits: deeper prefetch (prefetch=, "
            "prefetch_factor=) to absorb jitter, or more workers"}


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "median": float(np.median(arr)), "p95": float(np.percentile(arr, 95)),
            "total": float(arr.sum())}


class StepTimer:
    """Per-step wait / copy / compute / worker-stage times and their report.

    The loader (or prefetcher) calls :meth:`request` when the loop asks for a batch and :meth:`deliver` when it
    hands one over; :meth:`record` adds a finished step directly. A report counts the step in hand (a batch
    delivered and not yet followed by a request, as after a ``break``) with its compute up to the report. ``log_every=N`` logs one line every N steps
    (logger ``mmfeed.loaders.timing``). ``warmup=N`` leaves the first N steps (worker start-up, the first
    fill of the prefetch queue) out of the report. ``num_workers`` (set by mmfeed's DataLoader) turns worker
    seconds into the pipeline's per-batch load time for the diagnosis.
    """

    def __init__(self, *, log_every: int = 0, warmup: int = 0, num_workers: int | None = None,
                 stall_threshold: float = 0.05) -> None:
        if not isinstance(log_every, int) or log_every < 0:
            raise ValueError(f"log_every must be an int >= 0 (0 = never), got {log_every!r}")
        if not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0 (steps left out of the report), got {warmup!r}")
        self.log_every = log_every
        self.warmup = warmup
        self.num_workers = num_workers
        self.stall_threshold = stall_threshold
        self.reset()

    def reset(self) -> None:
        """Forget every recorded step."""
        self.wait_s: list[float] = []
        self.compute_s: list[float] = []
        self.copy_s: list[float] = []
        self.gpu_compute_s: list[float] = []
        self.stages: list[dict[str, float]] = []
        self._requested_at: float | None = None
        self._delivered_at: float | None = None
        self._pending: dict[str, Any] | None = None
        self._unresolved: list[tuple[str, Any, Any]] = []  # (list name, start event, end event)
        self.epoch_starts: list[int] = []  # index of the first step of each epoch the loader began

    # -- hooks for the loader -------------------------------------------------------------------------------
    def request(self) -> None:
        """The loop asks for the next batch: ends the compute of the previous step."""
        now = time.perf_counter()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            end = None
            if pending["gpu_start"] is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
            self._finish(pending, now - pending["delivered_at"], end)
        self._requested_at = now
        self._resolve(block=False)

    def deliver(self, stages: Mapping[str, float] | None = None, copy_events: tuple[Any, Any] | None = None,
                cuda: bool = False) -> None:
        """A batch is handed over: ends the wait; ``copy_events`` (start, end) time its device copy."""
        now = time.perf_counter()
        wait = 0.0 if self._requested_at is None else now - self._requested_at
        self._requested_at = None
        gpu_start = None
        if cuda:
            gpu_start = torch.cuda.Event(enable_timing=True)
            gpu_start.record()
        self._pending = {"wait": wait, "stages": dict(stages or {}), "copy": copy_events,
                         "gpu_start": gpu_start, "delivered_at": now}

    def begin_epoch(self) -> None:
        """An epoch begins: its first batch is the next one delivered (the loader calls this at ``iter()``)."""
        self.epoch_starts.append(len(self.wait_s) + (self._pending is not None))

    def exhausted(self) -> None:
        """The source ran out: close the last step at the moment it asked for more."""
        self._requested_at = None

    def record(self, wait_s: float, compute_s: float, copy_s: float | None = None,
               stages: Mapping[str, float] | None = None) -> None:
        """Add one finished step from known seconds (no clocks read)."""
        self._append(float(wait_s), float(compute_s), stages or {})
        if copy_s is not None:
            self.copy_s.append(float(copy_s))

    # -- internals ------------------------------------------------------------------------------------------
    def _finish(self, pending: dict[str, Any], compute: float, gpu_end: Any) -> None:
        if pending["copy"] is not None:
            self._unresolved.append(("copy_s", *pending["copy"]))
        if gpu_end is not None:
            self._unresolved.append(("gpu_compute_s", pending["gpu_start"], gpu_end))
        self._append(pending["wait"], compute, pending["stages"])

    def _append(self, wait: float, compute: float, stages: Mapping[str, float]) -> None:
        self.wait_s.append(wait)
        self.compute_s.append(compute)
        self.stages.append(dict(stages))
        if self.log_every and len(self.wait_s) % self.log_every == 0:
            logger.info("%s", self._line())

    def _resolve(self, block: bool) -> None:
        keep = []
        for name, start, end in self._unresolved:
            if block:
                end.synchronize()
            if block or end.query():
                getattr(self, name).append(start.elapsed_time(end) / 1e3)
            else:
                keep.append((name, start, end))
        self._unresolved = keep

    def _line(self) -> str:
        n = self.log_every
        wait, comp = sum(self.wait_s[-n:]), sum(self.compute_s[-n:])
        stall = wait / (wait + comp) if wait + comp > 0 else 0.0
        return (f"steps={len(self.wait_s)} last{n}: wait={wait / n * 1e3:.2f}ms compute={comp / n * 1e3:.2f}ms "
                f"stall={stall:.1%}")

    # -- report ---------------------------------------------------------------------------------------------
    def local_report(self) -> dict[str, Any]:
        """This process's report (no collective)."""
        self._resolve(block=True)
        w = self.warmup
        waits, computes, stages = list(self.wait_s), list(self.compute_s), list(self.stages)
        if self._pending is not None:  # the step in hand (the loop broke out, or reports mid-step) counts up to now
            waits.append(self._pending["wait"])
            computes.append(time.perf_counter() - self._pending["delivered_at"])
            stages.append(dict(self._pending["stages"]))
        waits, computes, stages = waits[w:], computes[w:], stages[w:]
        total_wait, total_compute = float(sum(waits)), float(sum(computes))
        total = total_wait + total_compute
        stall = total_wait / total if total > 0 else 0.0
        names = sorted({k for s in stages for k in s})
        n = max(len(stages), 1)
        stage_means = {k: sum(s.get(k, 0.0) for s in stages) / n for k in names}
        stage_total = sum(stage_means.values())
        step = [a + b for a, b in zip(waits, computes)]
        copy = _stats(self.copy_s[w:])
        mean_compute = total_compute / len(computes) if computes else 0.0
        report = {
            "steps": len(waits),
            "warmup_steps": min(w, len(self.wait_s) + (self._pending is not None)),
            "wait_s": _stats(waits),
            "compute_s": _stats(computes),
            "step_s": _stats(step),
            "copy_s": copy,
            "gpu_compute_s": _stats(self.gpu_compute_s[w:]),
            "stall_fraction": stall,
            "stages": {k: {"mean_s": v, "share": v / stage_total if stage_total > 0 else 0.0}
                       for k, v in stage_means.items()},
            "num_workers": self.num_workers,
        }
        report["bottleneck"] = diagnose(stall, mean_compute, None if copy is None else copy["mean"], stage_means,
                                        self.num_workers, self.stall_threshold)
        return report

    def report(self) -> dict[str, Any]:
        """The report as a dict; under torch.distributed every rank must call it (one all_gather).

        Keys: ``steps``; ``wait_s``, ``compute_s``, ``step_s``, ``copy_s``, ``gpu_compute_s`` each
        ``{mean, median, p95, total}`` or None; ``stall_fraction`` = total wait / total step time; ``stages``
        ``{name: {mean_s, share}}`` (worker seconds per batch); ``bottleneck`` ``{stage, recommendation}``; and,
        when torch.distributed is initialized, ``ranks``: ``{world_size, max, mean}`` over the ranks' scalar
        figures (the slowest rank sets the pace).
        """
        report = self.local_report()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            report["ranks"] = _reduce_ranks(report)
        return report

    def to_json(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Write :meth:`report` to ``path`` as JSON and return it."""
        report = self.report()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        return report


def _scalars(report: Mapping[str, Any]) -> dict[str, float]:
    out = {"steps": float(report["steps"]), "stall_fraction": float(report["stall_fraction"])}
    for key in ("wait_s", "compute_s", "step_s", "copy_s", "gpu_compute_s"):
        if report.get(key):
            for stat in ("mean", "median", "p95"):
                out[f"{key}.{stat}"] = float(report[key][stat])
    for name, vals in report["stages"].items():
        out[f"stages.{name}.mean_s"] = float(vals["mean_s"])
    return out


def _reduce_ranks(report: Mapping[str, Any]) -> dict[str, Any]:
    """Max and mean of every scalar figure over the ranks (figures a rank lacks count as absent there)."""
    dist = torch.distributed
    world = dist.get_world_size()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, _scalars(report))
    keys = sorted({k for g in gathered for k in g})
    mx = {k: max(g[k] for g in gathered if k in g) for k in keys}
    mean = {k: float(np.mean([g[k] for g in gathered if k in g])) for k in keys}
    return {"world_size": world, "max": mx, "mean": mean}
