"""Benchmark: NVDEC decode, prefetch overlap, FlexAttention and device transforms on one CUDA device, one table.

``mmfeed bench gpu [--json OUT] [--quick]``.

Four parts, each guarded on its own (a part that cannot run says why in its row and the run goes on):

1. ``decode``: NVDEC against PyAV on the CPU, on synthetic H.264 videos (GOP 30) written here at 224x224 and
   1280x720, read through :class:`mmfeed.codecs.VideoReaderCache` as :mod:`mmfeed.bench.gpu_decode` reads them
   (its request batches and outputs allocated outside the timing): every frame in order (``sequential``) and random
   windows of 2 frames (``windows``). The GPU decoders are :mod:`mmfeed.bench.gpu_decode`'s that run here: PyAV's
   bundled FFmpeg (``backend="pyav", device="cuda"``; a plain ``pip install av``) and torchcodec's CUDA build
   (``backend="torchcodec"``, skipped with its reason where it is not installed), frames left on the GPU as RGB.
   Figures: frames per wall second and CPU seconds of this process per 1000 frames, medians of the repeats, the
   decoders interleaved; ``nvdec`` False says the decoder fell back to the CPU for that video.
2. ``prefetch``: a packed loader (:class:`mmfeed.DataLoader` with ``packing=``, an in-memory robot dataset of
   224x224 frames, 4 worker processes) feeding a model step of known GPU time (a loop of bf16 matmuls calibrated to
   :data:`STEP_MS`, then a synchronize, as ``loss.item()`` would), once with ``device="cuda", prefetch=2`` (the
   copy on the prefetch side stream) and once with ``device=None`` and the copy in the loop
   (``batch.to("cuda")``). From the loader's :class:`~mmfeed.loaders.observe.timing.StepTimer`: step, wait, copy
   and compute ms per step (the first steps left out as warm-up); ``copy_hidden`` is True when, with prefetch, the
   loop waited less than 5% of its step time (the timer's stall threshold) while the copy took ``copy_ms``.
3. ``attention``: for one packed row of 8k, 32k and 128k tokens (documents of 64-4096 tokens, every other one
   block-causal video in 256-token frames), ``PackedBatch.block_mask()`` on CUDA (ms, median of 3) and one
   compiled ``flex_attention`` forward (bf16, 8 heads of 64; compile seconds apart) against
   ``scaled_dot_product_attention`` with the dense ``attention_mask()`` where it fits in memory (rows up to
   32k tokens), with the largest absolute difference of the two; and on a small row (1024 tokens, float32) whether
   the two outputs agree (``torch.allclose``, atol = rtol = 1e-3).
4. ``device transforms``: :mod:`mmfeed.bench.device_transforms` with ``device="cuda"``: a packed loader of
   640x480 frames (240x320 with ``--quick``) with normalize, camera dropout, colour jitter and a random resized
   crop to 224 in the workers, one sample at a time, against the same chain on each batch on the GPU after the
   copy (``device_transform=``), and no transform as the floor; samples/s, CPU seconds per 1000 samples (the
   training process and its workers) and the transform's ms per batch, medians of interleaved rounds.

Without CUDA it prints one line and exits 0. ``--quick`` runs the smallest sizes (224x224 decode, an 8k row, a
small loader). CI has no GPU; the README gives the figures of a run on one H100 and its time.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mmfeed.bench.common import environment, median_time, table

__all__ = ["NO_CUDA", "attention_rows", "decode_rows", "device_transform_rows", "flex_matches_sdpa", "main",
           "matmul_step", "measure_decode", "measure_overlap", "overlap_rows", "packed_row", "run_parts",
           "write_videos"]

NO_CUDA = "mmfeed bench gpu: no CUDA device (torch.cuda.is_available() is False); nothing to measure"
"""The one line printed where there is no CUDA device."""

CAM = "observation.images.cam_high"
DECODE_SIZES = [(224, 224), (720, 1280)]
"""(height, width) of the decode part's videos (``--quick``: the first only)."""
DECODE_FRAMES = {(224, 224): 300, (720, 1280): 120}
DECODE_GOP = 30
ROW_TOKENS = [8192, 32768, 131072]
"""Tokens of the attention part's packed rows (``--quick``: the first only)."""
DENSE_MAX_TOKENS = 32768
"""The longest row SDPA gets a dense mask for (R * C^2 bytes of mask, and several times that while building it)."""
CHECK_TOKENS = 1024
HEADS, HEAD_DIM, BLOCK = 8, 64, 128
STEP_MS = {"full": 30.0, "quick": 10.0}
"""Model step GPU time the matmul loop is calibrated to."""
WARMUP_STEPS = 2

