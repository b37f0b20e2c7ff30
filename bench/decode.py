"""Benchmark: coalesced batch decode vs one request at a time, with sequential decode as the ceiling.

On a 640x480 H.264 (GOP 30) and an AV1 (GOP 2) video of 300 frames, one episode each, a batch is 16 robot-style
samples from that episode: either 8-frame clips or 4 sparse history frames (offsets -15, -10, -5, 0 from a random
anchor, clamped to the video). For every backend that opens the file (PyAV; decord on H.264 when installed;
torchcodec when it loads in this process, see :mod:`mmfeed.codecs._torchcodec`) it times, in the same run, on the
same request sets, the methods interleaved:

- ``coalesced``: one :func:`mmfeed.codecs.decode_batch` call for the batch's 16 requests through a warm
  :class:`VideoReaderCache` (the file stays open across batches, as in a worker): the union of the wanted frames
  decoded in one forward pass per run of GOPs;
- ``per_sample``: one ``cache.decode_batch([request])`` call per sample on its own warm cache (one forward pass
  per sample on an open file), as LeRobot's torchcodec path does (its decoder stays cached per file);
- ``per_sample_reopen``: one :func:`mmfeed.codecs.read_frames` call per sample (opens and closes the file each
  time, a fresh output array per sample), as LeRobot's pyav path does;
- ``baseline``: for each requested frame, seek to its keyframe and decode forward to it, on an open file, with
  the same RGB conversion as the coalesced reader (so the ratio measures the seek strategy alone); torchcodec:
  one ``get_frames_at([i])`` per requested frame on an open decoder;
- ``sequential``: every frame in order into a whole-video buffer allocated up front: the ceiling.

``coalesced``, ``per_sample`` and ``baseline`` write into one uint8 batch buffer, ``sequential`` into its own
whole-video buffer, each allocated (and its pages touched) once per video and backend, outside the timing, and
reused by every batch: a fresh 118 MB output per batch (clips at 640x480) would time page faults, not decoding.

With ``--lerobot-python`` (a venv with lerobot and torchcodec), a child under that python times the same request
sets, with ``torch.set_num_threads(1)`` as in a DataLoader worker: ``lerobot`` is LeRobot's own
``decode_video_frames(path, [i / fps, ...], tolerance_s=1e-4, backend="torchcodec")`` per sample (cached decoder,
``get_frames_at``, its timestamp check and the float32 ``[0, 1]`` output) and ``torchcodec`` the cached decoder's
``get_frames_at(indices=...)`` per sample alone (uint8). Without it those figures are None. (Rows of backend
``torchcodec`` are this process's torchcodec through mmfeed's reader; its ``per_sample`` figure is the same
``get_frames_at`` per sample on a cached decoder, plus the demux-index check.)

Figures are frames per second, the median over repeats after one warm-up batch; ``*_spread`` is the
(max - min) / median of the per-batch rates behind each wall-clock median. ``frames_per_s`` counts every
frame handed to a request (duplicates included: the useful decoded frames/s), ``unique_frames_per_s`` each
distinct frame once; ``fraction_of_sequential`` and ``unique_fraction_of_sequential`` divide them by the
sequential rate. Speedups are coalesced frames/s over each other method's. The ``cpu_*`` figures use the process's
CPU time instead of wall time: on a machine shared with other jobs they show the same ratios with less noise
(decoding here is single-threaded). Targets, judged on the rows of the backend ``auto`` picks (column ``auto``):
``speedup_vs_lerobot`` >= 3 on h264_gop30, and ``fraction_of_sequential`` >= 0.6 where coverage (distinct frames
per batch / video length) is at least 0.25.
Run ``python -m mmfeed.bench.decode [--quick] [--json FILE] [--lerobot-python PATH]``.
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
from typing import Any, Callable, Sequence

import numpy as np

from mmfeed.bench.common import cache_dir as bench_cache
from mmfeed.bench.common import consecutive_views, environment, table
from mmfeed.bench.lerobot_child import run_child
from mmfeed.codecs import FrameRequest, VideoReaderCache, decode_batch, probe, read_frames
from mmfeed.codecs._decord import to_numpy, decord_available
from mmfeed.codecs._torchcodec import torchcodec_available, torchcodec_error
from mmfeed.codecs.video import DecodeOptions, choose_backend, open_reader

log = logging.getLogger(__name__)

SAMPLES_PER_BATCH = 16
CLIP_LEN = 8
SPARSE_OFFSETS = (-15, -10, -5, 0)
VIDEOS = {"h264_gop30": ("h264", 30), "av1_gop2": ("av1", 2)}
TARGETS = {"speedup_vs_lerobot_h264_gop30": 3.0, "fraction_of_sequential_at_coverage_ge_0.25": 0.6}
METHODS = ("coalesced", "per_sample", "per_sample_reopen", "baseline", "sequential")

LEROBOT_CHILD = r'''
import json, sys, time
import torch
torch.set_num_threads(1)  # as in a DataLoader worker
from lerobot.datasets.video_utils import _default_decoder_cache, decode_video_frames

args = json.loads(sys.argv[1])
path, fps = args["path"], args["fps"]


def lerobot(batch):
    for request in batch:
        decode_video_frames(path, [i / fps for i in request], tolerance_s=1e-4, backend="torchcodec")


def torchcodec(batch):
    decoder = _default_decoder_cache.get_decoder(path)
    for request in batch:
        decoder.get_frames_at(indices=request)


methods = {"lerobot": lerobot, "torchcodec": torchcodec}
rates = {name: [] for name in methods}
for r, batch in enumerate(args["batches"]):
    frames = sum(len(request) for request in batch)
    for name in list(methods)[r % 2:] + list(methods)[:r % 2]:
        start = time.perf_counter()
        methods[name](batch)
        if r:  # batch 0 is the warm-up
            rates[name].append(frames / (time.perf_counter() - start))
versions = {}
for name in ("lerobot", "torch", "torchcodec"):
    versions[name] = __import__(name).__version__
with open(args["out"], "w") as f:
    json.dump({"frames_per_s": rates, "versions": versions}, f)
'''
"""Run under LeRobot's python as ``python -c LEROBOT_CHILD ARGS_JSON``; writes per-batch frames/s to ``out``."""


