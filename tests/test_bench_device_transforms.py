"""The device-transforms benchmark: a small run gives its three ways, and its worker-side image ops do the same
arithmetic as the batched ones (so the comparison is of where they run, not of what they compute)."""

import numpy as np
import torch

from mmfeed.bench.device_transforms import OneSample, run
from mmfeed.loaders.planned.device_transforms import BatchSamples, ColorJitter, RandomResizedCrop
from mmfeed.loaders.planned.steps import sample_generator
from mmfeed.packing import PackedBatch

CAM = "observation.images.cam_high"


def test_one_sample_ops_equal_the_batched_ops_document_by_document():
    frames = torch.randint(0, 256, (5, 16, 20, 3), generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    batch = PackedBatch.from_segments([[3, 2]], 8, segments=[[[(1, 3)], [(1, 2)]]], modalities=["text", CAM],
                                      data={CAM: frames}, metadata={"sample": torch.tensor([4, 9])})
    for op in (ColorJitter(0.4, 0.4, 0.4), RandomResizedCrop(8, scale=(0.5, 1.0))):
        batched = op(batch, BatchSamples.of(batch, seed=1, epoch=2)).data[CAM]
        first = OneSample(op)({CAM: frames[:3]}, sample_generator(1, 2, 4))[CAM]
        second = OneSample(op)({CAM: frames[3:]}, sample_generator(1, 2, 9))[CAM]
        assert torch.equal(batched, torch.cat([first, second]))


def test_a_small_run_reports_each_way():
    report = run(episodes=2, rounds=1, workers=0, height=16, width=32, crop=8)
    rows = {r["way"]: r for r in report["rows"]}
    assert list(rows) == ["none", "workers", "device"]
    assert all(r["samples_per_s"] > 0 and r["cpu_s_per_1000"] >= 0 for r in rows.values())
    assert rows["device"]["transform_ms_per_batch"] > 0 and rows["workers"]["transform_ms_per_batch"] is None
    assert rows["none"]["samples"] == rows["device"]["samples"] == rows["workers"]["samples"] > 0
    assert np.isfinite(rows["device"]["samples_per_s"])
