"""``mmfeed bench``: the loader on a robot dataset beside torch's DataLoader, with a simulated training step.

One run, one process, one dataset (synthetic and cached unless ``--data`` names shards or a LeRobot directory):

1. **capacity**: each loader is iterated with no step; samples/s, useful (non-padding) tokens/s, decoded
   frames/s and packing efficiency over ``repeats`` consecutive stretches of ``steps`` batches (after a warm-up);
2. **stall**: then with a simulated training step of ``1 / (0.8 x mmfeed's capacity in batches/s)`` (the loop
   asks for 80% of what mmfeed's pipeline can give, as ``bench/stall.py`` does) or ``--step-ms``; a host sleep,
   so the step does not compete with the workers for the CPU (it stands for GPU compute). The
   :class:`~mmfeed.loaders.StepTimer` gives the stall fraction (wait / step time) and the worker seconds per
   batch of each stage (read, decode, collate).

The systems: **mmfeed** = ``mmfeed.DataLoader(source, packing=...)`` (planned, packed rows, batch decode,
prefetch thread); **baseline** = ``torch.utils.data.DataLoader`` over a per-sample dataset that decodes each
sample's frames on its own and pads each batch to its longest sample, its batch size chosen for the same token
budget (``bench/loader.py``). Both get the same workers and the same step time per batch. Every figure is the
median over the repeats, and the per-repeat values are kept (``repeats``) for ``mmfeed compare``.

The JSON report (``--json``; ``schema_version`` 1): mmfeed's figures at the top level, ``samples_per_s``,
``tokens_per_s`` (useful tokens), ``frames_per_s``, ``packing_efficiency`` (useful tokens / token slots),
``stall_fraction``, ``wait_s`` (mean input wait per step), ``stage_s`` (``{read, decode, collate, ...}``: mean
worker seconds per batch) and ``repeats`` (``{figure: [per-repeat values]}``, nested figures dotted:
``stage_s.decode``); ``baseline`` holds the same figures (and its ``batch_size``); ``ratios`` mmfeed / baseline
per figure; ``bottleneck`` the StepTimer's diagnosis; ``sweep`` (with ``--sweep``) ``{workers, mmfeed: {figure:
[...]}, baseline: {...}}``; ``settings`` every setting (LoaderBench fields, data path, repeats, step_ms,
load_fraction, device, ...); ``environment`` versions, CPU count, git revision; ``details`` the step time used,
capacities in batches/s and wall seconds of each phase.
"""

from __future__ import annotations

import gc
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmfeed.bench.common import environment, table
from mmfeed.bench.loader import LoaderBench, PerSampleDataset, dataset_path, pad_collate
from mmfeed.loaders import DataLoader, StepTimer, open_dataset
from mmfeed.loaders.timing import TimedBatch, TimedCollate

__all__ = ["BenchRun", "DEFAULT_DATASET", "LOAD_FRACTION", "QUICK_DATASET", "render", "run_bench",
           "write_json"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
LOAD_FRACTION = 0.8  # the simulated step asks for 80% of mmfeed's capacity
BASELINE_NAME = "torch.utils.data.DataLoader, per-sample decode, pad-to-longest"

DEFAULT_DATASET = LoaderBench(episodes=10, min_length=100, max_length=160, height=240, width=320, codec="h264",
                              gop=30, cameras=("cam_high",), history=4, horizon=50, tokens_per_frame=256,
                              capacity=8192, rows_per_batch=2, episode_block=2, workers=2, steps=16, warmup=3)
"""What plain ``mmfeed bench`` measures: 10 episodes of 100-160 steps, one 320x240 H.264 camera (GOP 30),
windows of 4 history frames of ``observation.images.cam_high`` + ``observation.state`` + a 50-step ``action``
chunk (seconds at 30 fps), 256 tokens per frame, 2 rows of 8192 tokens."""

QUICK_DATASET = replace(DEFAULT_DATASET, episodes=4, min_length=30, max_length=40, height=64, width=96,
                        tokens_per_frame=16, capacity=512, steps=4, warmup=1)
"""``--quick``: tiny videos and few steps (a smoke run, for tests)."""


@dataclass(frozen=True, kw_only=True)
class BenchRun:
    """How ``mmfeed bench`` runs, beyond the dataset and loader settings (:class:`LoaderBench`).

    data: shards or a LeRobot directory to read instead of the synthetic dataset.
    repeats: measured stretches of ``LoaderBench.steps`` batches per figure (the median is reported).
    step_ms: simulated step in ms; None derives it from mmfeed's capacity (``LOAD_FRACTION``).
    device: where mmfeed's prefetcher puts batches ("cpu": a prefetch thread, nothing moved; "cuda").
    prefetch: batches mmfeed's prefetcher keeps ready.
    sweep: worker counts for the scaling curve (empty: none).
    progress: show progress bars on stderr.
    """

    data: str | None = None
    repeats: int = 3
    step_ms: float | None = None
    device: str = "cpu"
    prefetch: int = 2
    sweep: tuple[int, ...] = ()
    progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an integer >= 1, got {self.repeats!r}")
        if self.step_ms is not None and not self.step_ms >= 0:
            raise ValueError(f"step_ms must be >= 0 (or None to derive it from the capacity), got {self.step_ms!r}")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in self.sweep):
            raise ValueError(f"sweep worker counts must be integers >= 0, got {list(self.sweep)}")


