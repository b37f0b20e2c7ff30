"""Chrome trace export of a :class:`~mmfeed.loaders.StepTimer`: open the file in Perfetto or chrome://tracing.

One process, one track per actor:

* ``training loop``: per step, ``wait`` (the loop blocked on the loader) and ``step N`` (from the hand-over to
  the next request: compute and exposed communication), and inside it ``comm (exposed)``: the tail from the
  last gradient bucket's hook to the last collective's completion;
* ``comm``: each gradient bucket's collective, from its hook call to its completion (overlapped or not);
* ``worker W`` (one per torch worker process) and ``in-process loading``: the stages (read, decode, collate,
  ...) that built each batch, with the step that consumed it in ``args``.

Timestamps are ``time.perf_counter()`` (the host's monotonic clock, shared by the worker processes), in
microseconds from the first event; epoch starts are instant events.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LOOP_TID", "COMM_TID", "INLINE_TID", "WORKER_TID", "chrome_trace", "write_trace"]

LOOP_TID, COMM_TID, INLINE_TID, WORKER_TID = 0, 1, 2, 100  # worker w runs on WORKER_TID + w


def _complete(name: str, tid: int, start: float, end: float, origin: float, **args: Any) -> dict[str, Any]:
    event = {"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": (start - origin) * 1e6,
             "dur": max(end - start, 0.0) * 1e6}
    if args:
        event["args"] = args
    return event


def chrome_trace(steps: Sequence[Mapping[str, Any]], *, epoch_starts: Sequence[int] = ()) -> dict[str, Any]:
    """The Chrome trace (``{"traceEvents": [...]}``) of a timer's kept steps (``StepTimer.trace`` records)."""
    stamps = [s["requested"] if s["requested"] is not None else s["delivered"] for s in steps]
    stamps += [span[1] for s in steps for span in s["spans"]] + [c[0] for s in steps for c in s["comm"]]
    origin = min(stamps) if stamps else 0.0
    events: list[dict[str, Any]] = []
    tracks = {LOOP_TID: "training loop"}
    first_of = {int(s): e for e, s in enumerate(epoch_starts)}
    for s in steps:
        k = int(s["step"])
        if k in first_of:
            events.append({"name": f"epoch {first_of[k]}", "ph": "i", "s": "g", "pid": 0, "tid": LOOP_TID,
                           "ts": (s["delivered"] - origin) * 1e6})
        if s["requested"] is not None:
            events.append(_complete("wait", LOOP_TID, s["requested"], s["delivered"], origin, step=k))
        events.append(_complete(f"step {k}", LOOP_TID, s["delivered"], s["end"], origin, step=k))
        if s["comm"]:
            tracks[COMM_TID] = "comm"
            last_return = max(c[1] for c in s["comm"])
            last_done = max(c[2] for c in s["comm"] if c[2] is not None) if any(
                c[2] is not None for c in s["comm"]) else last_return
            for b, (called, _, done) in enumerate(s["comm"]):
                events.append(_complete(f"bucket {b}", COMM_TID, called, done if done is not None else called,
                                        origin, step=k))
            if last_done > last_return:
                events.append(_complete("comm (exposed)", LOOP_TID, last_return, min(last_done, s["end"]), origin,
                                        step=k))
        worker = s["worker"]
        tid = INLINE_TID if worker is None else WORKER_TID + int(worker)
        if s["spans"]:
            tracks[tid] = "in-process loading" if worker is None else f"worker {int(worker)}"
        for name, start, end in s["spans"]:
            events.append(_complete(name, tid, start, end, origin, step=k))
    meta = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "mmfeed"}}]
    meta += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}}
             for tid, name in sorted(tracks.items())]
    meta += [{"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}}
             for tid in sorted(tracks)]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms"}


def write_trace(trace: Mapping[str, Any], path: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``trace`` as JSON to ``path``; returns it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return dict(trace)
