"""Recycled shared-memory payload buffers: the pool and tracker alone, then through real worker processes."""

import os
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders import shm
from mmfeed.loaders.shm import FREE, IN_MAIN, IN_WORKER, BufferPool, ReleaseTracker, _is_pooled, _state
from mmfeed.packing import PackedBatch
from mmfeed.testing import make_episodes, write_webdataset

KEY = "observation.images.cam_high"
SPEC = WindowSpec.from_delta_timestamps({KEY: [-2 / 15, 0.0], "observation.state": [0.0],
                                         "action": [i / 30 for i in range(5)]})
PACKING = Packing(layout=TokenLayout(tokens_per_frame={KEY: 16}), window=SPEC,
                  plan=PlanConfig(capacity=160, rows_per_batch=2), seed=1)


def test_a_buffer_is_taken_again_only_after_the_tracker_saw_it_unreferenced():
    pool, tracker = BufferPool(per_key=4), ReleaseTracker()
    a = pool.take(KEY, (3, 8, 8, 3))
    storage = a.untyped_storage()
    assert _is_pooled(storage) and _state(storage).value == IN_WORKER
    a.fill_(7)
    tracker.watch({KEY: a})
    assert _state(storage).value == IN_MAIN
    view = a[1:]  # a view keeps the buffer in use
    del a
    tracker.sweep()
    assert _state(storage).value == IN_MAIN
    b = pool.take(KEY, (3, 8, 8, 3))
    assert b.data_ptr() != view.data_ptr() - view.storage_offset() and pool.allocated == 2
    assert torch.all(view == 7)
    del view
    tracker.sweep()
    assert _state(storage).value == FREE and tracker.released == 1
    c = pool.take(KEY, (2, 8, 8, 3))  # smaller fits: the freed buffer again, nothing new allocated
    assert c.untyped_storage().data_ptr() == storage.data_ptr() and pool.reused == 1 and pool.allocated == 2
    assert _state(storage).value == IN_WORKER


def test_what_the_loop_let_go_of_is_free_before_the_next_batch_is_asked_for():
    # torch sends a worker its next index while it hands over a batch: the buffers the loop dropped must be free
    # by then, or the worker takes a new one (memory that grows by a buffer now and then over the epochs)
    from mmfeed.loaders.loop.epoch_iter import _recycle

    pool, tracker = BufferPool(per_key=4), ReleaseTracker()
    storages, asked = [], []

    def batches():
        for k in range(5):
            if k >= 2:  # as batch k is asked for: (the batch before last, the batch the loop holds)
                asked.append((_state(storages[k - 2]).value, _state(storages[k - 1]).value))
            batch = {KEY: pool.take(KEY, (2, 4, 4, 3))}
            storages.append(batch[KEY].untyped_storage())
            yield batch

    for batch in _recycle(batches(), tracker):  # the loop holds one batch at a time
        assert _state(batch[KEY].untyped_storage()).value == IN_MAIN
    assert asked == [(FREE, IN_MAIN)] * 3
    assert pool.allocated == 2  # so two buffers serve the five batches


def test_a_numpy_array_of_a_buffer_keeps_it_in_use():
    pool, tracker = BufferPool(per_key=2), ReleaseTracker()
    t = pool.take(KEY, (4, 4))
    storage = t.untyped_storage()
    tracker.watch({KEY: t})
    array = t.numpy()[1:]
    del t
    tracker.sweep()
    assert _state(storage).value == IN_MAIN
    del array
    tracker.sweep()
    assert _state(storage).value == FREE


def test_a_buffer_that_never_arrived_is_not_freed():
    pool, tracker = BufferPool(per_key=2), ReleaseTracker()
    a = pool.take(KEY, (1, 4, 4, 3))
    tracker.watch({KEY: a})
    del a
    tracker.sweep()
    b = pool.take(KEY, (1, 4, 4, 3))  # taken again: in the worker, on its way to the training process
    assert pool.reused == 1
    tracker.sweep()  # unreferenced in this process but not yet arrived: must stay the worker's
    assert _state(b.untyped_storage()).value == IN_WORKER


def test_the_pool_holds_at_most_per_key_buffers_and_the_tracker_lets_stale_ones_go():
    pool, tracker = BufferPool(per_key=3), ReleaseTracker(stale_after=2)
    held = [pool.take(KEY, (1, 4, 4, 3)) for _ in range(5)]  # never freed: a plain torch loader
    assert pool.allocated == 5 and len(pool._buffers[KEY]) == 3
    tracker.watch(held[:1])
    del held
    for _ in range(4):
        tracker.watch([])
    assert len(tracker) == 0


