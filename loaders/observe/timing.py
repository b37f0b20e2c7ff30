"""Step-time decomposition: where every millisecond of a training step goes.

Two halves:

* **Worker side** (:mod:`mmfeed.loaders.clock`). Datasets and collate functions mark their stages with
  ``with stage("decode"):``; the stage seconds of each batch cross the worker queue with it in a ``TimedBatch``,
  which mmfeed's loader and :class:`~mmfeed.loaders.DevicePrefetcher` unwrap in the main process, so the training
  loop always receives the batch itself, of its own type.
* **Loop side.** :class:`StepTimer` records, per step, the data wait (time the loop blocked on ``next``), the
  host-to-device copy (CUDA events), the busy time (from handing a batch over to asking for the next; CUDA
  events as well on a GPU) and the worker stages of that batch, and turns them into a report with the stall
  fraction and the bottleneck named in plain words (:mod:`mmfeed.loaders.observe.diagnosis`).
* **Communication and utilisation.** ``timer.watch(ddp_model)`` times DistributedDataParallel's gradient
  collectives through a comm hook (:mod:`mmfeed.loaders.observe.comm`), so the busy time splits into ``compute_s`` and
  ``comm_s`` (communication not overlapped with backward), beside ``comm_total_s``. ``flops_per_step``
  (:func:`count_flops`) and ``peak_flops`` give ``mfu``, and ``useful_mfu`` counts only the batches' non-padding
  tokens (:mod:`mmfeed.loaders.observe.flops`).
* **Traces.** :meth:`StepTimer.export_chrome_trace` writes the latest steps' phases and each worker's stages as
  a Chrome trace (:mod:`mmfeed.loaders.observe.trace`).

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
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from mmfeed.loaders.observe.comm import CommRecorder, resolve
from mmfeed.loaders.observe.diagnosis import diagnose
from mmfeed.loaders.observe.flops import count_flops, peak_flops

__all__ = ["StepTimer", "count_flops", "diagnose", "format_report"]

logger = logging.getLogger(__name__)

def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "median": float(np.median(arr)), "p95": float(np.percentile(arr, 95)),
            "total": float(arr.sum())}

class StepTimer:
    """Per-step wait / copy / compute / exposed-communication / worker-stage times and their report.

    The loader (or prefetcher) calls :meth:`request` when the loop asks for a batch and :meth:`deliver` when it
    hands one over; :meth:`record` adds a finished step directly. A step's time is its wait plus its busy time
    (from the hand-over to the next request), and the busy time splits into compute and exposed communication
    when a DistributedDataParallel model is :meth:`watch`-ed. A report counts the step in hand (a batch delivered
    and not yet followed by a request, as after a ``break``) with its time up to the report.

    Args:
        log_every: log one line every N steps (logger ``mmfeed.loaders.observe.timing``); 0 never.
        warmup: leave the first N steps (worker start-up, the first fill of the prefetch queue) out of the report.
        num_workers: set by mmfeed's DataLoader; turns worker seconds into the pipeline's per-batch load time for
            the diagnosis (0: loading runs in the loop).
        stall_threshold: the stall fraction under which input is not the bottleneck.
        flops_per_step: the FLOPs of one training step (:func:`count_flops`), for ``mfu``.
        peak_flops: the accelerator's peak FLOP/s, or ``"auto"`` to look a known CUDA device up
            (:mod:`mmfeed.loaders.observe.flops`).
        trace_steps: the latest N steps kept with their timestamps for :meth:`export_chrome_trace` (0: none).
        refill_steps: steps at the start of each epoch counted as its refill (default ``max(2, 2 * workers)``).
    """

    def __init__(self, *, log_every: int = 0, warmup: int = 0, num_workers: int | None = None,
                 stall_threshold: float = 0.05, flops_per_step: float | None = None,
                 peak_flops: float | str | None = None, trace_steps: int = 10_000,
                 refill_steps: int | None = None) -> None:
        for name, value in (("log_every", log_every), ("warmup", warmup), ("trace_steps", trace_steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if refill_steps is not None and (not isinstance(refill_steps, int) or refill_steps < 1):
            raise ValueError(f"refill_steps must be an int >= 1 or None, got {refill_steps!r}")
        if flops_per_step is not None and not float(flops_per_step) > 0:
            raise ValueError(f"flops_per_step must be > 0 (count_flops(step)), got {flops_per_step!r}")
        if peak_flops is not None and peak_flops != "auto" and not float(peak_flops) > 0:
            raise ValueError(f"peak_flops must be FLOP/s > 0 or 'auto', got {peak_flops!r}")
        self.log_every = log_every
        self.warmup = warmup
        self.num_workers = num_workers
        self.stall_threshold = stall_threshold
        self.flops_per_step = None if flops_per_step is None else float(flops_per_step)
        self.peak_flops = peak_flops
        self.trace_steps = trace_steps
        self.refill_steps = refill_steps
        self._comm: CommRecorder | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every recorded step (a watched model stays watched)."""
        self.wait_s: list[float] = []
        self.busy_s: list[float] = []
        self.copy_s: list[float] = []
        self.transform_s: list[float] = []  # the device transforms of each batch (DataLoader(device_transform=...))
        self.gpu_compute_s: list[float] = []
        self.stages: list[dict[str, float]] = []
        self.comm: list[Any] = []  # per step: (exposed_s, total_s), raw records (CUDA, resolved later) or None
        self.useful: list[float | None] = []
        self.trace: deque[dict[str, Any]] = deque(maxlen=self.trace_steps)
        self.epoch_starts: list[int] = []  # index of the first step of each epoch the loader began
        self._requested_at: float | None = None
        self._pending: dict[str, Any] | None = None
        self._unresolved: list[tuple[str, Any, Any]] = []  # (list name, start event, end event)
        if self._comm is not None:
            self._comm.drain()

    # -- set-up ---------------------------------------------------------------------------------------------
    def watch(self, model: Any, hook: Callable[[Any, Any], Any] | None = None, state: Any = None) -> Any:
        """Time ``model``'s gradient collectives (a ``DistributedDataParallel``): each step's busy time then
        splits into ``compute_s`` and ``comm_s`` (collective time not overlapped with backward).

        ``hook``/``state``: your own DDP comm hook and its state, timed and used instead of DDP's all-reduce
        (``state`` defaults to the default process group). Call it before the first backward, once per model
        (DDP takes one comm hook). Returns ``model``. On CUDA the collectives are timed with CUDA events (the hook
        call on the compute stream, the completion on the stream the future's callback runs on); ``compute_s``
        is then the wall-clock busy time less that device-side exposed time. FSDP is not covered (its comm hooks
        take other arguments).
        """
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"watch() times DistributedDataParallel's comm hooks; got {type(model).__name__} "
                            "(wrap the model in DistributedDataParallel first)")
        if self._comm is not None:
            raise RuntimeError("this StepTimer already watches a model")
        cuda = any(p.is_cuda for p in model.parameters())
        recorder = CommRecorder(hook, cuda=cuda)
        model.register_comm_hook(state, recorder.hook)
        self._comm = recorder
        return model

    # -- hooks for the loader -------------------------------------------------------------------------------
    def request(self) -> None:
        """The loop asks for the next batch: ends the busy time of the previous step."""
        now = time.perf_counter()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            end = None
            if pending["gpu_start"] is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
            self._finish(pending, now, end)
        self._requested_at = now
        self._resolve(block=False)

    def begin_epoch(self) -> None:
        """An epoch begins: its first batch is the next one delivered (the loader calls this at ``iter()``)."""
        self.epoch_starts.append(len(self.wait_s) + (self._pending is not None))

    def deliver(self, stages: Mapping[str, float] | None = None, copy_events: tuple[Any, Any] | None = None,
                cuda: bool = False, *, useful: float | None = None,
                spans: list[tuple[str, float, float]] | None = None, worker: int | None = None,
                transform: float | tuple[Any, Any] | None = None) -> None:
        """A batch is handed over: ends the wait. ``copy_events`` (start, end) time its device copy; ``useful``
        is its non-padding share; ``spans`` and ``worker`` (from its :class:`TimedBatch`) go to the trace;
        ``transform``: its device transform's seconds, or the (start, end) CUDA events around it."""
        now = time.perf_counter()
        wait = 0.0 if self._requested_at is None else now - self._requested_at
        gpu_start = None
        if cuda:
            gpu_start = torch.cuda.Event(enable_timing=True)
            gpu_start.record()
        self._pending = {"wait": wait, "stages": dict(stages or {}), "copy": copy_events, "gpu_start": gpu_start,
                         "requested_at": self._requested_at, "delivered_at": now, "useful": useful,
                         "spans": spans, "worker": worker, "transform": transform}
        self._requested_at = None

    def exhausted(self) -> None:
        """The source ran out: close the last step at the moment it asked for more."""
        self._requested_at = None

    def record(self, wait_s: float, compute_s: float, copy_s: float | None = None,
               stages: Mapping[str, float] | None = None, *, comm_s: float | None = None,
               comm_total_s: float | None = None, useful: float | None = None) -> None:
        """Add one finished step from known seconds (no clocks read); ``compute_s`` excludes ``comm_s``."""
        comm = None if comm_s is None else (float(comm_s), float(comm_s if comm_total_s is None else comm_total_s))
        self._append(float(wait_s), float(compute_s) + (comm[0] if comm else 0.0), stages or {}, comm, useful)
        if copy_s is not None:
            self.copy_s.append(float(copy_s))

    # -- internals ------------------------------------------------------------------------------------------
    def _finish(self, pending: dict[str, Any], now: float, gpu_end: Any) -> None:
        if pending["copy"] is not None:
            self._unresolved.append(("copy_s", *pending["copy"]))
        done = pending.get("transform")
        if isinstance(done, tuple):
            self._unresolved.append(("transform_s", *done))
        elif done is not None:
            self.transform_s.append(float(done))
        if gpu_end is not None:
            self._unresolved.append(("gpu_compute_s", pending["gpu_start"], gpu_end))
        comm: Any = None
        if self._comm is not None:
            records = self._comm.drain()
            comm = records if self._comm.cuda else resolve(records)
            if self.trace_steps and not self._comm.cuda:
                pending["comm"] = [tuple(r) for r in records]
        if self.trace_steps:
            self.trace.append({"requested": pending["requested_at"], "delivered": pending["delivered_at"],
                               "end": now, "worker": pending["worker"], "spans": pending["spans"] or [],
                               "comm": pending.get("comm", []), "step": len(self.wait_s)})
        self._append(pending["wait"], now - pending["delivered_at"], pending["stages"], comm, pending["useful"])

    def _append(self, wait: float, busy: float, stages: Mapping[str, float], comm: Any,
                useful: float | None) -> None:
        self.wait_s.append(wait)
        self.busy_s.append(busy)
        self.stages.append(dict(stages))
        self.comm.append(comm)
        self.useful.append(None if useful is None else float(useful))
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
        if block:
            self.comm = [resolve(c) if isinstance(c, list) else c for c in self.comm]

    def _line(self) -> str:
        n = self.log_every
        wait, busy = sum(self.wait_s[-n:]), sum(self.busy_s[-n:])
        stall = wait / (wait + busy) if wait + busy > 0 else 0.0
        comm = [c for c in self.comm[-n:] if isinstance(c, tuple)]
        tail = f" comm={sum(c[0] for c in comm) / n * 1e3:.2f}ms" if comm else ""
        return (f"steps={len(self.wait_s)} last{n}: wait={wait / n * 1e3:.2f}ms busy={busy / n * 1e3:.2f}ms"
                f"{tail} stall={stall:.1%}")

    def _steps_now(self) -> dict[str, list[Any]]:
        """Per-step lists including the step in hand, warm-up removed."""
        waits, busy, stages = list(self.wait_s), list(self.busy_s), list(self.stages)
        comm, useful = list(self.comm), list(self.useful)
        if self._pending is not None:  # the step in hand (the loop broke out, or reports mid-step) counts up to now
            waits.append(self._pending["wait"])
            busy.append(time.perf_counter() - self._pending["delivered_at"])
            stages.append(dict(self._pending["stages"]))
            comm.append(None if self._comm is None else resolve(self._comm.peek()))
            useful.append(self._pending["useful"])
        w = self.warmup
        return {"wait": waits[w:], "busy": busy[w:], "stages": stages[w:], "comm": comm[w:], "useful": useful[w:],
                "first": w}

    def _refill_share(self, waits: list[float], first: int) -> float | None:
        """Share of the wait in the first steps of epochs after the first (None: too few epochs or steps)."""
        starts = [s for s in self.epoch_starts[1:] if s >= first]
        k = self.refill_steps or max(2, 2 * int(self.num_workers or 1))
        total = float(sum(waits))
        inside = {i - first for s in starts for i in range(s, s + k) if i - first < len(waits)}
        if not starts or total <= 0 or len(inside) * 3 > len(waits):
            return None
        return float(sum(waits[i] for i in inside)) / total

    # -- report ---------------------------------------------------------------------------------------------
    def per_step(self) -> dict[str, list[float]]:
        """The steps after the warm-up, one value each: ``wait_s``, ``compute_s``, ``comm_s`` (0 when nothing is
        watched) and ``step_s`` (for plots of the phases step by step)."""
        self._resolve(block=True)
        steps = self._steps_now()
        comm = [c[0] if c is not None else 0.0 for c in steps["comm"]]
        return {"wait_s": steps["wait"], "compute_s": [max(b - c, 0.0) for b, c in zip(steps["busy"], comm)],
                "comm_s": comm, "step_s": [w + b for w, b in zip(steps["wait"], steps["busy"])]}

    def local_report(self) -> dict[str, Any]:
        """This process's report (no collective)."""
        self._resolve(block=True)
        steps = self._steps_now()
        waits, busy = steps["wait"], steps["busy"]
        comm = [c for c in steps["comm"] if c is not None]
        exposed = [c[0] if c is not None else 0.0 for c in steps["comm"]]
        computes = [max(b - e, 0.0) for b, e in zip(busy, exposed)]
        total_wait, total_busy = float(sum(waits)), float(sum(busy))
        total = total_wait + total_busy
        stall = total_wait / total if total > 0 else 0.0
        stages = steps["stages"]
        names = sorted({k for s in stages for k in s})
        n = max(len(stages), 1)
        stage_means = {k: sum(s.get(k, 0.0) for s in stages) / n for k in names}
        stage_total = sum(stage_means.values())
        w = self.warmup
        copy = _stats(self.copy_s[w:])
        transform = _stats(self.transform_s[w:])
        comm_s, comm_total = _stats([c[0] for c in comm]), _stats([c[1] for c in comm])
        mean_compute = float(np.mean(computes)) if computes else 0.0
        report = {
            "steps": len(waits),
            "warmup_steps": min(w, len(self.wait_s) + (self._pending is not None)),
            "wait_s": _stats(waits),
            "compute_s": _stats(computes),
            "comm_s": comm_s,
            "comm_total_s": comm_total,
            "step_s": _stats([a + b for a, b in zip(waits, busy)]),
            "copy_s": copy,
            "transform_s": transform,
            "gpu_compute_s": _stats(self.gpu_compute_s[w:]),
            "stall_fraction": stall,
            "phases": {"wait": total_wait / len(waits) if waits else 0.0,
                       "copy": None if copy is None else copy["mean"],
                       "transform": None if transform is None else transform["mean"], "compute": mean_compute,
                       "comm": None if comm_s is None else comm_s["mean"]},
            "stages": {k: {"mean_s": v, "share": v / stage_total if stage_total > 0 else 0.0}
                       for k, v in stage_means.items()},
            "num_workers": self.num_workers,
            "epoch_refill_share": self._refill_share(waits, steps["first"]),
        }
        report.update(self._utilisation(total, len(waits), steps["useful"]))
        report["bottleneck"] = diagnose(stall, mean_compute, None if copy is None else copy["mean"], stage_means,
                                        self.num_workers, self.stall_threshold,
                                        comm_s=None if comm_s is None else comm_s["mean"],
                                        refill_share=report["epoch_refill_share"], mfu=report["mfu"],
                                        transform_s=None if transform is None else transform["mean"])
        return report

    def _utilisation(self, total_s: float, steps: int, useful: list[float | None]) -> dict[str, Any]:
        known = [u for u in useful if u is not None]
        fraction = float(np.mean(known)) if known else None
        out: dict[str, Any] = {"useful_fraction": fraction, "achieved_flops_per_s": None, "mfu": None,
                               "useful_mfu": None}
        if self.flops_per_step is None or steps == 0 or total_s <= 0:
            return out
        achieved = self.flops_per_step * steps / total_s
        peak = peak_flops() if self.peak_flops == "auto" else self.peak_flops
        out["achieved_flops_per_s"] = achieved
        if peak is not None:
            out["mfu"] = achieved / float(peak)
            out["useful_mfu"] = None if fraction is None else out["mfu"] * fraction
        return out

    def report(self) -> dict[str, Any]:
        """The report as a dict; under torch.distributed every rank must call it (one all_gather).

        Keys: ``steps``; ``wait_s``, ``compute_s``, ``comm_s`` (exposed communication), ``comm_total_s``,
        ``step_s``, ``copy_s``, ``transform_s`` (the device transforms, ``DataLoader(device_transform=...)``),
        ``gpu_compute_s`` each ``{mean, median, p95, total}`` or None; ``phases`` the mean seconds per step of
        wait, copy, transform, compute and comm; ``stall_fraction`` = total wait / total step
        time; ``stages`` ``{name: {mean_s, share}}`` (worker seconds per batch); ``epoch_refill_share`` (the
        share of the wait in the first ``refill_steps`` of epochs after the first, or None);
        ``useful_fraction`` (non-padding share of the batches), ``achieved_flops_per_s``, ``mfu``,
        ``useful_mfu`` (None unless ``flops_per_step``/``peak_flops`` are set); ``bottleneck`` ``{stage,
        recommendation}``; and, when torch.distributed is initialized, ``ranks``: ``{world_size, max, mean}``
        over the ranks' scalar figures (the slowest rank sets the pace).
        """
        report = self.local_report()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            report["ranks"] = _reduce_ranks(report)
        return report

    def summary(self) -> str:
        """:meth:`report` in a few lines of text (:func:`format_report`): what ``print(loader.timer.summary())``
        shows. Under torch.distributed every rank must call it, as :meth:`report`."""
        return format_report(self.report())

    def to_json(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Write :meth:`report` to ``path`` as JSON and return it."""
        report = self.report()
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        return report

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Write the kept steps as a Chrome trace (Perfetto, chrome://tracing) to ``path`` and return it: the
        loop's phases on one track, each worker's stages on its own (:mod:`mmfeed.loaders.observe.trace`)."""
        from mmfeed.loaders.observe.trace import chrome_trace, write_trace

        return write_trace(chrome_trace(list(self.trace), epoch_starts=self.epoch_starts), path)


def format_report(report: Mapping[str, Any]) -> str:
    """A :meth:`StepTimer.report` in a few lines: the stall fraction over the steps, the mean seconds per step of
    each phase, the workers' stages per batch, MFU where known, and the bottleneck with what to do about it.

        >>> timer = StepTimer()
        >>> timer.record(wait_s=0.01, compute_s=0.09, stages={"decode": 0.2})
        >>> print(format_report(timer.report()))  # doctest: +ELLIPSIS
        stall 10.0% over 1 step(s) (warm-up 0 left out)
        per step: wait 10.00 ms, compute 90.00 ms
        worker stages per batch: decode 200.00 ms (100%)
        bottleneck: decode: stage 'decode' is the bottleneck (200.0 ms per batch): more workers, ...
    """
    lines = [f"stall {report['stall_fraction']:.1%} over {report['steps']} step(s) "
             f"(warm-up {report['warmup_steps']} left out)"]
    phases = [f"{name} {value * 1e3:.2f} ms" for name, value in report["phases"].items() if value is not None]
    lines.append("per step: " + ", ".join(phases))
    if report["stages"]:
        lines.append("worker stages per batch: " + ", ".join(
            f"{name} {v['mean_s'] * 1e3:.2f} ms ({v['share']:.0%})" for name, v in sorted(report["stages"].items())))
    if report.get("mfu") is not None:
        useful = report.get("useful_mfu")
        lines.append(f"MFU {report['mfu']:.1%}" + ("" if useful is None else f" (useful {useful:.1%})"))
    bottleneck = report["bottleneck"]
    lines.append(f"bottleneck: {bottleneck['stage']}: {bottleneck['recommendation']}")
    if report.get("ranks"):
        ranks = report["ranks"]
        lines.append(f"ranks: {ranks['world_size']}; slowest stall {ranks['max']['stall_fraction']:.1%}")
    return "\n".join(lines)


def _scalars(report: Mapping[str, Any]) -> dict[str, float]:
    out = {"steps": float(report["steps"]), "stall_fraction": float(report["stall_fraction"])}
    for key in ("wait_s", "compute_s", "comm_s", "comm_total_s", "step_s", "copy_s", "transform_s", "gpu_compute_s"):
        if report.get(key):
            for stat in ("mean", "median", "p95"):
                out[f"{key}.{stat}"] = float(report[key][stat])
    for key in ("mfu", "useful_mfu", "useful_fraction"):
        if report.get(key) is not None:
            out[key] = float(report[key])
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
