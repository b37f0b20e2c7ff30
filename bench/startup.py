"""Benchmark: what starting worker processes costs, ``iter(loader)`` + the first batch, mmfeed vs torch.

Each ``iter()`` of a loader without persistent workers forks its workers anew, so the time to the first batch is
paid every epoch (and by every evaluation loop). Both loaders read the same small map-style dataset with the same
``--workers`` worker processes (fork, the Linux default), batch size and shuffle; the two are timed in turn, the
order alternating from repeat to repeat, after one warm-up each. Timed: ``next(iter(loader))``; the workers' shutdown
afterwards is not.

Twice: in a bare process, and with a large Python heap present (``--heap-objects`` small lists kept alive, about
what a training process holds once a model library, its modules and their tensors are loaded): whatever the
loader does over the whole heap before it forks (a garbage collection, say) shows there. Each figure is the median
of ``--repeats`` with its spread; the ratio is mmfeed / torch of the medians.

Run ``python -m mmfeed.bench.startup [--repeats 9] [--heap-objects 2000000] [--json FILE]`` (also ``mmfeed bench
startup``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

from mmfeed.bench.common import environment, spread, table
from mmfeed.loaders import DataLoader

__all__ = ["SmallDataset", "first_batch_seconds", "main", "measure"]


class SmallDataset(Dataset):
    """Sample i: a float32 tensor of ``width`` values i; loading costs next to nothing, so starting is all."""

    def __init__(self, n: int = 4096, width: int = 64) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.width,), float(i))


def first_batch_seconds(make: Callable[[], Any]) -> float:
    """Wall seconds of ``next(iter(loader))`` for a loader ``make()`` builds (built and shut down untimed)."""
    loader = make()
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - start
    del it, loader  # the workers go here, outside the timing
    return elapsed


def measure(workers: int = 2, repeats: int = 9, batch_size: int = 32, heap: list | None = None) -> dict[str, Any]:
    """Interleaved first-batch times of torch's and mmfeed's loader: ``{loader: [seconds per repeat]}`` plus the
    medians, spreads and the mmfeed / torch ratio. ``heap`` is only held, so that it is alive while they run."""
    dataset = SmallDataset()
    makers = {
        "torch": lambda: TorchDataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers),
        "mmfeed": lambda: DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers),
    }
    for make in makers.values():  # warm-up: imports, the first fork's page-table copy
        first_batch_seconds(make)
    times: dict[str, list[float]] = {name: [] for name in makers}
    for r in range(repeats):
        order = list(makers) if r % 2 == 0 else list(reversed(makers))
        for name in order:
            times[name].append(first_batch_seconds(makers[name]))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    return {"times": times, "median_s": medians, "spread": {n: spread(ts) for n, ts in times.items()},
            "ratio": medians["mmfeed"] / medians["torch"], "heap_objects": len(heap) if heap is not None else 0}


def _rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for res in results:
        for name in ("torch", "mmfeed"):
            s = res["spread"][name]
            rows.append({"heap": res["heap_objects"], "loader": name, "median_ms": res["median_s"][name] * 1e3,
                         "min_ms": s["min"] * 1e3, "max_ms": s["max"] * 1e3,
                         "ratio": res["ratio"] if name == "mmfeed" else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command line of ``mmfeed bench startup``."""
    parser = argparse.ArgumentParser(prog="mmfeed bench startup", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats per loader and heap (median), default 9")
    parser.add_argument("--heap-objects", type=int, default=2_000_000,
                        help="small lists kept alive for the large-heap run (default 2e6; 0 skips that run)")
    parser.add_argument("--json", metavar="FILE", help="write {rows, results, settings, environment} to FILE")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.repeats < 1 or args.heap_objects < 0:
        parser.error("--workers and --repeats must be >= 1, --heap-objects >= 0")
    results = [measure(args.workers, args.repeats)]
    if args.heap_objects:
        heap = [[i] for i in range(args.heap_objects)]  # lists: every one tracked by the garbage collector
        results.append(measure(args.workers, args.repeats, heap=heap))
        del heap
    rows = _rows(results)
    print(f"iter(loader) + first batch, {args.workers} worker processes, median of {args.repeats} interleaved repeats")
    print(table(rows, [("heap", "heap objects"), ("loader", "loader"), ("median_ms", "median ms"),
                       ("min_ms", "min ms"), ("max_ms", "max ms"), ("ratio", "mmfeed / torch")]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "results": results, "settings": vars(args), "environment": environment()}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