def test_ordinary_tensors_are_not_taken_for_pooled_ones():
    tracker = ReleaseTracker()
    plain = torch.zeros(64, dtype=torch.uint8).share_memory_()
    tracker.watch({"x": plain, "y": torch.zeros(3)})
    assert len(tracker) == 0 and not _is_pooled(plain.untyped_storage())
    with pytest.raises(ValueError, match="at least 1"):
        BufferPool(per_key=0)


@pytest.fixture
def pool_here():
    """This process as a worker that recycles buffers (its pool and PackedBatch reducer), restored afterwards."""
    saved = shm._pool, shm._pool_pid, ForkingPickler._extra_reducers.get(PackedBatch)
    shm.enable_pool(per_key=1)
    yield shm._pool
    shm._forget({shm._pool.nonce}, alive_too=True)
    shm._pool, shm._pool_pid = saved[:2]
    if saved[2] is None:
        ForkingPickler._extra_reducers.pop(PackedBatch, None)
    else:
        ForkingPickler._extra_reducers[PackedBatch] = saved[2]


def _batch(frames: torch.Tensor) -> PackedBatch:
    return PackedBatch.from_segments([[2]], 4, data={KEY: frames}, metadata={"sample": torch.arange(2)})


def _send(batch: PackedBatch) -> tuple[bytes, PackedBatch]:
    """``batch`` pickled as the worker's queue pickles it, and rebuilt as the training process rebuilds it."""
    data = bytes(ForkingPickler.dumps(batch))
    return data, ForkingPickler.loads(data)


def _arrive(tracker: ReleaseTracker, data: bytes) -> PackedBatch:
    got = ForkingPickler.loads(data)
    tracker.watch(got)
    return got


def test_small_arrays_of_every_layout_arrive_equal_in_the_buffer_of_small_arrays(pool_here):
    frames = pool_here.take(KEY, (2, 4, 4, 3))
    frames.fill_(5)
    grid = torch.arange(24, dtype=torch.float64).view(4, 6)
    metadata = {"sample": torch.arange(2), "transposed": grid.t(), "strided": grid[::2, 1::3],
                "scalar": torch.tensor(7, dtype=torch.int16), "bools": torch.tensor([True, False, True])}
    batch = PackedBatch.from_segments([[2]], 4, data={KEY: frames}, metadata=metadata)
    _, got = _send(batch)
    small = got.document_ids.untyped_storage()
    for name, value in metadata.items():
        arrived = got.metadata[name]
        assert arrived.untyped_storage().data_ptr() == small.data_ptr(), name  # in the buffer of small arrays
        assert arrived.dtype == value.dtype and torch.equal(arrived, value), name
    assert torch.equal(got.data[KEY], frames)


def test_a_buffers_descriptor_crosses_once_and_a_dropped_buffer_is_forgotten(pool_here):
    tracker = ReleaseTracker()
    a = pool_here.take(KEY, (2, 16, 16, 3))
    a.copy_(torch.arange(a.numel(), dtype=torch.uint8).view(a.shape))
    first = bytes(ForkingPickler.dumps(_batch(a[:1])))
    got = _arrive(tracker, first)
    assert torch.equal(got.data[KEY], a[:1]) and got.data[KEY].data_ptr() == a.data_ptr()
    assert torch.equal(got.metadata["sample"], torch.arange(2)) and got.num_documents == 1
    received = shm._received[pool_here.nonce]
    assert sorted(received) == [0, 1]  # the frames' buffer, and the buffer of the batch's ids and metadata
    small = got.document_ids.untyped_storage()
    assert _is_pooled(small) and got.metadata["sample"].untyped_storage().data_ptr() == small.data_ptr()
    del got
    tracker.sweep()  # nothing refers to the small arrays any more: their buffer is free for the next batch
    again = bytes(ForkingPickler.dumps(_batch(a[1:])))  # the same buffers once more: named, no descriptor
    assert len(again) < len(first) and b"DupFd" in first and b"DupFd" not in again
    got = _arrive(tracker, again)
    assert got.data[KEY].data_ptr() == a.data_ptr() + a[0].numel() and torch.equal(got.data[KEY], a[1:])
    assert got.document_ids.untyped_storage().data_ptr() == small.data_ptr() and pool_here.allocated == 2
    del got
    tracker.sweep()
    b = pool_here.take(KEY, (2, 16, 16, 3))  # per_key=1 and buffer 0 still held here (a): dropped, buffer 2 made
    assert pool_here.allocated == 3
    got = _arrive(tracker, bytes(ForkingPickler.dumps(_batch(b))))  # carries the drop: buffer 0 forgotten
    assert sorted(received) == [1, 2] and got.data[KEY].data_ptr() == b.data_ptr()
    assert tracker._pools == {pool_here.nonce}
    tracker.clear()  # this process (the pool's "worker") is alive: its buffers stay received
    assert pool_here.nonce in shm._received
    del tracker  # the loader is gone: everything it received goes
    assert pool_here.nonce not in shm._received