def main(argv: list[str] | None = None) -> int:
    """Run the decode benchmark, print the tables, optionally write JSON; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.decode", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small videos and few repeats (a smoke run)")
    parser.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    parser.add_argument("--cache-dir", default=None,
                        help="where the synthetic videos are kept (default $MMFEED_CACHE/bench, ~/.cache/mmfeed/bench)")
    parser.add_argument("--repeats", type=int, default=None, help="measured repeats per figure (default 5, quick 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lerobot-python", default=None, help="python of a venv with lerobot and torchcodec: "
                        "time LeRobot's own decode on the same requests")
    parser.add_argument("--lib-dir", action="append", default=[], help="extra LD_LIBRARY_PATH folder for the child")
    args = parser.parse_args(argv)

    height, width, frames = (240, 320, 90) if args.quick else (480, 640, 300)
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        parser.error(f"--repeats must be >= 1, got {repeats}")
    if args.lerobot_python is not None and not os.path.exists(args.lerobot_python):
        parser.error(f"--lerobot-python {args.lerobot_python} does not exist; pass a venv's bin/python")
    try:
        cache_dir = str(bench_cache("bench")) if args.cache_dir is None else args.cache_dir
        os.makedirs(cache_dir, exist_ok=True)
    except OSError:
        cache_dir = tempfile.mkdtemp(prefix="mmfeed-bench-")
    results, lerobot_versions = [], None
    if not torchcodec_available():
        log.info("torchcodec not measured: %s", torchcodec_error())
    for name, (codec, gop) in VIDEOS.items():
        path = _video(cache_dir, codec, gop, height, width, frames)
        backends = ["pyav"] + (["decord"] if codec == "h264" and decord_available() else []) + (
            ["torchcodec"] if torchcodec_available() else [])
        for workload in ("clips", "sparse"):
            batches = request_sets(probe(path).num_frames, workload, repeats, args.seed)
            theirs: dict[str, Any] = {"lerobot_frames_per_s": None, "torchcodec_frames_per_s": None}
            if args.lerobot_python is not None:
                theirs = lerobot_rates(args.lerobot_python, path, batches, lib_dirs=args.lib_dir)
                lerobot_versions = theirs.pop("versions")
            for backend in backends:
                row = {"video": name, "backend": backend, "auto": backend == choose_backend(probe(path)),
                       "workload": workload, **_measure(path, backend, batches)}
                results.append(_with_lerobot(row, theirs))
                log.info("%s %s %s: coalesced %.0f frames/s", name, backend, workload, row["frames_per_s"])
    checks = check_targets(results)
    _print_report(results, checks)
    report = {
        "benchmark": "decode",
        "results": results,
        "targets": TARGETS,
        "target_checks": checks,
        "settings": {
            "height": height, "width": width, "frames": frames, "repeats": repeats, "seed": args.seed,
            "samples_per_batch": SAMPLES_PER_BATCH, "clip_len": CLIP_LEN, "sparse_offsets": list(SPARSE_OFFSETS),
            "threads": 1, "quick": args.quick, "lerobot_python": args.lerobot_python,
            "torchcodec": torchcodec_error() or "measured",
        },
        "lerobot_versions": lerobot_versions,
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


def request_sets(num_frames: int, workload: str, repeats: int, seed: int) -> list[list[np.ndarray]]:
    """``repeats + 1`` batches (batch 0 is the warm-up), each :data:`SAMPLES_PER_BATCH` int64 index arrays:
    ``"clips"`` of :data:`CLIP_LEN` consecutive frames or ``"sparse"`` frames at :data:`SPARSE_OFFSETS` from an
    anchor, clamped to ``[0, num_frames)``. Batch ``r`` depends only on ``(seed, r)``."""
    batches = []
    for r in range(repeats + 1):
        rng = np.random.default_rng([seed, r])
        if workload == "clips":
            starts = rng.integers(0, num_frames - CLIP_LEN + 1, size=SAMPLES_PER_BATCH)
            batches.append([np.arange(s, s + CLIP_LEN) for s in starts])
        else:
            anchors = rng.integers(0, num_frames, size=SAMPLES_PER_BATCH)
            batches.append([np.clip(a + np.array(SPARSE_OFFSETS), 0, num_frames - 1) for a in anchors])
    return batches


def _measure(path: str, backend: str, batches: list[list[np.ndarray]]) -> dict[str, float]:
    """Time every method of :data:`METHODS` on each batch, interleaved (the order rotates per batch) so that load
    from other processes hits them alike; batch 0 is the warm-up. Frames/s are medians over the other batches."""
    info = probe(path)
    delivered = [sum(len(x) for x in batch) for batch in batches]
    buffer = np.empty((max(delivered), info.height, info.width, 3), dtype=np.uint8)
    buffer[...] = 0  # touch every page now, outside the timing
    caches = {"coalesced": VideoReaderCache(max_open=1, backend=backend),
              "per_sample": VideoReaderCache(max_open=1, backend=backend)}
    sequential = _sequential_pass(path, backend)
    baseline = _per_frame_decoder(path, backend)

    def coalesced(batch, outs):
        decode_batch([FrameRequest(path, indices=r, out=o) for r, o in zip(batch, outs)], cache=caches["coalesced"])

    def per_sample(batch, outs):
        for r, o in zip(batch, outs):
            caches["per_sample"].decode_batch([FrameRequest(path, indices=r, out=o)])

    def per_sample_reopen(batch, outs):
        for r in batch:
            read_frames(path, r, backend=backend)

    methods: dict[str, Callable[[list[np.ndarray], list[np.ndarray]], None]] = {
        "coalesced": coalesced, "per_sample": per_sample, "per_sample_reopen": per_sample_reopen,
        "baseline": baseline, "sequential": lambda batch, outs: sequential(),
    }
    wall: dict[str, list[float]] = {m: [] for m in METHODS}
    cpu: dict[str, list[float]] = {m: [] for m in METHODS}
    for r, batch in enumerate(batches):
        outs = consecutive_views(buffer, [len(x) for x in batch])
        for name in METHODS[r % len(METHODS):] + METHODS[: r % len(METHODS)]:
            t0, c0 = time.perf_counter(), time.process_time()
            methods[name](batch, outs)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(max(time.process_time() - c0, 1e-9))
    for cache in caches.values():
        cache.close()
    sequential.close()
    return _figures(wall, cpu, batches, info.num_frames)


def _figures(wall: dict[str, list[float]], cpu: dict[str, list[float]], batches: list[list[np.ndarray]],
             num_frames: int) -> dict[str, float]:
    """Median frames/s per method (seconds per batch in ``wall`` / ``cpu``, batch 0 dropped) and their ratios."""
    delivered = np.array([sum(len(x) for x in b) for b in batches[1:]], dtype=np.float64)
    unique = np.array([len(np.unique(np.concatenate(b))) for b in batches[1:]], dtype=np.float64)
    frames = {m: np.full(len(delivered), float(num_frames)) if m == "sequential" else delivered for m in METHODS}

    def rate(seconds: dict[str, list[float]], method: str, counts: np.ndarray | None = None) -> float:
        counts = frames[method] if counts is None else counts
        return float(np.median(counts / np.asarray(seconds[method][1:])))

    def spread(method: str) -> float:
        rates = frames[method] / np.asarray(wall[method][1:])
        return float((rates.max() - rates.min()) / np.median(rates))

    out: dict[str, float] = {"coverage": float(unique.mean() / num_frames), "frames_per_batch": float(delivered.mean())}
    for prefix, seconds in (("", wall), ("cpu_", cpu)):
        fps = rate(seconds, "coalesced")
        seq = rate(seconds, "sequential")
        out[f"{prefix}frames_per_s"] = fps
        out[f"{prefix}unique_frames_per_s"] = rate(seconds, "coalesced", unique)
        for other in ("baseline", "per_sample", "per_sample_reopen", "sequential"):
            out[f"{prefix}{other}_frames_per_s"] = rate(seconds, other)
        for other in ("baseline", "per_sample", "per_sample_reopen"):
            out[f"{prefix}speedup_vs_{other}"] = fps / out[f"{prefix}{other}_frames_per_s"]
        out[f"{prefix}fraction_of_sequential"] = fps / seq
        out[f"{prefix}unique_fraction_of_sequential"] = out[f"{prefix}unique_frames_per_s"] / seq
    out["frames_per_s_spread"] = spread("coalesced")
    for other in ("baseline", "per_sample", "per_sample_reopen", "sequential"):
        out[f"{other}_frames_per_s_spread"] = spread(other)
    return out


def _per_frame_decoder(path: str, backend: str) -> Callable[[list[np.ndarray], list[np.ndarray]], None]:
    """``run(batch, outs)``: seek and decode per requested frame, on an already open file, each frame copied into
    its place in ``outs`` (one copy per frame, as in the coalesced reader)."""
    info = probe(path)
    if backend == "decord":
        import decord

        vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=1)

        def run(batch, outs):
            for request, out in zip(batch, outs):
                for k, i in enumerate(request.tolist()):
                    vr.seek_accurate(i)
                    out[k] = to_numpy(vr.next())

        return run
    if backend == "torchcodec":
        from torchcodec.decoders import VideoDecoder

        decoder = VideoDecoder(path, dimension_order="NHWC", num_ffmpeg_threads=1, seek_mode="exact")

        def run(batch, outs):
            for request, out in zip(batch, outs):
                for k, i in enumerate(request.tolist()):
                    out[k] = decoder.get_frames_at([i]).data[0].numpy()

        return run
    import av
    from av.video.reformatter import VideoReformatter

    container = av.open(path)
    stream = container.streams.video[0]
    stream.thread_count = 1
    # The same RGB conversion as the coalesced reader, so that the ratio measures only the seek strategy.
    reformatter = VideoReformatter()

    def run(batch, outs):
        for request, out in zip(batch, outs):
            for k, i in enumerate(request.tolist()):
                target = int(info.pts[i])
                container.seek(target, stream=stream, backward=True, any_frame=False)
                for frame in container.decode(stream):
                    if frame.pts is not None and frame.pts >= target:
                        out[k] = reformatter.reformat(frame, format="rgb24").to_ndarray()
                        break

    return run


class _sequential_pass:
    """Every frame in order through the backend's own reader: the ceiling (PyAV: seek to 0, decode to the end).

    Frames are copied into one whole-video buffer allocated (and touched) up front, so the ceiling measures
    decoding and conversion, like the other methods' reused batch buffer."""

    def __init__(self, path: str, backend: str) -> None:
        self.reader = open_reader(path, DecodeOptions(backend=backend))
        self.every = np.arange(self.reader.info.num_frames)
        h, w = self.reader.out_shape
        self.buffer = np.empty((len(self.every), h, w, 3), dtype=np.uint8)
        self.buffer[...] = 0

    def __call__(self) -> None:
        if hasattr(self.reader, "_frames"):
            self.reader._frames = None  # PyAV: start with a seek to frame 0, like a fresh sequential read
        buffer = self.buffer

        def store(k: int, frame: np.ndarray) -> None:
            buffer[k] = frame

        self.reader.decode_each(self.every, store)

    def close(self) -> None:
        self.reader.close()


