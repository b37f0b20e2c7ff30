"""The job tests/test_distributed.py starts with ``torchrun``: a gloo process group, one mmfeed.DataLoader per rank
over real shards, what each rank's batches held gathered to rank 0 and written as JSON.

Usage: ``python -m torch.distributed.run --nproc_per_node=N tests/dist_job.py CONFIG.json OUT.json``. CONFIG holds
``{"epochs": {name: run}, "save": {name: run}, "resume": {name: run}, "probe": bool}``; a run is ``{"data": path
or [paths] (a mixture), "weights": [..] or null, "num_workers": n}``, plus ``"steps"`` (save: how many),
``"state"`` (save/resume: the loader state file) and ``"mark": true`` (epochs: record which rank and worker
loaded each batch, see :func:`mark_loader`). ``epochs`` run one whole epoch each, ``save`` runs ``steps`` steps
and saves ``loader.state_dict()``, ``resume`` loads such a state (saved at any world size) and runs to the end of
the epoch. Each step ends with an all_reduce, as DDP's gradient sync does, so ranks with unequal step counts
would hang (and the test's timeout would fail) rather than pass. The sample ids are read from
``batch.metadata["sample"]`` only; the test checks them against plans it computes itself.
"""

import dataclasses
import datetime
import json
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
from mmfeed.loaders.loop.dist import dist_info

CAM = "observation.images.cam_high"
WINDOW = WindowSpec.from_delta_timestamps({CAM: [-2 / 30, 0.0], "observation.state": [0.0],
                                          "action": [i / 30 for i in range(5)]})


def packing(weights=None) -> Packing:
    """The packing of every run (the test builds the same to check the batches against its own plans)."""
    return Packing(layout=TokenLayout(tokens_per_frame={CAM: 16}), window=WINDOW,
                   plan=PlanConfig(capacity=160, rows_per_batch=2), seed=1, weights=weights)


def mark_loader(sample: dict, generator) -> dict:
    """A transform that writes where the sample was loaded into its state: ``rank * 10 + worker``."""
    info = dist_info()
    state = sample["observation.state"]
    return {**sample, "observation.state": torch.full_like(state, info.rank * 10 + info.worker)}


class WhoLoads(torch.utils.data.Dataset):
    """Item i is where it was loaded: (i, rank, world size, worker, num_workers)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> list[int]:
        info = dist_info()
        return [i, info.rank, info.world_size, info.worker, info.num_workers]


def loader_of(run: dict, timer: bool = False) -> DataLoader:
    config = packing(run.get("weights"))
    if run.get("mark"):
        config = dataclasses.replace(config, transform=mark_loader)
    return DataLoader(run["data"], packing=config, num_workers=run["num_workers"], timer=timer)


def steps_of(loader: DataLoader, limit: int | None = None, marks: list | None = None) -> list[list[int]]:
    """The sample ids of each batch, one list per step, ``limit`` steps at most; with ``marks``, the distinct
    state values of each batch (see :func:`mark_loader`) are appended to it."""
    steps, sync = [], torch.zeros(1)
    it = iter(loader)
    for batch in it:
        steps.append(batch.metadata["sample"].tolist())
        if marks is not None:
            marks.append(sorted(set(batch.data["observation.state"].flatten().tolist())))
        sync += 1
        dist.all_reduce(sync)  # a rank short of steps would leave the others waiting here
        if limit is not None and len(steps) == limit:
            break
    del it  # let this loader's workers go before the next one starts
    return steps


def gather(value) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def run_epoch(run: dict) -> dict:
    loader = loader_of(run, timer=True)
    marks = [] if run.get("mark") else None
    steps = steps_of(loader, marks=marks)
    timer = loader.timer.report()  # every rank calls it: one all_gather_object
    costs = loader.dataset.plan(0).rank_costs().sum(axis=1)
    return {
        "steps": gather(steps),
        "marks": gather(marks),
        "world_size": loader.dataset.world_size,
        "cost_balance": {"mean": float(costs.mean()), "max": float(costs.max()),
                         "mean_over_max": float(costs.mean() / costs.max()) if costs.max() > 0 else 1.0},
        "timer_ranks": timer.get("ranks"),
    }


def run_save(run: dict) -> dict:
    loader = loader_of(run)
    steps = steps_of(loader, limit=run["steps"])
    state = loader.state_dict()
    states = gather(state)
    if dist.get_rank() == 0:
        torch.save(state, run["state"])
    return {"steps": gather(steps), "states_equal": all(s == states[0] for s in states), "state": state}


def run_resume(run: dict) -> dict:
    loader = loader_of(run)
    loader.load_state_dict(torch.load(run["state"]))  # saved at another world size: the loader re-plans the rest
    return {"steps": gather(steps_of(loader)), "world_size": loader.dataset.world_size}


def main(argv: list[str]) -> None:
    with open(argv[0], encoding="utf-8") as f:
        config = json.load(f)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        info = dist_info()
        results = {"dist_info": gather([info.rank, info.world_size, info.local_rank, info.local_world_size])}
        for kind, fn in (("epochs", run_epoch), ("save", run_save), ("resume", run_resume)):
            results[kind] = {name: fn(run) for name, run in config.get(kind, {}).items()}
        if config.get("probe"):
            who = list(torch.utils.data.DataLoader(WhoLoads(), batch_size=None, num_workers=2))
            results["workers"] = gather(who)
        if info.rank == 0:
            with open(argv[1], "w", encoding="utf-8") as f:
                json.dump(results, f, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
