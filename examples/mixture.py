"""Mix two robot datasets with different cameras by weight, in one packed loader.

Dataset A is a folder of webdataset shards from a robot with one overhead camera at 15 fps; dataset B is a
LeRobot v3 directory from a robot with the overhead camera and a wrist camera, both at 30 fps. Given both paths,
``mmfeed.DataLoader`` reads them as one dataset (``open_dataset([a, b])``: features the union of theirs, stats
merged) and ``Packing(weights=[0.7, 0.3])`` draws 70% of each epoch's samples from A and 30% from B. A sample reads
only the features its own dataset has, each at that dataset's rate, and is priced accordingly: a window from A
holds no wrist frame and costs no wrist tokens.

    python examples/mixture.py
    python examples/mixture.py --quick
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

HIGH, WRIST = "observation.images.cam_high", "observation.images.cam_wrist"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")))
    p.add_argument("--epochs", type=int, default=None, help="epochs to run (default 3, quick 1)")
    p.add_argument("--workers", type=int, default=None, help="loader worker processes (default 2, quick 0)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    epochs = args.epochs or (1 if args.quick else 3)
    workers = args.workers if args.workers is not None else (0 if args.quick else 2)
    n = 4 if args.quick else 8
    with tempfile.TemporaryDirectory(prefix="mmfeed-mixture-") as tmp:
        dir_a, dir_b = Path(tmp) / "robot_a", Path(tmp) / "robot_b"
        write_webdataset(dir_a, make_episodes(n, seed=1, cameras=("cam_high",), camera_fps={"cam_high": 15.0},
                                              min_length=20, max_length=40), episodes_per_shard=4)
        write_lerobot(dir_b, make_episodes(n, seed=2, cameras=("cam_high", "cam_wrist"), min_length=20,
                                           max_length=40), codec="h264")

        ds = open_dataset([dir_a, dir_b])  # what the loader does with the list
        print(f"A: {int((ds.dataset_of == 0).sum())} episodes, B: {int((ds.dataset_of == 1).sum())} episodes; "
              f"{HIGH} at {sorted(set(ds.rates(HIGH).tolist()))} fps, {WRIST} in A {bool(ds.present(WRIST)[0])}, "
              f"in B {bool(ds.present(WRIST)[-1])}")

        window = WindowSpec.from_delta_timestamps({HIGH: [-1 / 15, 0.0], WRIST: [0.0], "observation.state": [0.0],
                                                   "action": [i / 30 for i in range(10)]})
        packing = Packing(layout=TokenLayout(tokens_per_frame={HIGH: 16, WRIST: 8}), window=window, stride=2,
                          weights=[0.7, 0.3], plan=PlanConfig(capacity=1024, rows_per_batch=2), seed=0)
        loader = DataLoader([dir_a, dir_b], packing=packing, num_workers=workers)
        planned = loader.dataset  # the planned dataset over the mixture
        episode_dataset = planned.source.dataset_of[planned.items.table.groups]  # each sample's dataset
        counts, drawn = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64)
        for epoch in range(epochs):
            drawn += np.bincount(episode_dataset[planned.epoch_samples(epoch)], minlength=2)
            for step, batch in enumerate(loader):
                of = batch.metadata["dataset"].numpy()  # which dataset each sample (document) comes from
                counts += np.bincount(of, minlength=2)
                wrist = batch.data.get(WRIST)  # absent from a batch with no sample from B
                assert (0 if wrist is None else len(wrist)) == int((of == 1).sum())
                if epoch == 0 and step < 2:
                    print(f"batch {step}: {batch.num_documents} samples ({int((of == 0).sum())} from A, "
                          f"{int((of == 1).sum())} from B); {HIGH} {tuple(batch.data[HIGH].shape)}, "
                          f"{WRIST} {None if wrist is None else tuple(wrist.shape)}")
        print(f"{epochs} epoch(s): drew {drawn[0]} samples from A, {drawn[1]} from B: share of A "
              f"{drawn[0] / drawn.sum():.1%} (weights 0.7 / 0.3); the batches held {counts[0]} and {counts[1]} "
              f"(the rest in plan(epoch).dropped)")


if __name__ == "__main__":
    main()
