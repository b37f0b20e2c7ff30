"""Chained epochs: a planned dataset with persistent workers keeps one torch iterator across epochs, so the next
epoch's first batches load while the loop finishes this one. Same batches and the same ``state_dict()`` as the
loader that drains at each epoch's end (``chain_epochs = False``), exact resume from anywhere, a fresh start after
a break, ``load_state_dict`` or an error, nothing left running after the loader goes, and the stall at each
epoch's start gone. Real worker processes throughout; the episodes come from shards written with the webdataset
writer."""

import gc
import multiprocessing
import threading
import time

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, PlannedDataset, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.planned.items import RecordItems
from mmfeed.loaders.clock import stage
from mmfeed.testing import make_episodes, write_webdataset

CAM = "observation.images.cam_high"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-1 / 15, 0.0], "observation.state": [0.0],
                                         "action": [i / 30 for i in range(3)]})
PACKING = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), window=SPEC,
                  plan=PlanConfig(capacity=96, rows_per_batch=2), seed=3)
EPOCHS = 3


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("epoch_prefetch")
    write_webdataset(out, make_episodes(4, seed=7, min_length=8, max_length=14, cameras=("cam_high",),
                                        camera_fps={"cam_high": 15.0}, height=16, width=32), episodes_per_shard=2)
    return out


def records(world_size=1, rank=0):
    """Token records of lengths 1..29: a planned dataset of a few steps per epoch, fast to load."""
    return PlannedDataset.records([torch.arange(n) for n in range(1, 30)], list(range(1, 30)),
                                  plan=PlanConfig(capacity=40), seed=1, rank=rank, world_size=world_size)


def loader_of(dataset, chain=True, **kwargs):
    loader = DataLoader(dataset, num_workers=2, persistent_workers=True, **kwargs)
    loader.chain_epochs = chain
    return loader


def signature(batch):
    tensors = {**batch.data, "cu_seqlens": batch.cu_seqlens, "document_ids": batch.document_ids}
    return batch.metadata["sample"].tolist(), {k: v.clone() for k, v in sorted(tensors.items())}


def same(a, b):
    return len(a) == len(b) and all(x[0] == y[0] and x[1].keys() == y[1].keys()
                                    and all(torch.equal(x[1][k], y[1][k]) for k in x[1]) for x, y in zip(a, b))


def key(batch):
    return tuple(batch.metadata["sample"].tolist())


@pytest.fixture(autouse=True)
def collected():
    """No decoder left as garbage in this process when workers fork: a worker freeing its copy would wait forever
    on decoder threads that do not exist there."""
    gc.collect()


def planned_samples(dataset, epoch):
    """The sample ids of each batch of ``epoch``, from the plan (nothing decoded in this process)."""
    return [np.concatenate(dataset.batch_samples(epoch, s)).tolist() for s in range(dataset.num_steps(epoch))]


@pytest.mark.parametrize("device,timer", [(None, False), ("cpu", False), (None, True), ("cpu", True)])
def test_chained_epochs_yield_the_batches_of_the_plan_with_the_next_epoch_in_flight(shards, device, timer):
    plan = PACKING.dataset(open_dataset(shards))
    loader = loader_of(open_dataset(shards), packing=PACKING, device=device, timer=timer)
    unchained = loader_of(open_dataset(shards), chain=False, packing=PACKING, device=device, timer=timer)
    released, wants = [], []
    for e in range(EPOCHS):
        want = planned_samples(plan, e)
        got, ahead = [], []
        for i, batch in enumerate(loader):
            got.append(signature(batch))
            if i == len(want) - 1:  # the last batch of the epoch: the next epoch's pass has begun
                ahead.append(loader._chain.length(loader._chain.pass_of(loader.cursor) + 1))
            del batch
        assert [g[0] for g in got] == want and ahead == [plan.num_steps(e + 1)]
        assert same(got, [signature(b) for b in unchained])  # every payload, bit for bit
        released.append(loader._recycler.released)
        wants.append(want)
    assert wants[0] != wants[1] and unchained._chain is None and loader._chain is not None  # fresh plans
    assert 0 < released[0] < released[1] < released[2]  # shared-memory buffers recycled in every epoch
    if timer:
        steps = np.cumsum([0] + [len(w) for w in wants])
        assert loader.timer.epoch_starts == unchained.timer.epoch_starts == steps[:-1].tolist()
        assert len(loader.timer.wait_s) == len(unchained.timer.wait_s) == steps[-1]


