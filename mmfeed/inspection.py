"""``mmfeed inspect PATH``: what a dataset holds and how it will pack, from its index alone (no pixel decoded).

The episodes, their length histogram, fps, features (kind, dtype, step shape, rate, stats) and tasks come from
the source's index (the parquet index beside webdataset shards, or a LeRobot directory's ``meta/``). The forecast
cuts the episodes into samples and prices and plans one epoch exactly as ``mmfeed.DataLoader(source,
packing=...)`` would (the planned dataset of ``packing.dataset(source)``, whose
:class:`~mmfeed.loaders.planned.items.EpisodeItems` are the sample table and its prices), so its packing efficiency,
rows, steps and tokens are the ones training will see; beside it, the same samples padded to the longest of each
batch (torch's way, the batch size giving the same token budget).

    >>> source = open_dataset("shards/")                                               # doctest: +SKIP
    >>> info = inspect_dataset(source, window_packing(source, capacity=8192))          # doctest: +SKIP
    >>> print(format_inspection(info))                                                 # doctest: +SKIP
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import numpy as np

from mmfeed.loaders import Packing, PlanConfig, TokenLayout, open_dataset
from mmfeed.loaders.sources.base import EpisodeSource
from mmfeed.packing.plan import plan_epoch
from mmfeed.packing.windows import WindowSpec

__all__ = ["describe_features", "format_features", "format_inspection", "histogram", "inspect_dataset",
           "robot_window", "window_packing"]

STATE, ACTION = "observation.state", "action"
"""The features read at a window's anchor and as its action chunk, where a dataset has them."""


def robot_window(videos: Mapping[str, float], *, fps: float, history: int, horizon: int,
                 state: str | None = "observation.state", action: str | None = "action") -> WindowSpec:
    """The robot window of the benchmarks and ``mmfeed inspect``: the last ``history`` frames of every video
    feature at its own rate (``videos``: feature -> fps), the state at the anchor and a ``horizon``-step chunk of
    actions from the anchor on at the control clock ``fps``; ``state`` / ``action`` None leave them out.

    >>> robot_window({"observation.images.cam_high": 15.0}, fps=30.0, history=2, horizon=3).deltas["action"]
    (0.0, 0.03333333333333333, 0.06666666666666667)
    """
    if isinstance(history, bool) or not isinstance(history, int) or history < 1:
        raise ValueError(f"history must be an integer >= 1 (frames per video), got {history!r}")
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1 (action steps), got {horizon!r}")
    deltas = {f: tuple((k - (history - 1)) / float(rate) for k in range(history)) for f, rate in videos.items()}
    if state is not None:
        deltas[state] = (0.0,)
    if action is not None:
        deltas[action] = tuple(i / float(fps) for i in range(horizon))
    return WindowSpec(deltas=deltas)


def window_packing(source: EpisodeSource, *, capacity: int = 8192, rows_per_batch: int = 1, history: int = 4,
                   horizon: int = 50, tokens_per_frame: int = 256, max_length: int | None = None,
                   stride: int = 1, algorithm: str = "bfd", seed: int = 0) -> Packing:
    """The :class:`~mmfeed.loaders.Packing` of ``mmfeed inspect``: windows of the last ``history`` frames of
    every video feature (each at its own rate), ``observation.state`` at the anchor and a ``horizon``-step
    ``action`` chunk (those the dataset has); or, with ``max_length``, whole episodes of those features cut into
    chunks of at most ``max_length`` steps. Video frames cost ``tokens_per_frame``, a state or an action one."""
    videos = {f: float(source.rates(f)[0]) for f, feature in source.features.items() if feature.kind == "video"}
    state = STATE if STATE in source.features else None
    action = ACTION if ACTION in source.features else None
    prices = {f: tokens_per_frame for f in videos}
    prices.update({f: 1 for f in (state, action) if f is not None})
    layout = TokenLayout(tokens_per_frame=prices)
    window = None
    if max_length is None:
        fps = float(source.fps[0]) if len(source) else 30.0
        window = robot_window(videos, fps=fps, history=history, horizon=horizon, state=state, action=action)
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


def describe_features(source: EpisodeSource) -> dict[str, dict[str, Any]]:
    """Every feature of ``source`` (JSON-ready): ``{name: {kind, dtype, shape, fps, rates, stats}}``; ``rates``
    the distinct per-episode rates, ``stats`` ``{statistic: nested lists}`` from the index (empty where it has
    none)."""
    out = {}
    for name, feature in source.features.items():
        stats = source.stats.get(name, {})
        out[name] = {"kind": feature.kind, "dtype": feature.dtype, "shape": list(feature.shape), "fps": feature.fps,
                     "rates": sorted({float(r) for r in np.asarray(source.rates(name)).tolist()}),
                     "stats": {k: np.asarray(v).tolist() for k, v in sorted(stats.items())}}
    return out


def _plan_figures(plan, tokens: np.ndarray, capacity: int) -> dict[str, Any]:
    used = plan.steps[plan.steps >= 0]
    members = np.concatenate([plan.row(int(r)) for r in used]) if used.size else np.zeros(0, np.int64)
    planned_tokens = int(tokens[members].sum())
    return {"efficiency": plan.efficiency, "rows": int(used.size), "steps": plan.num_steps,
            "samples": int(members.size), "tokens": planned_tokens,
            "token_slots": int(round(planned_tokens / plan.efficiency)) if plan.efficiency else 0,
            "dropped_samples": int(plan.dropped.size), "too_long_samples": int((tokens > capacity).sum())}


