"""``mmfeed bench``: the loader on a variable-length robot workload beside torch's DataLoader and the decode limit.

One run, one process, one workload (``bench/loader.py``: a synthetic mixture of two embodiments, windowed policy
samples beside whole-episode world-model chunks, cached; or ``--data`` shards / a LeRobot directory). Two
systems read the very same samples, shuffled across the whole epoch alike:

- **mmfeed** = ``mmfeed.DataLoader`` over the planned dataset (packed rows, batch decode, prefetch thread);
- **baseline** = ``torch.utils.data.DataLoader`` over a per-sample dataset that decodes each sample's frames on
  its own and pads each batch to its longest sample, its batch size the most that fits mmfeed's token budget
  (``rows_per_batch x capacity`` slots) whatever the batch draws.

Both loaders are alive at once (their workers started) and measured stretch by stretch in turn, mmfeed, baseline,
mmfeed, baseline, ... so that a change in background load hits both alike. A stretch is an untimed lead-in (the
other loader's batches in flight finish meanwhile) and then ``steps`` timed batches (default: as many as
``stretch_s`` seconds hold, from the warm-up's rate; the same count in every repeat of one system):

1. **capacity**: no training step; samples/s, useful (non-padding) tokens/s, delivered frames/s (frames in the
   batches), decoded frames/s (frames the decoder produced for them, GOP dependencies included: counted in the
   workers by :func:`mmfeed.codecs._pyav.decode_totals`), packing efficiency and padding fraction
   (1 - useful tokens / token slots), the worker seconds per batch of each stage (read, decode, collate:
   :mod:`mmfeed.loaders.observe.timing`), and the CPU seconds the stretch used (this process and the loader's workers):
   useful tokens and frames per CPU-second, which other processes on the machine disturb less than the rates.
   After each mmfeed stretch, the **decode limit** (``bench/limit.py``): every other batch of that stretch
   decoded by plain PyAV in as many processes as the loader has workers, with and without RGB conversion;
   ``limit_fraction`` = mmfeed's delivered frames/s / the limit's (with conversion), ``limit_fraction_cpu`` the
   same per CPU-second;
2. **stall**: a simulated training step of ``1 / (0.8 x mmfeed's capacity in batches/s)`` (or ``--step-ms``)
   for a full batch (``rows_per_batch x capacity`` token slots), in proportion to a batch's slots (a padded
   baseline batch of fewer slots computes for less), a host sleep (it stands for GPU compute, so it does not
   compete for the CPU); the :class:`~mmfeed.loaders.StepTimer` gives the stall fraction (wait / step time) and
   the wait per step.

Every figure is the median over the repeats; the per-repeat values are kept (``repeats``) for ``mmfeed compare``.

The JSON report (``--json``; ``schema_version`` 2; version 1 had no limit, padding or decoded frames, and ran the
systems one after the other): mmfeed's figures at the top level: ``samples_per_s``, ``tokens_per_s``,
``frames_per_s`` (= ``delivered_frames_per_s``), ``decoded_frames_per_s``, ``packing_efficiency``,
``padding_fraction``, ``stall_fraction``, ``wait_s``, ``stage_s`` (``{read, decode, collate, ...}``: worker
seconds per batch, capacity stretches), ``tokens_per_cpu_second``, ``frames_per_cpu_second``,
``readers_opened_per_batch``, ``decode_limit_frames_per_s``, ``decode_limit_raw_frames_per_s`` (no conversion),
``limit_fraction``, ``limit_fraction_cpu``, ``repeats`` (``{figure: [per-repeat
values]}``, nested figures dotted: ``stage_s.decode``);
``baseline`` the same figures (no limit) and its ``batch_size``; ``ratios`` mmfeed / baseline; ``bottleneck``
the StepTimer's diagnosis; ``sweep`` (``--sweep``) ``{workers, mmfeed: {figure: [...]}, baseline: {...}}``;
``settings``; ``environment``; ``details``: ``spread`` (``{mmfeed|baseline|paired_ratios: {figure: {min, max,
range}}}``, range = (max - min) / median; the stages' seconds per batch as ``stage_s.<stage>``; under ``details``
so that ``mmfeed compare`` does not judge min and max as figures), ``paired_ratios`` (mmfeed / baseline round by
round), ``breakdown`` (where a batch's worker time goes, in seconds), ``limit`` (the limit's own figures, ``cpu_share``
below 1 when other processes took the CPUs too), ``steps`` and ``lead`` per system, ``slot_fraction``, the step time,
capacities and wall seconds.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from mmfeed._progress import progress_bar
from mmfeed.bench.common import child_pids, cpu_seconds, environment, spread
from mmfeed.bench.limit import LimitPool, limit_figures
from mmfeed.bench.loader import Embodiment, LoaderBench, PerSampleDataset, data_spec, pad_collate
from mmfeed.bench.plot import render
from mmfeed.codecs._pyav import decode_totals
from mmfeed.loaders import DataLoader, PlannedDataset, StepTimer, open_dataset
from mmfeed.loaders.clock import TimedBatch, TimedCollate

__all__ = ["BenchRun", "DEFAULT_DATASET", "LOAD_FRACTION", "QUICK_DATASET", "render", "run_bench", "write_json"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
LOAD_FRACTION = 0.8  # the simulated step asks for 80% of mmfeed's capacity
LEAD_S = 0.4  # untimed seconds before each stretch (at least the batches a loader holds in flight)
STEPPED_SHARE = 0.6  # a stepped stretch lasts this share of a capacity stretch
WARM_S = 1.0  # seconds of batches after the first ones before the stretches (reader caches, the OS's caches)
BASELINE_NAME = "torch.utils.data.DataLoader, per-sample decode, pad-to-longest"

DEFAULT_DATASET = LoaderBench(
    embodiments=(Embodiment(name="arm", cameras=("cam_high",), height=240, width=320),
                 Embodiment(name="bimanual", cameras=("cam_front", "cam_wrist"), height=192, width=256,
                            camera_fps=(("cam_front", 15.0),))),
    episodes=8, min_length=100, max_length=160, codec="h264", gop=30, tasks="varied", history=4, horizon=50,
    chunk_steps=32, tokens_per_frame=256, capacity=8192, rows_per_batch=2, episode_block=0, workers=2, steps=None,
    warmup=3)
"""What plain ``mmfeed bench`` measures: 8 episodes (100-160 steps at 30 Hz, H.264 GOP 30) of an arm with one
320x240 camera and 8 of a robot with two 256x192 cameras (front 15 fps, wrist 30 fps), tasks of 5-600 bytes;
windows (4 history frames per camera, the state, a 50-step action chunk) beside whole-episode chunks of up to 32
steps (every frame, state and action); 256 tokens per frame, 2 rows of 8192 tokens, shuffled across the epoch."""

QUICK_DATASET = replace(
    DEFAULT_DATASET,
    embodiments=(Embodiment(name="arm", cameras=("cam_high",), height=64, width=96),
                 Embodiment(name="bimanual", cameras=("cam_front", "cam_wrist"), height=48, width=64,
                            camera_fps=(("cam_front", 15.0),))),
    episodes=3, min_length=30, max_length=40, tasks="default", tokens_per_frame=16, capacity=512, chunk_steps=8,
    steps=4, warmup=1)
"""``--quick``: tiny videos and few steps (a smoke run, for tests)."""


@dataclass(frozen=True, kw_only=True)
class BenchRun:
    """How ``mmfeed bench`` runs, beyond the workload and loader settings (:class:`LoaderBench`).

    data: shards or a LeRobot directory to read instead of the synthetic dataset.
    repeats: measured stretches per system and phase (the median is reported).
    stretch_s: seconds a stretch lasts when ``LoaderBench.steps`` is None (its batches fixed from the warm-up).
    lead_s: untimed seconds before each stretch (and at least as many batches as the loader holds in flight).
    warm_s: untimed seconds of each loader's warm-up (after its first batches), before the first stretch.
    step_ms: simulated step in ms; None derives it from mmfeed's capacity (``LOAD_FRACTION``).
    device: where mmfeed's prefetcher puts batches ("cpu": a prefetch thread, nothing moved; "cuda").
    prefetch: batches mmfeed's prefetcher keeps ready.
    worker_mode: mmfeed's workers: "process" (torch's worker processes) or "thread" (threads of this process).
    limit: measure the decode limit.
    sweep: worker counts for the scaling curve (empty: none).
    progress: show progress bars on stderr (drawn only when it is a terminal).
    """

    data: str | None = None
    repeats: int = 5
    stretch_s: float = 1.5
    lead_s: float = LEAD_S
    warm_s: float = WARM_S
    step_ms: float | None = None
    device: str = "cpu"
    prefetch: int = 2
    worker_mode: str = "process"
    limit: bool = True
    sweep: tuple[int, ...] = ()
    progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an integer >= 1, got {self.repeats!r}")
        if not self.stretch_s > 0 or not self.lead_s >= 0 or not self.warm_s >= 0:
            raise ValueError(f"stretch_s must be > 0, lead_s and warm_s >= 0, got {self.stretch_s!r}, "
                             f"{self.lead_s!r}, {self.warm_s!r}")
        if self.step_ms is not None and not self.step_ms >= 0:
            raise ValueError(f"step_ms must be >= 0 (or None to derive it from the capacity), got {self.step_ms!r}")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in self.sweep):
            raise ValueError(f"sweep worker counts must be integers >= 0, got {list(self.sweep)}")


# --------------------------------------------------------------------------------------------------- the systems


class _System:
    """A loader under test: ``next()`` gives one batch (timed by ``timer``), ``count(batch)`` what it holds
    (samples, delivered frames, decoded frames, useful tokens, token slots, sample ids or None); ``depth`` the
    batches it holds in flight. ``ensure(n)`` starts a fresh epoch unless ``n`` more batches fit in this one, so
    that no measured stretch crosses an epoch boundary where epochs are long enough (the refill lands in the
    untimed lead-in)."""

    def __init__(self, name: str, loader: Any, count: Callable[[Any], tuple], timer: StepTimer, depth: int,
                 budget: int, fetch: Callable[[Iterator[Any]], Any] = next, batch_size: int | None = None) -> None:
        self.name, self.loader, self.count, self.timer, self.depth = name, loader, count, timer, depth
        self.budget = budget  # token slots of a full batch: the simulated step is per this many slots
        self.pids: set[int] = set()  # its worker processes (their CPU seconds count to its stretches)
        self.batch_size, self._fetch = batch_size, fetch
        self._batches: Iterator[Any] | None = None
        self.taken = 0

    def ensure(self, n: int) -> None:
        if self._batches is None or self.taken + n > len(self.loader) - 1:
            self.close()
            self._batches, self.taken = iter(self.loader), 0

    def next(self) -> Any:
        try:
            batch = self._fetch(self._batches)
        except StopIteration:  # an epoch shorter than a stretch (a small dataset): the next one goes on
            self._batches, self.taken = iter(self.loader), 0
            batch = self._fetch(self._batches)
        self.taken += 1
        return batch

    def close(self) -> None:
        batches, self._batches = self._batches, None
        getattr(batches, "close", lambda: None)()


class _Counted(PlannedDataset):
    """mmfeed's planned dataset; each batch also carries ``metadata["frames_decoded"]`` and
    ``metadata["readers_opened"]``, the frames its worker's decoders produced and the video readers it opened
    while building it (nothing else changes)."""

    def __getitem__(self, key: Any) -> Any:
        before = decode_totals()
        batch = super().__getitem__(key)
        after = decode_totals()
        batch.metadata["frames_decoded"] = after["frames_decoded"] - before["frames_decoded"]
        batch.metadata["readers_opened"] = after["opened"] - before["opened"]
        return batch


def _mmfeed(cfg: LoaderBench, data: Any, run: BenchRun) -> _System:
    timer = StepTimer(num_workers=cfg.workers)
    planned = cfg.planned(open_dataset(data, backend=cfg.backend), dataset=_Counted)
    loader = DataLoader(planned, num_workers=cfg.workers, persistent_workers=cfg.workers > 0, device=run.device,
                        prefetch=run.prefetch, timer=timer, worker_mode=run.worker_mode)
    tokens = planned.items.table.tokens
    if len(tokens) and int(tokens.max()) > cfg.capacity:
        raise ValueError(f"samples cost up to {int(tokens.max())} tokens but --capacity is {cfg.capacity}: raise "
                         f"--capacity to at least {int(tokens.max())}")
    if len(loader) == 0:
        raise ValueError(f"{data}: the plan has no batch (episodes: {len(planned.source)}, samples: "
                         f"{len(tokens)}); lower --capacity or the rows per batch")
    videos = cfg.video_features

    def count(batch: Any) -> tuple:
        frames = sum(len(batch.data[f]) for f in videos if f in batch.data)
        meta = batch.metadata
        return (batch.num_documents, frames, int(meta.get("frames_decoded", 0)), int(meta.get("readers_opened", 0)),
                int((batch.document_ids >= 0).sum()), batch.document_ids.numel(), meta["sample"].numpy())

    depth = 2 * cfg.workers + run.prefetch  # torch's prefetch_factor per worker, and the prefetch thread
    return _System("mmfeed", loader, count, timer, depth, cfg.rows_per_batch * cfg.capacity)


def _baseline(cfg: LoaderBench, data: Any, run: BenchRun) -> _System:
    ds = PerSampleDataset(cfg, data)
    batch_size = max(1, cfg.rows_per_batch * cfg.capacity // int(ds.tokens.max()))
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

    def count(batch: dict[str, torch.Tensor]) -> tuple:
        n = len(batch["tokens"])
        return (n, int(batch["frames"].sum()), int(batch["frames_decoded"].sum()),
                int(batch["readers_opened"].sum()), int(batch["tokens"].sum()), n * int(batch["tokens"].max()), None)

    return _System("baseline", loader, count, timer, 2 * cfg.workers, cfg.rows_per_batch * cfg.capacity, fetch,
                   batch_size)


# ----------------------------------------------------------------------------------------------- measurement


def _segment(system: _System, steps: int, step_s: float, tick: Callable[[], object],
             keep: bool = False) -> dict[str, Any]:
    """``steps`` batches, after each a sleep of ``step_s`` per ``budget`` token slots of the batch (the
    compute of a step grows with the padded tensor it runs on); throughput, the timer's report of the stretch
    and, with ``keep``, the batches' sample ids."""
    system.timer.reset()
    totals = np.zeros(6, dtype=np.int64)
    kept = []
    cpu = time.process_time() + cpu_seconds(system.pids)  # this process (all its threads) and the workers
    start = time.perf_counter()
    for _ in range(steps):
        *counts, ids = system.count(system.next())
        totals += counts
        if keep:
            kept.append(ids)
        if step_s:
            time.sleep(step_s * counts[-1] / system.budget)
        tick()
    seconds = max(time.perf_counter() - start, 1e-9)
    cpu = max(time.process_time() + cpu_seconds(system.pids) - cpu, 1e-9)
    system.timer.request()  # closes the last step
    report, per_step = system.timer.local_report(), system.timer.per_step()
    system.timer.reset()
    samples, frames, decoded, opened, useful, slots = totals.tolist()
    return {"seconds": seconds, "batches_per_s": steps / seconds, "samples_per_s": samples / seconds,
            "tokens_per_s": useful / seconds, "frames_per_s": frames / seconds,
            "delivered_frames_per_s": frames / seconds,
            "decoded_frames_per_s": decoded / seconds if decoded or not frames else None,
            "tokens_per_cpu_second": useful / cpu, "frames_per_cpu_second": frames / cpu,
            "packing_efficiency": useful / slots if slots else 0.0,
            "padding_fraction": 1.0 - useful / slots if slots else 0.0, "report": report, "per_step": per_step,
            "batches": kept, "opened_per_batch": opened / max(steps, 1),
            "slot_fraction": slots / (max(steps, 1) * system.budget)}