def lerobot_rates(python: str, path: str, batches: list[list[np.ndarray]], *, lib_dirs: Sequence[str] = (),
                  timeout_s: float = 600.0) -> dict[str, Any]:
    """Median frames/s of LeRobot's ``decode_video_frames`` (torchcodec) and of torchcodec's ``get_frames_at``
    alone, one call per sample on ``batches`` (batch 0 the warm-up), run by :data:`LEROBOT_CHILD` under
    ``python``; also the child's ``versions``. Raises RuntimeError with the child's stderr when it fails."""
    with tempfile.TemporaryDirectory(prefix="mmfeed-decode-lerobot-") as tmp:
        out = os.path.join(tmp, "result.json")
        args = {"path": os.path.abspath(path), "fps": probe(path).fps, "out": out,
                "batches": [[request.tolist() for request in batch] for batch in batches]}
        run_child(python, LEROBOT_CHILD, args, tmp, lib_dirs=lib_dirs, timeout_s=timeout_s)
        with open(out) as f:
            result = json.load(f)
    rates = result["frames_per_s"]
    return {"lerobot_frames_per_s": statistics.median(rates["lerobot"]),
            "torchcodec_frames_per_s": statistics.median(rates["torchcodec"]), "versions": result["versions"]}


def _with_lerobot(row: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """``row`` plus LeRobot's and torchcodec's frames/s and the coalesced speedups over them (None when absent)."""
    row = {**row, **theirs}
    for name in ("lerobot", "torchcodec"):
        fps = theirs[f"{name}_frames_per_s"]
        row[f"speedup_vs_{name}"] = row["frames_per_s"] / fps if fps else None
    return row


def check_targets(results: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """For each of :data:`TARGETS`, the worst row it applies to among those of the backend ``auto`` picks (what
    mmfeed decodes with unless told otherwise): ``{"value", "row", "met"}``, or None when no row has the figure
    (no LeRobot baseline, or no batch reaching coverage 0.25)."""
    figures = {
        "speedup_vs_lerobot_h264_gop30": ("speedup_vs_lerobot", lambda r: r["video"] == "h264_gop30"),
        "fraction_of_sequential_at_coverage_ge_0.25": ("fraction_of_sequential", lambda r: r["coverage"] >= 0.25),
    }
    checks: dict[str, dict[str, Any] | None] = {}
    for target, (key, applies) in figures.items():
        rows = [r for r in results if r.get("auto", True) and applies(r) and r.get(key) is not None]
        if not rows:
            checks[target] = None
            continue
        worst = min(rows, key=lambda r: r[key])
        checks[target] = {"value": worst[key], "row": f"{worst['video']} {worst['backend']} {worst['workload']}",
                          "met": bool(worst[key] >= TARGETS[target])}
    return checks


def _print_report(results: list[dict[str, Any]], checks: dict[str, dict[str, Any] | None]) -> None:
    key = [("video", "video"), ("backend", "backend"), ("auto", "auto"), ("workload", "workload"),
           ("coverage", "coverage")]
    print("frames/s (wall clock; every frame handed to a request, duplicates included)")
    print(table(results, key + [("frames_per_s", "coalesced"), ("per_sample_frames_per_s", "per_sample"),
                                ("per_sample_reopen_frames_per_s", "per_sample_reopen"),
                                ("baseline_frames_per_s", "per_frame"), ("lerobot_frames_per_s", "lerobot"),
                                ("torchcodec_frames_per_s", "lerobot venv tc"),
                                ("sequential_frames_per_s", "sequential")]))
    print("\nspread of the per-batch frames/s behind each median above: (max - min) / median")
    print(table(results, key[:4] + [("frames_per_s_spread", "coalesced"),
                                    ("per_sample_frames_per_s_spread", "per_sample"),
                                    ("per_sample_reopen_frames_per_s_spread", "per_sample_reopen"),
                                    ("baseline_frames_per_s_spread", "per_frame"),
                                    ("sequential_frames_per_s_spread", "sequential")]))
    print("\ncoalesced speedup over each method, and share of sequential (delivered / distinct frames)")
    print(table(results, key[:4] + [("speedup_vs_per_sample", "x per_sample"),
                                    ("speedup_vs_per_sample_reopen", "x reopen"),
                                    ("speedup_vs_baseline", "x per_frame"),
                                    ("speedup_vs_lerobot", "x lerobot"), ("speedup_vs_torchcodec", "x venv tc"),
                                    ("fraction_of_sequential", "of seq"), ("unique_fraction_of_sequential", "uniq/seq"),
                                    ("cpu_speedup_vs_per_sample", "cpu x per_sample"),
                                    ("cpu_speedup_vs_baseline", "cpu x per_frame"),
                                    ("cpu_fraction_of_sequential", "cpu of seq")]))
    if results and results[0]["lerobot_frames_per_s"] is None:
        print("lerobot / lerobot venv tc: not measured (pass --lerobot-python PATH to a venv with lerobot and "
              "torchcodec)")
    if not any(r["backend"] == "torchcodec" for r in results):
        print(f"backend torchcodec: not measured ({torchcodec_error()})")
    for target, check in checks.items():
        figure = "not measured" if check is None else (
            f"worst {check['value']:.2f} ({check['row']}): {'met' if check['met'] else 'NOT met'}")
        print(f"target {target} >= {TARGETS[target]}: {figure}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