log = logging.getLogger(__name__)

Row = dict[str, Any]


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _failed(part: str, err: BaseException) -> Row:
    log.warning("%s failed", part, exc_info=True)
    return {"part": part, "case": "-", "note": f"failed: {type(err).__name__}: {' '.join(str(err).split())}"}


# ------------------------------------------------------------------------------------------------ 1. decode


def write_videos(folder: str | Path, sizes: list[tuple[int, int]], frames: Mapping[tuple[int, int], int] | int,
                 gop: int = DECODE_GOP) -> list[str]:
    """Write one synthetic H.264 video per (height, width) into ``folder`` (:func:`mmfeed.testing.write_video`,
    the pattern frames carrying their index); ``frames`` per size, or one count for all. Returns the paths."""
    from mmfeed.bench.gpu_decode import _write_videos

    paths = []
    for size in sizes:
        n = frames if isinstance(frames, int) else frames[size]
        paths += _write_videos(str(folder), [("h264", gop, size)], n)
    return paths


def measure_decode(path: str, decoders: Mapping[str, Mapping[str, Any]], repeats: int, seed: int = 0) -> list[Row]:
    """One row per workload (``sequential``, ``windows``) of one video: per decoder (name -> VideoReaderCache
    options), the median frames per wall second and CPU seconds per 1000 frames over ``repeats`` passes, the
    decoders interleaved with their order rotating; ``nvdec``: per GPU decoder, whether NVDEC decoded the video."""
    from mmfeed.bench.gpu_decode import _reader_run, nvdec_used, window_batches
    from mmfeed.codecs import VideoReaderCache, probe

    info = probe(path)
    workloads = {"sequential": [[np.arange(info.num_frames)]], "windows": window_batches(info.num_frames, 4, seed)}
    caches = {name: VideoReaderCache(max_open=1, **opts) for name, opts in decoders.items()}
    rows = []
    try:
        for workload, batches in workloads.items():
            runs = {name: _reader_run(cache, path, batches) for name, cache in caches.items()}
            for run in runs.values():  # warm-up: open the file and the decoder (NVDEC's session)
                run()
            wall: dict[str, list[float]] = {name: [] for name in runs}
            cpu: dict[str, list[float]] = {name: [] for name in runs}
            names = list(runs)
            for r in range(max(1, repeats)):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    t0, c0 = time.perf_counter(), time.process_time()
                    n = runs[name]()
                    t1, c1 = time.perf_counter(), time.process_time()
                    wall[name].append(n / max(t1 - t0, 1e-9))
                    cpu[name].append(1000.0 * (c1 - c0) / max(n, 1))
            row: Row = {"video": f"h264 {info.width}x{info.height}", "workload": workload}
            for name in names:
                row[f"{name}_frames_per_s"] = statistics.median(wall[name])
                row[f"{name}_cpu_s_per_1000"] = statistics.median(cpu[name])
            gpus = [name for name, options in decoders.items() if options.get("device")]
            if gpus:
                row["nvdec"] = {name: nvdec_used(caches[name], path) for name in gpus}
            rows.append(row)
    finally:
        for cache in caches.values():
            cache.close()
    return rows