_CAPACITY = ("samples_per_s", "tokens_per_s", "frames_per_s", "delivered_frames_per_s", "decoded_frames_per_s",
             "tokens_per_cpu_second", "frames_per_cpu_second", "packing_efficiency", "padding_fraction")


def _stretch(system: _System, lead: int, steps: int, step_s: float, tick: Callable[[], object],
             keep: bool = False) -> dict[str, Any]:
    system.ensure(lead + steps)
    _segment(system, lead, step_s, tick)
    return _segment(system, steps, step_s, tick, keep)


def _interleaved(systems: list[_System], limit: LimitPool | None, cfg: LoaderBench, run: BenchRun,
                 step_s: float | None, repeats: int, bar: Any) -> tuple[dict[str, dict[str, Any]], float, dict]:
    """Warm-up, then ``repeats`` rounds of capacity stretches (each mmfeed stretch followed by the limit), then
    ``repeats`` rounds of stepped stretches; the figures of each system, the step used and the details."""
    tick = bar.update
    steps, lead, rates = {}, {}, {}
    opens: list[tuple[int, float]] = []  # (videos opened, seconds) of each limit measurement
    for s in systems:  # worker start-up, first plan, codec caches (about WARM_S); then the rate of the stretches
        before = child_pids()
        s.ensure(1)
        first = _segment(s, max(cfg.warmup, s.depth), 0.0, tick)
        s.pids = child_pids() - before  # the workers it started
        more = max(cfg.warmup, s.depth, math.ceil(run.warm_s * first["batches_per_s"]))
        probe = _segment(s, more, 0.0, tick, keep=limit is not None and s.name == "mmfeed")
        rates[s.name] = probe["batches_per_s"]
        steps[s.name] = cfg.steps or max(8, math.ceil(run.stretch_s * rates[s.name]))
        lead[s.name] = max(cfg.warmup, s.depth, math.ceil(run.lead_s * rates[s.name]))
        if probe["batches"]:  # opens the videos (timing each open), imports, first decoders
            got = limit.measure(probe["batches"])["rgb"]
            opens.append((got["opened"], got["open_s"]))
    capacity: dict[str, list] = {s.name: [] for s in systems}
    limits: dict[str, list] = {"rgb": [], "raw": []}
    for _ in range(repeats):
        for s in systems:
            keep = limit is not None and s.name == "mmfeed"
            capacity[s.name].append(_stretch(s, lead[s.name], steps[s.name], 0.0, tick, keep))
        if limit is not None:  # every other batch of the mmfeed stretch, with and without conversion
            got = limit.measure(capacity["mmfeed"][-1]["batches"][::2], lead=2)
            for variant in limits:
                limits[variant].append(got[variant])
            opens.append((got["rgb"]["opened"], got["rgb"]["open_s"]))
    mm = statistics.median(c["batches_per_s"] for c in capacity["mmfeed"])
    step_s = 1.0 / (LOAD_FRACTION * mm) if step_s is None else step_s
    stepped: dict[str, list] = {s.name: [] for s in systems}
    stepped_steps, stepped_lead = {}, {}
    for s in systems:  # a batch takes its step (in proportion to its slots) or the time the loader needs
        slots = statistics.mean(c["slot_fraction"] for c in capacity[s.name])
        per_batch = max(step_s * slots, 1.0 / statistics.median(c["batches_per_s"] for c in capacity[s.name]))
        stepped_steps[s.name] = cfg.steps or max(8, math.ceil(STEPPED_SHARE * run.stretch_s / per_batch))
        stepped_lead[s.name] = max(cfg.warmup, math.ceil(run.lead_s / per_batch))
    for _ in range(repeats):
        for s in systems:
            stepped[s.name].append(_stretch(s, stepped_lead[s.name], stepped_steps[s.name], step_s, tick))
    out = {s.name: _figures(capacity[s.name], stepped[s.name]) for s in systems}
    if limit is not None:
        open_s = sum(t for _, t in opens) / max(sum(n for n, _ in opens), 1)
        limit_figures(out["mmfeed"], capacity["mmfeed"], limits, cfg.workers, open_s)
    details = {"steps": steps, "lead": lead, "stepped_steps": stepped_steps, "stepped_lead": stepped_lead,
               "warmup_batches_per_s": rates,
               # token slots of a stepped batch / rows x capacity: the share of the full step it was given
               "slot_fraction": {n: statistics.mean(c["slot_fraction"] for c in v) for n, v in stepped.items()}}
    if {"mmfeed", "baseline"} <= set(capacity):  # mmfeed / baseline of each round: both saw the same moment
        details["paired_ratios"] = {k: [a[k] / b[k] for a, b in zip(capacity["mmfeed"], capacity["baseline"])]
                                    for k in ("samples_per_s", "tokens_per_s", "delivered_frames_per_s",
                                              "tokens_per_cpu_second")}
    return out, step_s, details


