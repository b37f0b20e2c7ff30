"""Shared pieces of the benchmarks: the environment record, medians and spreads of repeats, a cache folder, tables,
back-to-back output views of one buffer, the CPU seconds of child processes, the robot window that ``mmfeed
bench`` and ``mmfeed inspect`` read, and what receiving a batch costs a bare torch loader's training process."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["batch_tensors", "cache_dir", "child_pids", "consecutive_views", "cpu_seconds", "environment",
           "median_time", "receive_floor", "spread", "table"]


def cache_dir(name: str) -> Path:
    """``$MMFEED_CACHE`` (default ``~/.cache/mmfeed``) / ``name``, created."""
    root = Path(os.environ.get("MMFEED_CACHE", Path.home() / ".cache" / "mmfeed"))
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def consecutive_views(buffer: np.ndarray, lengths: Sequence[int]) -> list[np.ndarray]:
    """Back-to-back views along ``buffer``'s first axis, one of each length: the outputs of one batch's requests
    in one buffer allocated (and touched) once, so that timed decoding pays no page faults for its outputs."""
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    return [buffer[end - n : end] for n, end in zip(lengths, ends)]


def environment() -> dict[str, Any]:
    """Versions, CPU count and git revision: what a figure was measured on."""
    import numpy
    import torch

    import mmfeed

    versions = {"python": platform.python_version(), "mmfeed": mmfeed.__version__, "torch": torch.__version__,
                "numpy": numpy.__version__}
    for name in ("numba", "av", "decord", "pyarrow", "webdataset"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # optional backends may be missing or broken; record that, do not fail the benchmark
            versions[name] = None
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        rev = None
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"versions": versions, "cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "machine": platform.machine(), "git_revision": rev,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> tuple[float, object]:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs, and the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """An aligned text table of ``rows`` with ``(key, heading)`` columns; floats shown with 4 significant digits."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    body = [[cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """``{min, max, range}`` of the repeats of one figure, ``range`` = (max - min) / median (None at median 0).

    >>> spread([9.0, 10.0, 12.0])["range"]
    0.3
    """
    values = [float(v) for v in values]
    mid = statistics.median(values)
    lo, hi = min(values), max(values)
    return {"min": lo, "max": hi, "range": (hi - lo) / abs(mid) if mid else None}


def forever(loader: Iterable[Any]) -> Iterator[Any]:
    """The batches of ``loader``'s successive epochs, without end."""
    while True:
        yield from loader


def bracket(before: dict[str, Any], after: dict[str, Any], rates: Sequence[str],
            summed: Sequence[str] = ()) -> dict[str, Any]:
    """One round's baseline from its runs right before and right after the side it is compared with: each of
    ``rates`` the mean of the two (a linear drift of the machine's speed over the round cancels), each of
    ``summed`` their sum, the rest as measured after; both runs kept under ``"bracket"``.

    >>> bracket({"rate": 10.0, "n": 2}, {"rate": 14.0, "n": 3}, ["rate"], ["n"])["rate"]
    12.0
    """
    return {**after, **{k: (before[k] + after[k]) / 2 for k in rates}, **{k: before[k] + after[k] for k in summed},
            "bracket": [before, after]}


def child_pids() -> set[int]:
    """The ids of this process's child processes (Linux ``/proc``; an empty set where it cannot tell)."""
    pid, out = os.getpid(), set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
    except OSError:
        return set()
    return out


def cpu_seconds(pids: Sequence[int] | set[int]) -> float:
    """User + system CPU seconds the processes ``pids`` used so far, to the nanosecond: each process's CPU-time
    clock (the clock id Linux's ``clock_getcpuclockid(pid)`` gives), or ``/proc`` in ticks (10 ms) where that clock
    cannot be read; a process that is gone counts 0."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            total += time.clock_gettime_ns((~pid << 3) | 2) / 1e9  # CPUCLOCK_SCHED of the whole process
            continue
        except (OSError, AttributeError, OverflowError):
            pass
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def batch_tensors(batch: Any) -> list[tuple[tuple[int, ...], Any]]:
    """``(shape, dtype)`` of every tensor a batch carries to the training process: a dict's, list's or tuple's
    values, and an object's attributes (a packed batch: its payloads, attention and metadata), nested."""
    import torch

    out: list[tuple[tuple[int, ...], Any]] = []

    def walk(item: Any, depth: int) -> None:
        if isinstance(item, torch.Tensor):
            out.append((tuple(item.shape), item.dtype))
        elif depth > 4 or isinstance(item, (str, bytes, int, float, bool, type(None))):
            return
        elif isinstance(item, dict):
            for value in item.values():
                walk(value, depth + 1)
        elif isinstance(item, (list, tuple)):
            for value in item:
                walk(value, depth + 1)
        elif hasattr(item, "__dict__") or hasattr(item, "__slots__"):
            names = list(getattr(item, "__dict__", {})) or list(getattr(item, "__slots__", ()))
            for name in names:
                walk(getattr(item, name, None), depth + 1)

    walk(batch, 0)
    return out


class _SameTensors:
    """A map-style dataset whose every item is a batch of fresh tensors of the given shapes and dtypes, made in
    the worker: what a bare torch loader hands its training process for a batch of that size."""

    def __init__(self, tensors: Sequence[tuple[tuple[int, ...], Any]], length: int) -> None:
        self.tensors, self.length = list(tensors), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> list:
        import torch

        return [torch.empty(shape, dtype=dtype) for shape, dtype in self.tensors]


def receive_floor(tensors: Sequence[tuple[tuple[int, ...], Any]], *, workers: int = 2, steps: int = 100,
                  warmup: int = 5) -> dict[str, float]:
    """The training process's CPU per batch in a bare ``torch.utils.data.DataLoader`` whose ``workers`` worker
    processes send batches of ``tensors`` (``(shape, dtype)`` each; :func:`batch_tensors` of a real batch): the
    floor of receiving a batch of those tensors, nothing built or checked. ``steps`` batches timed after
    ``warmup``; CPU of this process (user + system) and wall time per batch."""
    import torch

    loader = torch.utils.data.DataLoader(_SameTensors(tensors, 1 << 30), batch_size=None, num_workers=workers,
                                         persistent_workers=workers > 0)
    batches = iter(loader)
    for _ in range(warmup):
        next(batches)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        next(batches)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    del batches, loader
    return {"main_cpu_ms_per_batch": 1e3 * cpu / steps, "wall_ms_per_batch": 1e3 * wall / steps,
            "tensors": len(tensors), "bytes": sum(int(np.prod(s)) * d.itemsize for s, d in tensors)}