def decode_rows(quick: bool, repeats: int = 3, *, gpus: Mapping[str, Mapping[str, Any]] | None = None,
                sizes: list[tuple[int, int]] | None = None, frames: int | None = None) -> list[Row]:
    """Part 1's rows: PyAV on the CPU against each GPU decoder, interleaved. ``gpus``: name -> VideoReaderCache
    options; default, the GPU decoders of :func:`mmfeed.bench.gpu_decode.usable_decoders` that run here, with one
    skipped row, saying why, per one that cannot."""
    from mmfeed.bench.gpu_decode import usable_decoders

    rows: list[Row] = []
    if gpus is None:
        usable, why = usable_decoders()
        gpus = {name: options for name, options in usable.items() if options.get("device")}
        for name in ("pyav_cuda", "torchcodec_cuda"):
            if name in why:
                print(f"decode: {name} skipped, GPU decode is unavailable here: {why[name]}")
                rows.append({"part": "decode", "case": name, "note": f"skipped: {why[name]}"})
    if not gpus:
        return rows
    sizes = sizes or (DECODE_SIZES[:1] if quick else DECODE_SIZES)
    counts: Mapping[tuple[int, int], int] | int = frames or ({s: 60 for s in sizes} if quick else DECODE_FRAMES)
    with tempfile.TemporaryDirectory(prefix="mmfeed-bench-gpu-") as folder:
        for path in write_videos(folder, sizes, counts):
            for r in measure_decode(path, {"pyav": {"backend": "pyav"}, **gpus}, repeats):
                for name in gpus:
                    rows.append({"part": "decode", "case": f"{r['video']} {r['workload']}",
                                 "baseline": f"pyav {r['pyav_frames_per_s']:.0f} f/s, "
                                             f"{r['pyav_cpu_s_per_1000']:.2f} CPU-s/1000 f",
                                 "gpu": f"{name} {r[f'{name}_frames_per_s']:.0f} f/s, "
                                        f"{r[f'{name}_cpu_s_per_1000']:.2f} CPU-s/1000 f",
                                 "gain": r[f"{name}_frames_per_s"] / r["pyav_frames_per_s"],
                                 "note": f"nvdec={r.get('nvdec', {}).get(name)}", "decoder": name, **r})
    return rows


# ------------------------------------------------------------------------------------------------ 2. prefetch


def matmul_step(device: Any, target_ms: float, size: int | None = None) -> tuple[Callable[[Any], None], float]:
    """A model step of known time on ``device``: a loop of ``size`` x ``size`` matmuls (bf16 on CUDA, float32 on
    the CPU) calibrated to about ``target_ms`` (twice: from 8 matmuls, then at the count found), reading the
    batch's frames first (so it depends on the copy) and synchronizing at the end (as ``loss.item()`` does).
    Returns ``(step(batch), measured ms of the step alone)``, the measurement a median of 5 steps."""
    import torch

    if not target_ms > 0:
        raise ValueError(f"target_ms must be > 0, got {target_ms!r}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    size = size or (4096 if cuda else 256)
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(size, size, generator=g).to(dev, dtype)
    b = (torch.randn(size, size, generator=g) / size**0.5).to(dev, dtype)
    out = torch.empty_like(a)

    def matmuls(k: int) -> None:
        for _ in range(k):
            torch.matmul(a, b, out=out)

    def timed(k: int) -> float:
        seconds, _ = median_time(lambda: (matmuls(k), _sync(dev)), repeats=3)
        return max(seconds / k, 1e-9)

    k = max(1, round(target_ms / 1e3 / timed(8)))
    k = max(1, round(target_ms / 1e3 / timed(k)))  # again at the count found (clocks, caches, launch overhead)

    def step(batch: Any) -> None:
        frames = batch.data.get(CAM) if batch is not None else None
        if frames is not None and frames.numel():
            out[0, 0] += frames[:1].float().mean().to(dtype)
        matmuls(k)
        _sync(dev)

    seconds, _ = median_time(lambda: step(None), repeats=5)
    return step, seconds * 1e3


def overlap_dataset(quick: bool, seed: int = 0) -> tuple[Any, Any]:
    """The packed loader's source and :class:`~mmfeed.loaders.Packing`: an in-memory robot dataset (one camera,
    224x224 frames, or 64x64 with ``quick``), windows of 2 frames, the state and a 50-step action chunk, rows of
    4096 tokens (64 per frame), 4 rows a batch."""
    from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
    from mmfeed.loaders.sources.arrays import ArraySource
    from mmfeed.testing import make_episodes

    n, side, lengths = (6, 64, (20, 30)) if quick else (24, 224, (40, 80))
    eps = make_episodes(n, seed=seed, min_length=lengths[0], max_length=lengths[1], cameras=("cam_high",),
                        height=side, width=side)
    src = ArraySource([{**e.features(), "task": e.task, "fps": e.fps, "rates": e.rates()} for e in eps])
    spec = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], "observation.state": [0.0],
                                             "action": [i / 30 for i in range(50)]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 64}), window=spec,
                      plan=PlanConfig(capacity=4096, rows_per_batch=4), seed=seed)
    return src, packing


