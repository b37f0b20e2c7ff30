"""The ``mmfeed`` command line: ``mmfeed bench``, ``mmfeed bench packing`` and the dataset tools."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _bench(args: argparse.Namespace) -> int:
    if args.what == "packing":
        from mmfeed.bench.packing import main as packing_main

        return packing_main(args.rest)
    # The loader benchmark on synthetic robot data lands with the loaders; until then the main job is packing.
    from mmfeed.bench.packing import main as packing_main

    return packing_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmfeed",
        description="mmfeed: decode, pack, prefetch and measure multimodal training data.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench = sub.add_parser(
        "bench",
        help="benchmark mmfeed on built-in synthetic data",
        description="Benchmark mmfeed on built-in synthetic data. `mmfeed bench packing --help` lists its options.",
    )
    bench.add_argument("what", nargs="?", choices=["packing"], default=None, help="which benchmark to run")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to the benchmark")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"mmfeed: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