def _figures(capacity: list[dict[str, Any]], stepped: list[dict[str, Any]]) -> dict[str, Any]:
    reps: dict[str, list] = {k: [c[k] for c in capacity] for k in _CAPACITY}
    if any(v is None for v in reps["decoded_frames_per_s"]):  # a backend without the counter (decord)
        del reps["decoded_frames_per_s"]
    reps["stall_fraction"] = [s["report"]["stall_fraction"] for s in stepped]
    reps["wait_s"] = [s["report"]["wait_s"]["mean"] if s["report"]["wait_s"] else 0.0 for s in stepped]
    stages = sorted({k for c in capacity for k in c["report"]["stages"]})
    for name in stages:
        reps[f"stage_s.{name}"] = [c["report"]["stages"].get(name, {}).get("mean_s", 0.0) for c in capacity]
    figures: dict[str, Any] = {k: statistics.median(v) for k, v in reps.items() if not k.startswith("stage_s.")}
    figures.setdefault("decoded_frames_per_s", None)
    figures["stage_s"] = {name: statistics.median(reps[f"stage_s.{name}"]) for name in stages}
    figures["repeats"] = reps
    typical = min(stepped, key=lambda s: abs(s["report"]["stall_fraction"] - figures["stall_fraction"]))
    figures["bottleneck"] = typical["report"]["bottleneck"]  # the diagnosis of the repeat nearest the median
    figures["per_step"] = {k: typical["per_step"][k] for k in ("wait_s", "compute_s")}
    figures["capacity_batches_per_s"] = statistics.median(c["batches_per_s"] for c in capacity)
    figures["readers_opened_per_batch"] = statistics.median(c["opened_per_batch"] for c in capacity)
    return figures


