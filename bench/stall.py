"""Benchmark: input stall of a training loop at 80% of the pipeline's capacity, mmfeed vs torch's DataLoader.

A dataset with a known per-sample cost (``--cost sleep``, the default: a sleep inside the worker, which simulates
I/O or decode without the workers and the simulated step fighting for the 2 CPU cores of a small machine;
``--cost cpu``: a busy loop) feeds batches of uint8 "frames". In one run it measures:

1. **capacity**: batches/s of mmfeed's DataLoader (2 workers, prefetch thread) iterated with no step;
2. a simulated training step of 1.25x the per-batch load time (the loop asks for 80% of the capacity), run
   with mmfeed's DataLoader + prefetcher (``device`` = cuda if available, else cpu; ``prefetch=2``) and with
   torch's DataLoader, same dataset, same 2 workers, same ``prefetch_factor=2`` (torch's default: each worker
   already keeps 2 batches in flight), iterated plainly. Both stall fractions (total wait / total step time, after
   a warm-up) come from :class:`~mmfeed.loaders.StepTimer`; the figure is the median over repeats.

What differs between the two: only mmfeed's main-process prefetch thread, which receives and unpickles each batch
from the worker queue (and on CUDA pins and copies it on a side stream) ``prefetch`` batches ahead, so that the
loop finds it ready. Target: stall <= 2% for mmfeed. Run ``python -m mmfeed.bench.stall [--quick] [--json FILE]``.

``--epochs N`` measures the epoch boundary instead: a planned dataset (``PlannedDataset.records``) of the same
per-sample cost, ``--batch-size`` samples a batch and ``--epoch-steps`` batches an epoch, ``--workers`` persistent
workers, a step of 1.25x the nominal per-batch load time (sample cost x batch size / workers), N epochs per run,
and the stall (wait / step time) over the first ``--window`` steps of epochs 2..N, with the loader's epochs
chained (the next epoch's first batches load while the loop finishes this one) and drained (``chain_epochs =
False``: torch's behaviour, the workers idle from the epoch's end until the next ``iter(loader)``), in
interleaved runs; each figure is the median over repeats, printed with every run's. Run ``python -m
mmfeed.bench.stall --epochs 5 [--repeats 3] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

from mmfeed.loaders import DataLoader, PlanConfig, PlannedDataset, StepTimer
from mmfeed.loaders.clock import stage

log = logging.getLogger(__name__)

TARGET_STALL = 0.02
LOAD_FRACTION = 0.8  # the step asks for 80% of the pipeline's capacity


class CostlyDataset(Dataset):
    """Sample i: a uint8 [3, side, side] tensor filled with i % 256, after ``cost_s`` of sleep or CPU work."""

    def __init__(self, n: int, cost_s: float, kind: str = "sleep", side: int = 96) -> None:
        if kind not in ("sleep", "cpu"):
            raise ValueError(f"kind must be 'sleep' or 'cpu', got {kind!r}")
        self.n, self.cost_s, self.kind, self.side = n, cost_s, kind, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with stage("decode"):
            if self.kind == "sleep":
                time.sleep(self.cost_s)
            else:
                end = time.perf_counter() + self.cost_s
                while time.perf_counter() < end:
                    pass
            return torch.full((3, self.side, self.side), i % 256, dtype=torch.uint8)


class CostlyRecords(CostlyDataset):
    """Sample i of :class:`CostlyDataset` as a record of ``tokens`` tokens (ids and frames) for a planned dataset:
    ``PlannedDataset.records(CostlyRecords(...), [tokens] * n, plan=PlanConfig(capacity=tokens * batch_size))``
    makes batches of ``batch_size`` samples."""

    def __init__(self, n: int, cost_s: float, kind: str = "sleep", side: int = 96, tokens: int = 4) -> None:
        super().__init__(n, cost_s, kind, side)
        self.tokens = tokens

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        frames = super().__getitem__(i)
        return {"text": torch.full((self.tokens,), i, dtype=torch.int64), "frames": frames.expand(self.tokens, -1, -1,
                                                                                                   -1).clone()}


def _consume(batch: Any) -> None:
    """Touch the batch like a step would (its first element), so nothing is left lazily unread."""
    _ = batch[0, 0, 0, 0].item()


def capacity(ds: Dataset, batch_size: int, workers: int, device: str, batches: int) -> float:
    """Batches/s of mmfeed's loader with no step, after a warm-up of one batch per worker."""
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, device=device, prefetch=2)
    it = iter(loader)
    for _ in range(workers):
        _consume(next(it))
    start = time.perf_counter()
    for _ in range(batches):
        _consume(next(it))
    rate = batches / (time.perf_counter() - start)
    it.close()
    return rate


_CYCLES_PER_S: list[float] = []  # GPU spin rate, measured once per process by _gpu_cycles_per_s