def test_a_phased_buffer_starts_past_a_64_byte_boundary_and_crosses_as_it_is(pool_here):
    tracker = ReleaseTracker()
    a = pool_here.take(KEY, (2, 16, 16, 3), phase=16)
    assert a.data_ptr() % 64 == 16 and a.is_contiguous() and a.untyped_storage().nbytes() >= a.nbytes + 16
    a.copy_(torch.arange(a.numel(), dtype=torch.uint8).view(a.shape))
    got = _arrive(tracker, bytes(ForkingPickler.dumps(_batch(a))))
    assert got.data[KEY].data_ptr() == a.data_ptr() and torch.equal(got.data[KEY], a)
    storage = a.untyped_storage()
    del a, got
    tracker.sweep()
    again = pool_here.take(KEY, (2, 16, 16, 3))  # the same buffer, taken at phase 0: its start
    assert again.untyped_storage().data_ptr() == storage.data_ptr() and again.storage_offset() == 0
    assert pool_here.take("floats", (3, 5), torch.float32, phase=16).data_ptr() % 64 == 16
    taken = pool_here.allocated
    for phase, dtype in ((64, torch.uint8), (-16, torch.uint8), (6, torch.float32)):
        with pytest.raises(ValueError, match="phase"):
            pool_here.take("bad", (4,), dtype, phase=phase)
    assert pool_here.allocated == taken  # refused before any buffer was taken


@pytest.mark.parametrize("worker", [False, True])
def test_collation_buffers_start_at_the_phase_asked_for(worker, monkeypatch):
    from mmfeed.loaders.planned.collate import _alloc

    if worker:
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    for phase in (0, 16, 48):
        buffer, view = _alloc(KEY, (3, 8, 10, 3), phase)
        assert view.shape == (3, 8, 10, 3) and view.flags.c_contiguous
        assert isinstance(buffer, torch.Tensor) == worker and np.shares_memory(view, np.asarray(buffer))
        if phase:
            assert view.ctypes.data % 64 == phase
        view[...] = 5  # every byte of it is ours
        assert int(np.asarray(buffer).sum()) == 5 * view.size


def test_small_arrays_travel_in_one_pooled_buffer_with_their_dtypes_and_shapes(pool_here):
    tracker = ReleaseTracker()
    batch = PackedBatch.from_segments([[2, 1], [3]], 4, data={KEY: pool_here.take(KEY, (3, 2, 2, 3)).zero_(),
                                                             "state": torch.randn(3, 5),
                                                             "empty": torch.zeros(0, 7, dtype=torch.int16)},
                                      metadata={"sample": torch.arange(3), "pad": torch.tensor([True, False]),
                                                "nested": {"t": torch.tensor([0.5], dtype=torch.float64)}})
    data = bytes(ForkingPickler.dumps(batch))
    assert len(data) < 2000  # names and places only: no array's bytes
    got = _arrive(tracker, data)
    want = [batch.document_ids, batch.position_ids, batch.cu_seqlens, batch.data["state"], batch.data["empty"],
            batch.metadata["sample"], batch.metadata["pad"], batch.metadata["nested"]["t"]]
    have = [got.document_ids, got.position_ids, got.cu_seqlens, got.data["state"], got.data["empty"],
            got.metadata["sample"], got.metadata["pad"], got.metadata["nested"]["t"]]
    for w, h in zip(want, have):
        assert h.dtype == w.dtype and h.shape == w.shape and torch.equal(h, w) and h.is_contiguous()
        assert h.untyped_storage().data_ptr() == got.document_ids.untyped_storage().data_ptr()
        assert h.data_ptr() % 64 == 0 or h.numel() == 0
    storage = got.document_ids.untyped_storage()
    del got, have, h
    tracker.sweep()
    assert _state(storage).value == FREE  # the last view gone: the worker may write the next batch into it


