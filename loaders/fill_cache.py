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
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING

import numpy as np

from mmfeed._parsing import FRAME_SIZE, frame_size, positive

if TYPE_CHECKING:
    from mmfeed.loaders.sources.base import EpisodeSource

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
    p.add_argument("--frame-size", type=frame_size(), metavar=FRAME_SIZE,
                   help=f"decoded frame size, {FRAME_SIZE}, e.g. 224x224 (default: as stored); training opens the "
                        "dataset with frame_size=(HEIGHT, WIDTH)")
    p.add_argument("--frame-format", choices=["rgb24", "yuv420"], default="rgb24")
    p.add_argument("--backend", default="auto", help="video backend (default auto)")
    p.add_argument("--budget", type=positive(int, 1), metavar="BYTES",
                   help="bytes the cache may hold (open_dataset's cache_bytes=; default half the free space)")
    p.add_argument("--processes", type=positive(int, 1), default=2, help="decoding processes (default 2)")
    p.add_argument("--info", action="store_true", help="report what the cache holds; decode nothing")
    p.add_argument("--clear", action="store_true", help="delete the cache; decode nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (none is drawn unless stderr is a "
                   "terminal)")


CHUNKS_PER_PROCESS = 8
"""Runs of episodes each decoding process is dealt (a progress bar moves as each run is done)."""


def fill(source: EpisodeSource, processes: int = 2, progress: Callable[[int], object] | None = None) -> int:
    """Decode every video segment of ``source`` (opened with ``cache=``) into its store, the episodes dealt over
    ``processes`` processes in runs of consecutive episodes; returns the segments this call decoded.
    ``progress(n)`` is called as each run of ``n`` episodes is done (e.g. a tqdm bar's ``update``)."""
    episodes = np.arange(len(source))
    if not len(episodes):
        return 0
    processes = max(1, min(processes, len(episodes)))
    runs = [r for r in np.array_split(episodes, min(len(episodes), CHUNKS_PER_PROCESS * processes)) if len(r)]
    done = progress if progress is not None else (lambda n: None)
    if processes == 1:
        filled = 0
        for run in runs:
            filled += _fill(source, run)
            done(len(run))
        return filled
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"), initializer=_adopt,
                             initargs=(source,)) as pool:
        futures = {pool.submit(_fill, None, run): len(run) for run in runs}
        filled = 0
        for future in as_completed(futures):
            filled += future.result()
            done(futures[future])
        return filled


def run(args: argparse.Namespace) -> int:
    """The command (see :data:`DESCRIPTION`)."""
    # imported here, not above: the command line builds its parser from this module, and `mmfeed --help` should
    # not import torch and the decoders
    from mmfeed._progress import progress_bar
    from mmfeed.loaders.open import open_dataset
    from mmfeed.loaders.stores.frame_store import FrameStore

    store = FrameStore(args.dir, args.budget)
    if args.clear:
        before = store.info()
        store.clear()
        print(f"cleared {args.dir}: {before.segments} segments, {_gib(before.bytes)}")
        return 0
    if not args.info:
        if args.path is None:
            raise ValueError("mmfeed cache: give the dataset PATH to fill the cache from (or --info / --clear)")
        size = None if args.frame_size is None else args.frame_size.hw  # WIDTHxHEIGHT given, (H, W) taken
        source = open_dataset(args.path, cache=args.dir, cache_bytes=args.budget, frame_size=size,
                              frame_format=args.frame_format, backend=args.backend)
        start = time.perf_counter()
        with progress_bar(len(source), desc="decoding into the cache", unit="episode",
                          enabled=not args.no_progress) as bar:
            filled = fill(source, args.processes, bar.update)
        print(f"decoded {filled} segments of {len(source)} episodes into {args.dir} in "
              f"{time.perf_counter() - start:.1f} s")
    info = store.info()
    print(f"{info.directory}: {info.segments} segments, {_gib(info.bytes)} of a {_gib(info.budget_bytes)} budget"
          + (f", {info.partial} partial files" if info.partial else ""))
    return 0


_SOURCE: EpisodeSource | None = None  # a decoding process's source (sent once, at its start)


def _adopt(source: EpisodeSource) -> None:
    global _SOURCE
    _SOURCE = source


def _fill(source: EpisodeSource | None, episodes: Sequence[int]) -> int:
    """Decode the segments of ``episodes`` (``source`` None: the process's own); the segments decoded."""
    from mmfeed.loaders.sources.requests import EpisodeRequest

    source = _SOURCE if source is None else source
    cameras = [f for f, feature in source.features.items() if feature.kind == "video"]
    store = getattr(source, "_store", None)
    if store is None:
        raise ValueError(f"{source.name}: its format keeps no frame cache (cache= applies to LeRobot v3 "
                         "directories and webdataset shards)")
    before = store.filled
    for e in episodes:
        present = [c for c in cameras if source.present(c)[e] and source.frames(c)[e] > 0]
        if present:
            source.read_many([EpisodeRequest(int(e), {c: np.zeros(1, dtype=np.int64) for c in present})])
    return store.filled - before


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"
