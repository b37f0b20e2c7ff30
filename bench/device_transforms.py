"""Augmentation in the workers, one sample at a time, against the same ops batched after the copy
(``DataLoader(..., device=..., device_transform=...)``), on the CPU of this machine.

A synthetic webdataset (``mmfeed.testing``: two cameras, windows of two frames of one and one of the other, the
state and a 4-step action chunk) is loaded in packed batches by ``--workers`` persistent worker processes, three
ways, interleaved round by round (the order alternating):

- ``none``: no transform (the floor);
- ``workers``: ``Packing(transform=...)``: Normalize, CameraDropout, colour jitter and a random resized crop run
  on each sample in the workers (the image ops are the device ones applied to a one-sample batch, with the
  sample's own generator, so both sides do the same arithmetic);
- ``device``: the same chain as device transforms (DeviceNormalize, DeviceCameraDropout, ColorJitter,
  RandomResizedCrop) on each whole batch, on ``device="cpu"`` in the prefetch thread of the training process.

Per way: samples/s (wall clock over one epoch), CPU-seconds per 1000 samples (the training process and its
workers, their CPU-time clocks), and on the device side the transform phase per batch from the StepTimer; medians
over the rounds with their spread (``(max - min) / median``). The training process runs torch's ops on ``--threads``
threads (default 1, as each worker: on a loaded 2-core machine two intra-op threads made the batched ops up to 9x
slower, each op waiting for the core the workers hold). On a CPU device the batched ops compete with the workers for
the same cores; on a GPU they leave the workers alone (``mmfeed bench gpu``).

::

    python -m mmfeed.bench.device_transforms [--episodes 24] [--rounds 5] [--workers 2] [--threads 1]
        [--size 128x96] [--crop 64] [--device cpu] [--json out.json]   (or: mmfeed bench device-transforms ...)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmfeed import DataLoader
from mmfeed._parsing import FRAME_SIZE, frame_size
from mmfeed.bench.common import child_pids, cpu_seconds, environment, spread
from mmfeed.loaders import (CameraDropout, Compose, Normalize, Packing, PlanConfig, StepTimer, TokenLayout,
                            WindowSpec, open_dataset)
from mmfeed.loaders.planned.device_transforms import (BatchSamples, ColorJitter, DeviceCameraDropout, DeviceCompose,
                                                      DeviceNormalize, RandomResizedCrop)
from mmfeed.packing import PackedBatch
from mmfeed.testing import make_episodes, write_webdataset

__all__ = ["OneSample", "main", "run"]

CAM, WRIST = "observation.images.cam_high", "observation.images.cam_wrist"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], WRIST: [0.0], "observation.state": [0.0],
                                         "action": [i / 30 for i in range(4)]})
LAYOUT = TokenLayout(tokens_per_frame={CAM: 16, WRIST: 16})
WAYS = ("none", "workers", "device")


class OneSample:
    """A device op run in a worker on one sample: each video feature of the sample as a one-document batch, drawn
    from the sample's own generator."""

    def __init__(self, op: Any) -> None:
        self.op = op

    def __call__(self, sample: dict, generator: torch.Generator) -> dict:
        out = dict(sample)
        for feature in (CAM, WRIST):
            frames = sample.get(feature)
            if not isinstance(frames, torch.Tensor) or len(frames) == 0:
                continue
            n = len(frames)
            batch = PackedBatch.from_segments([[n]], n, segments=[[[(1, n)]]], modalities=["text", feature],
                                              data={feature: frames}, metadata={"sample": torch.zeros(1)})
            samples = BatchSamples(np.zeros(1, np.int64), 0, 0, {feature: np.zeros(n, np.int64)})
            samples._generators[0] = generator
            out[feature] = self.op(batch, samples).data[feature]
        return out


def _ops(crop: int) -> tuple[ColorJitter, RandomResizedCrop]:
    return ColorJitter(0.4, 0.4, 0.4), RandomResizedCrop(crop, scale=(0.5, 1.0))


def loader(root: str, way: str, workers: int, crop: int, device: str = "cpu") -> DataLoader:
    source = open_dataset(root)
    jitter, rrc = _ops(crop)
    plan = PlanConfig(capacity=512, rows_per_batch=4)
    kw: dict[str, Any] = dict(num_workers=workers, persistent_workers=workers > 0, device=device, timer=StepTimer())
    if way == "workers":
        transform = Compose(Normalize(source), CameraDropout(0.3), OneSample(jitter), OneSample(rrc))
        return DataLoader(source, packing=Packing(layout=LAYOUT, window=SPEC, plan=plan, transform=transform), **kw)
    pack = Packing(layout=LAYOUT, window=SPEC, plan=plan)
    if way == "device":
        kw["device_transform"] = DeviceCompose(DeviceNormalize(source), DeviceCameraDropout(0.3), jitter, rrc)
    return DataLoader(source, packing=pack, **kw)


