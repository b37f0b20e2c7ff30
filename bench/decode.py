"""Benchmark: coalesced batch decode vs one request at a time, with sequential decode as the ceiling.

On a 640x480 H.264 (GOP 30) and an AV1 (GOP 2) video of 300 frames, one episode each, a batch is 16 robot-style
samples from that episode: either 8-frame clips or 4 sparse history frames (offsets -15, -10, -5, 0 from a random
anchor). For every backend that opens the file it measures, in the same run and on the same request sets:

- ``coalesced``: :func:`mmfeed.codecs.decode_batch` through a warm :class:`VideoReaderCache` (the file stays open
  across batches, as in a worker);
- ``baseline`` (the LeRobot way): for each requested frame, seek to its keyframe and decode forward to it, on an
  open file, with the same RGB conversion as the coalesced reader (so the ratio measures the seek strategy alone);
- ``per_sample``: one :func:`mmfeed.codecs.read_frames` call per sample (opens the file each time, decodes the
  sample's frames in one forward pass), like LeRobot's per-item video decode;
- ``sequential``: every frame in order, the ceiling.

Figures are frames delivered to the requests per second (``frames_per_s``), median over repeats after a warm-up;
``unique_frames_per_s`` counts each distinct frame once and is what ``fraction_of_sequential`` compares. The
``cpu_*`` figures use the process's CPU time instead of wall time: on a machine shared with other jobs they show
the same ratios with less noise (decoding here is single-threaded).
Run ``python -m mmfeed.bench.decode [--quick] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from mmfeed.bench.common import environment
from mmfeed.codecs import VideoReaderCache, decode_batch, probe, read_frames
from mmfeed.codecs._decord import decord_available
from mmfeed.codecs.video import DecodeOptions, open_reader

log = logging.getLogger(__name__)

SAMPLES_PER_BATCH = 16
CLIP_LEN = 8
SPARSE_OFFSETS = (-15, -10, -5, 0)
VIDEOS = {"h264_gop30": ("h264", 30), "av1_gop2": ("av1", 2)}


def main(argv: list[str] | None = None) -> int:
    """Run the decode benchmark, print a table, optionally write JSON; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.decode", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small videos and few repeats (a smoke run)")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    parser.add_argument("--cache-dir", default=None, help="where the synthetic videos are kept")
    parser.add_argument("--repeats", type=int, default=None, help="measured repeats per figure (default 5, quick 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    height, width, frames = (240, 320, 90) if args.quick else (480, 640, 300)
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        parser.error(f"--repeats must be >= 1, got {repeats}")
    cache_dir = args.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "mmfeed", "bench")
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError:
        cache_dir = tempfile.mkdtemp(prefix="mmfeed-bench-")
    results = []
    for name, (codec, gop) in VIDEOS.items():
        path = _video(cache_dir, codec, gop, height, width, frames)
        backends = ["pyav"] + (["decord"] if codec == "h264" and decord_available() else [])
        for backend in backends:
            for workload in ("clips", "sparse"):
                row = _measure(path, backend, workload, repeats, args.seed)
                row.update(video=name, backend=backend, workload=workload)
                row["speedup_vs_baseline"] = row["frames_per_s"] / row["baseline_frames_per_s"]
                row["speedup_vs_per_sample"] = row["frames_per_s"] / row["per_sample_frames_per_s"]
                row["fraction_of_sequential"] = row["unique_frames_per_s"] / row["sequential_frames_per_s"]
                results.append(row)
                print(_format(row), flush=True)
    report = {
        "benchmark": "decode",
        "results": results,
        "targets": {"speedup_vs_baseline_h264_gop30": 3.0, "fraction_of_sequential_at_coverage_0.25": 0.6},
        "settings": {
            "height": height, "width": width, "frames": frames, "repeats": repeats, "seed": args.seed,
            "samples_per_batch": SAMPLES_PER_BATCH, "clip_len": CLIP_LEN, "sparse_offsets": list(SPARSE_OFFSETS),
            "threads": 1, "quick": args.quick,
        },
        "environment": environment(),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def _video(cache_dir: str, codec: str, gop: int, height: int, width: int, frames: int) -> str:
    from mmfeed.testing import frame_pattern, write_video

    path = os.path.join(cache_dir, f"{codec}_g{gop}_{width}x{height}_{frames}.mp4")
    if not os.path.exists(path):
        pixels = np.concatenate(
            [frame_pattern(min(30, frames - s), height=height, width=width, start=s) for s in range(0, frames, 30)]
        )
        tmp = path + f".tmp{os.getpid()}.mp4"
        write_video(tmp, pixels, codec=codec, gop=gop)
        os.replace(tmp, path)
    return path


def _requests(num_frames: int, workload: str, rng: np.random.Generator) -> list[np.ndarray]:
    if workload == "clips":
        starts = rng.integers(0, num_frames - CLIP_LEN + 1, size=SAMPLES_PER_BATCH)
        return [np.arange(s, s + CLIP_LEN) for s in starts]
    anchors = rng.integers(0, num_frames, size=SAMPLES_PER_BATCH)
    return [np.clip(a + np.array(SPARSE_OFFSETS), 0, num_frames - 1) for a in anchors]


def _measure(path: str, backend: str, workload: str, repeats: int, seed: int) -> dict:
    """Each repeat draws one batch of requests and times every method on it, the methods interleaved (and the
    sequential ceiling with them) so that load from other processes hits them alike; repeat 0 is the warm-up."""
    n = probe(path).num_frames
    cache = VideoReaderCache(max_open=2, backend=backend)
    sequential = _sequential_pass(path, backend)
    baseline = _per_frame_decoder(path, backend)

    def count(batch: list[np.ndarray]) -> int:
        return sum(len(x) for x in batch)

    def coalesced(batch: list[np.ndarray]) -> int:
        return sum(len(x) for x in decode_batch([(path, r) for r in batch], cache=cache))

    def per_frame(batch: list[np.ndarray]) -> int:
        baseline(batch)
        return count(batch)

    def per_sample(batch: list[np.ndarray]) -> int:
        return sum(len(read_frames(path, r, backend=backend)) for r in batch)

    methods: dict[str, Callable[[list[np.ndarray]], int]] = {
        "coalesced": coalesced,
        "baseline": per_frame,
        "per_sample": per_sample,
        "sequential": lambda batch: sequential(),
    }
    fps: dict[str, list[float]] = {m: [] for m in methods}
    cpu_fps: dict[str, list[float]] = {m: [] for m in methods}  # per CPU second: robust to other processes' load
    delivered, unique = [], []
    for r in range(repeats + 1):
        batch = _requests(n, workload, np.random.default_rng([seed, r]))
        order = list(methods)[r % len(methods) :] + list(methods)[: r % len(methods)]
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            frames = methods[name](batch)
            if r:
                fps[name].append(frames / (time.perf_counter() - t0))
                cpu_fps[name].append(frames / max(time.process_time() - c0, 1e-9))
        if r:
            delivered.append(count(batch))
            unique.append(len(np.unique(np.concatenate(batch))))
    cache.close()
    sequential.close()
    coalesced = statistics.median(fps["coalesced"])
    cpu = {m: statistics.median(v) for m, v in cpu_fps.items()}
    share = float(np.mean(np.divide(unique, delivered)))
    return {
        "cpu_frames_per_s": cpu["coalesced"],
        "cpu_speedup_vs_baseline": cpu["coalesced"] / cpu["baseline"],
        "cpu_speedup_vs_per_sample": cpu["coalesced"] / cpu["per_sample"],
        "cpu_fraction_of_sequential": cpu["coalesced"] * share / cpu["sequential"],
        "frames_per_s": coalesced,
        "unique_frames_per_s": coalesced * share,
        "baseline_frames_per_s": statistics.median(fps["baseline"]),
        "per_sample_frames_per_s": statistics.median(fps["per_sample"]),
        "sequential_frames_per_s": statistics.median(fps["sequential"]),
        "coverage": float(np.mean(unique) / n),
        "frames_per_batch": float(np.mean(delivered)),
    }


def _per_frame_decoder(path: str, backend: str) -> Callable[[list[np.ndarray]], None]:
    """Seek and decode per requested frame (the LeRobot way), on an already open file."""
    info = probe(path)
    if backend == "decord":
        import decord

        vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)

        def run(batch):
            for request in batch:
                for i in request.tolist():
                    vr.seek_accurate(i)
                    vr.next().asnumpy()  # a copy, like every method here

        return run
    import av
    from av.video.reformatter import VideoReformatter

    container = av.open(path)
    stream = container.streams.video[0]
    stream.thread_count = 1
    # The same RGB conversion as the coalesced reader, so that the ratio measures only the seek strategy.
    reformatter = VideoReformatter()

    def run(batch):
        for request in batch:
            for i in request.tolist():
                target = int(info.pts[i])
                container.seek(target, stream=stream, backward=True, any_frame=False)
                for frame in container.decode(stream):
                    if frame.pts is not None and frame.pts >= target:
                        reformatter.reformat(frame, format="rgb24").to_ndarray().copy()
                        break

    return run


