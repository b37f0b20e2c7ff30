"""The ``mmfeed`` command line (also ``python -m mmfeed``).

``mmfeed bench`` benchmarks the loader on a small synthetic robot dataset (or ``--data PATH``) beside torch's
DataLoader; ``mmfeed bench packing`` (and ``stall``, ``decode``, ``loader``, ``scaling``) run the focused
benchmarks, each with its own ``--help``; ``mmfeed compare``
finds regressions between two ``--json`` reports; ``mmfeed synth``, ``mmfeed index`` and ``mmfeed inspect`` make,
index and survey datasets; ``mmfeed convert`` converts them and ``mmfeed stats`` computes their statistics (per
dataset and per embodiment, with quantiles) from the arrays alone.

Exit status: 0 success; 1 ``compare`` found a regression; 2 bad arguments or an input that cannot be used (a
missing path, a file that is not a report, settings that cannot work), always with one line
``mmfeed: error: ...`` on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from mmfeed._parsing import FRAME_SIZE, frame_size
from mmfeed._parsing import positive as _positive

__all__ = ["build_parser", "main"]

EPILOG = ("exit status: 0 success, 1 `compare` found a regression, 2 bad arguments or unusable input "
          "(one line `mmfeed: error: ...` on stderr)")

# named benchmarks: `mmfeed bench NAME [options]` runs NAME's own command line (`mmfeed bench NAME --help`)
NAMED_BENCHMARKS = {
    "packing": ("mmfeed.bench.packing", "bin packing, lower-bound gap, online packing, rank balance"),
    "stall": ("mmfeed.bench.stall", "input stall at 80% of capacity, mmfeed vs torch's DataLoader"),
    "decode": ("mmfeed.bench.decode", "video decode backends and GOP-aware batch decode"),
    "loader": ("mmfeed.bench.one_camera", "the one-camera windowed workload beside the decode limit and torch"),
    "scaling": ("mmfeed.bench.scaling", "the epoch plan from 8 to 1024 ranks: steps, drops, balance"),
    "scale": ("mmfeed.bench.scale", "planning, windows, the index and block masks up to 1e8 samples, 4096 ranks"),
    "convert": ("mmfeed.bench.convert", "mmfeed convert throughput: local processes and Ray"),
    "train": ("mmfeed.bench.train", "training on packed rows vs pad-to-longest: useful tokens/s, padding, loss"),
    "device-transforms": ("mmfeed.bench.device_transforms",
                          "augmentation in the workers vs batched after the copy (device='cpu'): samples/s, CPU"),
    "startup": ("mmfeed.bench.startup", "iter() + first batch with worker processes, mmfeed vs torch"),
    "reuse": ("mmfeed.bench.reuse", "decode reuse k = 1, 2, 4, 8: frames per CPU-second against episodes per batch"),
    "gpu-decode": ("mmfeed.bench.gpu_decode", "NVDEC (PyAV, torchcodec) against CPU decode (one line without a GPU)"),
    "gpu": ("mmfeed.bench.gpu", "NVDEC, prefetch overlap, FlexAttention and device transforms on one CUDA device "
            "(one line without CUDA)"),
    "soak": ("mmfeed.bench.soak", "memory of the training process and each persistent worker over 100 epochs"),
}

#: ``--backend`` choices: "auto" and mmfeed.codecs.video.BACKENDS (listed here: the CLI starts without torch)
VIDEO_BACKENDS = ["auto", "decord", "pyav", "torchcodec"]


_size = frame_size(min_width=32, min_height=16)  # the synthetic frames carry their index in 32 columns, 16 rows


def _cameras(text: str) -> tuple[str, ...]:
    names = tuple(c.strip() for c in text.split(",") if c.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more camera names, e.g. cam_high,cam_wrist")
    return names


INT1, INT0, NUM0 = _positive(int, 1), _positive(int, 0), _positive(float, 0)


# --------------------------------------------------------------------------------------------------- commands


def _sweep(text: str) -> tuple[int, ...]:
    """``workers=1,2,4`` -> ``(1, 2, 4)``."""
    key, sep, values = text.partition("=")
    if not sep or key.strip() != "workers":
        raise argparse.ArgumentTypeError(f"{text!r}: write it as workers=1,2,4 (only the worker count is swept)")
    try:
        counts = tuple(int(v) for v in values.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: worker counts must be integers, e.g. workers=1,2,4") from None
    if not counts or min(counts) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more worker counts >= 0, e.g. workers=1,2,4")
    return counts


def _check_exists(path: str, what: str) -> None:
    """FileNotFoundError for a local path (no URL, pattern or glob) that does not exist; before heavy imports."""
    if "://" not in path and not any(c in path for c in "{*?[") and not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory ({what})")


def _bench(args: argparse.Namespace) -> int:
    if args.benchmark is not None:
        raise ValueError(f"put the benchmark's name right after `bench`: mmfeed bench {args.benchmark} [its options] "
                         f"(`mmfeed bench {args.benchmark} --help`)")
    for option, value in (("--json", args.json), ("--plot", args.plot)):
        if value is not None and not Path(value).resolve().parent.is_dir():
            raise ValueError(f"{option} {value}: directory {Path(value).resolve().parent} does not exist")
    if args.data is not None:
        _check_exists(args.data, "--data takes webdataset shards or a LeRobot v3 directory")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:  # fail now, not after the run
        raise ImportError("--plot needs matplotlib: pip install matplotlib")
    from mmfeed.bench.run import DEFAULT_DATASET, QUICK_DATASET, BenchRun, render, run_bench, write_json

    cfg = QUICK_DATASET if args.quick else DEFAULT_DATASET
    codec = args.codec or ("av1" if args.format == "lerobot" else "h264")
    cfg = replace(cfg, format=args.format, codec=codec, gop=30 if codec == "h264" else 2, backend=args.backend)
    for field in ("episodes", "capacity", "workers", "steps", "rows_per_batch", "tokens_per_frame", "seed",
                  "episode_block"):
        if getattr(args, field) is not None:
            cfg = replace(cfg, **{field: getattr(args, field)})
    if args.chunk_steps is not None:
        cfg = replace(cfg, chunk_steps=args.chunk_steps or None)
    if args.size is not None:  # the first embodiment's frame size; the others keep their size relative to it
        width, height = args.size.width, args.size.height
        first = cfg.embodiments[0] if cfg.embodiments else cfg
        scale = (width / first.width, height / first.height)
        even = lambda v: max(2, 2 * round(v / 2))  # noqa: E731 (H.264 wants even sizes)
        cfg = replace(cfg, width=width, height=height, embodiments=tuple(
            replace(e, width=even(e.width * scale[0]), height=even(e.height * scale[1])) for e in cfg.embodiments))
    if args.steps is not None:
        cfg = replace(cfg, warmup=max(1, min(cfg.warmup, args.steps)))
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    run = BenchRun(data=args.data, repeats=args.repeats, stretch_s=args.stretch_s, step_ms=args.step_ms,
                   lead_s=0.0 if args.quick else BenchRun.lead_s, warm_s=0.0 if args.quick else BenchRun.warm_s,
                   device=device, limit=not args.no_limit, worker_mode=args.worker_mode,
                   sweep=args.sweep or (), progress=not args.no_progress)
    report = run_bench(cfg, run)
    print(render(report))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        from mmfeed.bench.plot import plot_report

        plot_report(report, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from mmfeed.bench.compare import compare, format_comparison, load_report

    base, new = load_report(args.base), load_report(args.new)
    result = compare(base, new, tolerance=args.tolerance, min_stall=args.min_stall, min_time_s=args.min_time_ms / 1e3)
    print(f"base: {args.base}\nnew:  {args.new}")
    print(format_comparison(result, all_figures=not args.changes_only))
    return 1 if result.regressed else 0


def _synth(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; choose a new output directory")
    if args.min_length > args.max_length:
        raise ValueError(f"--min-length {args.min_length} is above --max-length {args.max_length}")
    from mmfeed._progress import progress_bar
    from mmfeed.testing.synth_dataset import SyntheticDataset, write_synthetic

    codec = args.codec or ("av1" if args.format == "lerobot" else "h264")
    width, height = args.size.width, args.size.height
    cfg = SyntheticDataset(format=args.format, episodes=args.episodes, min_length=args.min_length,
                      max_length=args.max_length, height=height, width=width, codec=codec,
                      gop=args.gop or (30 if codec == "h264" else 2), fps=args.fps, cameras=args.cameras,
                      seed=args.seed)
    with progress_bar(args.episodes, desc=f"writing {args.format}", unit="episode",
                      enabled=not args.no_progress) as bar:
        write_synthetic(out, cfg, progress=bar.update)
    what = "webdataset shards + mmfeed-index.parquet" if args.format == "webdataset" else "a LeRobot v3 directory"
    videos = ",".join(f"observation.images.{c}" for c in cfg.cameras)
    print(f"wrote {args.episodes} episodes ({width}x{height} {codec}, videos {videos}) as "
          f"{what} to {out}")
    return 0


def _index(args: argparse.Namespace) -> int:
    if len(args.shards) == 1 and args.output is None:
        from mmfeed.loaders.formats.rlds import detect as is_rlds

        if is_rlds(args.shards[0]) is not None:
            return _index_rlds(args.shards[0])
    for spec in args.shards:
        _check_exists(spec, "give a directory of .tar shards, a brace pattern, a glob or shard files")
        if os.path.isfile(os.path.join(spec, "meta", "info.json")):
            raise ValueError(f"{spec} is a LeRobot directory: it carries its own index in meta/episodes/")
    from mmfeed._progress import progress_bar
    from mmfeed.inspection import describe_features, format_features
    from mmfeed.loaders.stores.index import write_index
    from mmfeed.loaders.formats.webdataset.source import WebDatasetSource, expand_shards

    shards = expand_shards(list(args.shards))
    with progress_bar(len(shards), desc="indexing", unit="shard", enabled=not args.no_progress) as bar:
        path = write_index(shards, args.output, progress=bar.update)
    source = WebDatasetSource(path)
    steps = int(source.lengths.sum())
    print(f"wrote {path}: {len(source)} episodes, {steps} steps, {len(shards)} shard(s)")
    print("\n".join(format_features(describe_features(source))))
    return 0


def _index_rlds(path: str) -> int:
    """Build the index of every split of an RLDS dataset (kept in the cache, as its first open would)."""
    from mmfeed.loaders.formats.rlds import RldsSource
    from mmfeed.loaders.formats.rlds.metadata import locate, split_names

    for split in split_names(locate(path)):
        source = RldsSource(path, split=split)
        skipped = f", {len(source.skipped)} skipped" if source.skipped else ""
        print(f"indexed {source.name}: {len(source)} episodes, {int(source.lengths.sum())} steps, "
              f"{len(source.shards)} shard(s){skipped}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    _check_exists(args.path, "give webdataset shards, a LeRobot v3 directory or an RLDS dataset")
    from mmfeed.inspection import format_inspection, inspect_dataset, window_packing
    from mmfeed.loaders import open_dataset

    options = {k: v for k, v in (("split", args.split), ("fps", args.fps)) if v is not None}  # formats that take them
    source = open_dataset(args.path, backend=args.backend, **options)
    packing = window_packing(source, capacity=args.capacity, rows_per_batch=args.rows_per_batch,
                             history=args.history, horizon=args.horizon, tokens_per_frame=args.tokens_per_frame,
                             max_length=args.max_length, stride=args.stride, algorithm=args.algorithm, seed=args.seed)
    info = inspect_dataset(source, packing, world_size=args.world_size)
    info["path"] = str(args.path)
    print(format_inspection(info))
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


# ----------------------------------------------------------------------------------------------------- parser


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    names = ", ".join(f"`mmfeed bench {n}`: {h}" for n, (_, h) in NAMED_BENCHMARKS.items())
    p = sub.add_parser(
        "bench", help="benchmark the loader against torch's DataLoader and the decode limit (mmfeed bench packing: "
                      "the packer)",
        description="Benchmark mmfeed's loader on a variable-length robot workload (a synthetic mixture of two "
                    "embodiments, one and two cameras at other sizes and rates, windowed policy samples beside "
                    "whole-episode world-model chunks, tasks of 5-600 bytes; synthesized once, cached under "
                    "$MMFEED_CACHE or ~/.cache/mmfeed) or on --data PATH, beside torch's DataLoader with per-sample "
                    "decode and pad-to-longest batches, both reading the same samples shuffled across the epoch, "
                    "measured stretch by stretch in turn in one process, and beside the decode limit (the frames "
                    "the batches need, GOP dependencies included, decoded by plain PyAV in as many processes). "
                    "Prints samples/s, useful tokens/s, delivered and decoded frames/s, packing efficiency, "
                    "padding fraction, stall fraction under a simulated step, the per-stage worker time, the "
                    "fraction of the limit mmfeed delivers and where a batch's time goes. Figures are medians of "
                    f"--repeats stretches, their spread shown. Other benchmarks: {names} (each has its own --help).",
        epilog=EPILOG)
    p.add_argument("benchmark", nargs="?", choices=sorted(NAMED_BENCHMARKS), metavar="NAME",
                   help=f"run a named benchmark instead: {', '.join(sorted(NAMED_BENCHMARKS))}")
    p.add_argument("--data", metavar="PATH", help="webdataset shards (directory, pattern) or a LeRobot v3 directory "
                   "instead of the synthetic dataset")
    p.add_argument("--format", choices=["webdataset", "lerobot"], default="webdataset",
                   help="format of the synthetic dataset (default webdataset)")
    p.add_argument("--codec", choices=["h264", "av1"], default=None,
                   help="codec of the synthetic dataset (default h264; av1 for --format lerobot, as LeRobot)")
    p.add_argument("--episodes", type=INT1, help="episodes of each embodiment of the synthetic dataset (default 8)")
    p.add_argument("--size", type=_size, metavar=FRAME_SIZE, help=f"frame size of the first embodiment's camera, "
                   f"{FRAME_SIZE} (default 320x240; the other embodiment's cameras scale alike from 256x192)")
    p.add_argument("--capacity", type=INT1, help="tokens per packed row (default 8192)")
    p.add_argument("--rows-per-batch", type=INT1, help="packed rows per batch (default 2)")
    p.add_argument("--tokens-per-frame", type=INT1, help="tokens one frame costs (default 256)")
    p.add_argument("--chunk-steps", type=INT0, help="longest whole-episode world-model chunk in steps, beside the "
                   "windows (default 32; 0: windows only)")
    p.add_argument("--episode-block", type=INT0, help="0 (default): mmfeed shuffles samples across the whole epoch, "
                   "as the baseline's sampler does; N: each batch from blocks of N episodes (mmfeed's locality)")
    p.add_argument("--workers", type=INT0, help="worker processes of both loaders (and of the decode limit; default 2)")
    p.add_argument("--backend", choices=VIDEO_BACKENDS, default="auto", help="video decode backend")
    p.add_argument("--steps", type=INT1, help="batches per measured stretch (default: as many as --stretch-s takes)")
    p.add_argument("--stretch-s", type=NUM0, default=1.5, help="seconds of one measured stretch when --steps is not "
                   "given (default 1.5)")
    p.add_argument("--repeats", type=INT1, default=5, help="measured stretches per figure, median reported (default 5)")
    p.add_argument("--step-ms", type=NUM0, default=None,
                   help="simulated training step in ms (default: 1 / (0.8 x mmfeed's measured capacity))")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where mmfeed's prefetcher puts batches (default cuda if available, else cpu)")
    p.add_argument("--worker-mode", choices=["process", "thread"], default="process",
                   help="mmfeed's workers: processes (default) or threads of the training process")
    p.add_argument("--seed", type=INT0, help="seed of the synthetic data and the plan (default 0)")
    p.add_argument("--no-limit", action="store_true", help="do not measure the decode limit")
    p.add_argument("--json", metavar="FILE", help="write every figure, the settings and the environment as JSON "
                   "(input of `mmfeed compare`)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the worker-scaling curve and the stall breakdown")
    p.add_argument("--sweep", type=_sweep, metavar="workers=1,2,4",
                   help="also measure at these worker counts (the scaling curve)")
    p.add_argument("--quick", action="store_true", help="tiny videos and few steps (a smoke run)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (drawn only when stderr is a "
                   "terminal)")
    p.set_defaults(func=_bench)


def build_parser() -> argparse.ArgumentParser:
    """The ``mmfeed`` argument parser (one subparser per command)."""
    from mmfeed import __version__

    parser = argparse.ArgumentParser(
        prog="mmfeed", epilog=EPILOG,
        description="mmfeed: decode, pack, prefetch and measure multimodal training data. Start with "
                    "`mmfeed bench`; `mmfeed COMMAND --help` for each command.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"mmfeed {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _bench_parser(sub)

    p = sub.add_parser("compare", help="compare two `mmfeed bench --json` reports; exit 1 on a regression",
                       description="Noise-aware regression detection between two benchmark reports (mmfeed bench "
                                   "--json; also bench packing/stall/loader JSON). A throughput (*_per_s) that fell, "
                                   "or a stall or time that rose, by more than --tolerance AND more than the noise "
                                   "of the recorded repeats (half range, both sides) AND an absolute floor, is a "
                                   "regression. Baseline figures and ratios are shown, never fail. Settings that "
                                   "differ are listed, not refused.", epilog=EPILOG)
    p.add_argument("base", metavar="BASE.json")
    p.add_argument("new", metavar="NEW.json")
    p.add_argument("--tolerance", type=NUM0, default=0.1, help="relative change allowed (default 0.1 = 10%%)")
    p.add_argument("--min-stall", type=NUM0, default=0.01,
                   help="a stall fraction must also rise by this much in absolute terms (default 0.01)")
    p.add_argument("--min-time-ms", type=NUM0, default=1.0,
                   help="a time must also rise by this many ms (default 1)")
    p.add_argument("--changes-only", action="store_true", help="list only figures beyond the tolerance")
    p.set_defaults(func=_compare)

    p = sub.add_parser("synth", help="write a synthetic robot dataset (webdataset shards or LeRobot v3)",
                       description="Write seeded synthetic robot episodes as webdataset shards (v2: every feature "
                                   "a member under its own name) with their parquet index, or as a LeRobot v3 "
                                   "directory: observation.state (smooth trajectories), action, "
                                   "observation.velocity, next.reward, next.done, task text and one video "
                                   "observation.images.<camera> per camera, whose pixels carry their frame "
                                   "index.", epilog=EPILOG)
    p.add_argument("out", metavar="OUT", help="output directory (new or empty)")
    p.add_argument("--format", choices=["webdataset", "lerobot"], default="webdataset")
    p.add_argument("--episodes", type=INT1, default=10, help="number of episodes (default 10)")
    p.add_argument("--codec", choices=["h264", "av1"], default=None,
                   help="video codec (default h264; av1 for --format lerobot, as LeRobot)")
    p.add_argument("--size", type=_size, default="320x240", metavar=FRAME_SIZE,
                   help=f"frame size, {FRAME_SIZE} (default 320x240: 320 wide, 240 high)")
    p.add_argument("--min-length", type=INT1, default=100, help="shortest episode in steps (default 100)")
    p.add_argument("--max-length", type=INT1, default=160, help="longest episode in steps (default 160)")
    p.add_argument("--fps", type=_positive(float, 1), default=30.0, help="steps and frames per second (default 30)")
    p.add_argument("--cameras", type=_cameras, default=("cam_high",),
                   help="comma-separated; camera C is feature observation.images.C (default cam_high)")
    p.add_argument("--gop", type=INT1, default=None, help="keyframe interval (default 30 for h264, 2 for av1)")
    p.add_argument("--seed", type=INT0, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one is drawn only when stderr is "
                   "a terminal)")
    p.set_defaults(func=_synth)

    p = sub.add_parser("index", help="write the parquet index (features and stats) beside webdataset shards, or "
                                     "build an RLDS dataset's record index",
                       description="Index webdataset shards into mmfeed-index.parquet beside the first shard: every "
                                   "feature of every episode under its own name (<key>.<feature>.npy or .mp4; "
                                   "kind, dtype, step shape, rate, frame count, where its bytes lie) and the stats of "
                                   "the numeric array features, merged over the dataset. Shards of ShardWriter "
                                   "(meta.json lists the features) cost tar headers and meta.json alone; shards "
                                   "written by hand (meta.json with fps, length and task only) have their arrays "
                                   "read for the stats and their videos probed (no frame decoded). Prints the "
                                   "features and stats found. Given an RLDS dataset (its version directory or the "
                                   "directory above), builds the record index of each of its splits in the cache "
                                   "($MMFEED_CACHE/index/rlds), as its first open would, its shards scanned in "
                                   "parallel.", epilog=EPILOG)
    p.add_argument("shards", nargs="+", metavar="SHARDS",
                   help="a directory of .tar shards, a brace pattern or glob, or shard files; or an RLDS dataset")
    p.add_argument("-o", "--output", metavar="PATH", help="index file (default <shard dir>/mmfeed-index.parquet)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one is drawn only when stderr is "
                   "a terminal)")
    p.set_defaults(func=_index)

    import mmfeed.loaders.fill_cache as frame_cache

    p = sub.add_parser("cache", help=frame_cache.HELP, description=frame_cache.DESCRIPTION, epilog=EPILOG)
    frame_cache.add_arguments(p)
    p.set_defaults(func=frame_cache.run)

    p = sub.add_parser("inspect", help="episodes, lengths, features, stats and a packing forecast, from the index",
                       description="Survey a dataset from its index alone (no pixel decoded): episodes, a length "
                                   "histogram, fps, every feature (kind, dtype, step shape, rate) with the stats "
                                   "the index holds, tasks, and a forecast of one epoch's packing "
                                   "efficiency, rows, steps and tokens at --capacity, planned exactly as "
                                   "mmfeed.DataLoader(packing=...) would, beside pad-to-longest batches.",
                       epilog=EPILOG)
    p.add_argument("path", metavar="PATH", help="webdataset shards (directory, pattern), a LeRobot v3 directory, "
                                               "an RLDS dataset (its version directory or the directory above), "
                                               "HDF5 or Zarr demonstrations")
    p.add_argument("--split", default=None,
                   help="the split to read: an RLDS dataset's (default train), a robomimic file's mask (default all)")
    p.add_argument("--fps", type=_positive(float, 0), default=None,
                   help="steps per second of a dataset whose files record none (RLDS, HDF5 and Zarr)")
    p.add_argument("--capacity", type=INT1, default=8192, help="tokens per packed row (default 8192)")
    p.add_argument("--rows-per-batch", type=INT1, default=1, help="packed rows per batch (default 1)")
    p.add_argument("--history", type=INT1, default=4,
                   help="frames of each video feature in a window, at its own rate (default 4)")
    p.add_argument("--horizon", type=INT1, default=50, help="`action` steps in a window (default 50)")
    p.add_argument("--tokens-per-frame", type=INT1, default=256,
                   help="tokens one video frame costs (default 256; a state or an action step costs 1)")
    p.add_argument("--stride", type=INT1, default=1, help="steps between window anchors (default 1)")
    p.add_argument("--max-length", type=INT1, default=None,
                   help="whole-episode chunks of at most this many steps instead of windows")
    p.add_argument("--algorithm", default="bfd", help="packing algorithm (default bfd)")
    p.add_argument("--world-size", type=INT1, default=1, help="ranks the epoch is dealt to (default 1)")
    p.add_argument("--seed", type=INT0, default=0)
    p.add_argument("--backend", choices=VIDEO_BACKENDS, default="auto")
    p.add_argument("--json", metavar="FILE", help="also write the survey and forecast as JSON")
    p.set_defaults(func=_inspect)

    import mmfeed.loaders.conversion.job as conversion
    import mmfeed.loaders.conversion.statistics as statistics

    p = sub.add_parser("convert", help=conversion.HELP, description=conversion.DESCRIPTION, epilog=EPILOG)
    conversion.add_arguments(p)
    p.set_defaults(func=conversion.run)

    p = sub.add_parser("stats", help=statistics.HELP, description=statistics.DESCRIPTION, epilog=EPILOG)
    statistics.add_arguments(p)
    p.set_defaults(func=statistics.run)
    return parser


def _named_benchmark(argv: list[str]) -> tuple[str, list[str]] | None:
    """``("packing", rest)`` when argv runs a named benchmark (``[-v] bench packing ...``)."""
    i = 0
    while i < len(argv) and argv[i] in ("-v", "--verbose"):
        i += 1
    if len(argv) > i + 1 and argv[i] == "bench" and argv[i + 1] in NAMED_BENCHMARKS:
        return argv[i + 1], argv[i + 2:]
    return None


def _one_line(err: BaseException) -> str:
    text = str(err)
    if "\nOriginal Traceback (most recent call last):" in text:  # raised in a DataLoader worker: torch's message
        text = _raised_in_worker(text)  # is the worker's whole traceback; the error is its last entry
    text = " ".join(text.split())
    return text or type(err).__name__


def _raised_in_worker(text: str) -> str:
    """The message of the error at the end of a traceback (torch's re-raise of a worker's error), without the
    error's qualified type name."""
    lines = text.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")
                or line.startswith("Original Traceback (most recent call last):"))
    body = [i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()]
    if not body:
        return text
    error = "\n".join(lines[body[0]:])
    kind, sep, message = error.partition(": ")
    return message if sep and kind.replace(".", "").replace("_", "").isalnum() else error


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mmfeed`` command line; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = any(a in ("-v", "--verbose") for a in argv[:1])
    named = _named_benchmark(argv)
    if named is None:
        args = build_parser().parse_args(argv)
        verbose = args.verbose
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if named is not None:
            return int(importlib.import_module(NAMED_BENCHMARKS[named[0]][0]).main(named[1]) or 0)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("mmfeed: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError, ImportError) as err:
        logging.getLogger(__name__).debug("error", exc_info=True)
        print(f"mmfeed: error: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
