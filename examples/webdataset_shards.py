"""Write your own robot episodes as webdataset shards, index them and load packed batches from them.

``ShardWriter`` takes each episode as a dict of features under your own names: arrays of any dtype (one entry
per step of the control clock, or at a rate of their own), uint8 ``[T, H, W, 3]`` frames (encoded to H.264 at
the feature's rate) and a task string. Every feature becomes one tar member (``<key>.<feature>.npy`` or
``<key>.<feature>.mp4``) beside ``<key>.meta.json`` (fps, length, task, rates, each feature's dtype, shape and
stats). The parquet index beside the shards (written when the writer closes; ``mmfeed index SHARDS`` on the
command line or ``write_index`` rebuild it) lists every episode's length, rates, task, stats and byte ranges, so
an epoch is planned and packed before a single frame is decoded, and workers read exactly the members their
batches need. The shards stay plain webdataset: the ``webdataset`` library reads them as they are.

    python examples/webdataset_shards.py                 # writes to a temporary directory
    python examples/webdataset_shards.py --out shards/   # keep them (the directory must hold no shards yet)
    python examples/webdataset_shards.py --quick
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import webdataset as wds

from mmfeed import DataLoader
from mmfeed.loaders import Normalize, Packing, PlanConfig, ShardWriter, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.stores.index import INDEX_FILENAME, write_index
from mmfeed.packing.windows import frames_at_rate

FPS, CAMERA_FPS = 30.0, 15.0
TOP = "observation.images.top"
TASKS = ("stack the blue block on the red one", "put the cup in the sink")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")))
    p.add_argument("--out", default=None, help="directory for the shards (default: a temporary one)")
    p.add_argument("--episodes", type=int, default=None, help="episodes to write (default 12, quick 4)")
    p.add_argument("--workers", type=int, default=None, help="loader worker processes (default 2, quick 0)")
    return p.parse_args(argv)


def record_episode(rng: np.random.Generator, steps: int) -> dict[str, np.ndarray]:
    """One episode as your robot might log it: 6-joint state and action (float32), encoder ticks (int32), a
    gripper-closed flag (bool), a reward (float64), all at 30 Hz, and a 15 fps camera (a bar sweeping across)."""
    t = np.arange(steps) / FPS
    state = np.sin(2 * np.pi * rng.uniform(0.2, 1.0, 6) * t[:, None] + rng.uniform(0, 6.3, 6)).astype(np.float32)
    action = np.diff(state, axis=0, append=state[-1:]).astype(np.float32)
    n_frames = int(frames_at_rate(steps, FPS, CAMERA_FPS))  # the frames at j / 15 s within the episode
    frames = np.zeros((n_frames, 48, 64, 3), dtype=np.uint8)
    for j in range(n_frames):
        frames[j, :, (4 * j) % 64 : (4 * j) % 64 + 4] = (200, 120, 40)
    return {
        "observation.state": state,
        "action": action,
        "observation.encoder_ticks": (state * 4096).astype(np.int32),
        "observation.gripper_closed": state[:, 5] > 0,
        "next.reward": -np.abs(state).sum(axis=1).astype(np.float64),
        TOP: frames,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n = args.episodes or (4 if args.quick else 12)
    workers = args.workers if args.workers is not None else (0 if args.quick else 2)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="mmfeed-shards-") as tmp:
        out = Path(args.out or tmp)
        # 1. write: 3 episodes per shard, the camera encoded at its own 15 fps; the index is written on close
        t0 = time.perf_counter()
        with ShardWriter(out, episodes_per_shard=3) as writer:
            for i in range(n):
                writer.write(record_episode(rng, int(rng.integers(20, 41))), fps=FPS, rates={TOP: CAMERA_FPS},
                             task=TASKS[i % len(TASKS)])
        shards = writer.shards
        size = sum(os.path.getsize(s) for s in shards)
        print(f"wrote {len(shards)} shards, {n} episodes, {size / 1e6:.2f} MB in {time.perf_counter() - t0:.1f}s")

        # 2. index: one parquet row per episode, no pixels; rebuilding it is `mmfeed index <out>` or this line
        index_path = write_index(shards, out / INDEX_FILENAME)
        table = pq.read_table(index_path)
        print(f"index {Path(index_path).name}: {table.num_rows} episodes, columns {table.column_names[:6]} ...")

        # the shards are ordinary webdataset tars: one member per feature
        first = next(iter(wds.WebDataset(shards[0], shardshuffle=False)))
        print(f"webdataset reads shard 0 as it is: key {first['__key__']!r}, members "
              f"{sorted(k for k in first if not k.startswith('__'))}")

        # 3. open: every feature under its own name and rate, stats merged from the index
        ds = open_dataset(out)
        print(f"{len(ds)} episodes, {int(ds.lengths.sum())} steps at {ds.fps[0]:g} fps; features:")
        for name, f in ds.features.items():
            print(f"  {name}: {f.kind} {f.dtype} {f.shape} at {f.fps:g} fps")
        print(f"stats['observation.state']: mean[:3] {ds.stats['observation.state']['mean'][:3].round(3)}, "
              f"std[:3] {ds.stats['observation.state']['std'][:3].round(3)}")
        ep = ds.episode(0)
        print(f"episode 0: task {ep['task']!r}, {TOP} {ep[TOP].shape}, observation.state "
              f"{ep['observation.state'].shape}")

        # 4. load packed: windows in seconds (each feature at its rate), normalized in the workers
        window = WindowSpec.from_delta_timestamps({TOP: [-1 / CAMERA_FPS, 0.0], "observation.state": [0.0],
                                                   "observation.gripper_closed": [0.0],
                                                   "action": [i / FPS for i in range(10)]})
        packing = Packing(layout=TokenLayout(tokens_per_frame={TOP: 16}), window=window, stride=2,
                          transform=Normalize(ds.stats, features=["observation.state", "action"]),
                          plan=PlanConfig(capacity=1024, rows_per_batch=2), seed=0)
        loader = DataLoader(ds, packing=packing, num_workers=workers)
        plan = loader.dataset.plan(0)
        print(f"{len(ds)} episodes -> {len(loader.dataset.items)} samples -> {plan.num_steps} batches "
              f"(packing efficiency {plan.efficiency:.1%}, {len(plan.dropped)} samples left to the next epoch)")
        batch = next(iter(loader))
        print(f"batch: {batch.num_rows} rows x {batch.capacity} tokens, {batch.num_documents} documents, "
              f"max_seqlen {batch.max_seqlen}, modalities {batch.modalities}")
        for key, value in sorted(batch.data.items()):
            print(f"  data[{key!r}]: {tuple(value.shape)} {value.dtype}")
        print(f"  metadata episodes {batch.metadata['episode'].tolist()}")


if __name__ == "__main__":
    main()