# --------------------------------------------------------------------------------------------------- the systems


class _System:
    """A loader under test: ``next()`` gives one batch (timed by ``timer``), ``count(batch)`` what it holds,
    ``restart()`` starts a fresh epoch (so that a measured phase shorter than an epoch crosses no epoch boundary,
    whose pipeline refill would otherwise land in one repeat and not the others)."""

    def __init__(self, name: str, loader: Any, count: Callable[[Any], tuple[int, int, int, int]], timer: StepTimer,
                 fetch: Callable[[Iterator[Any]], Any] = next, batch_size: int | None = None) -> None:
        self.name, self.loader, self.count, self.timer, self.batch_size = name, loader, count, timer, batch_size
        self._fetch = fetch
        self._batches: Iterator[Any] | None = None

    def restart(self) -> None:
        self.close()
        self._batches = _forever(self.loader)

    def next(self) -> Any:
        if self._batches is None:
            self.restart()
        return self._fetch(self._batches)

    def close(self) -> None:
        if self._batches is not None:
            self._batches.close()
            self._batches = None


def _forever(loader: Any) -> Iterator[Any]:
    """Batches of successive epochs without end (the loader must not be empty)."""
    while True:
        yield from loader


def _mmfeed(cfg: LoaderBench, path: str, run: BenchRun) -> _System:
    timer = StepTimer(num_workers=cfg.workers)
    loader = DataLoader(open_dataset(path, backend=cfg.backend), packing=cfg.packing(), num_workers=cfg.workers,
                        persistent_workers=cfg.workers > 0, device=run.device, prefetch=run.prefetch, timer=timer)
    tokens = loader.dataset.items.tokens
    if len(tokens) and int(tokens.max()) > cfg.capacity:
        raise ValueError(f"samples cost up to {int(tokens.max())} tokens but --capacity is {cfg.capacity}: raise "
                         f"--capacity to at least {int(tokens.max())}")
    if len(loader) == 0:
        raise ValueError(f"{path}: the plan has no batch (episodes: {len(loader.dataset.source)}, samples: "
                         f"{len(tokens)}); lower --capacity or the rows per batch")
    videos = cfg.video_features

    def count(batch: Any) -> tuple[int, int, int, int]:
        frames = sum(len(batch.data[f]) for f in videos if f in batch.data)
        return (batch.num_documents, frames, int((batch.document_ids >= 0).sum()), batch.document_ids.numel())

    return _System("mmfeed", loader, count, timer)


def _baseline(cfg: LoaderBench, path: str, run: BenchRun) -> _System:
    ds = PerSampleDataset(cfg, Path(path))
    longest = int(ds.tokens.max())
    batch_size = max(1, cfg.rows_per_batch * cfg.capacity // longest)
    cuda = torch.device(run.device).type == "cuda"
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=cfg.workers,
                                         collate_fn=TimedCollate(pad_collate), pin_memory=cuda,
                                         generator=torch.Generator().manual_seed(cfg.seed),
                                         persistent_workers=cfg.workers > 0)
    timer = StepTimer(num_workers=cfg.workers)

    def fetch(batches: Iterator[TimedBatch]) -> dict[str, torch.Tensor]:
        timer.request()
        got = next(batches)
        batch = got.batch
        if cuda:  # the plain loop copies too (a blocking copy), inside the wait
            batch = {k: v.to(run.device) for k, v in batch.items()}
        timer.deliver(got.stages)
        return batch

    def count(batch: dict[str, torch.Tensor]) -> tuple[int, int, int, int]:
        n = len(batch["tokens"])
        frames = sum(batch[f].shape[0] * batch[f].shape[1] for f in cfg.video_features if f in batch)
        return n, frames, int(batch["tokens"].sum()), n * int(batch["tokens"].max())

    return _System("baseline", loader, count, timer, fetch, batch_size)


