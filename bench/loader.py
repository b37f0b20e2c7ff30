"""Benchmark: the packed, planned loader on synthetic robot video, beside its ceiling and a torch baseline.

In one run, on the same synthetic dataset (webdataset shards or a LeRobot v3 directory, cached under
``~/.cache/mmfeed/bench``), with the same number of worker processes:

1. **mmfeed**: ``mmfeed.DataLoader(source, packing=...)``: windowed clip samples (the last ``history`` frames of
   ``observation.images.<camera>``, ``observation.state`` at the anchor and a ``horizon``-step ``action`` chunk,
   in seconds by feature name) planned, packed into rows of ``capacity`` tokens and decoded batch by batch;
2. **ceiling**: the very same frames of the very same batches decoded by the same backend in as many processes,
   into buffers allocated once, and nothing else (no collation, no packing, no transfer to the training process);
3. **baseline**: torch's DataLoader over a per-sample dataset (the same samples and prices,
   :class:`~mmfeed.loaders.items.EpisodeItems`) that opens, seeks and decodes each sample's frames on its own (the
   way LeRobot reads video) and pads every batch to its longest sample; its batch size gives the same token
   budget per batch as mmfeed's rows.

Figures: samples/s, decoded frames/s, useful (non-padding) tokens/s, packing efficiency, and the ratios
mmfeed/ceiling (frames) and mmfeed/baseline (useful tokens). ``python -m mmfeed.bench.loader --help``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmfeed.bench.common import cache_dir, consecutive_views, environment, robot_window, table
from mmfeed.codecs.video import read_frames
from mmfeed.loaders import DataLoader, Packing, PlanConfig, PlannedDataset, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.items import EpisodeItems
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource
from mmfeed.loaders.timing import stage
from mmfeed.testing.synth_episodes import IMAGE_PREFIX

log = logging.getLogger(__name__)

DATASET_VERSION = 2
"""Part of the cache key of the synthetic datasets: bumped when what they hold changes (2: features by name)."""


@dataclass(frozen=True, kw_only=True)
class LoaderBench:
    """Settings of one loader benchmark (see the module docstring).

    cameras: the synthetic dataset's cameras; each is the video feature ``observation.images.<camera>``.
    videos, video_fps: the video features read and their rates, for a given dataset (None: the synthetic
        cameras' features, at ``fps``).
    state, action: the features read at the anchor and as the action chunk (None: the dataset has none).
    history, horizon: frames of each video before and at the anchor, and action steps from the anchor on.
    """

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
    videos: tuple[str, ...] | None = None
    video_fps: tuple[float, ...] | None = None
    state: str | None = "observation.state"
    action: str | None = "action"
    history: int = 4
    horizon: int = 50
    tokens_per_frame: int = 256
    capacity: int = 8192
    rows_per_batch: int = 2
    episode_block: int = 2
    workers: int = 2
    steps: int = 24
    warmup: int = 3
    backend: str = "auto"
    seed: int = 0

    @property
    def video_features(self) -> tuple[str, ...]:
        """The video features a sample reads."""
        return tuple(self.videos) if self.videos is not None else tuple(IMAGE_PREFIX + c for c in self.cameras)

    def window(self) -> WindowSpec:
        """``history`` frames of every video (at its own rate), the state at the anchor, ``horizon`` actions."""
        rates = self.video_fps or (self.fps,) * len(self.video_features)
        return robot_window(dict(zip(self.video_features, rates)), fps=self.fps, history=self.history,
                            horizon=self.horizon, state=self.state, action=self.action)

    def layout(self) -> TokenLayout:
        """``tokens_per_frame`` tokens per video frame; one per state and per action step."""
        return TokenLayout(tokens_per_frame={f: self.tokens_per_frame for f in self.video_features})

    def packing(self) -> Packing:
        plan = PlanConfig(capacity=self.capacity, rows_per_batch=self.rows_per_batch, episode_block=self.episode_block)
        return Packing(layout=self.layout(), window=self.window(), plan=plan, seed=self.seed)


def dataset_path(cfg: LoaderBench, *, progress: Callable[[int], object] | None = None) -> Path:
    """The synthetic dataset for ``cfg``, written once and cached.

    progress: called with the number of episodes just written (shard by shard), e.g. ``tqdm.update``.
    """
    key = (f"v{DATASET_VERSION}-{cfg.format}-{cfg.episodes}ep-{cfg.min_length}-{cfg.max_length}-{cfg.width}x"
           f"{cfg.height}-{cfg.codec}-g{cfg.gop}-{cfg.fps:g}fps-{'+'.join(cfg.cameras)}-s{cfg.seed}")
    path = cache_dir("bench") / key
    done = path / ".complete"
    if not done.exists():
        if path.exists():  # an interrupted earlier attempt: start again from nothing
            shutil.rmtree(path)
        log.info("writing synthetic %s dataset to %s", cfg.format, path)
        write_synthetic(path, cfg, progress=progress)
        done.write_text("ok")
    return path


EPISODES_PER_SHARD = 4


def _write_shard(args: tuple[LoaderBench, int, int, str]) -> tuple[int, str]:
    """Pool worker: write episodes ``start:stop`` of ``cfg`` as one shard under ``tmp``; (episodes, path)."""
    from mmfeed.testing import make_episodes, write_webdataset

    cfg, start, stop, tmp = args
    episodes = _episodes(cfg, make_episodes)[start:stop]
    (shard,) = write_webdataset(Path(tmp) / f"part-{start:06d}", episodes, episodes_per_shard=stop - start,
                                codec=cfg.codec, gop=cfg.gop)
    return stop - start, shard


def _episodes(cfg: LoaderBench, make_episodes):
    return make_episodes(cfg.episodes, seed=cfg.seed, cameras=cfg.cameras, height=cfg.height, width=cfg.width,
                         fps=cfg.fps, min_length=cfg.min_length, max_length=cfg.max_length)


def write_synthetic(path: str | Path, cfg: LoaderBench, *, progress: Callable[[int], object] | None = None,
                    processes: int | None = None) -> Path:
    """Write the synthetic dataset that ``cfg`` describes (format, episodes, size, codec, ...) at ``path``.

    Webdataset shards of ``EPISODES_PER_SHARD`` episodes are written by :func:`mmfeed.testing.write_webdataset`
    in up to ``processes`` processes (default: one per CPU), then indexed together (``mmfeed-index.parquet``);
    the shards are those of ``write_webdataset(path, episodes, episodes_per_shard=4)``. A LeRobot directory is
    written in one go. ``progress(n)`` is called as ``n`` more episodes are done.
    """
    from mmfeed.loaders.sources.index import INDEX_FILENAME, write_index
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


def _figures(seconds: float, samples: int, frames: int, useful: int, slots: int) -> dict[str, float]:
    return {"seconds": seconds, "samples_per_s": samples / seconds, "frames_per_s": frames / seconds,
            "tokens_per_s": useful / seconds, "packing_efficiency": useful / slots if slots else 0.0}


def run_mmfeed(cfg: LoaderBench, path: Path, *, step_s: float = 0.0, timer: bool = False) -> dict[str, Any]:
    """Iterate mmfeed's loader for ``warmup + steps`` batches; figures over the measured ones."""
    loader = DataLoader(open_dataset(path, backend=cfg.backend), packing=cfg.packing(), num_workers=cfg.workers,
                        timer=timer or None, persistent_workers=cfg.workers > 0)
    videos = cfg.video_features
    batches = _forever(loader)
    for _ in range(cfg.warmup):
        next(batches)
    samples = frames = useful = slots = 0
    start = time.perf_counter()
    for _ in range(cfg.steps):
        batch = next(batches)
        samples += batch.num_documents
        frames += sum(len(batch.data[f]) for f in videos if f in batch.data)
        useful += int((batch.document_ids >= 0).sum())
        slots += batch.document_ids.numel()
        if step_s:
            time.sleep(step_s)
    out = _figures(time.perf_counter() - start, samples, frames, useful, slots)
    if timer:
        out["timing"] = loader.timer.report()
    return out


def _forever(loader):
    """Batches of successive epochs, without end."""
    while True:
        yield from loader


def _planned(cfg: LoaderBench, path: Path | str, backend: str | None = None) -> PlannedDataset:
    """The planned dataset mmfeed's loader iterates (one rank of one)."""
    return cfg.packing().dataset(open_dataset(path, backend=backend or cfg.backend))


def _epoch_steps(ds: PlannedDataset, first: int, count: int) -> list[tuple[int, int]]:
    """The ``(epoch, step)`` of global steps ``first .. first + count - 1``, epochs back to back (as the loader
    runs them)."""
    out, epoch, offset = [], 0, 0
    while len(out) < count:
        n = ds.num_steps(epoch)
        if n == 0:
            raise ValueError("the plan has no batch; lower the capacity or the rows per batch")
        out.extend((epoch, s) for s in range(n) if offset + s >= first)
        offset, epoch = offset + n, epoch + 1
    return out[:count]


def _decode_steps(args: tuple[str, str, list[tuple[int, int]], LoaderBench]) -> tuple[int, float]:
    """Ceiling worker: decode the frames of the given (epoch, step)s, nothing more; (frames decoded, seconds
    spent decoding). Dataset and plan set-up are excluded, and every batch decodes into the same buffers, allocated
    and touched before the clock starts, so the ceiling pays no page faults for its outputs."""
    path, backend, steps, cfg = args
    ds = _planned(cfg, path, backend)
    videos = [f for f in cfg.video_features if f in ds.source.features]
    batches = []
    for epoch, step in steps:
        samples = np.concatenate(ds.batch_samples(epoch, step)).astype(np.int64)
        batches.append([EpisodeRequest(r.episode, {f: r.indices[f] for f in videos if f in r.indices})
                        for r, _, _ in ds.items.requests(samples)])
    most = {f: max((sum(len(r.indices.get(f, ())) for r in b) for b in batches), default=0) for f in videos}
    shapes = {f: ds.source.features[f].shape for f in videos}
    buffers = {f: np.ones((most[f], *shapes[f]), dtype=np.uint8) for f in videos}
    given = []
    for requests in batches:
        views = {f: consecutive_views(buffers[f], [len(r.indices.get(f, ())) for r in requests]) for f in videos}
        given.append([replace(r, out={f: views[f][i] for f in r.indices}) for i, r in enumerate(requests)])
    start, count = time.perf_counter(), 0
    for requests in given:
        for got in ds.source.read_many(requests):
            count += sum(len(v) for v in got.values())
    return count, time.perf_counter() - start


def run_ceiling(cfg: LoaderBench, path: Path) -> dict[str, Any]:
    """Raw decode of the same frames (same plan, same steps) in ``workers`` processes, round robin like torch."""
    steps = _epoch_steps(_planned(cfg, path), cfg.warmup, cfg.steps)
    workers = max(1, cfg.workers)
    parts = [(str(path), cfg.backend, steps[w::workers], cfg) for w in range(workers)]
    with mp.get_context("fork").Pool(workers) as pool:
        pool.map(_decode_steps, [(p[0], p[1], steps[: workers], cfg) for p in parts[:1]] * workers)  # warm up
        results = pool.map(_decode_steps, parts)
    # The workers decode side by side: the slowest one's decoding time is the wall time of the ceiling.
    seconds = max(r[1] for r in results)
    frames = sum(r[0] for r in results)
    return {"seconds": seconds, "frames_per_s": frames / seconds}


class PerSampleDataset(torch.utils.data.Dataset):
    """The baseline: each sample reads its own bytes and opens, seeks and decodes its own frames.

    Its samples, prices and frames are those of mmfeed's loader (:class:`~mmfeed.loaders.items.EpisodeItems`
    with the same window and layout): ``{feature: [K, ...], "text", "tokens"}``.
    """

    def __init__(self, cfg: LoaderBench, path: Path) -> None:
        self.cfg = cfg
        source = open_dataset(path, backend=cfg.backend)
        self.items = EpisodeItems(source, layout=cfg.layout(), window=cfg.window(), capacity=cfg.capacity)
        self.videos = {f for f, feature in source.features.items() if feature.kind == "video"}

    @property
    def tokens(self) -> np.ndarray:
        """int64 ``[n]``: each sample's price in tokens."""
        return self.items.tokens

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        items, source = self.items, self.items.source
        ((request, _, _),) = items.requests(np.array([i]))
        arrays = {f: idx for f, idx in request.indices.items() if f not in self.videos}
        out = source.read_many([EpisodeRequest(request.episode, arrays)])[0]
        for feature, idx in request.indices.items():
            if feature in self.videos:
                out[feature] = _decode_alone(source, request.episode, feature, idx, self.cfg.backend)
        sample = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
        task = int(items.task[i])
        sample["text"] = torch.from_numpy(items.text[task] if task >= 0 else np.zeros(0, np.int32))
        sample["tokens"] = torch.tensor(int(items.tokens[i]))
        return sample


def _decode_alone(source: EpisodeSource, episode: int, feature: str, idx: np.ndarray, backend: str) -> np.ndarray:
    """One sample's frames of one video, opened, sought and decoded on their own (a fresh open every sample)."""
    from mmfeed.loaders.sources.lerobot import LeRobotSource

    if isinstance(source, LeRobotSource):
        path, times = source._frame_times(episode, feature, idx)
        with stage("decode"):
            return read_frames(str(path), timestamps=times, tolerance_s=source.tolerance_s, backend=backend)
    data = source._member(episode, feature)
    with stage("decode"):
        return read_frames(data, indices=idx, backend=backend)


def pad_collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad every field to the batch's longest sample (what a plain torch pipeline does)."""
    out: dict[str, torch.Tensor] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if values[0].dim() == 0:
            out[key] = torch.stack(values)
        else:
            out[key] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True)
    return out