def inspect_dataset(path: Any, packing: Packing, *, world_size: int = 1, backend: str = "auto") -> dict[str, Any]:
    """Episodes, lengths, fps, features, stats and tasks of the dataset at ``path`` (or an open source), and one
    epoch's packing forecast.

    ``packing`` gives the windows (or chunks), token layout and plan (see :func:`window_packing`); the forecast
    is epoch 0 of ``world_size`` ranks: rows and steps per rank, tokens and token slots over all ranks.
    """
    source = path if isinstance(path, EpisodeSource) else open_dataset(path, backend=backend)
    lengths = np.asarray(source.lengths, dtype=np.int64)
    tasks = collections.Counter(source.task(e) for e in range(len(lengths)))
    planned = packing.dataset(source, world_size=world_size, refuse_unfit=False)  # an empty epoch is forecast too
    tokens = planned.items.table.tokens
    epoch_plan = planned.planned(0)
    plan = epoch_plan.plan
    capacity = packing.plan.capacity
    packed = _plan_figures(plan, tokens, capacity)
    fits = tokens[tokens <= capacity]
    longest = int(fits.max()) if fits.size else capacity
    batch = max(1, packing.plan.rows_per_batch * capacity // longest)
    padded_config = PlanConfig(mode="fixed", batch_size=batch, shuffle=packing.plan.shuffle)
    padded_plan = plan_epoch(fits, padded_config, seed=packing.seed, epoch=0, world_size=world_size)
    padded = _plan_figures(padded_plan, fits, capacity)
    padded["batch_size"] = batch
    window = packing.window
    return {
        "path": source.name if path is source else str(path), "source": type(source).__name__,
        "episodes": int(len(lengths)),
        "steps": int(lengths.sum()), "length": _stats(lengths), "lengths": lengths.tolist(),
        "fps": {f"{k:g}": v for k, v in sorted(collections.Counter(np.asarray(source.fps).tolist()).items())},
        "features": describe_features(source), "tasks": dict(tasks.most_common()),
        "forecast": {"mode": "windows" if window is not None else f"chunks of <= {packing.max_length} steps",
                     "features": planned.items.features, "capacity": capacity,
                     "rows_per_batch": packing.plan.rows_per_batch, "world_size": world_size,
                     "sample_tokens": _stats(tokens), "packed": packed, "padded": padded,
                     "planner": epoch_plan.planner, "planner_reason": epoch_plan.reason},
    }


def _stats(values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values)
    if values.size == 0:
        return {"min": 0, "median": 0, "mean": 0.0, "max": 0}
    return {"min": int(values.min()), "median": float(np.median(values)), "mean": float(values.mean()),
            "max": int(values.max())}


def _short(values: Any) -> str:
    """A statistic for one line: a scalar as is, a vector by its range."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 1:
        return f"{float(arr.reshape(-1)[0]):.4g}"
    return f"[{arr.min():.3g}..{arr.max():.3g}]"


_STAT_ORDER = ("mean", "std", "min", "max")


def format_features(features: dict[str, dict[str, Any]]) -> list[str]:
    """Lines listing :func:`describe_features`: name, kind, dtype, step shape, rate(s) and the stats held (a
    vector statistic shown by its range over the vector)."""
    if not features:
        return ["features: none"]
    width = max(len(name) for name in features)
    lines = [f"features ({len(features)}):"]
    for name, f in features.items():
        rates = "/".join(f"{r:g}" for r in f["rates"]) or f"{f['fps']:g}"
        stats = f["stats"]
        names = [k for k in _STAT_ORDER if k in stats] + sorted(k for k in stats if k not in (*_STAT_ORDER, "count"))
        held = "stats: " + " ".join(f"{k} {_short(stats[k])}" for k in names) if stats else "no stats"
        if "count" in stats:
            held += f" (n={_short(stats['count'])})"
        lines.append(f"  {name:<{width}}  {f['kind']:<5}  {f['dtype']:<7}  {str(f['shape']):<13}  {rates:>5} fps  "
                     f"{held}")
    return lines


def format_inspection(info: dict[str, Any]) -> str:
    """The text ``mmfeed inspect`` prints."""
    ln = info["length"]
    out = [f"{info['path']} ({info['source']}): {info['episodes']} episodes, {info['steps']} steps",
           f"episode length: min {ln['min']}, median {ln['median']:g}, mean {ln['mean']:.1f}, max {ln['max']}"]
    out += histogram(np.asarray(info["lengths"]))
    out.append("fps: " + ", ".join(f"{k} ({v} episodes)" for k, v in info["fps"].items()))
    out += format_features(info["features"])
    tasks = list(info["tasks"].items())
    more = " ..." if len(tasks) > 5 else ""
    out.append(f"tasks: {len(tasks)}: " + "; ".join(f"{t!r} x{n}" for t, n in tasks[:5]) + more)
    f = info["forecast"]
    st = f["sample_tokens"]
    out.append(f"\nforecast, one epoch: {f['mode']} of {', '.join(f['features'])}; capacity {f['capacity']}, rows "
               f"per batch {f['rows_per_batch']}, ranks {f['world_size']}; sample price {st['min']}-{st['max']} "
               f"tokens (median {st['median']:g})")
    p, q = f["packed"], f["padded"]
    out.append(f"  planner: {f['planner']} ({f['planner_reason']})")
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
