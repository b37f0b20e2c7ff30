"""Benchmark: the packed, planned loader on synthetic robot video, beside its ceiling and a torch baseline.

In one run, on the same synthetic dataset (webdataset shards or a LeRobot v3 directory, cached under
``~/.cache/mmfeed/bench``), with the same number of worker processes:

1. **mmfeed**: ``mmfeed.DataLoader(source, packing=...)``: windowed clip samples (history frames, the current
   state, an action chunk) planned, packed into rows of ``capacity`` tokens and decoded batch by batch;
2. **ceiling**: the very same frames of the very same batches decoded by the same backend in as many processes,
   into buffers allocated once, and nothing else (no collation, no packing, no transfer to the training process);
3. **baseline**: torch's DataLoader over a per-sample dataset that opens, seeks and decodes each sample's frames
   on its own (the way LeRobot reads video) and pads every batch to its longest sample; its batch size gives
   the same token budget per batch as mmfeed's rows.

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

from mmfeed.bench.common import cache_dir, consecutive_views, environment, table
from mmfeed.codecs.video import read_frames
from mmfeed.loaders import (DataLoader, Packing, PackedEpisodeDataset, PlanConfig, TokenLayout, WindowSpec,
                            open_dataset, stage)
from mmfeed.loaders.sources import EpisodeRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LoaderBench:
    """Settings of one loader benchmark (see the module docstring)."""

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

    def window(self) -> WindowSpec:
        frames = tuple(range(-(self.history - 1), 1))
        spec = {f"frames.{c}": frames for c in self.cameras}
        return WindowSpec(offsets={**spec, "proprio": (0,), "action": tuple(range(self.horizon))})

    def packing(self) -> Packing:
        layout = TokenLayout(tokens_per_frame={c: self.tokens_per_frame for c in self.cameras})
        plan = PlanConfig(capacity=self.capacity, rows_per_batch=self.rows_per_batch, episode_block=self.episode_block)
        return Packing(layout=layout, window=self.window(), plan=plan, seed=self.seed)


def dataset_path(cfg: LoaderBench, *, progress: Callable[[int], object] | None = None) -> Path:
    """The synthetic dataset for ``cfg``, written once and cached.

    progress: called with the number of episodes just written (shard by shard), e.g. ``tqdm.update``.
    """
    key = (f"{cfg.format}-{cfg.episodes}ep-{cfg.min_length}-{cfg.max_length}-{cfg.width}x{cfg.height}-{cfg.codec}"
           f"-g{cfg.gop}-{cfg.fps:g}fps-{'+'.join(cfg.cameras)}-s{cfg.seed}")
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
    """Pool worker: encode episodes ``start:stop`` of ``cfg`` into one shard under ``tmp``; (episodes, path)."""
    from mmfeed.testing import make_episodes, write_webdataset

    cfg, start, stop, tmp = args
    episodes = _episodes(cfg, make_episodes)[start:stop]
    (shard,) = write_webdataset(Path(tmp) / f"part-{start:06d}", episodes, episodes_per_shard=stop - start,
                                codec=cfg.codec, gop=cfg.gop, index=False)
    return stop - start, shard


def _episodes(cfg: LoaderBench, make_episodes):
    return make_episodes(cfg.episodes, seed=cfg.seed, cameras=cfg.cameras, height=cfg.height, width=cfg.width,
                         fps=cfg.fps, min_length=cfg.min_length, max_length=cfg.max_length)


def write_synthetic(path: str | Path, cfg: LoaderBench, *, progress: Callable[[int], object] | None = None,
                    processes: int | None = None) -> Path:
    """Write the synthetic dataset that ``cfg`` describes (format, episodes, size, codec, ...) at ``path``.

    Webdataset shards of ``EPISODES_PER_SHARD`` episodes are encoded in up to ``processes`` processes (default:
    one per CPU), then indexed (``mmfeed-index.parquet``); the bytes are those of ``write_webdataset(path,
    episodes, episodes_per_shard=4)``. A LeRobot directory is written in one go. ``progress(n)`` is called as
    ``n`` more episodes are done.
    """
    from mmfeed.loaders.index import INDEX_FILENAME, write_index
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
    batches = _forever(loader)
    for _ in range(cfg.warmup):
        next(batches)
    samples = frames = useful = slots = 0
    start = time.perf_counter()
    for _ in range(cfg.steps):
        batch = next(batches)
        samples += batch.num_documents
        frames += sum(len(batch.data[f"frames.{c}"]) for c in cfg.cameras)
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


def _planned(cfg: LoaderBench, path: Path | str, backend: str | None = None) -> PackedEpisodeDataset:
    return PackedEpisodeDataset(open_dataset(path, backend=backend or cfg.backend), layout=cfg.packing().layout,
                                window=cfg.window(), plan=cfg.packing().plan, seed=cfg.seed)


def _epoch_steps(ds: PackedEpisodeDataset, first: int, count: int) -> list[tuple[int, int]]:
    """The ``(epoch, step)`` of global steps ``first .. first + count - 1``, epochs back to back (as the loader
    runs them)."""
    out, epoch, offset = [], 0, 0
    while len(out) < count:
        n = ds.num_steps(epoch)
        out.extend((epoch, s) for s in range(n) if offset + s >= first)
        offset, epoch = offset + n, epoch + 1
    return out[:count]


def _decode_steps(args: tuple[str, str, list[tuple[int, int]], LoaderBench]) -> tuple[int, float]:
    """Ceiling worker: decode the frames of the given (epoch, step)s, nothing more; (frames decoded, seconds
    spent decoding). Dataset and plan set-up are excluded, and every batch decodes into the same buffers, allocated
    and touched before the clock starts, so the ceiling pays no page faults for its outputs."""
    path, backend, steps, cfg = args
    ds = _planned(cfg, path, backend)
    frame_keys = [f"frames.{c}" for c in cfg.cameras]
    batches = []
    for epoch, step in steps:
        requests = []
        for s in ds.plan(epoch).batch_samples(0, step):
            request, _ = ds.table.request(int(s), ds.source.lengths)
            requests.append(EpisodeRequest(request.episode, {k: request.steps[k] for k in frame_keys}))
        batches.append(requests)
    most = max((sum(len(r.steps[k]) for r in b) for b in batches for k in frame_keys), default=0)
    buffers = {k: np.ones((most, cfg.height, cfg.width, 3), dtype=np.uint8) for k in frame_keys}
    given = []
    for requests in batches:
        views = {k: consecutive_views(buffers[k], [len(r.steps[k]) for r in requests]) for k in frame_keys}
        given.append([replace(r, out={k: views[k][i] for k in frame_keys}) for i, r in enumerate(requests)])
    start, count = time.perf_counter(), 0
    for requests in given:
        for got in ds.source.read_many(requests):
            count += sum(len(got[k]) for k in frame_keys)
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
    """The baseline: each sample reads its own bytes and opens, seeks and decodes its own frames."""

    def __init__(self, cfg: LoaderBench, path: Path) -> None:
        self.cfg = cfg
        self.inner = PackedEpisodeDataset(open_dataset(path, backend=cfg.backend), layout=cfg.packing().layout,
                                          window=cfg.window(), capacity=cfg.capacity)
        self.table = self.inner.table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        source, table = self.inner.source, self.table
        request, pads = table.request(int(i), source.lengths)
        keys = {k: v for k, v in request.steps.items() if not k.startswith("frames.")}
        out = source.read_many([EpisodeRequest(request.episode, keys)])[0]
        for camera in self.cfg.cameras:
            key = f"frames.{camera}"
            video, indices = _video_of(source, request.episode, camera, request.steps[key])
            with stage("decode"):
                out[key] = read_frames(video, indices=indices, backend=self.cfg.backend)  # a fresh open every sample
        sample = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
        sample["text"] = torch.from_numpy(table.text[table.episode[i]])
        sample["tokens"] = torch.tensor(int(table.tokens[i]))
        return sample


def _video_of(source, episode: int, camera: str, steps: np.ndarray):
    """The video (bytes or path) and frame selection of one camera for the baseline."""
    from mmfeed.loaders.lerobot import LeRobotSource

    if isinstance(source, LeRobotSource):
        path, times = source._frame_times(episode, camera, steps)
        info = source._videos.info(path) if source._videos else None
        from mmfeed.codecs.demux import frames_at_times, probe

        return str(path), frames_at_times(info or probe(path), times)
    data = source._member(episode, f"{camera}.mp4")
    return data, steps


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
    longest = int(ds.table.tokens.max())
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
        frames += sum(batch[f"frames.{c}"].shape[0] * batch[f"frames.{c}"].shape[1] for c in cfg.cameras)
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