def _build(root: str, way: str, workers: int, crop: int, device: str) -> DataLoader:
    dl = loader(root, way, workers, crop, device)
    dl.chain_epochs = False  # each timed epoch drains: no epoch's batches load during another's clock
    return dl


def one_epoch(dl: DataLoader) -> dict[str, float]:
    """One timed epoch of a loader whose workers already run: samples, seconds, CPU-seconds, transform phase."""
    dl.timer.reset()
    pids = child_pids()
    cpu0, wall0 = time.process_time() + cpu_seconds(pids), time.perf_counter()
    samples = 0
    for batch in dl:
        samples += len(batch.metadata["sample"])
    if dl.device is not None and dl.device.type == "cuda":
        torch.cuda.synchronize(dl.device)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() + cpu_seconds(pids) - cpu0
    transform = dl.timer.report()["transform_s"]
    return {"samples": samples, "wall_s": wall, "cpu_s": cpu, "samples_per_s": samples / wall,
            "cpu_s_per_1000": 1000 * cpu / max(samples, 1),
            "transform_ms_per_batch": None if transform is None else 1e3 * transform["mean"]}


def synthetic(root: Path, episodes: int, height: int, width: int) -> str:
    out = root / "wds"
    write_webdataset(out, make_episodes(episodes, seed=5, min_length=20, max_length=40, height=height, width=width,
                                        cameras=("cam_high", "cam_wrist")), episodes_per_shard=4)
    return str(out)


def run(episodes: int = 24, rounds: int = 5, workers: int = 2, height: int = 96, width: int = 128,
        crop: int = 64, root: str | None = None, threads: int = 1, device: str = "cpu") -> dict[str, Any]:
    """The table; ``threads``: torch's intra-op threads in the training process (where the device transforms
    run on a CPU device), as each worker has one; ``device``: where batches go (``"cuda"``: ``mmfeed bench gpu``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _run(episodes, rounds, workers, height, width, crop, root, threads, device)
    finally:
        torch.set_num_threads(before)


def _run(episodes: int, rounds: int, workers: int, height: int, width: int, crop: int, root: str | None,
         threads: int, device: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = root or synthetic(Path(tmp), episodes, height, width)
        loaders = {way: _build(root, way, workers, crop, device) for way in WAYS}
        for dl in loaders.values():  # workers started, the first epoch's refill paid
            for _ in dl:
                pass
        runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
        for r in range(rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                runs[way].append(one_epoch(loaders[way]))
        del loaders
    rows = []
    for way in WAYS:
        row: dict[str, Any] = {"way": way, "samples": runs[way][0]["samples"]}
        for key in ("samples_per_s", "cpu_s_per_1000", "transform_ms_per_batch"):
            values = [m[key] for m in runs[way] if m[key] is not None]
            row[key] = statistics.median(values) if values else None
            row[f"{key}_spread"] = spread(values) if values else None
        rows.append(row)
    return {"episodes": episodes, "frame": [height, width], "crop": crop, "rounds": rounds, "workers": workers,
            "threads": threads, "device": device, "rows": rows, "environment": environment()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmfeed bench device-transforms",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--size", type=frame_size(min_width=32, min_height=16), default="128x96", metavar=FRAME_SIZE,
                        help=f"frame size of both cameras, {FRAME_SIZE} (default 128x96: 128 wide, 96 high)")
    parser.add_argument("--crop", type=int, default=64, help="the random resized crop's output side")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's intra-op threads in the training process (each worker has one)")
    parser.add_argument("--device", default="cpu", help="where batches go and device transforms run (default cpu; "
                                                         "cuda: as mmfeed bench gpu runs it)")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args(argv)
    report = run(args.episodes, args.rounds, args.workers, args.size.height, args.size.width, args.crop,
                 threads=args.threads, device=args.device)
    print(f"{report['episodes']} episodes, {args.size.width}x{args.size.height} frames, {args.workers} workers, "
          f"batches on {args.device}, "
          f"{args.threads} torch thread(s) in the training process, median of {args.rounds} interleaved rounds "
          "(spread = (max - min) / median)")
    print(f"{'way':>8} {'samples/s':>10} {'spread':>7} {'CPU-s/1000':>11} {'spread':>7} {'transform ms/batch':>19}")
    for row in report["rows"]:
        t = row["transform_ms_per_batch"]
        print(f"{row['way']:>8} {row['samples_per_s']:>10.0f} {row['samples_per_s_spread']['range']:>7.2f} "
              f"{row['cpu_s_per_1000']:>11.2f} {row['cpu_s_per_1000_spread']['range']:>7.2f} "
              f"{'-' if t is None else f'{t:.2f}':>19}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