def measure_overlap(device: Any, *, quick: bool, workers: int, step: Callable[[Any], None],
                    model_ms: float, steps: int) -> list[Row]:
    """Two rows: the packed loader with ``device=device, prefetch=2`` (copies on the side stream), and with
    ``device=None`` and the copy in the loop (``batch.to(device)``, timed to its completion); each ``steps``
    steps long (epochs following one another, persistent workers), with the timer's step / wait / copy / compute
    ms per step after :data:`WARMUP_STEPS` and the frames' MB per batch."""
    if not isinstance(steps, int) or steps <= WARMUP_STEPS:
        raise ValueError(f"steps must be an int > {WARMUP_STEPS} (the warm-up steps), got {steps!r}")
    import torch

    from mmfeed import DataLoader
    from mmfeed.loaders.observe.timing import StepTimer

    src, packing = overlap_dataset(quick)
    dev = torch.device(device)
    rows = []
    for mode in ("prefetch=2", "copy in the loop"):
        timer = StepTimer(warmup=WARMUP_STEPS)
        prefetch = mode == "prefetch=2"
        loader = DataLoader(src, packing=packing, num_workers=workers, timer=timer, persistent_workers=workers > 0,
                            **({"device": dev, "prefetch": 2} if prefetch else {}))
        copies: list[float] = []
        frame_bytes: list[int] = []
        done = 0
        while done < steps:
            for batch in loader:
                if not prefetch:
                    t0 = time.perf_counter()
                    batch = batch.to(dev)
                    _sync(dev)
                    copies.append(time.perf_counter() - t0)
                frames = batch.data.get(CAM)
                frame_bytes.append(0 if frames is None else frames.numel() * frames.element_size())
                step(batch)
                done += 1
                if done >= steps:
                    break
        report = timer.report()
        del loader
        phases = report["phases"]
        copy_s = phases["copy"] if prefetch else (statistics.mean(copies[WARMUP_STEPS:] or copies) if copies
                                                 else None)
        step_s = report["step_s"]["mean"] if report["step_s"] else math.nan
        compute_s = phases["compute"] if prefetch else phases["compute"] - (copy_s or 0.0)  # busy less the copy
        row: Row = {"part": "prefetch", "case": mode, "steps": report["steps"], "model_ms": model_ms,
                    "step_ms": step_s * 1e3, "wait_ms": phases["wait"] * 1e3,
                    "copy_ms": None if copy_s is None else copy_s * 1e3, "compute_ms": compute_s * 1e3,
                    "stall_fraction": report["stall_fraction"],
                    "frames_mb_per_batch": statistics.mean(frame_bytes) / 1e6 if frame_bytes else 0.0}
        row["copy_hidden"] = (report["stall_fraction"] < timer.stall_threshold) if prefetch else False
        rows.append(row)
    base = rows[1]["step_ms"]
    for row in rows:
        copy = "-" if row["copy_ms"] is None else f"{row['copy_ms']:.2f}"
        row["baseline"] = f"model step {row['model_ms']:.1f} ms"
        row["gpu"] = (f"step {row['step_ms']:.1f} ms (wait {row['wait_ms']:.2f}, copy {copy}, compute "
                      f"{row['compute_ms']:.1f}), {row['frames_mb_per_batch']:.1f} MB frames")
        row["gain"] = base / row["step_ms"] if row["step_ms"] > 0 else None
        row["note"] = f"copy hidden={row['copy_hidden']}" if row["case"] == "prefetch=2" else "copy exposed"
    return rows


def overlap_rows(quick: bool) -> list[Row]:
    """Part 2's rows on ``cuda``."""
    step, model_ms = matmul_step("cuda", STEP_MS["quick" if quick else "full"])
    return measure_overlap("cuda", quick=quick, workers=2 if quick else 4, step=step, model_ms=model_ms,
                           steps=10 if quick else 30)


# ------------------------------------------------------------------------------------------------ 3. attention


