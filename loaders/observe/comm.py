"""Exposed communication: the part of a step that waited on DistributedDataParallel's gradient collectives.

DDP overlaps the all-reduce of each gradient bucket with the rest of the backward pass. What the step pays for is
the communication that is *not* overlapped: the time the backward pass spent inside comm hooks (a hook runs on
the autograd thread, so compute cannot go on meanwhile) plus the tail after the last bucket's hook returned, during
which all gradients are computed and DDP only waits for the collectives to finish before the optimizer may step.

:class:`CommRecorder` wraps a comm hook (default: DDP's own all-reduce-and-average) and records, per bucket, when
the hook was called, when it returned and when its future completed. :func:`exposed` turns the records of one
step into ``(exposed_s, total_s)``: the exposed time as above, and the length of the union of the buckets'
[call, done] intervals (all communication, overlapped or not). With CUDA tensors (NCCL) the times come from CUDA
events, resolved when the report asks: the ``ready`` event on the compute stream at the hook call, the ``done``
event on the stream the future's callback runs on (which waits for the collective's kernels).

    >>> [round(t, 6) for t in exposed([(0.0, 0.001, 0.004), (0.002, 0.003, 0.010)])]  # done at 10 ms
    [0.009, 0.01]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["CommRecorder", "exposed", "resolve"]


def exposed(records: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """``(exposed_s, total_s)`` of one step's bucket records ``(called, returned, done)`` in seconds.

    exposed = the hooks' own time (``returned - called``, spent on the autograd thread) + the tail from the last
    hook's return to the last completion; total = the union of the ``[called, done]`` intervals.
    """
    if not records:
        return 0.0, 0.0
    inside = sum(max(r - c, 0.0) for c, r, _ in records)
    last_return = max(r for _, r, _ in records)
    last_done = max(d for _, _, d in records)
    total, reach = 0.0, -float("inf")
    for c, _, d in sorted(records):
        if d <= reach:
            continue
        total += d - max(c, reach)
        reach = d
    return inside + max(last_done - last_return, 0.0), total


class CommRecorder:
    """Times each bucket of a DDP comm hook (register :meth:`hook`); :meth:`drain` hands over one step's records.

    ``hook(state, bucket) -> Future[Tensor]`` is the hook to time (None: all-reduce and average over the
    process group ``state``, which is what DDP does without a hook). ``cuda=True`` records CUDA events instead of
    wall clocks.
    """

    def __init__(self, hook: Callable[[Any, Any], Any] | None = None, *, cuda: bool = False) -> None:
        if hook is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            hook = allreduce_hook
        if not callable(hook):
            raise TypeError(f"hook must be a DDP comm hook (state, bucket) -> Future, got {hook!r}")
        self.inner = hook
        self.cuda = bool(cuda)
        self._lock = threading.Lock()
        self._records: list[list[Any]] = []  # [called, returned, done] (floats, or CUDA events)

    def hook(self, state, bucket):  # unannotated: DDP checks a hook's annotations against its own types
        """The comm hook to register with DDP: the inner hook, its call and completion timed."""
        record: list[Any] = [self._now(), None, None]
        with self._lock:
            self._records.append(record)
        fut = self.inner(state, bucket)
        record[1] = self._now()

        def done(f: torch.futures.Future) -> Any:
            record[2] = self._now()
            return f.value()

        return fut.then(done)

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def peek(self) -> list[list[Any]]:
        """The records since the last drain, left in place."""
        with self._lock:
            return list(self._records)

    def drain(self) -> list[list[Any]]:
        """The records since the last drain (a step's buckets); a record's ``done`` is None while in flight."""
        with self._lock:
            out, self._records = self._records, []
        return out


def resolve(records: Sequence[Sequence[Any]]) -> tuple[float, float]:
    """``(exposed_s, total_s)`` of drained records, wall-clock floats or CUDA events (synchronised here).

    A record whose collective has not completed counts up to now (wall clock) or to its returned event.
    """
    if not records:
        return 0.0, 0.0
    if isinstance(records[0][0], float):
        now = time.perf_counter()
        return exposed([(c, r if r is not None else now, d if d is not None else now) for c, r, d in records])
    origin = records[0][0]
    times = []
    for c, r, d in records:
        events = (c, r, d if d is not None else r)
        for e in events:
            e.synchronize()
        times.append(tuple(origin.elapsed_time(e) / 1e3 for e in events))
    return exposed(times)
