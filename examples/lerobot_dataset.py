"""Train-style sampling from a LeRobot v3 dataset directory: history frames, the current state, action chunks.

LeRobot policies (ACT, diffusion, pi0) train on one sample per frame: a couple of past camera frames, the current
``observation.state`` and the next 50 actions, asked for as ``delta_timestamps`` in seconds. Steps past an
episode's edges are clamped and flagged in ``<key>_is_pad`` (mask them out of the action loss). mmfeed reads the
same directory (``meta/``, ``data/`` parquet, AV1 ``videos/`` decoded with PyAV), prices every sample in tokens
from the metadata alone and packs whole samples into rows, so no compute goes to padding.

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

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_lerobot


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")))
    p.add_argument("--root", default=None, help="an existing LeRobot v3 directory (default: write a synthetic one)")
    p.add_argument("--camera", default="cam_high", help="camera whose history frames each sample takes")
    p.add_argument("--codec", default="av1", choices=["av1", "h264"], help="codec of the synthetic videos")
    p.add_argument("--batches", type=int, default=None, help="batches to read (default 6, quick 2)")
    p.add_argument("--workers", type=int, default=None, help="loader worker processes (default 2, quick 0)")
    return p.parse_args(argv)


def lerobot_keys_to_mmfeed(delta_timestamps: dict[str, list[float]]) -> dict[str, list[float]]:
    """LeRobot feature names -> mmfeed window keys: ``observation.images.<cam>`` -> ``frames.<cam>``,
    ``observation.state`` -> ``proprio``, ``action`` stays."""
    out = {}
    for key, deltas in delta_timestamps.items():
        if key.startswith("observation.images."):
            out["frames." + key.rsplit(".", 1)[-1]] = deltas
        elif key == "observation.state":
            out["proprio"] = deltas
        else:
            out[key] = deltas
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n_batches = args.batches or (2 if args.quick else 6)
    workers = args.workers if args.workers is not None else (0 if args.quick else 2)
    with tempfile.TemporaryDirectory(prefix="mmfeed-lerobot-") as tmp:
        root = args.root
        if root is None:
            t0 = time.perf_counter()
            episodes = make_episodes(3 if args.quick else 8, seed=0, min_length=40, max_length=80, height=48,
                                     width=64)
            root = write_lerobot(Path(tmp) / "synthetic", episodes, codec=args.codec)
            print(f"wrote a LeRobot v3 directory ({len(episodes)} episodes, {args.codec}) in "
                  f"{time.perf_counter() - t0:.1f}s: {root}")
        source = open_dataset(root)
        fps = float(source.fps[0])
        print(f"{len(source)} episodes, {int(source.lengths.sum())} frames at {fps:g} fps, cameras {source.cameras}")

        # LeRobot's delta_timestamps (seconds): 2 history frames, the current state, a 50-step action chunk
        delta_timestamps = {
            f"observation.images.{args.camera}": [-1 / fps, 0.0],
            "observation.state": [0.0],
            "action": [i / fps for i in range(50)],
        }
        window = WindowSpec.from_delta_timestamps(lerobot_keys_to_mmfeed(delta_timestamps), fps)
        layout = TokenLayout(tokens_per_frame={args.camera: 64})  # e.g. 8x8 patches per frame
        packing = Packing(layout=layout, window=window, plan=PlanConfig(capacity=2048, rows_per_batch=2), seed=0)
        loader = DataLoader(source, packing=packing, num_workers=workers)
        print(f"window offsets (steps): { {k: (v[0], v[-1], len(v)) for k, v in window.offsets.items()} } "
              f"as (first, last, count); {len(loader)} packed batches per epoch")

        frames_key = f"frames.{args.camera}"
        for i, batch in enumerate(loader):
            if i >= n_batches:
                break
            d = batch.data
            pads = {k[: -len("_is_pad")]: int(v.sum()) for k, v in d.items() if k.endswith("_is_pad")}
            n = batch.num_documents
            print(f"batch {i}: {n} samples in {batch.num_rows}x{batch.capacity} tokens "
                  f"({int(batch.cu_seqlens[-1]) / batch.document_ids.numel():.0%} full); "
                  f"{frames_key} {tuple(d[frames_key].shape)} {d[frames_key].dtype}, "
                  f"proprio {tuple(d['proprio'].shape)}, action {tuple(d['action'].shape)} "
                  f"= {n} x 50 steps; is_pad counts {pads}")
            if i == 0:
                eps, starts = batch.metadata["episode"][:3].tolist(), batch.metadata["start_step"][:3].tolist()
                print(f"  first samples: episode {eps}, anchor step {starts}; an anchor near an episode's end "
                      f"clamps its chunk and flags the steps past the end in action_is_pad")


if __name__ == "__main__":
    main()