def run_baseline(cfg: LoaderBench, path: Path) -> dict[str, Any]:
    """torch's DataLoader, per-sample decode, pad-to-longest; batch size matched to mmfeed's token budget."""
    ds = PerSampleDataset(cfg, path)
    longest = int(ds.tokens.max())
    batch_size = max(1, cfg.rows_per_batch * cfg.capacity // longest)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=cfg.workers,
                                         collate_fn=pad_collate, generator=torch.Generator().manual_seed(cfg.seed),
                                         persistent_workers=cfg.workers > 0)
    batches = _forever(loader)
    for _ in range(cfg.warmup):
        next(batches)
    samples = frames = useful = slots = 0
    start = time.perf_counter()
    for _ in range(cfg.steps):
        batch = next(batches)
        n = len(batch["tokens"])
        samples += n
        frames += sum(batch[f].shape[0] * batch[f].shape[1] for f in cfg.video_features if f in batch)
        useful += int(batch["tokens"].sum())
        slots += n * int(batch["tokens"].max())
    out = _figures(time.perf_counter() - start, samples, frames, useful, slots)
    out["batch_size"] = batch_size
    return out


def run(cfg: LoaderBench) -> dict[str, Any]:
    """All three measurements on one dataset, and their ratios."""
    path = dataset_path(cfg)
    results = {"mmfeed": run_mmfeed(cfg, path), "ceiling": run_ceiling(cfg, path), "baseline": run_baseline(cfg, path)}
    m, c, b = results["mmfeed"], results["ceiling"], results["baseline"]
    results["ratios"] = {"frames_vs_ceiling": m["frames_per_s"] / c["frames_per_s"],
                         "useful_tokens_vs_baseline": m["tokens_per_s"] / b["tokens_per_s"],
                         "frames_vs_baseline": m["frames_per_s"] / b["frames_per_s"]}
    results["settings"] = asdict(cfg)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.loader", description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=["webdataset", "lerobot"], default="webdataset")
    parser.add_argument("--codec", choices=["h264", "av1"], default=None, help="default: h264 (webdataset), av1 (lerobot)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--episode-block", type=int, default=2, help="0 = shuffle samples across the whole epoch")
    parser.add_argument("--lerobot-style", action="store_true",
                        help="320x240 AV1 g=2, 2 history frames, 50-step chunk, about 32 samples per batch")
    parser.add_argument("--quick", action="store_true", help="tiny videos and few steps (for tests)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    cfg = LoaderBench(format=args.format, workers=args.workers, steps=args.steps, episode_block=args.episode_block)
    if args.lerobot_style:
        cfg = replace(cfg, format="lerobot", codec="av1", gop=2, height=240, width=320, history=2, horizon=50,
                      tokens_per_frame=64, capacity=1024, rows_per_batch=8)
    if args.codec:
        cfg = replace(cfg, codec=args.codec, gop=30 if args.codec == "h264" else 2)
    elif cfg.format == "lerobot" and not args.lerobot_style:
        cfg = replace(cfg, codec="av1", gop=2)
    if args.quick:
        cfg = replace(cfg, episodes=4, min_length=30, max_length=40, height=64, width=96, steps=4, warmup=1,
                      tokens_per_frame=16, capacity=512)
    results = run(cfg)
    rows = [{"run": name, **{k: results[name].get(k) for k in ("samples_per_s", "frames_per_s", "tokens_per_s",
                                                                "packing_efficiency")}}
            for name in ("mmfeed", "ceiling", "baseline")]
    print(table(rows, [("run", "run"), ("samples_per_s", "samples/s"), ("frames_per_s", "frames/s"),
                       ("tokens_per_s", "useful tokens/s"), ("packing_efficiency", "packing eff.")]))
    r = results["ratios"]
    print(f"\nmmfeed / ceiling (frames/s): {r['frames_vs_ceiling']:.2f}   "
          f"mmfeed / baseline (useful tokens/s): {r['useful_tokens_vs_baseline']:.2f}   "
          f"(frames/s: {r['frames_vs_baseline']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "environment": environment()}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
