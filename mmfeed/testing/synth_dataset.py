"""The synthetic robot datasets of ``mmfeed synth`` and the benchmarks, on disk: webdataset shards with their
index, or a LeRobot v3 directory, written from :func:`~mmfeed.testing.synth_episodes.make_episodes` by the
writers of this package, in several processes where shards allow.

    >>> spec = SyntheticDataset(episodes=4, min_length=20, max_length=30, height=48, width=64)
    >>> write_synthetic(tmp_dir / "shards", spec)                        # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mmfeed.testing.synth_episodes import DEFAULT_TASKS

__all__ = ["FORMATS", "SyntheticDataset", "VARIED_TASKS", "write_synthetic"]

FORMATS = ("webdataset", "lerobot")


def _varied_tasks() -> tuple[str, ...]:
    """Task texts of 5 to about 600 bytes (UTF-8 bytes are tokens): eight instructions built from fixed clauses."""
    clauses = ("pick up the red cube", "then place it in the blue bowl on the left side of the table",
               "without touching the glass", "open the top drawer halfway", "fold the towel in half twice",
               "and wipe the counter from left to right", "push the green button once the light turns on",
               "finally return the gripper to its home pose above the tray")
    out = ["stack"]
    for target in (24, 48, 96, 160, 260, 400, 600):
        text, k = "", 0
        while len(text) < target:
            text += ("" if not text else ", ") + clauses[k % len(clauses)]
            k += 1
        out.append(text[:target].rstrip(", ") + ".")
    return tuple(out)


VARIED_TASKS = _varied_tasks()
"""The tasks of the default workload: eight texts of 5 to about 600 bytes."""


@dataclass(frozen=True, kw_only=True)
class SyntheticDataset:
    """One synthetic dataset: its format ("webdataset" or "lerobot"), episodes and their lengths in steps, frame
    size, codec and GOP, control clock, cameras (feature ``observation.images.<camera>``; ``camera_fps``:
    ``((camera, fps), ...)`` for those at their own rate), tasks ("default", or "varied": :data:`VARIED_TASKS`)
    and seed."""

    format: str = "webdataset"
    episodes: int = 12
    min_length: int = 120
    max_length: int = 180
    height: int = 480
    width: int = 640
    codec: str = "h264"
    gop: int = 30
    fps: float = 30.0
    cameras: tuple[str, ...] = ("cam_high",)
    camera_fps: tuple[tuple[str, float], ...] = ()
    tasks: str = "default"
    seed: int = 0


EPISODES_PER_SHARD = 4


def _write_shard(args: tuple[SyntheticDataset, int, int, str]) -> tuple[int, str]:
    """Pool worker: write episodes ``start:stop`` of ``cfg`` as one shard under ``tmp``; (episodes, path)."""
    from mmfeed.testing import make_episodes, write_webdataset

    cfg, start, stop, tmp = args
    episodes = _episodes(cfg, make_episodes)[start:stop]
    (shard,) = write_webdataset(Path(tmp) / f"part-{start:06d}", episodes, episodes_per_shard=stop - start,
                                codec=cfg.codec, gop=cfg.gop)
    return stop - start, shard


def _episodes(cfg: SyntheticDataset, make_episodes):
    tasks = {"default": DEFAULT_TASKS, "varied": VARIED_TASKS}.get(cfg.tasks)
    if tasks is None:
        raise ValueError(f"unknown tasks {cfg.tasks!r}; choose 'default' or 'varied'")
    return make_episodes(cfg.episodes, seed=cfg.seed, cameras=cfg.cameras, height=cfg.height, width=cfg.width,
                         fps=cfg.fps, min_length=cfg.min_length, max_length=cfg.max_length,
                         camera_fps=dict(cfg.camera_fps), tasks=tasks)


def write_synthetic(path: str | Path, cfg: SyntheticDataset, *, progress: Callable[[int], object] | None = None,
                    processes: int | None = None) -> Path:
    """Write the single synthetic dataset that ``cfg`` describes (format, episodes, size, codec, ...) at ``path``.

    Webdataset shards of ``EPISODES_PER_SHARD`` episodes are written by :func:`mmfeed.testing.write_webdataset`
    in up to ``processes`` processes (default: one per CPU), then indexed together (``mmfeed-index.parquet``);
    the shards are those of ``write_webdataset(path, episodes, episodes_per_shard=4)``. A LeRobot directory is
    written in one go. ``progress(n)`` is called as ``n`` more episodes are done.
    """
    from mmfeed.loaders.stores.index import INDEX_FILENAME, write_index
    from mmfeed.testing import make_episodes, write_lerobot

    path = Path(path)
    if cfg.format == "lerobot":
        write_lerobot(path, _episodes(cfg, make_episodes), codec=cfg.codec, gop=cfg.gop)
        if progress is not None:
            progress(cfg.episodes)
        return path
    if cfg.format != "webdataset":
        raise ValueError(f"unknown format {cfg.format!r}; choose 'webdataset' or 'lerobot'")
    _episodes(cfg, make_episodes)  # validates the settings here, before any process starts
    path.mkdir(parents=True, exist_ok=True)
    parts = [(cfg, s, min(s + EPISODES_PER_SHARD, cfg.episodes)) for s in range(0, cfg.episodes, EPISODES_PER_SHARD)]
    processes = max(1, min(processes or os.cpu_count() or 1, len(parts)))
    shards = []
    with tempfile.TemporaryDirectory(dir=path, prefix=".mmfeed-synth-") as tmp:
        jobs = [(*p, tmp) for p in parts]
        if processes == 1:
            results = map(_write_shard, jobs)
            pool = None
        else:
            pool = mp.get_context("fork").Pool(processes)
            results = pool.imap(_write_shard, jobs)
        try:
            for k, (count, shard) in enumerate(results):
                target = path / f"shard-{k:06d}.tar"
                os.replace(shard, target)
                shards.append(str(target))
                if progress is not None:
                    progress(count)
        finally:
            if pool is not None:
                pool.close()
                pool.join()
    if shards:
        write_index(shards, path / INDEX_FILENAME)
    return path