def packed_row(capacity: int, seed: int = 0) -> Any:
    """A :class:`~mmfeed.PackedBatch` of one row of ``capacity`` tokens filled with documents of 64-4096 tokens
    (seeded; at most a quarter of the row each), every other one block-causal video in 256-token frames (64 in
    rows under 4096 tokens), the others token-causal; the row's tail that no document fits stays padding."""
    from mmfeed import PackedBatch

    if not isinstance(capacity, int) or capacity < 256:
        raise ValueError(f"capacity must be an int >= 256 tokens, got {capacity!r}")
    rng = np.random.default_rng(seed)
    frame = 256 if capacity >= 4096 else 64
    hi = min(4096, capacity // 4)
    lengths: list[int] = []
    steps: list[list[int] | None] = []
    while True:
        n = int(rng.integers(64, hi + 1))
        video = len(lengths) % 2 == 1
        if video:
            n = max(frame, n // frame * frame)
        if sum(lengths) + n > capacity:
            break
        lengths.append(n)
        steps.append([frame] * (n // frame) if video else None)
    return PackedBatch.from_lengths([lengths], capacity, step_sizes=[steps])


def _qkv(batch: Any, heads: int, dim: int, dtype: Any, seed: int) -> list[Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    shape = (batch.num_rows, heads, batch.capacity, dim)
    return [torch.randn(shape, generator=g).to(batch.device, dtype) for _ in range(3)]


def flex_matches_sdpa(batch: Any, *, flex: Callable[..., Any], heads: int = 2, dim: int = 16, dtype: Any = None,
                      block_size: int = BLOCK, seed: int = 0, atol: float = 1e-3, rtol: float = 1e-3) -> Row:
    """``flex(q, k, v, block_mask=batch.block_mask(block_size))`` against ``scaled_dot_product_attention`` with
    ``batch.attention_mask()`` on the batch's device, q, k, v seeded normal: ``max_abs_diff`` and ``allclose``
    (every token, padding included: a padding query attends to itself under both masks)."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v = _qkv(batch, heads, dim, dtype or torch.float32, seed)
    got = flex(q, k, v, block_mask=batch.block_mask(block_size))
    want = sdpa(q, k, v, attn_mask=batch.attention_mask())
    return {"max_abs_diff": float((got.float() - want.float()).abs().max()),
            "allclose": bool(torch.allclose(got.float(), want.float(), atol=atol, rtol=rtol))}


def _dense_fits(capacity: int, device: Any, rows: int = 1) -> bool:
    import torch

    if capacity > DENSE_MAX_TOKENS:
        return False
    if torch.device(device).type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return 8 * rows * capacity**2 < free  # the bool mask, its intermediates and SDPA's additive bias


def attention_rows(quick: bool, device: str = "cuda", *, flex: Callable[..., Any] | None = None,
                   sizes: list[int] | None = None, check_tokens: int = CHECK_TOKENS, heads: int = HEADS,
                   dim: int = HEAD_DIM, dtype: Any = None) -> list[Row]:
    """Part 3's rows: the small-row equivalence check (float32), then per row length (``sizes``, default
    :data:`ROW_TOKENS`) the block mask, the FlexAttention forward (``flex``, default ``flex_attention`` compiled)
    in ``dtype`` (default bf16) and, where the dense mask fits, SDPA."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    flex = flex or torch.compile(flex_attention, dynamic=False)
    dtype = dtype or torch.bfloat16
    check = flex_matches_sdpa(packed_row(check_tokens, seed=1).to(device), flex=flex, heads=heads, dim=dim,
                              dtype=torch.float32)
    rows: list[Row] = [{"part": "attention", "case": f"{check_tokens} tokens float32: flex == sdpa",
                        "gain": None, "note": f"allclose={check['allclose']} "
                                              f"(max |diff| {check['max_abs_diff']:.2e})", **check}]
    for capacity in sizes or (ROW_TOKENS[:1] if quick else ROW_TOKENS):
        batch = packed_row(capacity).to(device)
        mask_s, block_mask = median_time(lambda: (batch.block_mask(BLOCK), _sync(device))[0], repeats=3)
        q, k, v = _qkv(batch, heads, dim, dtype, seed=capacity)
        t0 = time.perf_counter()
        out = flex(q, k, v, block_mask=block_mask)
        _sync(device)
        compile_s = time.perf_counter() - t0
        flex_s, out = median_time(lambda: (flex(q, k, v, block_mask=block_mask), _sync(device))[0], repeats=3,
                                  warmup=0)
        row: Row = {"part": "attention", "case": f"{capacity // 1024}k tokens, {batch.num_documents} docs",
                    "tokens": capacity, "documents": batch.num_documents, "block_mask_ms": mask_s * 1e3,
                    "block_sparsity_pct": float(block_mask.sparsity()), "flex_compile_s": compile_s,
                    "flex_ms": flex_s * 1e3, "sdpa_ms": None, "max_abs_diff": None}
        if _dense_fits(capacity, device):
            mask = batch.attention_mask()
            sdpa_s, dense = median_time(lambda: (sdpa(q, k, v, attn_mask=mask), _sync(device))[0], repeats=3)
            row["sdpa_ms"] = sdpa_s * 1e3
            row["max_abs_diff"] = float((out.float() - dense.float()).abs().max())
            del mask, dense
        row["baseline"] = ("sdpa dense: does not fit" if row["sdpa_ms"] is None
                           else f"sdpa dense {row['sdpa_ms']:.2f} ms")
        row["gpu"] = (f"flex {row['flex_ms']:.2f} ms (compile {compile_s:.1f} s), block mask "
                      f"{row['block_mask_ms']:.2f} ms, {row['block_sparsity_pct']:.0f}% blocks skipped")
        row["gain"] = None if row["sdpa_ms"] is None else row["sdpa_ms"] / row["flex_ms"]
        row["note"] = "" if row["max_abs_diff"] is None else f"max |diff| {row['max_abs_diff']:.2e}"
        rows.append(row)
        del q, k, v, out, block_mask, batch
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------------ 4. device transforms


def device_transform_rows(quick: bool, device: str = "cuda", **sizes: Any) -> list[Row]:
    """Part 4's rows: :mod:`mmfeed.bench.device_transforms` with batches going to ``device``: the same augmentation
    chain (normalize, camera dropout, colour jitter, random resized crop to 224) in the workers, one sample at a
    time, against on the batch after the copy, and the loader with no transform as the floor; one row per way.
    ``sizes`` override its episodes, rounds, workers, height, width and crop."""
    from mmfeed.bench import device_transforms

    options = dict(episodes=8, rounds=2, workers=2, height=240, width=320, crop=224) if quick else \
        dict(episodes=24, rounds=3, workers=4, height=480, width=640, crop=224)
    report = device_transforms.run(**{**options, **sizes}, device=device)
    rows: list[Row] = []
    per_way = {row["way"]: row for row in report["rows"]}
    floor = per_way["none"]["samples_per_s"]
    for way, row in per_way.items():
        transform = row["transform_ms_per_batch"]
        rows.append({"part": "device transforms", "case": f"{way} ({report['frame'][1]}x{report['frame'][0]} -> "
                                                          f"{report['crop']})",
                     "baseline": f"no transform {floor:.0f} samples/s",
                     "gpu": f"{row['samples_per_s']:.0f} samples/s, {row['cpu_s_per_1000']:.2f} CPU-s/1000"
                            + ("" if transform is None else f", transform {transform:.2f} ms/batch"),
                     "gain": row["samples_per_s"] / per_way["workers"]["samples_per_s"],
                     "note": f"spread {row['samples_per_s_spread']['range']:.2f}", **row})
    return rows


# ------------------------------------------------------------------------------------------------ the command


PARTS: dict[str, Callable[[bool], list[Row]]] = {"decode": decode_rows, "prefetch": overlap_rows,
                                                  "attention": attention_rows,
                                                  "device transforms": device_transform_rows}
COLUMNS = [("part", "part"), ("case", "case"), ("baseline", "baseline"), ("gpu", "on the GPU"),
           ("gain", "gain"), ("note", "note")]


def run_parts(parts: Mapping[str, Callable[[bool], list[Row]]], quick: bool) -> tuple[list[Row], dict[str, float]]:
    """Every part's rows, in order, and its seconds; a part that raises becomes one ``failed: ...`` row."""
    rows: list[Row] = []
    seconds: dict[str, float] = {}
    for part, run in parts.items():
        t0 = time.perf_counter()
        try:
            rows += run(quick)
        except Exception as err:  # one part failing is a row of the table, not the end of the run
            rows.append(_failed(part, err))
        seconds[part] = time.perf_counter() - t0
        log.info("%s: %.1f s", part, seconds[part])
    return rows, seconds


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (see the module docstring); without CUDA print :data:`NO_CUDA` and exit 0."""
    parser = argparse.ArgumentParser(
        prog="mmfeed bench gpu", description=__doc__.splitlines()[0],
        epilog="Under 5 minutes on one H100; without CUDA it prints one line and exits 0.")
    parser.add_argument("--json", metavar="OUT", help="write every part's rows and the environment here")
    parser.add_argument("--quick", action="store_true",
                        help="the smallest sizes: 224x224 decode only, an 8k-token row, a small loader")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_CUDA)
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": NO_CUDA, "environment": environment()}, indent=1))
        return 0
    rows, seconds = run_parts(PARTS, args.quick)
    print(table(rows, COLUMNS))
    print(f"total {sum(seconds.values()):.0f} s on {torch.cuda.get_device_name(0)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "quick": args.quick, "seconds": seconds,
                                               "environment": environment()}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
