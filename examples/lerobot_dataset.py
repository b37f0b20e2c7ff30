"""Train-style sampling from a LeRobot v3 dataset directory: history frames, the current state, action chunks.

LeRobot policies (ACT, diffusion, pi0) train on one sample per frame: a couple of past camera frames, the current
``observation.state`` and the next 50 actions, asked for as ``delta_timestamps`` in seconds under the dataset's
own feature names. mmfeed takes the same dictionary unchanged (``WindowSpec.from_delta_timestamps``): times past
an episode's edges are clamped and flagged in ``<feature>_is_pad`` (mask them out of the action loss). It reads
the directory itself (``meta/info.json`` features, ``meta/stats.json``, per-step tasks, ``data/`` parquet, AV1
``videos/`` decoded with PyAV) and offers two loaders:

1. ``ds.windows(spec)``: LeRobotDataset-shaped samples, so moving from LeRobot is one line and the training loop
   keeps ``mmfeed.DataLoader(windows, batch_size=32, shuffle=True)``;
2. the packed loader: every sample priced in tokens from the metadata alone and whole samples packed into rows,
   so no compute goes to padding.

Here a synthetic LeRobot v3 directory is written first (AV1, LeRobot's default codec); point ``--root`` at a
real one (e.g. a ``lerobot/...`` download) to read that instead.

    python examples/lerobot_dataset.py
    python examples/lerobot_dataset.py --quick
    python examples/lerobot_dataset.py --root ~/.cache/huggingface/lerobot/lerobot/aloha_sim_insertion_human
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_lerobot


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")))
    p.add_argument("--root", default=None, help="an existing LeRobot v3 directory (default: write a synthetic one)")
    p.add_argument("--camera", default=None,
                   help="video feature whose history frames each sample takes (default: the dataset's first)")
    p.add_argument("--codec", default="av1", choices=["av1", "h264"], help="codec of the synthetic videos")
    p.add_argument("--batches", type=int, default=None, help="batches to read of each loader (default 6, quick 2)")
    p.add_argument("--workers", type=int, default=None, help="loader worker processes (default 2, quick 0)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n_batches = args.batches or (2 if args.quick else 6)
    workers = args.workers if args.workers is not None else (0 if args.quick else 2)
    torch.manual_seed(0)  # the shuffle of the windows loader below (as with torch's DataLoader)
    with tempfile.TemporaryDirectory(prefix="mmfeed-lerobot-") as tmp:
        root = args.root
        if root is None:
            t0 = time.perf_counter()
            episodes = make_episodes(3 if args.quick else 8, seed=0, min_length=40, max_length=80, height=48,
                                     width=64)
            root = write_lerobot(Path(tmp) / "synthetic", episodes, codec=args.codec)
            print(f"wrote a LeRobot v3 directory ({len(episodes)} episodes, {args.codec}) in "
                  f"{time.perf_counter() - t0:.1f}s: {root}")
        ds = open_dataset(root)
        fps = float(ds.fps[0])
        videos = [name for name, f in ds.features.items() if f.kind == "video"]
        camera = args.camera or videos[0]
        print(f"{len(ds)} episodes, {int(ds.lengths.sum())} frames at {fps:g} fps; videos {videos}; "
              f"stats of {len(ds.stats)} features, e.g. action mean[:2] {ds.stats['action']['mean'][:2].round(4)}")

        # LeRobot's delta_timestamps, keys as in the dataset: 2 history frames, the current state, 50 actions
        delta_timestamps = {
            camera: [-1 / fps, 0.0],
            "observation.state": [0.0],
            "action": [i / fps for i in range(50)],
        }
        spec = WindowSpec.from_delta_timestamps(delta_timestamps)

        # 1. the LeRobotDataset-shaped view: one sample per frame, torch's batching and shuffling
        windows = ds.windows(spec)
        loader = DataLoader(windows, batch_size=32, shuffle=True, num_workers=workers)
        print(f"ds.windows(spec): {len(windows)} samples, {len(loader)} batches of 32")
        for i, sample in enumerate(loader):
            if i >= n_batches:
                break
            print(f"windows batch {i}: {camera} {tuple(sample[camera].shape)}, observation.state "
                  f"{tuple(sample['observation.state'].shape)}, action {tuple(sample['action'].shape)}, "
                  f"action_is_pad {int(sample['action_is_pad'].sum())} of {sample['action_is_pad'].numel()}, "
                  f"task {sample['task'][0]!r}")

        # 2. the packed loader: the same samples priced and packed into rows of 2048 tokens
        layout = TokenLayout(tokens_per_frame={camera: 64})  # e.g. 8x8 patches per frame
        packing = Packing(layout=layout, window=spec, plan=PlanConfig(capacity=2048, rows_per_batch=2), seed=0)
        packed = DataLoader(ds, packing=packing, num_workers=workers)
        print(f"packed: {len(packed)} batches per epoch of 2x2048 tokens")
        for i, batch in enumerate(packed):
            if i >= n_batches:
                break
            d = batch.data
            pads = {k[: -len("_is_pad")]: int(v.sum()) for k, v in d.items() if k.endswith("_is_pad")}
            n = batch.num_documents
            print(f"batch {i}: {n} samples in {batch.num_rows}x{batch.capacity} tokens "
                  f"({int(batch.cu_seqlens[-1]) / batch.document_ids.numel():.0%} full); "
                  f"{camera} {tuple(d[camera].shape)} {d[camera].dtype}, "
                  f"observation.state {tuple(d['observation.state'].shape)}, action {tuple(d['action'].shape)} "
                  f"= {n} x 50 steps; is_pad counts {pads}")
            if i == 0:
                eps, starts = batch.metadata["episode"][:3].tolist(), batch.metadata["start_step"][:3].tolist()
                print(f"  first samples: episode {eps}, anchor step {starts}; an anchor near an episode's end "
                      f"clamps its chunk and flags the steps past the end in action_is_pad")


if __name__ == "__main__":
    main()