# ----------------------------------------------------------------------------------------------- measurement


def _segment(system: _System, steps: int, step_s: float, tick: Callable[[], object]) -> dict[str, Any]:
    """``steps`` batches with a ``step_s`` sleep after each; throughput and the timer's report of the stretch."""
    system.timer.reset()
    samples = frames = useful = slots = 0
    start = time.perf_counter()
    for _ in range(steps):
        batch = system.next()
        s, f, u, t = system.count(batch)
        samples, frames, useful, slots = samples + s, frames + f, useful + u, slots + t
        if step_s:
            time.sleep(step_s)
        tick()
    seconds = time.perf_counter() - start
    system.timer.request()  # closes the last step
    report = system.timer.local_report()
    per_step = system.timer.per_step()
    system.timer.reset()
    return {"seconds": seconds, "batches_per_s": steps / seconds, "samples_per_s": samples / seconds,
            "tokens_per_s": useful / seconds, "frames_per_s": frames / seconds,
            "packing_efficiency": useful / slots if slots else 0.0, "report": report, "per_step": per_step}


def _measure(system: _System, cfg: LoaderBench, run: BenchRun, step_s: float | None, repeats: int,
             bar: Any) -> tuple[dict[str, Any], float]:
    """Capacity stretches, then stepped stretches; the figures, their repeats, and the step used."""
    tick = bar.update
    system.restart()
    _segment(system, cfg.warmup, 0.0, tick)  # worker start-up, first plan, codec caches
    capacity = [_segment(system, cfg.steps, 0.0, tick) for _ in range(repeats)]
    if step_s is None:
        step_s = 1.0 / (LOAD_FRACTION * statistics.median(c["batches_per_s"] for c in capacity))
    system.restart()
    _segment(system, cfg.warmup, step_s, tick)  # the new epoch's refill, and settling into the stepped regime
    stepped = [_segment(system, cfg.steps, step_s, tick) for _ in range(repeats)]
    reps: dict[str, list[float]] = {k: [c[k] for c in capacity]
                                    for k in ("samples_per_s", "tokens_per_s", "frames_per_s", "packing_efficiency")}
    reps["stall_fraction"] = [s["report"]["stall_fraction"] for s in stepped]
    reps["wait_s"] = [s["report"]["wait_s"]["mean"] if s["report"]["wait_s"] else 0.0 for s in stepped]
    stages = sorted({k for s in stepped for k in s["report"]["stages"]})
    for name in stages:
        reps[f"stage_s.{name}"] = [s["report"]["stages"].get(name, {}).get("mean_s", 0.0) for s in stepped]
    figures: dict[str, Any] = {k: statistics.median(v) for k, v in reps.items() if not k.startswith("stage_s.")}
    figures["stage_s"] = {name: statistics.median(reps[f"stage_s.{name}"]) for name in stages}
    figures["repeats"] = reps
    typical = min(stepped, key=lambda s: abs(s["report"]["stall_fraction"] - figures["stall_fraction"]))
    figures["bottleneck"] = typical["report"]["bottleneck"]  # the diagnosis of the repeat nearest the median
    figures["per_step"] = {k: typical["per_step"][k] for k in ("wait_s", "compute_s")}
    figures["capacity_batches_per_s"] = statistics.median(c["batches_per_s"] for c in capacity)
    return figures, step_s


def _bar(run: BenchRun, total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="batch", leave=False, disable=not run.progress or None)


def _run_system(make: Callable[..., _System], cfg: LoaderBench, path: str, run: BenchRun, step_s: float | None,
                repeats: int) -> tuple[dict[str, Any], float]:
    """Build one system, measure it, and let its workers go before the next system starts."""
    total = 2 * cfg.warmup + 2 * repeats * cfg.steps
    system = None
    with _bar(run, total, f"{make.__name__.strip('_')} ({cfg.workers} workers)") as bar:
        try:
            system = make(cfg, path, run)
            figures, step_s = _measure(system, cfg, run, step_s, repeats, bar)
            figures["batch_size"] = system.batch_size
        finally:
            if system is not None:
                system.close()
            del system
            gc.collect()  # the loaders (and their persistent workers) go now, not during the next measurement
    return figures, step_s