def _measure_pair(cfg: LoaderBench, data: Any, run: BenchRun, step_s: float | None, repeats: int,
                  with_limit: bool) -> tuple[dict[str, dict[str, Any]], float, dict]:
    """Build both systems (and the limit's processes, forked first), measure them interleaved, let them go."""
    systems: list[_System] = []
    limit = None
    with progress_bar(desc=f"mmfeed and baseline, interleaved ({cfg.workers} workers)", unit="batch",
                      enabled=run.progress) as bar:
        try:
            systems.append(_mmfeed(cfg, data, run))
            if with_limit:
                limit = LimitPool(systems[0].loader.dataset.items, cfg.workers)
            systems.append(_baseline(cfg, data, run))
            figures, step_s, details = _interleaved(systems, limit, cfg, run, step_s, repeats, bar)
            figures["baseline"]["batch_size"] = systems[1].batch_size
        finally:
            for s in systems:
                s.close()
            if limit is not None:
                limit.close()
            del systems
            gc.collect()  # the loaders (and their persistent workers) go now, not during the next measurement
    return figures, step_s, details


_RATIOS = ("samples_per_s", "tokens_per_s", "frames_per_s", "decoded_frames_per_s", "tokens_per_cpu_second",
           "packing_efficiency", "padding_fraction", "stall_fraction")


