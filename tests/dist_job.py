"""The job tests/test_distributed.py starts with ``torchrun --nproc_per_node=2``: a gloo process group, one
mmfeed.DataLoader per rank over real shards, results gathered to rank 0 and written as JSON.

Usage: ``python -m torch.distributed.run --nproc_per_node=2 tests/dist_job.py OUT.json NAME=SHARDS [NAME=SHARDS]``.
Each step ends with an all_reduce, as DDP's gradient sync does, so ranks with unequal step counts would hang
(and the test's timeout would fail) rather than pass.
"""

import datetime
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
from mmfeed.loaders.dist import dist_info

PACKING = Packing(layout=TokenLayout(tokens_per_frame={"cam_high": 16}),
                  window=WindowSpec(offsets={"frames.cam_high": (-2, 0), "proprio": (0,), "action": tuple(range(5))}),
                  plan=PlanConfig(capacity=160, rows_per_batch=2), seed=1)


class WhoLoads(torch.utils.data.Dataset):
    """Item i is where it was loaded: (i, rank, world size, worker, num_workers)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> list[int]:
        info = dist_info()
        return [i, info.rank, info.world_size, info.worker, info.num_workers]


def run_epoch(shards: str, num_workers: int) -> dict:
    loader = DataLoader(shards, packing=PACKING, num_workers=num_workers, timer=True)
    rank = dist.get_rank()
    plan = loader.dataset.plan(0)
    samples, steps, in_plan_order = [], 0, True
    sync = torch.zeros(1)
    for step, batch in enumerate(loader):
        ids = batch.metadata["sample"].tolist()
        in_plan_order &= sorted(ids) == sorted(plan.batch_samples(rank, step).tolist())
        samples.extend(ids)
        steps += 1
        sync += 1
        dist.all_reduce(sync)  # a rank short of steps would leave the others waiting here
    timer = loader.timer.report()  # every rank calls it: one all_gather_object
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"samples": samples, "steps": steps, "in_plan_order": bool(in_plan_order)})
    costs = plan.rank_costs().sum(axis=1)
    return {
        "ranks": gathered,
        "num_samples": len(loader.dataset.table),
        "dropped": plan.dropped.tolist(),
        "num_steps": plan.num_steps,
        "rank_costs": costs.tolist(),
        "cost_balance": {"mean": float(costs.mean()), "max": float(costs.max()),
                         "mean_over_max": float(costs.mean() / costs.max()) if costs.max() > 0 else 1.0},
        "timer_ranks": timer.get("ranks"),
    }


def main(argv: list[str]) -> None:
    out, configs = argv[0], dict(arg.split("=", 1) for arg in argv[1:])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        info = dist_info()
        results = {"dist_info": [None] * info.world_size}
        dist.all_gather_object(results["dist_info"], [info.rank, info.world_size, info.local_rank,
                                                      info.local_world_size])
        for name, shards in configs.items():
            results[name] = run_epoch(shards, num_workers=1 if name == "even" else 0)
        who = [item for item in torch.utils.data.DataLoader(WhoLoads(), batch_size=None, num_workers=2)]
        results["workers"] = [None] * info.world_size
        dist.all_gather_object(results["workers"], who)
        if info.rank == 0:
            with open(out, "w", encoding="utf-8") as f:
                json.dump(results, f, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
