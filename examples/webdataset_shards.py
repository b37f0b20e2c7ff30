"""Write, index and load webdataset shards of robot episodes.

One tar member group per episode (``<key>.<camera>.mp4``, ``<key>.proprio.npy``, ``<key>.action.npy``,
``<key>.meta.json``). The parquet index beside the shards (``mmfeed index SHARDS`` on the command line, or
``write_index`` here) lists every episode's length, fps, cameras, task and byte ranges, so an epoch is planned
and packed before a single frame is decoded, and workers read exactly the members their batches need. The
shards stay plain webdataset: the ``webdataset`` library reads them as they are.

    python examples/webdataset_shards.py                 # writes to a temporary directory
    python examples/webdataset_shards.py --out shards/   # keep them
    python examples/webdataset_shards.py --quick
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import webdataset as wds

from mmfeed import DataLoader
from mmfeed.loaders import INDEX_FILENAME, Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset, write_index
from mmfeed.testing import make_episodes, write_webdataset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("MMFEED_EXAMPLE_QUICK")))
    p.add_argument("--out", default=None, help="directory for the shards (default: a temporary one)")
    p.add_argument("--episodes", type=int, default=None, help="episodes to write (default 12, quick 4)")
    p.add_argument("--workers", type=int, default=None, help="loader worker processes (default 2, quick 0)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n = args.episodes or (4 if args.quick else 12)
    workers = args.workers if args.workers is not None else (0 if args.quick else 2)
    with tempfile.TemporaryDirectory(prefix="mmfeed-shards-") as tmp:
        out = Path(args.out or tmp)
        # 1. write: H.264 videos inside plain tars, 4 episodes per shard (index written separately below)
        t0 = time.perf_counter()
        shards = write_webdataset(out, make_episodes(n, seed=0, min_length=20, max_length=40), episodes_per_shard=4,
                                  index=False)
        size = sum(os.path.getsize(s) for s in shards)
        print(f"wrote {len(shards)} shards, {n} episodes, {size / 1e6:.2f} MB in {time.perf_counter() - t0:.1f}s")

        # 2. index: one parquet row per episode, no pixels (same as `mmfeed index <out>`)
        index_path = write_index(shards, out / INDEX_FILENAME)
        table = pq.read_table(index_path)
        print(f"index {Path(index_path).name}: {table.num_rows} episodes, columns {table.column_names[:6]} ...")

        # the shards are ordinary webdataset tars
        first = next(iter(wds.WebDataset(shards[0], shardshuffle=False)))
        print(f"webdataset reads shard 0 as it is: key {first['__key__']!r}, members "
              f"{sorted(k for k in first if not k.startswith('__'))}")

        # 3. load: plan from the index, pack windows into rows, decode in workers
        source = open_dataset(out)
        window = WindowSpec(offsets={"frames.cam_high": (-2, 0), "frames.cam_wrist": (0,), "proprio": (0,),
                                     "action": tuple(range(10))})
        packing = Packing(layout=TokenLayout(tokens_per_frame={"cam_high": 16, "cam_wrist": 16}), window=window,
                          stride=2, plan=PlanConfig(capacity=1024, rows_per_batch=2), seed=0)
        loader = DataLoader(source, packing=packing, num_workers=workers)
        plan = loader.dataset.plan(0)
        print(f"{len(source)} episodes -> {len(loader.dataset.table)} samples -> {plan.num_steps} batches "
              f"(packing efficiency {plan.efficiency:.1%}, {len(plan.dropped)} samples left to the next epoch)")
        batch = next(iter(loader))
        print(f"batch: {batch.num_rows} rows x {batch.capacity} tokens, {batch.num_documents} documents, "
              f"max_seqlen {batch.max_seqlen}, modalities {batch.modalities}")
        for key, value in sorted(batch.data.items()):
            print(f"  data[{key!r}]: {tuple(value.shape)} {value.dtype}")
        print(f"  metadata episodes {batch.metadata['episode'].tolist()}")


if __name__ == "__main__":
    main()