def _gpu_cycles_per_s() -> float:
    if not _CYCLES_PER_S:
        torch.cuda._sleep(1_000_000)  # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        torch.cuda._sleep(50_000_000)
        torch.cuda.synchronize()
        _CYCLES_PER_S.append(50_000_000 / (time.perf_counter() - start))
    return _CYCLES_PER_S[0]


def _step(step_s: float, cuda: bool) -> None:
    if cuda:  # a GPU step: host issues work and waits for it, as a synchronizing training step would
        torch.cuda._sleep(int(step_s * _gpu_cycles_per_s()))
        torch.cuda.synchronize()
    else:
        time.sleep(step_s)


def run_mmfeed(ds: Dataset, batch_size: int, workers: int, device: str, steps: int, warmup: int,
               step_s: float) -> dict[str, Any]:
    timer = StepTimer(warmup=warmup)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, device=device, prefetch=2, timer=timer)
    it = iter(loader)
    for _ in range(steps + warmup):
        _consume(next(it))
        _step(step_s, device == "cuda")
    it.close()
    return timer.report()


def run_torch(ds: Dataset, batch_size: int, workers: int, steps: int, warmup: int, step_s: float,
              cuda: bool) -> dict[str, Any]:
    timer = StepTimer(warmup=warmup, num_workers=workers)
    it = iter(TorchDataLoader(ds, batch_size=batch_size, num_workers=workers, prefetch_factor=2,
                              pin_memory=cuda))
    for _ in range(steps + warmup):
        timer.request()
        batch = next(it)
        if cuda:
            batch = batch.to("cuda")  # torch's loop must copy too; a plain blocking copy
        timer.deliver()
        _consume(batch)
        _step(step_s, cuda)
    timer.request()
    del it
    return timer.report()


def _planned(args: argparse.Namespace) -> PlannedDataset:
    tokens = 4
    records = CostlyRecords(args.epoch_steps * args.batch_size, args.sample_ms / 1e3, args.cost, tokens=tokens)
    return PlannedDataset.records(records, [tokens] * len(records),
                                  plan=PlanConfig(capacity=tokens * args.batch_size), seed=0)


def run_epochs(args: argparse.Namespace, chain: bool, device: str, step_s: float) -> dict[str, Any]:
    """One run of ``args.epochs`` epochs: wait, step time and stall over the first ``args.window`` steps of
    each epoch after the first, and the wait of each epoch's first step."""
    loader = DataLoader(_planned(args), num_workers=args.workers, persistent_workers=True, device=device,
                        prefetch=2, timer=StepTimer())
    loader.chain_epochs = chain
    for _ in range(args.epochs):
        for batch in loader:
            _ = batch.data["frames"][0, 0, 0, 0].item()
            _step(step_s, device == "cuda")
            del batch
    timer = loader.timer
    window = [s + k for s in timer.epoch_starts[1:] for k in range(args.window)]
    wait = sum(timer.wait_s[i] for i in window)
    total = wait + sum(timer.busy_s[i] for i in window)
    return {"stall_fraction": wait / total if total > 0 else 0.0, "wait_s": wait,
            "first_step_wait_ms": [timer.wait_s[s] * 1e3 for s in timer.epoch_starts[1:]],
            "steps": len(timer.wait_s), "epoch_starts": list(timer.epoch_starts),
            "epoch_refill_share": timer.report().get("epoch_refill_share")}


