"""mmfeed.DataLoader over a planned, packed episode source: real shards, real worker processes, exact resume."""

import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_webdataset

CAM = "observation.images.cam_high"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-2 / 15, 0.0], "observation.state": [0.0],
                                         "action": [i / 30 for i in range(5)]})
PACKING = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), window=SPEC,
                  plan=PlanConfig(capacity=96, rows_per_batch=2), seed=1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("loader")
    write_webdataset(out, make_episodes(4, seed=3, min_length=10, max_length=16, cameras=("cam_high",),
                                        camera_fps={"cam_high": 15.0}), episodes_per_shard=2)
    return out


def signature(batch):
    """What identifies a batch: its documents and every payload and id tensor, bit for bit."""
    tensors = {**batch.data, "cu_seqlens": batch.cu_seqlens, "step_ids": batch.step_ids,
               "modality_ids": batch.modality_ids, "document_ids": batch.document_ids}
    return batch.metadata["sample"].tolist(), {k: v.clone() for k, v in tensors.items()}


def same(a, b):
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def test_loader_yields_the_plan_in_order_with_worker_processes(shards):
    ds = PACKING.dataset(open_dataset(shards))
    loader = DataLoader(open_dataset(shards), packing=PACKING, num_workers=2)
    firsts = []
    for epoch in range(2):
        got = [signature(b) for b in loader]
        want = [signature(ds[epoch, s]) for s in range(ds.num_steps(epoch))]
        assert len(got) == len(want) > 2 and all(same(g, w) for g, w in zip(got, want))
        firsts.append(got[0][0])
    assert firsts[0] != firsts[1]  # epoch 1 is a fresh plan


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("workers_before,workers_after", [(0, 2), (2, 0), (2, 3)])
def test_resume_mid_epoch_continues_with_exactly_the_remaining_batches(shards, workers_before, workers_after):
    reference = [signature(b) for b in DataLoader(shards, packing=PACKING, num_workers=0)]
    for cut in (1, len(reference) - 1):
        loader = DataLoader(shards, packing=PACKING, num_workers=workers_before)
        it = iter(loader)
        for _ in range(cut):
            next(it)
        state = loader.state_dict()
        del it
        resumed = DataLoader(shards, packing=PACKING, num_workers=workers_after)
        resumed.load_state_dict(state)
        rest = [signature(b) for b in resumed]
        assert len(rest) == len(reference) - cut
        assert all(same(g, w) for g, w in zip(rest, reference[cut:]))


def test_ranks_from_the_environment_split_the_epoch(shards, monkeypatch):
    samples, steps = [], set()
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = DataLoader(shards, packing=PACKING)
        assert (loader.dataset.rank, loader.dataset.world_size) == (rank, 2)
        batches = list(loader)
        steps.add(len(batches))
        samples.append([s for b in batches for s in b.metadata["sample"].tolist()])
    assert len(steps) == 1, "every rank runs the same number of steps"
    assert not set(samples[0]) & set(samples[1])
    plan = loader.dataset.plan(0)
    assert sorted(samples[0] + samples[1] + plan.dropped.tolist()) == list(range(len(loader.dataset.items)))


def test_timer_attributes_worker_stages(shards):
    loader = DataLoader(shards, packing=PACKING, num_workers=2, timer=True)
    batches = [b for b in loader]
    assert batches and all(b.__class__.__name__ == "PackedBatch" for b in batches)  # the batch, not a wrapper
    report = loader.timer.report()
    assert {"read", "decode", "collate"} <= set(report["stages"])


def test_planned_datasets_refuse_torch_batching_arguments(shards):
    with pytest.raises(ValueError, match="makes its own batches"):
        DataLoader(shards, packing=PACKING, batch_size=4)
    with pytest.raises(TypeError, match="packing must be"):
        DataLoader(shards, packing={"capacity": 8})