def test_a_buffer_dropped_before_its_batch_was_pickled_goes_by_descriptor(pool_here):
    a = pool_here.take(KEY, (1, 8, 8, 3))
    batch = _batch(a)
    pool_here.take(KEY, (1, 8, 8, 3))  # drops buffer 0 before the batch holding it is pickled (queue feeder lag)
    data, got = _send(batch)
    assert b"DupFd" in data and got.data[KEY].data_ptr() == a.data_ptr()
    assert list(shm._received[pool_here.nonce]) == [2]  # by name: only the buffer of small arrays taken after it
    assert pool_here.take_dropped() == []  # never sent by name: nothing to forget


def test_a_batch_naming_a_buffer_never_received_is_an_error(pool_here):
    a = pool_here.take(KEY, (1, 8, 8, 3))
    ForkingPickler.dumps(_batch(a))  # "sent" somewhere else
    with pytest.raises(RuntimeError, match=r"shared buffer 0 of worker pool [0-9a-f]{16}.*never received"):
        _send(_batch(a))


def test_pools_of_ended_workers_are_forgotten_on_clear():
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(child.stdout).to_bytes(4, "little") + b"dead"
    live = os.getpid().to_bytes(4, "little") + b"live"
    shm._received.update({dead: {0: torch.UntypedStorage(4)}, live: {0: torch.UntypedStorage(4)}})
    try:
        assert shm._forget({dead, live}) == {live}
        assert dead not in shm._received and live in shm._received
    finally:
        shm._forget({live}, alive_too=True)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shm")
    write_webdataset(out, make_episodes(6, seed=5, min_length=10, max_length=18, cameras=("cam_high",),
                                        camera_fps={"cam_high": 15.0}), episodes_per_shard=3)
    return out


def _reference(shards, epochs):
    """The frames, position ids and sample numbers of every batch of the first epochs, read in this process (no
    workers, no pool)."""
    ds = PACKING.dataset(open_dataset(shards))
    return [[_content(ds[e, s]) for s in range(ds.num_steps(e))] for e in range(epochs)]


def _content(batch: PackedBatch) -> tuple[torch.Tensor, ...]:
    return batch.data[KEY], batch.position_ids, batch.metadata["sample"]


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_held_batches_are_never_overwritten_and_dropped_ones_are_reused(shards):
    want = _reference(shards, 2)
    loader = DataLoader(open_dataset(shards), packing=PACKING, num_workers=2, persistent_workers=True)
    kept = [_content(b) for b in loader]  # every batch of epoch 0 held to the end: frames, ids and metadata
    assert len(kept) == len(want[0]) and all(_same(k, w) for k, w in zip(kept, want[0]))
    for part in range(3):  # the frames in their buffers, the ids and metadata in the batch's buffer of small arrays
        assert all(_is_pooled(k[part].untyped_storage()) for k in kept)
        assert len({k[part].untyped_storage().data_ptr() for k in kept}) == len(kept)
    assert loader._recycler.released == 0
    del kept
    got, buffers = [], set()
    for b in loader:  # epoch 1: batches dropped as the loop goes on
        got.append(tuple(t.clone() for t in _content(b)))
        buffers.add(b.data[KEY].untyped_storage().data_ptr())
    assert len(got) == len(want[1]) and all(_same(g, w) for g, w in zip(got, want[1]))
    assert loader._recycler.released > 0 and len(buffers) < len(got)  # some buffers carried two batches


def test_recycling_works_under_the_step_timer(shards):
    loader = DataLoader(open_dataset(shards), packing=PACKING, num_workers=2, timer=True)
    assert sum(1 for _ in loader) > 3 and loader._recycler.released > 0


def test_recycling_off_and_on_yield_the_same_batches(shards):
    on = DataLoader(open_dataset(shards), packing=PACKING, num_workers=2)
    off = DataLoader(open_dataset(shards), packing=PACKING, num_workers=2, recycle_buffers=False)
    assert on._recycler is not None and off._recycler is None
    a, b = [x.data[KEY].clone() for x in on], [x.data[KEY].clone() for x in off]
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(on._recycler) == 0  # workers that do not persist take their buffers with them at the epoch's end
    assert DataLoader(open_dataset(shards), packing=PACKING, num_workers=2, pin_memory=True)._recycler is None
    assert DataLoader(np.arange(4), num_workers=2)._recycler is None  # torch's arguments only: torch's behaviour


def test_the_old_module_paths_import_the_moved_modules_themselves_with_a_warning():
    import importlib

    from mmfeed.loaders import heap

    for old, new in (("mmfeed.loaders.loop.shm", shm), ("mmfeed.loaders.loop.heap", heap)):
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {new.__name__}"):
            assert importlib.import_module(old) is new