def epochs_main(args: argparse.Namespace, repeats: int) -> dict[str, Any]:
    """The epoch-boundary benchmark (``--epochs``): chained vs drained, interleaved, median and spread."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    load_s = args.batch_size * args.sample_ms / 1e3 / args.workers  # per batch, the workers together
    step_s = load_s / LOAD_FRACTION
    runs: dict[str, list[dict[str, Any]]] = {"chained": [], "drained": []}
    for _ in range(repeats):
        for name in runs:
            runs[name].append(run_epochs(args, name == "chained", device, step_s))
    figures: dict[str, Any] = {}
    for name, rs in runs.items():
        stalls = [r["stall_fraction"] for r in rs]
        firsts = [statistics.mean(r["first_step_wait_ms"]) for r in rs]
        figures[name] = {"stall_fraction": statistics.median(stalls), "stall_runs": stalls,
                         "spread": [min(stalls), max(stalls)], "first_step_wait_ms": statistics.median(firsts),
                         "first_step_wait_ms_runs": firsts,
                         "timer_epoch_refill_share_runs": [r["epoch_refill_share"] for r in rs]}
    for name, f in figures.items():
        print(f"{name:8s}: stall over the first {args.window} steps of epochs 2..{args.epochs}: "
              f"{f['stall_fraction']:.2%} (runs {', '.join(f'{x:.2%}' for x in f['stall_runs'])}); wait at an "
              f"epoch's first step {f['first_step_wait_ms']:.1f} ms (runs "
              f"{', '.join(f'{x:.1f}' for x in f['first_step_wait_ms_runs'])})")
    return {"benchmark": "stall-epochs", **figures, "load_s_per_batch": load_s, "step_s": step_s,
            "settings": {"epochs": args.epochs, "epoch_steps": args.epoch_steps, "window": args.window,
                         "cost": args.cost, "sample_ms": args.sample_ms, "batch_size": args.batch_size,
                         "workers": args.workers, "repeats": repeats, "device": device,
                         "load_fraction": LOAD_FRACTION},
            "environment": {"python": platform.python_version(), "torch": torch.__version__,
                            "cpus": os.cpu_count(), "platform": platform.platform()}}


def main(argv: list[str] | None = None) -> int:
    """Run the stall benchmark, print the figures, optionally write JSON; returns 0 (1 if the target is missed)."""
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.stall", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and one repeat (a smoke run)")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    parser.add_argument("--cost", choices=("sleep", "cpu"), default="sleep", help="per-sample cost (default sleep)")
    parser.add_argument("--sample-ms", type=float, default=5.0, help="per-sample cost in ms (default 5)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="measured repeats (default 3, quick 1)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="measure the epoch boundary over this many epochs (>= 2): chained vs drained")
    parser.add_argument("--epoch-steps", type=int, default=24, help="with --epochs: steps per epoch (default 24)")
    parser.add_argument("--window", type=int, default=16, help="with --epochs: steps counted per epoch start")
    args = parser.parse_args(argv)
    if args.sample_ms <= 0 or args.batch_size < 1 or args.workers < 1:
        parser.error("--sample-ms must be > 0, --batch-size and --workers >= 1")
    repeats = args.repeats or (1 if args.quick else 3)
    if args.epochs is not None:
        if args.epochs < 2 or not 1 <= args.window <= args.epoch_steps:
            parser.error("--epochs must be >= 2 and 1 <= --window <= --epoch-steps")
        report = epochs_main(args, repeats)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2, sort_keys=True)
        return 0
    steps, warmup = (25, 4) if args.quick else (80, 6)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = (steps + warmup + 2 * args.workers + 4) * args.batch_size * 2
    ds = CostlyDataset(n, args.sample_ms / 1e3, args.cost)

    caps = [capacity(ds, args.batch_size, args.workers, device, 20 if args.quick else 40) for _ in range(repeats)]
    cap = statistics.median(caps)
    step_s = 1.0 / (cap * LOAD_FRACTION)  # = 1.25 x the per-batch load time
    ours, theirs = [], []
    for _ in range(repeats):  # interleaved, so both see the same machine load
        ours.append(run_mmfeed(ds, args.batch_size, args.workers, device, steps, warmup, step_s))
        theirs.append(run_torch(ds, args.batch_size, args.workers, steps, warmup, step_s, device == "cuda"))
    stall_ours = statistics.median(r["stall_fraction"] for r in ours)
    stall_theirs = statistics.median(r["stall_fraction"] for r in theirs)
    report = {
        "benchmark": "stall",
        "stall_fraction": stall_ours,
        "baseline": {"name": "torch.utils.data.DataLoader, plain iteration", "stall_fraction": stall_theirs,
                     "wait_ms_mean": statistics.median(r["wait_s"]["mean"] for r in theirs) * 1e3},
        "wait_ms_mean": statistics.median(r["wait_s"]["mean"] for r in ours) * 1e3,
        "stall_ratio_baseline_over_mmfeed": stall_theirs / stall_ours if stall_ours > 0 else None,
        "capacity_batches_per_s": cap,
        "capacity_runs_batches_per_s": caps,
        "step_s": step_s,
        "target_stall_fraction": TARGET_STALL,
        "target_met": stall_ours <= TARGET_STALL,
        "stall_runs": [r["stall_fraction"] for r in ours],
        "baseline_stall_runs": [r["stall_fraction"] for r in theirs],
        "stages_per_batch_s": {k: v["mean_s"] for k, v in ours[0]["stages"].items()},
        "bottleneck": ours[0]["bottleneck"],
        "settings": {"cost": args.cost, "sample_ms": args.sample_ms, "batch_size": args.batch_size,
                     "workers": args.workers, "prefetch": 2, "prefetch_factor": 2, "steps": steps,
                     "warmup_steps": warmup, "repeats": repeats, "load_fraction": LOAD_FRACTION, "device": device,
                     "quick": args.quick},
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    print(f"capacity (mmfeed, {args.workers} workers, no step): {cap:.1f} batches/s; step {step_s * 1e3:.1f} ms "
          f"(80% load, {args.cost} cost {args.sample_ms} ms/sample x {args.batch_size}, device {device})")
    print(f"stall mmfeed DataLoader + prefetcher: {stall_ours:.2%}  (target <= {TARGET_STALL:.0%}: "
          f"{'met' if report['target_met'] else 'MISSED'}); runs {[round(x, 4) for x in report['stall_runs']]}")
    print(f"stall torch DataLoader (same workers, prefetch_factor=2): {stall_theirs:.2%}; runs "
          f"{[round(x, 4) for x in report['baseline_stall_runs']]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, sort_keys=True)
    return 0 if report["target_met"] else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
