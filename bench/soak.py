"""Benchmark: memory over many epochs with persistent workers (a soak run).

Fine-tuning runs go for hundreds of epochs over small datasets; whatever a persistent worker keeps per epoch adds
up. This runs ``--epochs`` epochs (default 100) of a small synthetic dataset through each of two loaders, each with
2 persistent worker processes:

- ``windows``: the windows view of a LeRobot v3 directory written as LeRobot writes it (AV1, a keyframe every 2
  frames), ``mmfeed.DataLoader(ds.windows(spec), batch_size=32, shuffle=True, num_workers=2,
  persistent_workers=True)``;
- ``packed``: the planned, packed loader over webdataset shards (H.264) of the same episodes,
  ``mmfeed.DataLoader(ds, packing=Packing(...), num_workers=2, persistent_workers=True)`` (epochs chained,
  buffers recycled).

After each epoch it records, per process (the training process and each worker): PSS (``/proc/PID/smaps_rollup``)
and its part in anonymous and shared memory ("own": heap, Python objects, decoders, batch buffers; the rest of PSS
is mostly shared libraries, whose share moves whenever another process on the machine maps them too), RSS, open
file descriptors and mapped shared-memory segments, and the entries of ``/dev/shm`` (the whole machine's). It
reports per process (and for all of them) the values after epoch 2 and after the last epoch, the growth in MB and
%, and the slope in KB per epoch (least squares over epochs 2..N). Epoch 1 is left out of the comparison: it is
where lazily built state (decoders, the recycled buffers, the plan) is made. Only numbers are kept per epoch, so
that the measuring process holds no more from one epoch to the next.

Diagnostics: ``--probe`` asks every worker after each epoch (through a ``worker_init_fn``, :class:`WorkerProbe`)
for its live objects by type (``gc.get_objects()``) and its C heap in use (glibc's ``mallinfo2``, which neither
``gc`` nor ``tracemalloc`` sees) and lists the types whose count changed from epoch 2 to the last; ``--trace``
adds the allocation sites that grew most (``tracemalloc`` in each worker; slow); ``--trim`` has each worker call
``malloc_trim(0)`` after each epoch and reports what that gave back (memory the allocator held free). Run with
``MALLOC_ARENA_MAX=2`` in the environment to see whether glibc's per-thread arenas matter.

Run ``python -m mmfeed.bench.soak [--epochs 100] [--quick] [--paths windows,packed] [--json FILE]`` (also ``mmfeed
bench soak``). The dataset is small (20 episodes of 30-60 steps, two cameras of 64x48: about 900 windows) so that
the epoch count is what is long: 100 epochs of each path take a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from mmfeed._parsing import positive
from mmfeed.bench.common import child_pids, environment, table

__all__ = ["PATHS", "SUSPECTS", "WorkerProbe", "ask_workers", "growth", "mallinfo", "main", "make_loader",
           "process_memory", "report", "run_path", "slope", "suspect_counts", "write_datasets"]

PATHS = ("windows", "packed")
"""The loaders soaked: the windows view of a LeRobot directory, the packed planned loader over shards."""
CAMERAS = ("cam_high", "cam_wrist")
BATCH_SIZE = 32
WORKERS = 2


# ----------------------------------------------------------------------------------------------- measurements


def rollup_kib(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup`` of process ``pid`` in KiB (``Pss``, ``Pss_Anon``, ``Pss_File``, ``Pss_Shmem``,
    ...); empty once it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if rest.strip().endswith("kB"):
                    out[key] = int(rest.split()[0])
    except OSError:
        return {}
    return out


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def shm_segments(pid: int) -> int | None:
    """Distinct shared-memory files process ``pid`` maps or holds open (deleted ones included)."""
    names = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if "/dev/shm/" in line:
                    names.add(line.split(None, 5)[-1].strip())
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/shm/"):
                names.add(target)
    except OSError:
        return None
    return len(names)


def process_memory(pid: int) -> dict[str, Any]:
    """``{pss_mb, own_mb, anon_mb, file_mb, shmem_mb, rss_mb, fds, shm}`` of one process now: its PSS, and the PSS
    of its anonymous memory (heap, Python objects, decoders), of the files it maps (libraries: shared with every
    process on the machine that maps them, so that share moves with whatever else runs) and of shared memory
    (the batches' buffers); ``own_mb`` is anonymous plus shared memory, the PSS no other program moves; RSS."""
    r = rollup_kib(pid)
    mb = lambda key: r[key] / 1024 if key in r else None  # noqa: E731
    own = None if "Pss_Anon" not in r else (r["Pss_Anon"] + r.get("Pss_Shmem", 0)) / 1024
    return {"pss_mb": mb("Pss"), "own_mb": own, "anon_mb": mb("Pss_Anon"), "file_mb": mb("Pss_File"),
            "shmem_mb": mb("Pss_Shmem"), "rss_mb": mb("Rss"), "fds": open_fds(pid), "shm": shm_segments(pid)}


def dev_shm_entries() -> int:
    try:
        return len(os.listdir("/dev/shm"))
    except OSError:
        return 0


def slope(ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over their positions (units of y per epoch); 0 for fewer than 2 points."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def growth(series: Sequence[float], first: int = 1) -> dict[str, float]:
    """``{start, end, mb, pct, slope_mb_per_epoch}`` of a per-epoch series from position ``first`` (epoch 2) on."""
    part = [float(v) for v in series[first:]]
    start, end = part[0], part[-1]
    return {"start": start, "end": end, "mb": end - start, "pct": 100 * (end - start) / start if start else 0.0,
            "slope_mb_per_epoch": slope(part)}


# ------------------------------------------------------------------------------------------- the worker probe

# what the probe counts besides every type's instances: the decoders, containers, buffers and plans of a worker
_PROBE_POLL_S = 0.02


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def mallinfo() -> dict[str, int] | None:
    """glibc's ``mallinfo2()`` of this process over all its arenas (bytes): ``arena`` (obtained from the system,
    mmapped chunks aside), ``hblkhd`` (mmapped chunks), ``uordblks`` (in use), ``fordblks`` (free, kept); None
    without glibc."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return None
    fn.restype = _Mallinfo2
    info = fn()
    return {name: int(getattr(info, name)) for name in ("arena", "hblkhd", "uordblks", "fordblks")}


def _type_counts() -> dict[str, int]:
    gc.collect()
    counts: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        t = type(obj)
        counts[f"{t.__module__}.{t.__qualname__}"] += 1
    return dict(counts)


class WorkerProbe:
    """A ``worker_init_fn`` that starts a thread in each worker answering requests the training process leaves in
    ``directory`` (:func:`ask_workers`): for ``ask-K`` the worker writes ``worker-<id>-K.json`` with its pid, its
    counts of live objects by type (``gc.get_objects()``, after a collection) and, with ``trace``, the
    ``tracemalloc`` statistics by line (tracing starts in the worker's init)."""

    def __init__(self, directory: str | os.PathLike, trace: bool = False, trim: bool = False) -> None:
        self.directory, self.trace, self.trim = str(directory), trace, trim

    def __call__(self, worker_id: int) -> None:
        if self.trace:
            import tracemalloc

            tracemalloc.start(4)
        threading.Thread(target=self._serve, args=(worker_id,), name="mmfeed-soak-probe", daemon=True).start()

    def _serve(self, worker_id: int) -> None:
        done = -1
        while True:
            asked = [int(n[4:]) for n in os.listdir(self.directory) if n.startswith("ask-")]
            if asked and max(asked) > done:
                done = max(asked)
                self._answer(worker_id, done)
            time.sleep(_PROBE_POLL_S)

    def _answer(self, worker_id: int, k: int) -> None:
        from mmfeed.loaders import heap

        out: dict[str, Any] = {"pid": os.getpid(), "types": _type_counts(), "malloc": mallinfo(),
                               "heap_trims": heap.trims}
        if self.trim:  # a diagnostic: what the allocator holds free, given back
            before = rollup_kib(os.getpid()).get("Pss_Anon", 0)
            heap.release_free_heap()
            out["trimmed_kib"] = before - rollup_kib(os.getpid()).get("Pss_Anon", 0)
        if self.trace:
            import tracemalloc

            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            out["traced_bytes"] = tracemalloc.get_traced_memory()[0]
            out["trace"] = [[_where(s.traceback), s.size, s.count] for s in snap.statistics("traceback")[:400]]
        target = Path(self.directory) / f"worker-{worker_id}-{k}.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, target)


def _where(traceback: Any) -> str:
    """``file:line <- caller:line <- ...`` of a tracemalloc traceback, innermost first."""
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(traceback))


def ask_workers(directory: str | os.PathLike, k: int, workers: int, timeout_s: float = 60.0) -> list[dict]:
    """Ask every :class:`WorkerProbe` in ``directory`` for its answer ``k``; their answers, by worker id."""
    directory = Path(directory)
    (directory / f"ask-{k}").touch()
    deadline = time.monotonic() + timeout_s
    answers = [directory / f"worker-{w}-{k}.json" for w in range(workers)]
    while not all(p.exists() for p in answers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{directory}: the workers did not answer probe {k} within {timeout_s:.0f} s")
        time.sleep(_PROBE_POLL_S)
    out = [json.loads(p.read_text()) for p in answers]
    for p in answers:
        p.unlink()
    return out


SUSPECTS = ("av.", "mmfeed.", "torch.", "numpy.", "numba.", "pyarrow.")
"""The object types whose counts :func:`suspect_counts` keeps per epoch: decoders and containers (PyAV), the
library's own objects (readers, caches, pools, plans, requests), tensors and arrays, compiled functions, tables."""


def suspect_counts(types: dict[str, int]) -> dict[str, int]:
    """The counts of the types of the :data:`SUSPECTS` modules, out of a probe's counts of every type."""
    return {name: n for name, n in types.items() if name.startswith(SUSPECTS)}


def changed_types(before: dict[str, int], after: dict[str, int], top: int = 15) -> list[tuple[str, int, int]]:
    """``(type, count before, count after)`` of the types whose count changed most, largest change first."""
    names = set(before) | set(after)
    rows = [(n, before.get(n, 0), after.get(n, 0)) for n in names if before.get(n, 0) != after.get(n, 0)]
    return sorted(rows, key=lambda r: -abs(r[2] - r[1]))[:top]


def trace_growth(before: list, after: list, top: int = 10) -> list[tuple[str, int]]:
    """``(traceback, bytes grown)`` of the allocation sites that grew most between two probe traces."""
    old = {tb: size for tb, size, _ in before}
    rows = [(tb, size - old.get(tb, 0)) for tb, size, _ in after]
    return sorted(rows, key=lambda r: -r[1])[:top]


# ------------------------------------------------------------------------------------------------ the dataset


def write_datasets(root: Path, episodes: int = 20, seed: int = 0) -> dict[str, Path]:
    """The soak's two small datasets under ``root``: a LeRobot v3 directory (AV1 as LeRobot writes by default)
    and webdataset shards (H.264) of the same ``episodes`` episodes, two cameras of 64x48, 30-60 steps each."""
    from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

    eps = make_episodes(episodes, seed=seed, cameras=CAMERAS, height=48, width=64, min_length=30, max_length=60,
                        state_dim=6, action_dim=6)
    lerobot = Path(write_lerobot(root / "lerobot", eps, codec="av1", gop=2))
    write_webdataset(root / "shards", eps, episodes_per_shard=4)
    return {"lerobot": lerobot, "shards": root / "shards"}


def _window(features: Iterable[str], fps: float = 30.0):
    from mmfeed.loaders import WindowSpec

    delta = {f"observation.images.{c}": [-1 / fps, 0.0] for c in CAMERAS}
    delta.update({"observation.state": [-1 / fps, 0.0], "action": [i / fps for i in range(10)]})
    return WindowSpec.from_delta_timestamps({k: v for k, v in delta.items() if k in set(features)})


def make_loader(path: str, data: dict[str, Path], worker_init_fn: Callable | None = None):
    """The loader of soak path ``path`` (see :data:`PATHS`) over the datasets of :func:`write_datasets`."""
    import torch

    from mmfeed import DataLoader
    from mmfeed.loaders import Packing, PlanConfig, TokenLayout, open_dataset

    if path == "windows":
        source = open_dataset(data["lerobot"])
        return DataLoader(source.windows(_window(source.features)), batch_size=BATCH_SIZE, shuffle=True,
                          num_workers=WORKERS, persistent_workers=True, worker_init_fn=worker_init_fn,
                          generator=torch.Generator().manual_seed(0))
    if path == "packed":
        source = open_dataset(data["shards"])
        layout = TokenLayout(tokens_per_frame={f"observation.images.{c}": 16 for c in CAMERAS})
        packing = Packing(layout=layout, window=_window(source.features), seed=0,
                          plan=PlanConfig(capacity=1024, rows_per_batch=2))
        return DataLoader(source, packing=packing, num_workers=WORKERS, persistent_workers=True,
                          worker_init_fn=worker_init_fn)
    raise ValueError(f"unknown soak path {path!r}; choose from {list(PATHS)}")


# ------------------------------------------------------------------------------------------------------- runs


def _worker_pids(loader) -> list[int]:
    """The loader's worker processes, by worker id (the children of this process when torch hides them)."""
    it = getattr(getattr(loader, "_loader", None), "_iterator", None)
    workers = getattr(it, "_workers", None)
    if workers:
        return [w.pid for w in workers]
    return sorted(child_pids())


def run_path(path: str, data: dict[str, Path], epochs: int, *, probe: bool = False, trace: bool = False,
             trim: bool = False, baseline_epoch: int = 2,
             on_epoch: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """``epochs`` epochs of soak path ``path``: per epoch, the memory of the training process and of each worker
    (:func:`process_memory`), ``/dev/shm`` entries, batches and seconds; with ``probe`` also the C heap in use
    (``mallinfo``) of every process; then the growth of each process from ``baseline_epoch`` to the last and,
    with ``probe``, the object types whose counts changed between the two and the counts of :data:`SUSPECTS`
    in both.
    Only numbers are kept per epoch (and the full type counts of epoch 2 and of the latest), so that the
    measurement itself holds no more memory from epoch to epoch."""
    from mmfeed.loaders.shm import received_buffers

    probe_dir = tempfile.mkdtemp(prefix="mmfeed-soak-probe-") if probe or trace or trim else None
    loader = make_loader(path, data, WorkerProbe(probe_dir, trace, trim) if probe_dir else None)
    first = min(baseline_epoch, epochs) - 1  # the baseline epoch's position
    records: list[dict] = []
    baseline: dict[str, Any] = {}
    latest: dict[str, Any] = {}
    pids: list[int] = []
    try:
        for epoch in range(1, epochs + 1):
            start, batches = time.perf_counter(), 0
            for _ in loader:
                batches += 1
            seconds = time.perf_counter() - start
            gc.collect()
            if not pids:
                pids = _worker_pids(loader)
            record = {"epoch": epoch, "batches": batches, "seconds": seconds, "dev_shm": dev_shm_entries(),
                      "processes": {"main": process_memory(os.getpid()),
                                    **{f"worker {w}": process_memory(pid) for w, pid in enumerate(pids)}}}
            if probe_dir is not None:
                latest = {"main": {"types": _type_counts(), "pooled": received_buffers()}}
                record["processes"]["main"]["malloc"] = mallinfo()
                for w, answer in enumerate(ask_workers(probe_dir, epoch, len(pids))):
                    latest[f"worker {w}"] = answer
                    record["processes"][f"worker {w}"].update(
                        malloc=answer["malloc"], trimmed_kib=answer.get("trimmed_kib"),
                        traced_bytes=answer.get("traced_bytes"), heap_trims=answer["heap_trims"])
                if len(records) == first:
                    baseline = latest
            records.append(record)
            if on_epoch is not None:
                on_epoch(record)
    finally:
        del loader
        gc.collect()
        if probe_dir is not None:
            shutil.rmtree(probe_dir, ignore_errors=True)
    result: dict[str, Any] = {"path": path, "epochs": records, "worker_pids": pids, "baseline_epoch": first + 1}
    keys = ("pss_mb", "own_mb", "rss_mb", "fds", "shm")
    result["summary"] = {name: {key: growth([r["processes"][name][key] or 0 for r in records], first)
                                for key in keys}
                         for name in records[0]["processes"]}
    result["dev_shm"] = growth([r["dev_shm"] for r in records], first)
    if baseline and len(records) > first:
        result["types_changed"] = {name: changed_types(baseline[name]["types"], latest[name]["types"])
                                   for name in baseline}
        result["suspects"] = {name: {"baseline": suspect_counts(baseline[name]["types"]),
                                     "last": suspect_counts(latest[name]["types"])} for name in baseline}
        # the pooled buffers the training process maps (each a storage), which grow where a worker met a stall
        # with every buffer it kept in use, up to its pool's bound
        result["pooled"] = {"baseline": baseline["main"]["pooled"], "last": latest["main"]["pooled"]}
        if trace:
            result["trace_growth"] = {name: trace_growth(baseline[name]["trace"], latest[name]["trace"])
                                      for name in baseline if "trace" in baseline[name]}
    return result


def rows_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows of one path: per process (and their total) PSS at the baseline epoch and at the last one and
    its growth; the same of the process's own PSS (anonymous and shared memory) with the least-squares slope;
    the growth of RSS; open fds and shared-memory segments."""
    rows = []
    summary = dict(result["summary"])
    records = result["epochs"]
    first = result["baseline_epoch"] - 1
    total = {key: growth([sum(r["processes"][n][key] or 0 for n in summary) for r in records], first)
             for key in ("pss_mb", "own_mb", "rss_mb", "fds", "shm")}
    for name, s in [*summary.items(), ("total", total)]:
        p, o = s["pss_mb"], s["own_mb"]
        rows.append({"path": result["path"], "process": name, "start": f"{p['start']:.1f}", "end": f"{p['end']:.1f}",
                     "pct": f"{p['pct']:+.2f}", "own_start": f"{o['start']:.1f}", "own_end": f"{o['end']:.1f}",
                     "own_mb": f"{o['mb']:+.2f}", "own_pct": f"{o['pct']:+.2f}",
                     "slope": f"{o['slope_mb_per_epoch'] * 1024:+.1f}", "rss_pct": f"{s['rss_mb']['pct']:+.2f}",
                     "fds": f"{s['fds']['start']:.0f} -> {s['fds']['end']:.0f}",
                     "shm": f"{s['shm']['start']:.0f} -> {s['shm']['end']:.0f}"})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line of ``mmfeed bench soak``."""
    parser = argparse.ArgumentParser(prog="mmfeed bench soak", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=positive(int, 3), default=100,
                        help="epochs of each path (default 100; epoch 2 is the baseline)")
    parser.add_argument("--quick", action="store_true", help="6 epochs of 10 episodes (a smoke test)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated loaders to soak, of {', '.join(PATHS)} (default both)")
    parser.add_argument("--episodes", type=positive(int, 1), default=20,
                        help="episodes of the synthetic dataset (default 20)")
    parser.add_argument("--probe", action="store_true", help="also count every process's live objects by type "
                        "and its C heap in use after each epoch; the types whose count changed are listed")
    parser.add_argument("--trace", action="store_true", help="also trace the workers' allocations (tracemalloc; "
                        "slow) and list the allocation sites that grew most")
    parser.add_argument("--trim", action="store_true", help="a diagnostic: each worker calls malloc_trim(0) after "
                        "each epoch and reports what it gave back (memory its allocator held free)")
    parser.add_argument("--json", metavar="FILE", help="write {results, settings, environment} to FILE")
    parser.add_argument("--progress", action="store_true", help="one line on stderr per epoch")
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in PATHS for p in paths):
        raise ValueError(f"--paths {args.paths}: give one or more of {', '.join(PATHS)}, comma-separated")
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        raise ValueError(f"--json {args.json}: directory {Path(args.json).resolve().parent} does not exist")
    epochs, episodes = (6, 10) if args.quick else (args.epochs, args.episodes)
    root = Path(tempfile.mkdtemp(prefix="mmfeed-soak-"))
    try:
        data = write_datasets(root, episodes)
        results = []
        for path in paths:
            def progress(r: dict, path: str = path) -> None:
                pss = "  ".join(f"{n} {p['pss_mb']:.1f} (own {p['own_mb']:.1f})" for n, p in r["processes"].items())
                print(f"{path} epoch {r['epoch']}: {r['batches']} batches {r['seconds']:.1f} s  PSS MB {pss}",
                      file=sys.stderr, flush=True)

            results.append(run_path(path, data, epochs, probe=args.probe or args.trace, trace=args.trace,
                                    trim=args.trim, on_epoch=progress if args.progress else None))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(report(results, epochs, episodes))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "settings": {**vars(args), "epochs": epochs, "episodes": episodes},
                       "environment": environment()}, f, indent=2)
    return 0


def report(results: list[dict[str, Any]], epochs: int, episodes: int) -> str:
    """The soak's table and notes, as printed."""
    rows = [row for res in results for row in rows_of(res)]
    lines = [f"PSS after epoch 2 and after epoch {epochs}: {WORKERS} persistent workers, {episodes} episodes, "
             f"batches of {BATCH_SIZE} windows (windows) / 2 packed rows (packed)",
             table(rows, [("path", "path"), ("process", "process"), ("start", "PSS e2 MB"),
                          ("end", f"PSS e{epochs} MB"), ("pct", "PSS %"), ("own_start", "own e2 MB"),
                          ("own_end", f"own e{epochs} MB"), ("own_mb", "own MB"), ("own_pct", "own %"),
                          ("slope", "own KB/epoch"), ("rss_pct", "RSS %"), ("fds", "open fds"),
                          ("shm", "shm segments")]),
             "PSS: /proc/PID/smaps_rollup; %: growth from epoch 2; own: the PSS of anonymous and shared memory "
             "(heap, objects, decoders, batch buffers), which no other program moves (the rest of PSS is mostly "
             "shared libraries, whose share moves as other processes on the machine map them too); KB/epoch: "
             "least-squares slope over epochs 2..N."]
    for res in results:
        d = res["dev_shm"]
        lines.append(f"{res['path']}: /dev/shm entries {d['start']:.0f} -> {d['end']:.0f} (the machine's), "
                     f"{sum(r['seconds'] for r in res['epochs']):.0f} s for {epochs} epochs of "
                     f"{res['epochs'][-1]['batches']} batches")
        trimmed = [p["trimmed_kib"] for r in res["epochs"] for n, p in r["processes"].items()
                   if p.get("trimmed_kib") is not None]
        if trimmed:
            lines.append(f"  malloc_trim(0) after each epoch gave back {statistics.median(trimmed):.0f} KiB per worker "
                         f"(median; {min(trimmed)}-{max(trimmed)})")
        for name, changed in res.get("types_changed", {}).items():
            if changed:
                lines.append(f"  {name} objects by type, epoch 2 -> {epochs}: "
                             + ", ".join(f"{n} {a} -> {b}" for n, a, b in changed))
        for name, grown in res.get("trace_growth", {}).items():
            lines.append(f"  {name} allocations grown most, epoch 2 -> {epochs}:")
            lines += [f"    {size / 1024:+.1f} KiB  {tb}" for tb, size in grown]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
