"""Benchmark: GPU decode (NVDEC, frames left on the GPU) against CPU decode.

For H.264 and AV1 at 240x320 and 480x640, GOP 2 and 30 (8 videos of 300 frames at 30 fps, written here with PyAV
into a temporary folder), the decoders that run here (:func:`usable_decoders`) read the same request sets through
:class:`mmfeed.codecs.VideoReaderCache` (one open reader, one decoder thread, as in a DataLoader worker):

- ``pyav``: mmfeed's PyAV reader on the CPU (what ``backend="auto"`` uses), numpy frames;
- ``torchcodec_cpu``: torchcodec on the CPU (``backend="torchcodec"``), numpy frames, where torchcodec loads;
- ``pyav_cuda``: NVDEC through PyAV's bundled FFmpeg (``backend="pyav", device="cuda"``), torch uint8 frames on
  the GPU (timed up to ``torch.cuda.synchronize()``);
- ``torchcodec_cuda``: torchcodec with ``device="cuda"``, where its CUDA build is installed.

Every decoder writes into outputs allocated once per video and workload, outside the timing (host arrays, device
tensors for the GPU), so that no figure times page faults or allocations.

Two workloads: ``windows``, batches of 16 random-access windows of 2 consecutive frames (as training reads a
LeRobot-style window, each batch one coalesced ``decode_batch`` call), and ``sequential``, every frame in order.
Each repeat times every decoder once on the same batches, the decoders interleaved (their order rotating from
repeat to repeat); figures are the median over ``--repeats`` (default 3) of frames per wall second and frames per
CPU second of this process, with ``*_spread`` = (max - min) / median of the repeats. ``{gpu}_over_{cpu}`` divides
a GPU decoder's median frames/s by a CPU decoder's (``cpu_{gpu}_over_{cpu}``: the same per CPU second);
``nvdec_{gpu}`` says whether it decoded the video with NVDEC (False: FFmpeg fell back to the CPU for that codec on
this GPU, and its figures are then CPU decode plus an upload). CPU decoders run one thread each, so the CPU figures
are per core.

Without a GPU decoder here it prints one line saying what each one lacks and exits 0. On a GPU machine with a CUDA
build of torch, ``mmfeed bench gpu-decode --json gpu_decode.json`` needs nothing more for ``pyav_cuda``; for the
torchcodec decoders install its CUDA build and link PyAV's FFmpeg first::

    pip install torchcodec==0.13.0 --index-url https://download.pytorch.org/whl/cu128
    python -m mmfeed.codecs._torchcodec link /tmp/ffmpeg   # PyAV's bundled FFmpeg under the standard sonames
    LD_LIBRARY_PATH=/tmp/ffmpeg mmfeed bench gpu-decode --json gpu_decode.json

(2.5 minutes on 2 shared CPU cores with torchcodec's CPU decoder standing in for the GPU one; ``--quick`` reads two
240x320 videos of 90 frames). CI has no GPU; ``mmfeed bench gpu``'s decode part ran on an H100 (README).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mmfeed.bench.common import consecutive_views, environment, spread, table
from mmfeed.codecs import FrameRequest, VideoReaderCache, probe
from mmfeed.codecs._torchcodec import cuda_decode_error

__all__ = ["DECODERS", "main", "measure_video", "unavailable", "usable_decoders", "window_batches"]

VIDEOS = [(codec, gop, size) for codec in ("h264", "av1") for size in ((240, 320), (480, 640)) for gop in (2, 30)]
"""(codec, GOP, (height, width)) of every video the full run reads."""
QUICK_VIDEOS = [("h264", 30, (240, 320)), ("av1", 2, (240, 320))]
DECODERS = {"pyav": {"backend": "pyav"}, "torchcodec_cpu": {"backend": "torchcodec"},
            "pyav_cuda": {"backend": "pyav", "device": "cuda"},
            "torchcodec_cuda": {"backend": "torchcodec", "device": "cuda"}}
"""Every decoder the benchmark knows; :func:`usable_decoders` says which run here."""


def usable_decoders() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """``(decoders that run here, {decoder: why not} for the others)``: PyAV on the CPU always; torchcodec on
    the CPU where it loads; NVDEC through PyAV and through torchcodec where each can decode onto the GPU."""
    from mmfeed.codecs._nvdec import pyav_cuda_error
    from mmfeed.codecs._torchcodec import torchcodec_error

    reasons = {"torchcodec_cpu": torchcodec_error(), "pyav_cuda": pyav_cuda_error("cuda"),
               "torchcodec_cuda": cuda_decode_error("cuda")}
    usable = {name: dict(opts) for name, opts in DECODERS.items() if reasons.get(name) is None}
    return usable, {name: why for name, why in reasons.items() if why is not None}


def unavailable() -> str | None:
    """None where some decoder here decodes onto the GPU, else why none does (each GPU decoder's reason)."""
    usable, why = usable_decoders()
    if any("device" in opts for opts in usable.values()):
        return None
    return "; ".join(f"{name}: {why[name]}" for name in ("pyav_cuda", "torchcodec_cuda"))
"""Decoder name -> the VideoReaderCache options it reads with."""
WINDOW, WINDOWS_PER_BATCH, BATCHES = 2, 16, 4

log = logging.getLogger(__name__)


def window_batches(num_frames: int, batches: int, seed: int) -> list[list[np.ndarray]]:
    """``batches`` lists of :data:`WINDOWS_PER_BATCH` windows of :data:`WINDOW` consecutive frame indices at random
    anchors (seeded), as a training epoch's random-access reads of one video."""
    rng = np.random.default_rng(seed)
    return [[np.arange(a, a + WINDOW) for a in rng.integers(0, num_frames - WINDOW + 1, size=WINDOWS_PER_BATCH)]
            for _ in range(batches)]


def _reader_run(cache: VideoReaderCache, path: str, batches: list[list[np.ndarray]]) -> Callable[[], int]:
    """One timed pass: every batch as one ``decode_batch`` call into outputs allocated (and touched) once, here,
    outside the timing (host arrays for the CPU decoders, device tensors for the GPU); returns the frames
    delivered."""
    import torch

    info, device = probe(path), cache.options.device
    outs = []
    for batch in batches:
        shape = (sum(len(w) for w in batch), info.height, info.width, 3)
        buffer = np.zeros(shape, np.uint8) if device is None else torch.zeros(shape, dtype=torch.uint8, device=device)
        outs.append(consecutive_views(buffer, [len(w) for w in batch]))

    def run() -> int:
        n = 0
        for batch, views in zip(batches, outs):
            frames = cache.decode_batch([FrameRequest(path, indices=w, out=v) for w, v in zip(batch, views)])
            n += sum(len(f) for f in frames)
        if device is not None:
            torch.cuda.synchronize(device)
        return n

    return run


def measure_video(path: str, repeats: int, seed: int = 0,
                  decoders: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The rows of one video: per workload, each decoder's median frames/s (wall and CPU) and spreads, and each
    GPU decoder's ratios over each CPU decoder (``{gpu}_over_{cpu}``, per CPU second ``cpu_{gpu}_over_{cpu}``) and
    whether it decoded with NVDEC (``nvdec_{gpu}``). ``decoders``: name -> VideoReaderCache options (default
    :func:`usable_decoders`'); those with a ``device`` are the GPU ones."""
    decoders = usable_decoders()[0] if decoders is None else decoders
    gpus = [name for name, opts in decoders.items() if opts.get("device")]
    cpus = [name for name in decoders if name not in gpus]
    num_frames = probe(path).num_frames
    workloads = {"windows": window_batches(num_frames, BATCHES, seed),
                 "sequential": [[np.arange(num_frames)]]}
    caches = {name: VideoReaderCache(max_open=1, **opts) for name, opts in decoders.items()}
    rows = []
    try:
        for workload, batches in workloads.items():
            runs = {name: _reader_run(cache, path, batches) for name, cache in caches.items()}
            for run in runs.values():  # warm-up: open the file, the decoder, NVDEC's session
                run()
            wall: dict[str, list[float]] = {name: [] for name in runs}
            cpu: dict[str, list[float]] = {name: [] for name in runs}
            names = list(runs)
            for r in range(repeats):
                for name in names[r % len(names):] + names[: r % len(names)]:  # interleaved, the order rotating
                    t0, c0 = time.perf_counter(), time.process_time()
                    n = runs[name]()
                    t1, c1 = time.perf_counter(), time.process_time()
                    wall[name].append(n / max(t1 - t0, 1e-9))
                    cpu[name].append(n / max(c1 - c0, 1e-9))
            row: dict[str, Any] = {"video": Path(path).stem, "workload": workload,
                                   "frames_per_pass": sum(len(w) for b in batches for w in b)}
            for name in names:
                row[f"{name}_frames_per_s"] = statistics.median(wall[name])
                row[f"{name}_frames_per_s_spread"] = spread(wall[name])["range"]
                row[f"cpu_{name}_frames_per_s"] = statistics.median(cpu[name])
            for gpu in gpus:
                for other in cpus:
                    for prefix in ("", "cpu_"):
                        row[f"{prefix}{gpu}_over_{other}"] = (row[f"{prefix}{gpu}_frames_per_s"]
                                                              / row[f"{prefix}{other}_frames_per_s"])
                row[f"nvdec_{gpu}"] = nvdec_used(caches[gpu], path)
            rows.append(row)
    finally:
        for cache in caches.values():
            cache.close()
    return rows


def _write_videos(folder: str, videos: list[tuple[str, int, tuple[int, int]]], frames: int) -> list[str]:
    from mmfeed.testing import frame_pattern, write_video

    paths = []
    for codec, gop, (h, w) in videos:
        path = str(Path(folder) / f"{codec}_gop{gop}_{h}x{w}.mp4")
        write_video(path, frame_pattern(frames, height=h, width=w), codec=codec, gop=gop)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (see the module docstring); exit 0 with one line when GPU decode is unavailable."""
    parser = argparse.ArgumentParser(prog="mmfeed bench gpu-decode", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows and the environment here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=300, help="frames per video (default 300)")
    parser.add_argument("--quick", action="store_true", help="two 240x320 videos of 90 frames")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"gpu_decode: skipped, GPU decode is unavailable here: {reason}")
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": reason, "environment": environment()}, indent=1))
        return 0
    decoders, skipped = usable_decoders()
    for name, why in skipped.items():
        print(f"gpu_decode: {name} skipped: {why}")
    videos, frames = (QUICK_VIDEOS, 90) if args.quick else (VIDEOS, args.frames)
    rows = []
    with tempfile.TemporaryDirectory(prefix="mmfeed-gpu-decode-") as folder:
        for path in _write_videos(folder, videos, frames):
            rows += measure_video(path, max(1, args.repeats), decoders=decoders)
            log.info("%s done", path)
    gpus = [name for name, opts in decoders.items() if opts.get("device")]
    columns = [("video", "video"), ("workload", "workload"),
               *((f"{name}_frames_per_s", f"{name} f/s") for name in decoders),
               *(c for gpu in gpus for c in ((f"{gpu}_over_pyav", f"{gpu}/pyav"),
                                             (f"cpu_{gpu}_over_pyav", f"{gpu}/pyav per cpu-s"),
                                             (f"nvdec_{gpu}", f"nvdec {gpu}")))]
    print(table(rows, columns))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "repeats": args.repeats, "frames": frames,
                                               "environment": environment()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def nvdec_used(cache: Any, path: str) -> bool | None:
    """Whether the GPU reader of ``path`` in ``cache`` (PyAV's or torchcodec's) decoded on NVDEC (False: it fell
    back to the CPU; None: torchcodec does not say)."""
    reader = cache.reader(path)
    status = getattr(getattr(reader, "_decoder", reader), "cpu_fallback", None)
    return None if status is None else not bool(status)
