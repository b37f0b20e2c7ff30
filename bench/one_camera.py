"""``mmfeed bench loader``: the single-camera windowed workload through mmfeed bench's measurement: mmfeed, the
decode limit and the torch baseline (``python -m mmfeed.bench.one_camera --help``)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from mmfeed.bench.loader import LoaderBench
from mmfeed.bench.run import BenchRun, render, run_bench, write_json

__all__ = ["main"]



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.one_camera",
                                     description="The single-camera windowed workload through mmfeed bench's "
                                                 "measurement: mmfeed, the decode limit and the torch baseline.")
    parser.add_argument("--format", choices=["webdataset", "lerobot"], default="webdataset")
    parser.add_argument("--codec", choices=["h264", "av1"], default=None,
                        help="default: h264 (webdataset), av1 (lerobot)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="batches per stretch (default: about 1.5 s of them)")
    parser.add_argument("--episode-block", type=int, default=0, help="0 = shuffle samples across the whole epoch")
    parser.add_argument("--lerobot-style", action="store_true",
                        help="320x240 AV1 g=2, 2 history frames, 50-step chunk, about 32 samples per batch")
    parser.add_argument("--quick", action="store_true", help="tiny videos and few steps (for tests)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    cfg = LoaderBench(format=args.format, episodes=10, min_length=100, max_length=160, height=240, width=320,
                      workers=args.workers, steps=args.steps, episode_block=args.episode_block)
    if args.lerobot_style:
        cfg = replace(cfg, format="lerobot", codec="av1", gop=2, history=2, horizon=50, tokens_per_frame=64,
                      capacity=1024, rows_per_batch=8)
    if args.codec:
        cfg = replace(cfg, codec=args.codec, gop=30 if args.codec == "h264" else 2)
    elif cfg.format == "lerobot" and not args.lerobot_style:
        cfg = replace(cfg, codec="av1", gop=2)
    if args.quick:
        cfg = replace(cfg, episodes=4, min_length=30, max_length=40, height=64, width=96, steps=4, warmup=1,
                      tokens_per_frame=16, capacity=512)
    report = run_bench(cfg, BenchRun(repeats=1 if args.quick else 5, progress=False))
    print(render(report))
    if args.json:
        write_json(report, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