class _sequential_pass:
    """Every frame in order through the backend's own reader: the ceiling (PyAV: seek to 0, decode to the end).

    Frames are copied into one buffer allocated up front, so the ceiling measures decoding and conversion, not
    the page faults of a fresh whole-video array (the coalesced figures do pay for their fresh outputs)."""

    def __init__(self, path: str, backend: str) -> None:
        self.reader = open_reader(path, DecodeOptions(backend=backend))
        self.every = np.arange(self.reader.info.num_frames)
        h, w = self.reader.out_shape
        self.buffer = np.zeros((len(self.every), h, w, 3), dtype=np.uint8)

    def __call__(self) -> int:
        if hasattr(self.reader, "_frames"):
            self.reader._frames = None  # PyAV: start with a seek to frame 0, like a fresh sequential read
        buffer = self.buffer

        def store(k: int, frame: np.ndarray) -> None:
            buffer[k] = frame

        self.reader.decode_each(self.every, store)
        return len(self.every)

    def close(self) -> None:
        self.reader.close()


def _format(row: dict) -> str:
    return (
        f"{row['video']:<11} {row['backend']:<6} {row['workload']:<6} coverage {row['coverage']:.0%}  "
        f"coalesced {row['frames_per_s']:7.0f} f/s  baseline {row['baseline_frames_per_s']:6.0f} "
        f"(x{row['speedup_vs_baseline']:.1f})  per-sample {row['per_sample_frames_per_s']:6.0f} "
        f"(x{row['speedup_vs_per_sample']:.1f})  sequential {row['sequential_frames_per_s']:6.0f} "
        f"(unique {row['fraction_of_sequential']:.0%})  | per CPU s: x{row['cpu_speedup_vs_baseline']:.1f} "
        f"x{row['cpu_speedup_vs_per_sample']:.1f} {row['cpu_fraction_of_sequential']:.0%}"
    )


if __name__ == "__main__":
    sys.exit(main())
