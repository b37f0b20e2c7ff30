"""worker_mode="thread": batches loaded by threads of the training process are the worker processes' batches.

Real shards (H.264 through PyAV, decoded in several threads at once), the planned loader with its timer, a
mid-epoch resume, a map-style dataset with a sampler, errors, and nothing left running after the loader goes.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.clock import stage
from mmfeed.testing import make_episodes, read_index, write_webdataset

CAM = "observation.images.cam_high"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-1 / 15, 0.0], "observation.state": [0.0], "action": [0.0, 1 / 30]})
PACKING = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), window=SPEC,
                  plan=PlanConfig(capacity=96, rows_per_batch=2), seed=3)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("threads")
    write_webdataset(out, make_episodes(4, seed=2, min_length=12, max_length=20, height=32, width=48),
                     episodes_per_shard=2)
    return out


def contents(batches) -> list[tuple]:
    return [(b.metadata["sample"].tolist(), read_index(b.data[CAM].numpy()).tolist(),
             b.data["observation.state"].numpy().round(6).tolist()) for b in batches]


def loader_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("mmfeed-load")}


def test_threads_give_the_worker_processes_batches(shards):
    ds = open_dataset(shards)
    processes = contents(DataLoader(ds, packing=PACKING, num_workers=2))
    loader = DataLoader(ds, packing=PACKING, num_workers=3, worker_mode="thread", timer=True)
    assert contents(loader) == processes and len(processes) > 3
    report = loader.timer.report()
    assert report["stages"]["decode"]["mean_s"] > 0 and report["num_workers"] == 3
    time.sleep(0.2)
    assert not loader_threads()  # the epoch ran out: its threads ended


def test_a_thread_loader_resumes_mid_epoch_exactly(shards):
    ds = open_dataset(shards)
    whole = contents(DataLoader(ds, packing=PACKING, num_workers=2, worker_mode="thread"))
    first = DataLoader(ds, packing=PACKING, num_workers=2, worker_mode="thread")
    it = iter(first)
    head = contents([next(it), next(it)])
    state = first.state_dict()
    del it
    second = DataLoader(ds, packing=PACKING, num_workers=2, worker_mode="thread")
    second.load_state_dict(state)
    assert head + contents(second) == whole


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == 33 and getattr(self, "fail", False):
            raise ValueError("sample 33 is broken")
        with stage("read"):
            time.sleep(0.002)
        return torch.tensor([i * i])


def test_map_style_order_init_and_errors():
    seen = []
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2, worker_mode="thread",
                        generator=torch.Generator().manual_seed(0), worker_init_fn=seen.append, prefetch_factor=3)
    reference = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=0,
                           generator=torch.Generator().manual_seed(0))
    assert [b.tolist() for b in loader] == [b.tolist() for b in reference]
    assert sorted(seen) == [0, 1]
    broken = Squares()
    broken.fail = True
    with pytest.raises(ValueError, match="sample 33 is broken"):
        list(DataLoader(broken, batch_size=4, num_workers=2, worker_mode="thread"))
    with pytest.raises(ValueError, match="worker_mode"):
        DataLoader(Squares(), worker_mode="fork")


def test_breaking_out_leaves_no_thread_running(shards):
    loader = DataLoader(open_dataset(shards), packing=PACKING, num_workers=2, worker_mode="thread")
    for _ in zip(range(2), loader):
        pass
    deadline = time.monotonic() + 5
    while loader_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not loader_threads()


def test_iterable_datasets_are_refused():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="iterable"):
        DataLoader(Stream(), num_workers=2, worker_mode="thread")
    assert list(DataLoader(Stream(), batch_size=None, worker_mode="thread")) == [0, 1, 2]  # no workers: inline
