"""The bottleneck of a training loop named in plain words, from a :class:`~mmfeed.loaders.StepTimer`'s means.

:func:`diagnose` is a pure function of per-step figures (seconds), so its rules can be read and tested on their
own. In order, the first that applies:

1. the stall is at most the threshold: the input is not the bottleneck; exposed gradient communication is named
   if it takes a quarter of the step or more, else compute (with the MFU when it is known);
2. ``num_workers == 0``: loading runs in the training process, and the remedy is worker processes;
3. most of the wait falls in the first steps of each epoch after the first: the pipeline refills at every epoch
   boundary (deeper prefetch cannot help: the next epoch's batches are not asked for before it starts);
4. no worker stage was timed: unknown;
5. the host-to-device copy is longer than loading and compute: copy; then the device transforms
   (``DataLoader(device_transform=...)``, run in the prefetcher one batch after another): transform;
6. the workers' per-batch time (stage seconds over the workers) is at least the step: the slowest stage;
7. otherwise the workers keep up on average and the loop waits on jitter: deeper prefetch.

A worker count is never advised beyond the cores this process may run on (``cores``, default
:func:`usable_cores`): where keeping up would take more, the advice is as many workers as cores and a cheaper
batch (or more cores), since workers beyond the cores only share them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["diagnose", "usable_cores"]

_CHEAPER = ("make each batch cheaper to load (a lower decode resolution, fewer frames per sample, frames decoded "
            "ahead with `mmfeed cache`) or run on a machine with more cores")

# stage name (lower case, substring match) -> how to make that stage cheaper when it is the bottleneck
_ADVICE = {
    "read": "faster storage (local SSD, larger reads, fewer small files)",
    "fetch": "faster storage (local SSD, larger reads, fewer small files)",
    "open": "faster storage (local SSD, larger reads, fewer small files)",
    "decode": "a lower decode resolution / fewer frames per sample (or frames decoded ahead with `mmfeed cache`)",
    "pack": "a cheaper packing algorithm",
    "collate": "a cheaper collate (build tensors in the dataset, avoid Python loops)",
}


def _advice(stage_name: str) -> str:
    low = stage_name.lower()
    for key, text in _ADVICE.items():
        if key in low:
            return text
    return "make this stage cheaper"


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


def _workers(load_s: float, compute_s: float, cores: int) -> str:
    """The workers to advise for ``load_s`` worker seconds per batch and a ``compute_s`` step on ``cores`` cores:
    as many as keep up, at most ``cores`` (then a cheaper batch or more cores as well)."""
    need = max(1, int(np.ceil(load_s / max(compute_s, 1e-9))))
    step = f"a {compute_s * 1e3:.1f} ms step"
    if need <= cores:
        return f"about {need} workers would keep up with {step}"
    return (f"keeping up with {step} would take about {need} workers but this machine has {cores} cores: use "
            f"num_workers={cores} and {_CHEAPER}")


def diagnose(stall_fraction: float, compute_s: float, copy_s: float | None, stages: Mapping[str, float],
             num_workers: int | None, threshold: float = 0.05, *, comm_s: float | None = None,
             refill_share: float | None = None, mfu: float | None = None, cores: int | None = None,
             transform_s: float | None = None) -> dict[str, Any]:
    """``{stage, recommendation}`` for per-step means: compute, exposed comm, copy and device-transform
    (``transform_s``) seconds, worker ``stages``
    seconds per batch; ``refill_share`` = the share of all wait that falls in the first steps of epochs after
    the first; ``num_workers`` None means unknown (not 0: loading inline); ``cores``: the cores workers may use
    (default :func:`usable_cores`), the most workers ever advised."""
    cores = usable_cores() if cores is None else max(1, int(cores))
    if stall_fraction <= threshold:
        step = compute_s + (comm_s or 0.0)
        if comm_s is not None and step > 0 and comm_s >= 0.25 * step:
            return {"stage": "comm", "recommendation":
                    f"exposed gradient communication is {comm_s / step:.0%} of the step ({comm_s * 1e3:.1f} ms "
                    "not overlapped with backward): larger buckets (bucket_cap_mb), fewer syncs (gradient "
                    "accumulation under no_sync), or a faster interconnect"}
        at = f" (MFU {mfu:.1%})" if mfu is not None else ""
        return {"stage": "compute", "recommendation":
                f"input is not the bottleneck (stall {stall_fraction:.1%} <= {threshold:.0%}); speed up the "
                f"model{at}"}
    if num_workers == 0:
        count = f"; {_workers(sum(stages.values()), compute_s, cores)}" if stages and compute_s > 0 else \
            f" (at most this machine's {cores} cores)"
        return {"stage": "inline", "recommendation":
                f"loading runs in the training loop (num_workers=0, stall {stall_fraction:.1%}): start worker "
                f"processes with num_workers=N, so batches are loaded while the model computes{count}"}
    if refill_share is not None and refill_share >= 0.5:
        return {"stage": "epoch_boundary", "recommendation":
                f"{refill_share:.0%} of the wait falls at the start of each epoch: the pipeline drains at the "
                "epoch boundary and refills; with a planned dataset, persistent_workers=True keeps the next "
                "epoch's batches in flight across it (deeper prefetch does not help here)"}
    if not stages:
        return {"stage": "unknown", "recommendation":
                f"the loop waits (stall {stall_fraction:.1%}) but no worker stage times were recorded: time the "
                "dataset with stage(...) and mmfeed.DataLoader(timer=True); meanwhile try more workers or a "
                "deeper prefetch"}
    workers = max(int(num_workers or 1), 1)
    load_s = sum(stages.values()) / workers
    if copy_s is not None and copy_s > max(load_s, compute_s):
        return {"stage": "copy", "recommendation":
                "host-to-device copy dominates: pin memory, use a deeper prefetch, or send smaller dtypes (uint8)"}
    if transform_s is not None and transform_s > max(load_s, compute_s):
        return {"stage": "transform", "recommendation":
                f"the device transforms take {transform_s * 1e3:.1f} ms a batch, longer than loading and compute: "
                "run them on the GPU (device='cuda'), make them cheaper, or move some into the workers "
                "(Packing(transform=...))"}
    if load_s >= compute_s:
        top = max(stages, key=stages.get)
        where = f"stage '{top}' is the bottleneck ({stages[top] * 1e3:.1f} ms per batch)"
        if workers >= cores:  # every core already has a worker: more workers only share them
            return {"stage": top, "recommendation":
                    f"{where}, and its {workers} workers already fill this machine's {cores} cores: "
                    f"{_advice(top)}, or a machine with more cores"}
        return {"stage": top, "recommendation": f"{where}: more workers, or {_advice(top)}; "
                                                f"{_workers(sum(stages.values()), compute_s, cores)}"}
    return {"stage": "prefetch", "recommendation":
            "the workers keep up on average but the loop still waits: deeper prefetch (prefetch=, "
            "prefetch_factor=) to absorb jitter" + (", or more workers" if workers < cores else "")}