def _ratios(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    keys = ("samples_per_s", "tokens_per_s", "frames_per_s", "packing_efficiency", "stall_fraction")
    return {k: (ours[k] / base[k] if base.get(k) else None) for k in keys}


def _source_settings(cfg: LoaderBench, run: BenchRun) -> tuple[LoaderBench, str, float]:
    """The dataset to read (synthesized and cached unless ``run.data``), the features a sample reads from it, and
    the seconds spent synthesizing."""
    start = time.perf_counter()
    if run.data is not None:
        return _given(cfg, open_dataset(run.data, backend=cfg.backend)), str(run.data), 0.0
    from tqdm import tqdm

    with tqdm(total=cfg.episodes, desc="synthesizing dataset (cached)", unit="episode", leave=False,
              disable=not run.progress or None) as bar:
        path = dataset_path(cfg, progress=bar.update)
    return cfg, str(path), time.perf_counter() - start


def _given(cfg: LoaderBench, source: Any) -> LoaderBench:
    """``cfg`` reading a given dataset: every video feature at its own rate, ``observation.state`` and ``action``
    where the dataset has them, at its control clock."""
    videos = tuple(f for f, feature in source.features.items() if feature.kind == "video")
    if not videos:
        raise ValueError(f"{source.name}: no video features; mmfeed bench measures video loading (its features: "
                         f"{sorted(source.features)})")
    rates = tuple(float(source.rates(f)[0]) for f in videos)
    return replace(cfg, format="given", videos=videos, video_fps=rates, fps=float(source.fps[0]), cameras=(),
                   state=cfg.state if cfg.state in source.features else None,
                   action=cfg.action if cfg.action in source.features else None)


def run_bench(cfg: LoaderBench = DEFAULT_DATASET, run: BenchRun = BenchRun()) -> dict[str, Any]:
    """Measure mmfeed and the baseline as the module docstring says; the report (JSON-ready dict).

    >>> report = run_bench(QUICK_DATASET, BenchRun(repeats=1, progress=False))   # doctest: +SKIP
    >>> report["samples_per_s"] > 0 and 0 <= report["stall_fraction"] <= 1        # doctest: +SKIP
    True
    """
    begin = time.perf_counter()
    cfg, path, synth_s = _source_settings(cfg, run)
    fixed = None if run.step_ms is None else run.step_ms / 1e3
    t0 = time.perf_counter()
    ours, step_s = _run_system(_mmfeed, cfg, path, run, fixed, run.repeats)
    ours.pop("batch_size")
    t1 = time.perf_counter()
    base, _ = _run_system(_baseline, cfg, path, run, step_s, run.repeats)
    t2 = time.perf_counter()
    base = {"name": BASELINE_NAME, **base}
    report: dict[str, Any] = {"benchmark": "mmfeed bench", "schema_version": SCHEMA_VERSION}
    internal = ("bottleneck", "capacity_batches_per_s", "per_step")
    report.update({k: v for k, v in ours.items() if k not in internal})
    report["baseline"] = {k: v for k, v in base.items() if k not in internal}
    report["ratios"] = _ratios(ours, base)
    report["bottleneck"] = ours["bottleneck"]
    if run.sweep:
        report["sweep"] = _sweep(cfg, path, run, step_s, {cfg.workers: (ours, base)})
    settings = {**asdict(cfg), "videos": list(cfg.video_features), "data": path, "repeats": run.repeats,
                "step_ms": run.step_ms, "load_fraction": None if run.step_ms is not None else LOAD_FRACTION,
                "device": run.device, "prefetch": run.prefetch, "sweep": list(run.sweep),
                "baseline_batch_size": base["batch_size"]}
    report["settings"] = settings
    report["environment"] = environment()
    report["details"] = {"step_s": step_s, "capacity_batches_per_s": ours["capacity_batches_per_s"],
                         "baseline_capacity_batches_per_s": base["capacity_batches_per_s"],
                         "baseline_bottleneck": base["bottleneck"],
                         # the stepped stretch nearest the median stall, step by step (mmfeed bench --plot)
                         "per_step": {"mmfeed": ours["per_step"], "baseline": base["per_step"]},
                         "wall_s": {"synthesis": synth_s, "mmfeed": t1 - t0, "baseline": t2 - t1,
                                    "total": time.perf_counter() - begin}}
    return report


def _sweep(cfg: LoaderBench, path: str, run: BenchRun, step_s: float,
           done: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The scaling curve: both systems at each worker count (one repeat each; the main run reused)."""
    keys = ("samples_per_s", "tokens_per_s", "frames_per_s", "stall_fraction")
    out: dict[str, Any] = {"workers": sorted(set(run.sweep)), "step_s": step_s,
                           "mmfeed": {k: [] for k in keys}, "baseline": {k: [] for k in keys}}
    for workers in out["workers"]:
        if workers not in done:
            at = replace(cfg, workers=workers)
            ours, _ = _run_system(_mmfeed, at, path, run, step_s, 1)
            base, _ = _run_system(_baseline, at, path, run, step_s, 1)
            done[workers] = (ours, base)
        for name, figures in zip(("mmfeed", "baseline"), done[workers]):
            for k in keys:
                out[name][k].append(figures[k])
    return out


# ------------------------------------------------------------------------------------------------- the table


def _fmt(value: float | None, kind: str) -> str:
    if value is None:
        return ""
    if kind == "pct":
        return f"{value:.1%}"
    if kind == "ms":
        return f"{value * 1e3:.2f}"
    if kind == "x":
        return f"{value:.2f}x"
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"


def render(report: dict[str, Any]) -> str:
    """The one table ``mmfeed bench`` prints: every figure for mmfeed and the baseline, and their ratio."""
    base = report["baseline"]
    rows = [("samples/s", "samples_per_s", ""), ("useful tokens/s", "tokens_per_s", ""),
            ("decoded frames/s", "frames_per_s", ""), ("packing efficiency", "packing_efficiency", "pct"),
            ("stall fraction", "stall_fraction", "pct"), ("wait per step (ms)", "wait_s", "ms")]
    out = []
    for label, key, kind in rows:
        ratio = report["ratios"].get(key) if key in report["ratios"] else (
            report[key] / base[key] if base.get(key) else None)
        out.append({"figure": label, "mmfeed": _fmt(report[key], kind), "baseline": _fmt(base.get(key), kind),
                    "ratio": _fmt(ratio, "x")})
    for name in sorted(set(report["stage_s"]) | set(base["stage_s"])):
        ours, theirs = report["stage_s"].get(name), base["stage_s"].get(name)
        out.append({"figure": f"{name} (ms/batch, workers)", "mmfeed": _fmt(ours, "ms"),
                    "baseline": _fmt(theirs, "ms"), "ratio": _fmt(ours / theirs if ours and theirs else None, "x")})
    s, d = report["settings"], report["details"]
    step = (f"{d['step_s'] * 1e3:.1f} ms ({s['load_fraction']:.0%} of mmfeed's capacity)"
            if s["step_ms"] is None else f"{d['step_s'] * 1e3:.1f} ms (--step-ms)")
    video = f"{s['width']}x{s['height']} {s['codec']}" if s["format"] != "given" else "given dataset"
    head = (f"mmfeed bench: {s['data']}\n  {video}, videos {','.join(s['videos'])}, {s['workers']} workers, "
            f"capacity {s['capacity']} x {s['rows_per_batch']} rows (baseline batch {s['baseline_batch_size']}), "
            f"step {step}, median of {s['repeats']} x {s['steps']} batches")
    text = [head, "", table(out, [("figure", "figure"), ("mmfeed", "mmfeed"), ("baseline", "baseline"),
                                  ("ratio", "mmfeed/baseline")])]
    text.append(f"\nbottleneck: {report['bottleneck']['recommendation']}")
    if "sweep" in report:
        sw = report["sweep"]
        text.append("workers scaling (samples/s): " + ", ".join(
            f"{w}: {a:.4g} vs {b:.4g}" for w, a, b in zip(sw["workers"], sw["mmfeed"]["samples_per_s"],
                                                           sw["baseline"]["samples_per_s"])))
    text.append(f"({d['wall_s']['total']:.1f} s)")
    return "\n".join(text)


def write_json(report: dict[str, Any], path: str | Path) -> None:
    """Write ``report`` as JSON (``mmfeed compare`` reads it)."""
    Path(path).write_text(json.dumps(report, indent=2, sort_keys=True, default=_json_default) + "\n",
                          encoding="utf-8")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    return str(obj)
