"""``mmfeed inspect PATH``: what a dataset holds and how it will pack, from its index alone (no pixel decoded).

The episodes, their length histogram, fps and cameras come from the source's index (the parquet index beside
webdataset shards, or a LeRobot directory's ``meta/episodes``). The forecast cuts the episodes into samples and
prices and plans one epoch exactly as ``mmfeed.DataLoader(source, packing=...)`` would (``build_samples`` and
``plan_epoch``), so its packing efficiency, rows, steps and tokens are the ones training will see; beside it,
the same samples padded to the longest of each batch (torch's way, the batch size giving the same token budget).

    >>> info = inspect_dataset("shards/", window_packing(["cam_high"], capacity=8192))  # doctest: +SKIP
    >>> print(format_inspection(info))                                                  # doctest: +SKIP
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from mmfeed.codecs.text import ByteTokenizer
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset, plan_epoch
from mmfeed.loaders.samples import SamplingConfig, build_samples

__all__ = ["format_inspection", "histogram", "inspect_dataset", "window_packing"]


def window_packing(cameras: list[str], *, capacity: int = 8192, rows_per_batch: int = 1, history: int = 4,
                   horizon: int = 50, tokens_per_frame: int = 256, max_length: int | None = None,
                   stride: int = 1, algorithm: str = "bfd", seed: int = 0) -> Packing:
    """The :class:`~mmfeed.loaders.Packing` of ``mmfeed bench`` and ``inspect``: windows of ``history`` frames
    of every camera, the current state and a ``horizon``-step action chunk; or, with ``max_length``, whole
    episodes cut into chunks of at most ``max_length`` steps (every frame, state and action of each step)."""
    layout = TokenLayout(tokens_per_frame={c: tokens_per_frame for c in cameras})
    window = None
    if max_length is None:
        frames = tuple(range(-(history - 1), 1))
        window = WindowSpec(offsets={**{f"frames.{c}": frames for c in cameras}, "proprio": (0,),
                                     "action": tuple(range(horizon))})
    plan = PlanConfig(capacity=capacity, rows_per_batch=rows_per_batch, algorithm=algorithm)
    return Packing(layout=layout, window=window, stride=stride, max_length=max_length, plan=plan, seed=seed)


def histogram(values: np.ndarray, bins: int = 10, width: int = 40) -> list[str]:
    """Text histogram lines ``"  lo-hi  count  ####"`` of integer ``values``, in at most ``bins`` bins of equal
    integer width."""
    values = np.asarray(values, dtype=np.int64)
    if values.size == 0:
        return ["  (no values)"]
    lo, hi = int(values.min()), int(values.max())
    step = -(-(hi - lo + 1) // bins)  # ceil
    edges = np.arange(lo, hi + step + 1, step)
    counts = np.histogram(values, bins=edges)[0]
    top = max(int(counts.max()), 1)
    labels = [f"{a}-{b - 1}" if b - 1 > a else f"{a}" for a, b in zip(edges[:-1], edges[1:])]
    w = max(len(s) for s in labels)
    return [f"  {label:>{w}}  {int(c):>6}  {'#' * (max(round(width * c / top), 1) if c else 0)}"
            for label, c in zip(labels, counts)]


def _plan_figures(plan, tokens: np.ndarray, capacity: int) -> dict[str, Any]:
    used = plan.steps[plan.steps >= 0]
    members = np.concatenate([plan.row(int(r)) for r in used]) if used.size else np.zeros(0, np.int64)
    planned_tokens = int(tokens[members].sum())
    return {"efficiency": plan.efficiency, "rows": int(used.size), "steps": plan.num_steps,
            "samples": int(members.size), "tokens": planned_tokens,
            "token_slots": int(round(planned_tokens / plan.efficiency)) if plan.efficiency else 0,
            "dropped_samples": int(plan.dropped.size), "too_long_samples": int((tokens > capacity).sum())}


def inspect_dataset(path: str, packing: Packing, *, world_size: int = 1, backend: str = "auto") -> dict[str, Any]:
    """Episodes, lengths, fps, cameras and tasks of the dataset at ``path``, and one epoch's packing forecast.

    ``packing`` gives the windows (or chunks), token layout and plan (see :func:`window_packing`); the forecast
    is epoch 0 of ``world_size`` ranks: rows and steps per rank, tokens and token slots over all ranks.
    """
    source = open_dataset(path, backend=backend)
    lengths = np.asarray(source.lengths, dtype=np.int64)
    cameras = list(source.cameras)
    camera_fps = {c: sorted({float(source.camera_fps(e, c)) for e in range(len(lengths))}) for c in cameras}
    tasks = collections.Counter(source.task(e) for e in range(len(lengths)))
    sampling = SamplingConfig(window=packing.window, stride=packing.stride, max_length=packing.max_length)
    samples = build_samples(source, sampling, packing.layout, packing.tokenizer or ByteTokenizer())
    tokens = samples.tokens
    plan = plan_epoch(tokens, packing.plan, seed=packing.seed, epoch=0, world_size=world_size,
                      groups=samples.episode)
    capacity = packing.plan.capacity
    packed = _plan_figures(plan, tokens, capacity)
    fits = tokens[tokens <= capacity]
    longest = int(fits.max()) if fits.size else capacity
    batch = max(1, packing.plan.rows_per_batch * capacity // longest)
    padded_config = PlanConfig(mode="fixed", batch_size=batch, shuffle=packing.plan.shuffle)
    padded_plan = plan_epoch(fits, padded_config, seed=packing.seed, epoch=0, world_size=world_size)
    padded = _plan_figures(padded_plan, fits, capacity)
    padded["batch_size"] = batch
    return {
        "path": str(path), "source": type(source).__name__, "episodes": int(len(lengths)),
        "steps": int(lengths.sum()), "length": _stats(lengths), "lengths": lengths.tolist(),
        "fps": {f"{k:g}": v for k, v in sorted(collections.Counter(np.asarray(source.fps).tolist()).items())},
        "cameras": cameras, "camera_fps": camera_fps, "tasks": dict(tasks.most_common()),
        "forecast": {"mode": "windows" if packing.window is not None else f"chunks of <= {packing.max_length} steps",
                     "capacity": capacity, "rows_per_batch": packing.plan.rows_per_batch, "world_size": world_size,
                     "sample_tokens": _stats(tokens), "packed": packed, "padded": padded},
    }


def _stats(values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values)
    if values.size == 0:
        return {"min": 0, "median": 0, "mean": 0.0, "max": 0}
    return {"min": int(values.min()), "median": float(np.median(values)), "mean": float(values.mean()),
            "max": int(values.max())}


def format_inspection(info: dict[str, Any]) -> str:
    """The text ``mmfeed inspect`` prints."""
    ln = info["length"]
    out = [f"{info['path']} ({info['source']}): {info['episodes']} episodes, {info['steps']} steps",
           f"episode length: min {ln['min']}, median {ln['median']:g}, mean {ln['mean']:.1f}, max {ln['max']}"]
    out += histogram(np.asarray(info["lengths"]))
    out.append("fps: " + ", ".join(f"{k} ({v} episodes)" for k, v in info["fps"].items()))
    cams = [f"{c} ({'/'.join(f'{f:g}' for f in info['camera_fps'][c])} fps)" for c in info["cameras"]]
    out.append("cameras: " + (", ".join(cams) if cams else "none"))
    tasks = list(info["tasks"].items())
    more = " ..." if len(tasks) > 5 else ""
    out.append(f"tasks: {len(tasks)}: " + "; ".join(f"{t!r} x{n}" for t, n in tasks[:5]) + more)
    f = info["forecast"]
    st = f["sample_tokens"]
    out.append(f"\nforecast, one epoch: {f['mode']}, capacity {f['capacity']}, rows per batch {f['rows_per_batch']}, "
               f"ranks {f['world_size']}; sample price {st['min']}-{st['max']} tokens (median {st['median']:g})")
    p, q = f["packed"], f["padded"]
    out.append(f"  packed (mmfeed):       efficiency {p['efficiency']:.1%}, {p['rows']} rows, {p['steps']} steps per "
               f"rank, {p['samples']} samples, {p['tokens']:,} tokens in {p['token_slots']:,} slots")
    out.append(f"  pad-to-longest (torch, batch {q['batch_size']}): efficiency {q['efficiency']:.1%}, "
               f"{q['steps']} steps "
               f"per rank, {q['tokens']:,} tokens in {q['token_slots']:,} slots")
    if p["dropped_samples"]:
        why = (f" ({p['too_long_samples']} longer than the capacity: raise --capacity to at least {st['max']})"
               if p["too_long_samples"] else "")
        out.append(f"  dropped this epoch: {p['dropped_samples']} samples{why}")
    return "\n".join(out)