def states_and_keys(loader, epochs=EPOCHS):
    """The state before the first iter(), after every batch and after each epoch's StopIteration, and the keys
    of the batches of each epoch."""
    states, keys = [loader.state_dict()], []
    for _ in range(epochs):
        keys.append([])
        for batch in loader:
            keys[-1].append(key(batch))
            states.append(loader.state_dict())
        states.append(loader.state_dict())
    return states, keys


def test_state_dict_is_the_unchained_one_everywhere_and_resumes_from_anywhere():
    chained, unchained = loader_of(records()), loader_of(records(), chain=False)
    states, keys = states_and_keys(chained)
    assert (states, keys) == states_and_keys(unchained)
    assert len(keys[0]) >= 4 and len(set(map(tuple, keys))) == EPOCHS  # fresh plans
    flat, ends = [k for epoch in keys for k in epoch], np.cumsum([0] + [len(k) for k in keys]).tolist()
    n0 = len(keys[0])
    # before the first iter(), mid-epoch 0, after its last batch, after its StopIteration, mid-epoch 1
    for name, index in {"start": 0, "mid": 2, "last": n0, "ended": n0 + 1, "mid-1": n0 + 4}.items():
        state = states[index]
        first = state["epoch"] + 1 if state["done"] else state["epoch"]  # the epoch the resumed loader runs
        handed = ends[first] + (0 if state["done"] else state["batches"])
        resumed = loader_of(records(), device="cpu")
        resumed.load_state_dict(state)
        got = [key(b) for _ in range(2) for b in resumed]  # the rest of that epoch, then the next one
        assert got == flat[handed:ends[first + 2]], name


def test_breaking_out_mid_epoch_starts_the_next_epoch_afresh():
    _, keys = states_and_keys(loader_of(records(), chain=False))
    loader, unchained = loader_of(records(), device="cpu"), loader_of(records(), chain=False, device="cpu")
    left = [iter(loader), iter(unchained)]
    for it in left:
        next(it), next(it)
    chain = loader._chain
    first = iter(loader)  # the previous iterator is left at its third batch: its chain must go
    assert chain.closed and loader._chain is not chain
    second = iter(unchained)
    assert loader.state_dict() == unchained.state_dict()
    assert [key(b) for b in first] == [key(b) for b in second] == keys[1]
    for _ in iter(loader):  # epoch 2 chained on after a whole epoch 1
        break
    del _
    gc.collect()  # the iterator dropped mid-epoch drops its chain
    assert loader._chain is None
    assert [key(b) for b in loader] == states_and_keys(loader_of(records(), chain=False), 4)[1][3]


@pytest.mark.parametrize("persistent", [False, True])
def test_the_state_after_a_break_and_iter_is_the_new_epochs_start_unchained_too(persistent):
    """An epoch left mid-way leaves the sampler's cursor inside it; the next epoch's state is where its own pass
    starts, so resuming from it runs that epoch."""
    _, keys = states_and_keys(loader_of(records(), chain=False))
    loader = DataLoader(records(), num_workers=2, persistent_workers=persistent)
    loader.chain_epochs = False
    it = iter(loader)
    next(it), next(it)
    iter(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"], state["order"]["state"]["epoch"]) == (1, 0, 1)
    resumed = loader_of(records())
    resumed.load_state_dict(state)
    assert [key(b) for b in resumed] == keys[1]


def test_load_state_dict_in_the_middle_of_a_chain_discards_what_is_in_flight():
    states, keys = states_and_keys(loader_of(records(), chain=False))
    loader = loader_of(records())
    assert [key(b) for b in loader] == keys[0]  # epoch 1 is in flight now
    it = iter(loader)
    next(it)
    state = states[len(keys[0]) + 4]  # epoch 1 after 3 batches
    assert state["epoch"] == 1 and state["batches"] == 3
    loader.load_state_dict(state)
    assert list(it) == []  # the old iterator's chain is closed: it hands out nothing more
    assert [key(b) for b in loader] == keys[1][3:]
    assert [key(b) for b in loader] == keys[2]


class FailingAt(PlannedDataset):
    """Records whose step ``fail_at`` of epoch 0 raises in the worker."""

    fail_at = 3

    def __getitem__(self, key):
        if tuple(key[:2]) == (0, self.fail_at):
            raise RuntimeError(f"cannot load step {key}")
        return super().__getitem__(key)


def test_an_error_drops_the_chain_and_the_next_epoch_starts_afresh():
    _, keys = states_and_keys(loader_of(records(), chain=False))
    base = records()
    loader = loader_of(FailingAt(RecordItems(base.items.dataset, base.items.table.tokens), plan=base.config, seed=1),
                       device="cpu", timer=True)
    it = iter(loader)
    got = [key(next(it)) for _ in range(FailingAt.fail_at)]
    with pytest.raises(RuntimeError, match="cannot load step"):
        next(it)
    assert got == keys[0][:FailingAt.fail_at] and loader._chain is None
    assert list(it) == []
    state = loader.state_dict()
    assert (state["epoch"], state["batches"], state["done"]) == (0, FailingAt.fail_at, False)
    assert [key(b) for b in loader] == keys[1]
    assert [key(b) for b in loader] == keys[2]


def test_an_elastic_resume_runs_its_segments_then_fresh_epochs():
    """A state saved by rank 0 of two resumes at world size 1: the rest of that epoch has done segments, the
    epochs after it are fresh plans, with the chain running from the one into the others."""
    saver = loader_of(records(world_size=2), chain=False)
    it = iter(saver)
    next(it), next(it)
    state = saver.state_dict()
    del it
    resumed = loader_of(records())
    resumed.load_state_dict(resumed.dataset.reshard_state(state))
    got = [[key(b) for b in resumed] for _ in range(3)]
    ds = records()
    done = ((2, 2),)
    assert got[0] == [key(ds[0, s, done]) for s in range(ds.num_steps(0, done))]
    assert got[1:] == [[key(ds[e, s]) for s in range(ds.num_steps(e))] for e in (1, 2)]


def test_epochs_of_no_steps_end_at_once():
    """A plan of no steps (the one sample is longer than the capacity, which the dataset is told to accept rather
    than refuse) never spins."""
    loader = loader_of(PlannedDataset.records([torch.arange(30)], [30], plan=PlanConfig(capacity=20),
                                              refuse_unfit=False), device="cpu")
    start = time.monotonic()
    assert [list(loader) for _ in range(3)] == [[], [], []]
    assert time.monotonic() - start < 20
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["done"] is True


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "mmfeed-prefetch" and t.is_alive()]


def wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        gc.collect()
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("how", ["after-epochs", "iterator-mid-epoch"])
def test_nothing_outlives_a_chained_loader(how):
    before = set(prefetch_threads())
    loader = loader_of(records(), device="cpu")
    for _ in range(2):
        for batch in loader:
            del batch
    workers = multiprocessing.active_children()
    assert len(workers) >= 2 and len(set(prefetch_threads()) - before) == 1  # the chain's thread, between epochs
    if how == "iterator-mid-epoch":
        it = iter(loader)
        next(it)
        del it  # dropping the iterator drops the chain and its thread; the persistent workers stay
        assert wait_until(lambda: not set(prefetch_threads()) - before)
        assert all(w.is_alive() for w in workers)
    del loader
    assert wait_until(lambda: not any(w.is_alive() for w in workers)), "worker processes outlived their loader"
    assert wait_until(lambda: not set(prefetch_threads()) - before), "a prefetch thread outlived its loader"


class Sleepy(torch.utils.data.Dataset):
    """Token records of ``length`` tokens whose read sleeps ``cost_s`` (I/O, not CPU: steady on a busy machine)."""

    def __init__(self, n, length, cost_s):
        self.n, self.length, self.cost_s = n, length, cost_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with stage("read"):
            time.sleep(self.cost_s)
        return torch.full((self.length,), i)


def test_no_stall_at_the_start_of_a_chained_epoch():
    """2 workers, 4 samples of 10 ms per batch: 20 ms a batch; the loop's step takes 24 ms. Drained at each
    epoch's end, the loop waits a whole batch's load (40 ms in one worker) at the next epoch's first step;
    chained, it waits nothing. The median over 5 epoch starts leaves out a step the machine's load delays."""
    per_batch_s, step_s, head, epochs = 0.020, 0.024, 3, 6

    def waits(chain):
        ds = PlannedDataset.records(Sleepy(40, 5, 0.010), [5] * 40, plan=PlanConfig(capacity=20), seed=2)
        loader = loader_of(ds, chain=chain, device="cpu", timer=True)
        for _ in range(epochs):
            for batch in loader:
                time.sleep(step_s)
                del batch
        timer = loader.timer
        assert timer.epoch_starts == list(range(0, 10 * epochs, 10)) and len(timer.wait_s) == 10 * epochs
        return [sum(timer.wait_s[s:s + head]) for s in timer.epoch_starts[1:]]

    chained, drained = waits(True), waits(False)
    assert min(drained) > 0.6 * per_batch_s, drained  # the epoch's first batch starts loading at iter()
    assert np.median(chained) < 0.25 * per_batch_s, chained
