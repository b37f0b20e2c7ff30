"""``python -m mmfeed.bench.scaling_job`` under ``torchrun``: one rank of a measured weak-scaling job.

``mmfeed bench scaling --measure`` starts this with ``torchrun --standalone --nproc_per_node=W`` once per world
size. Every rank trains a small MLP (``--layers`` Linear layers of ``--hidden`` units: real matmuls of a few ms
on one CPU thread) wrapped in :class:`~torch.nn.parallel.DistributedDataParallel` on gloo, fed by
:class:`mmfeed.DataLoader` over :class:`SleepyDataset` (a seeded synthetic map-style dataset whose per-sample
cost is a sleep inside ``stage("decode")``, so workers do not compete for the CPUs) through a per-rank
DistributedSampler: weak scaling, the per-rank batch stays ``--batch`` whatever the world size. A
:class:`~mmfeed.loaders.observe.timing.StepTimer` watches the DDP model, so each step splits into wait / copy / compute
/ comm. ``--compute-ms`` sleeps inside the model's forward (a bigger model, a flag away); ``--comm-delay-ms``
sleeps in the comm hook after each bucket's allreduce (a slower network).

After ``--warmup`` steps the job measures ``--repeats`` stretches of ``--steps`` steps; each stretch ends with
``timer.report()`` (every rank calls it: it all-gathers) and a reset. Rank 0 writes ``{"world_size",
"settings", "reports": [one timer report per stretch]}`` to ``--json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DistributedSampler

__all__ = ["DelayedAllreduce", "Model", "Pacer", "SleepyDataset", "main", "run"]


class Pacer:
    """Sleeps that last ``seconds`` on average: what one sleep overran (a loaded machine wakes sleepers late) is
    taken off the next, up to one sleep's length (a long preemption is not paid back)."""

    def __init__(self) -> None:
        self.debt = 0.0

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        want = seconds - self.debt
        if want <= 0:
            self.debt = -want
            return
        start = time.perf_counter()
        time.sleep(want)
        self.debt = min(max(time.perf_counter() - start - want, 0.0), seconds)


class SleepyDataset(Dataset):
    """``length`` seeded (features, label) samples; each costs ``decode_s`` of sleep (paced, see :class:`Pacer`)
    timed as stage "decode"."""

    def __init__(self, length: int, features: int, classes: int, decode_s: float, seed: int = 0) -> None:
        self.length, self.features, self.classes = length, features, classes
        self.decode_s, self.seed = decode_s, seed
        self.pacer = Pacer()  # each worker paces its own copy

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from mmfeed.loaders.clock import stage

        with stage("decode"):
            self.pacer.sleep(self.decode_s)
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            x = torch.randn(self.features, generator=g)
            y = torch.randint(0, self.classes, (), generator=g)
        return x, y


class Model(torch.nn.Module):
    """``layers`` Linear layers (ReLU between) and ``compute_s`` of (paced) sleep in each forward: a bigger
    model."""

    def __init__(self, features: int, hidden: int, layers: int, classes: int, compute_s: float = 0.0) -> None:
        super().__init__()
        widths = [features] + [hidden] * (layers - 1) + [classes]
        mods: list[torch.nn.Module] = []
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            mods.append(torch.nn.Linear(a, b))
            if i < layers - 1:
                mods.append(torch.nn.ReLU())
        self.net = torch.nn.Sequential(*mods)
        self.compute_s = compute_s
        self.pacer = Pacer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.pacer.sleep(self.compute_s)
        return self.net(x)


class DelayedAllreduce:
    """A DDP comm hook: DDP's default allreduce (mean), its future chained with a ``delay_s`` sleep."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut = default_hooks.allreduce_hook(state, bucket)
        delay = self.delay_s

        def late(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            time.sleep(delay)
            return done.value()

        return fut.then(late)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train under the current process group; every rank returns the job's result (see the module docstring)."""
    from mmfeed import DataLoader
    from mmfeed.loaders import StepTimer

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = Model(args.features, args.hidden, args.layers, args.classes, args.compute_ms / 1e3)
    # One bucket for the whole model: --comm-delay-ms is then paid once per step.
    ddp = DistributedDataParallel(model, bucket_cap_mb=1024)
    timer = StepTimer()
    hook = DelayedAllreduce(args.comm_delay_ms / 1e3) if args.comm_delay_ms > 0 else None
    timer.watch(ddp, hook=hook)
    steps = args.warmup + args.repeats * args.steps
    dataset = SleepyDataset(world * args.batch * (steps + 1), args.features, args.classes, args.decode_ms / 1e3,
                            seed=args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    # device="cpu": a thread receives batches from the workers ``prefetch`` ahead, as a GPU job's prefetcher would
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers, timer=timer,
                        drop_last=True, device="cpu" if args.prefetch else None, prefetch=max(args.prefetch, 1))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    it = iter(loader)

    def step() -> None:
        x, y = next(it)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    timer.reset()  # the warm-up (worker start, first fill of the queue) is not measured
    reports = []
    for _ in range(args.repeats):
        for _ in range(args.steps):
            step()
        reports.append(timer.report())  # every rank: it all-gathers
        timer.reset()
    it.close()  # let the prefetch thread and the workers go
    return {"world_size": world, "settings": vars(args), "reports": reports}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mmfeed.bench.scaling_job", description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, metavar="FILE", help="where rank 0 writes the job's result")
    p.add_argument("--steps", type=int, default=20, help="steps per measured stretch")
    p.add_argument("--warmup", type=int, default=5, help="steps before the first stretch")
    p.add_argument("--repeats", type=int, default=3, help="measured stretches")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--workers", type=int, default=2, help="loader workers per rank")
    p.add_argument("--prefetch", type=int, default=2, help="batches received ahead by a thread (0: none)")
    p.add_argument("--decode-ms", type=float, default=1.0, help="sleep per sample in stage 'decode'")
    p.add_argument("--compute-ms", type=float, default=0.0, help="sleep in each forward")
    p.add_argument("--comm-delay-ms", type=float, default=0.0, help="sleep after each bucket's allreduce")
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for name in ("steps", "repeats", "batch", "layers", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    try:
        result = run(args)
        if dist.get_rank() == 0:
            tmp = f"{args.json}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1, sort_keys=True)
            os.replace(tmp, args.json)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