def _ratios(ours: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    return {k: (ours[k] / base[k] if ours.get(k) is not None and base.get(k) else None) for k in _RATIOS}


def _source_settings(cfg: LoaderBench, run: BenchRun) -> tuple[LoaderBench, Any, float]:
    """The dataset to read (synthesized and cached unless ``run.data``), the features a sample reads from it, and
    the seconds spent synthesizing."""
    start = time.perf_counter()
    if run.data is not None:
        return cfg.given(open_dataset(run.data, backend=cfg.backend)), str(run.data), 0.0
    total = sum(d.episodes for d in cfg.datasets())
    with progress_bar(total, desc="synthesizing dataset (cached)", unit="episode", enabled=run.progress) as bar:
        data = data_spec(cfg, progress=bar.update)
    return cfg, data, time.perf_counter() - start


_INTERNAL = ("bottleneck", "capacity_batches_per_s", "per_step", "breakdown", "limit")


def run_bench(cfg: LoaderBench = DEFAULT_DATASET, run: BenchRun = BenchRun()) -> dict[str, Any]:
    """Measure mmfeed, the baseline and the decode limit as the module docstring says; the report (JSON-ready).

    >>> report = run_bench(QUICK_DATASET, BenchRun(repeats=1, progress=False))   # doctest: +SKIP
    >>> report["samples_per_s"] > 0 and 0 <= report["stall_fraction"] <= 1        # doctest: +SKIP
    True
    """
    begin = time.perf_counter()
    cfg, data, synth_s = _source_settings(cfg, run)
    fixed = None if run.step_ms is None else run.step_ms / 1e3
    t0, load = time.perf_counter(), list(os.getloadavg())
    figures, step_s, details = _measure_pair(cfg, data, run, fixed, run.repeats, run.limit)
    ours, base = figures["mmfeed"], {"name": BASELINE_NAME, **figures["baseline"]}
    report: dict[str, Any] = {"benchmark": "mmfeed bench", "schema_version": SCHEMA_VERSION}
    report.update({k: v for k, v in ours.items() if k not in _INTERNAL})
    report["baseline"] = {k: v for k, v in base.items() if k not in _INTERNAL}
    report["ratios"] = _ratios(ours, base)
    report["bottleneck"] = ours["bottleneck"]
    if run.sweep:
        report["sweep"] = _sweep(cfg, data, run, step_s, {cfg.workers: (ours, base)})
    report["settings"] = {**asdict(cfg), "videos": list(cfg.video_features), "data": data, "repeats": run.repeats,
                          "stretch_s": run.stretch_s, "lead_s": run.lead_s, "warm_s": run.warm_s,
                          "step_ms": run.step_ms, "load_fraction": None if run.step_ms is not None else LOAD_FRACTION,
                          "device": run.device, "prefetch": run.prefetch, "worker_mode": run.worker_mode,
                          "limit": run.limit, "sweep": list(run.sweep),
                          "baseline_batch_size": base["batch_size"]}
    report["environment"] = environment()
    keys = [k for k in (*_CAPACITY, "stall_fraction", "wait_s", "decode_limit_frames_per_s",
                        "decode_limit_raw_frames_per_s", "limit_fraction", "limit_fraction_cpu")
            if k in ours["repeats"]]
    keys += sorted({k for f in (ours, base) for k in f["repeats"] if k.startswith("stage_s.")})  # worker s per batch
    report["details"] = {
        **details, "step_s": step_s, "capacity_batches_per_s": ours["capacity_batches_per_s"],
        "baseline_capacity_batches_per_s": base["capacity_batches_per_s"], "baseline_bottleneck": base["bottleneck"],
        "spread": {**{name: {k: spread(f["repeats"][k]) for k in keys if k in f["repeats"]}
                      for name, f in (("mmfeed", ours), ("baseline", base))},
                   "paired_ratios": {k: spread(v) for k, v in details.get("paired_ratios", {}).items()}},
        "breakdown": ours.get("breakdown"), "limit": ours.get("limit"),
        # the stepped stretch nearest the median stall, step by step (mmfeed bench --plot)
        "per_step": {"mmfeed": ours["per_step"], "baseline": base["per_step"]},
        "loadavg": {"start": load, "end": list(os.getloadavg())},  # other processes on the machine
        "wall_s": {"synthesis": synth_s, "measurement": time.perf_counter() - t0,
                   "total": time.perf_counter() - begin}}
    return report


def _sweep(cfg: LoaderBench, data: Any, run: BenchRun, step_s: float,
           done: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The scaling curve: both systems at each worker count (one interleaved round each; the main run reused)."""
    keys = ("samples_per_s", "tokens_per_s", "frames_per_s", "stall_fraction")
    out: dict[str, Any] = {"workers": sorted(set(run.sweep)), "step_s": step_s,
                           "mmfeed": {k: [] for k in keys}, "baseline": {k: [] for k in keys}}
    for workers in out["workers"]:
        if workers not in done:
            figures, _, _ = _measure_pair(replace(cfg, workers=workers), data, run, step_s, 1, False)
            done[workers] = (figures["mmfeed"], figures["baseline"])
        for name, figures in zip(("mmfeed", "baseline"), done[workers]):
            for k in keys:
                out[name][k].append(figures[k])
    return out


def write_json(report: dict[str, Any], path: Any) -> None:
    """Write ``report`` as JSON (``mmfeed compare`` reads it)."""
    from pathlib import Path

    Path(path).write_text(json.dumps(report, indent=2, sort_keys=True, default=_json_default) + "\n",
                          encoding="utf-8")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, (tuple, set)):
        return list(obj)
    return str(obj)
