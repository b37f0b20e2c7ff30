"""``mmfeed cache``: fill the decoded-frame store ahead of training, or report on it, or clear it.

Filling reads the first frame of every camera of every episode through a source opened with ``cache=DIR``: the
source decodes each segment (one camera of one episode) whole into the store, in worker processes that share
the store exactly as a DataLoader's workers do. Training then opens the dataset with the same ``cache``,
``frame_size`` (and frame format and backend) and reads every frame from the store.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from mmfeed._parsing import height_width, positive
from mmfeed.loaders.open import open_dataset
from mmfeed.loaders.sources.base import EpisodeSource
from mmfeed.loaders.sources.frame_store import FrameStore
from mmfeed.loaders.sources.requests import EpisodeRequest

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "fill", "run"]

HELP = "fill the decoded-frame cache ahead of training (or --info, --clear)"
DESCRIPTION = ("Decode every camera of every episode of PATH (a LeRobot v3 directory or webdataset shards, local or "
               "remote) at --frame-size into the frame cache in --dir, in --processes processes; training that "
               "opens the dataset with open_dataset(PATH, cache=DIR, frame_size=...) at the same size, format and "
               "backend then reads frames from it and never decodes. Prints what was stored. --info reports the "
               "cache; --clear deletes it.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's options."""
    p.add_argument("path", nargs="?", metavar="PATH", help="the dataset to decode into the cache")
    p.add_argument("--dir", required=True, metavar="DIR", help="the cache directory (open_dataset's cache=)")
    p.add_argument("--frame-size", type=height_width, metavar="HxW",
                   help="decoded frame size, HEIGHTxWIDTH (default: as stored)")
    p.add_argument("--frame-format", choices=["rgb24", "yuv420"], default="rgb24")
    p.add_argument("--backend", default="auto", help="video backend (default auto)")
    p.add_argument("--budget", type=positive(int, 1), metavar="BYTES",
                   help="bytes the cache may hold (open_dataset's cache_bytes=; default half the free space)")
    p.add_argument("--processes", type=positive(int, 1), default=2, help="decoding processes (default 2)")
    p.add_argument("--info", action="store_true", help="report what the cache holds; decode nothing")
    p.add_argument("--clear", action="store_true", help="delete the cache; decode nothing")


def fill(source: EpisodeSource, processes: int = 2) -> int:
    """Decode every video segment of ``source`` (opened with ``cache=``) into its store, the episodes dealt over
    ``processes`` processes; returns the segments this call decoded."""
    episodes = np.arange(len(source))
    parts = [p for p in np.array_split(episodes, max(1, min(processes, len(episodes)))) if len(p)]
    if len(parts) == 1:
        return _fill(source, parts[0])
    with ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("spawn")) as pool:
        return sum(pool.map(_fill, [source] * len(parts), parts))


def run(args: argparse.Namespace) -> int:
    """The command (see :data:`DESCRIPTION`)."""
    store = FrameStore(args.dir, args.budget)
    if args.clear:
        before = store.info()
        store.clear()
        print(f"cleared {args.dir}: {before.segments} segments, {_gib(before.bytes)}")
        return 0
    if not args.info:
        if args.path is None:
            raise ValueError("mmfeed cache: give the dataset PATH to fill the cache from (or --info / --clear)")
        source = open_dataset(args.path, cache=args.dir, cache_bytes=args.budget, frame_size=args.frame_size,
                              frame_format=args.frame_format, backend=args.backend)
        start = time.perf_counter()
        filled = fill(source, args.processes)
        print(f"decoded {filled} segments of {len(source)} episodes into {args.dir} in "
              f"{time.perf_counter() - start:.1f} s")
    info = store.info()
    print(f"{info.directory}: {info.segments} segments, {_gib(info.bytes)} of a {_gib(info.budget_bytes)} budget"
          + (f", {info.partial} partial files" if info.partial else ""))
    return 0


def _fill(source: EpisodeSource, episodes: Sequence[int]) -> int:
    cameras = [f for f, feature in source.features.items() if feature.kind == "video"]
    store = getattr(source, "_store", None)
    if store is None:
        raise ValueError(f"{source.name}: its format keeps no frame cache (cache= applies to LeRobot v3 "
                         "directories and webdataset shards)")
    for e in episodes:
        present = [c for c in cameras if source.present(c)[e] and source.frames(c)[e] > 0]
        if present:
            source.read_many([EpisodeRequest(int(e), {c: np.zeros(1, dtype=np.int64) for c in present})])
    return store.filled


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"
