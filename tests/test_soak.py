"""Memory over many epochs: what a persistent worker keeps per read, per batch or per epoch stays bounded.

The PyAV reader seeks once per sample under a shuffle; PyAV's demux generator, dropped half way, keeps its packet
buffer (about 150 bytes of native memory) for good, so a reader must close the generators it drops. Measured with
glibc's ``mallinfo2`` (bytes in use on the C heap), which the Python-level tools (``tracemalloc``, ``gc``) do not
see. A worker of the planned loader gives its free heap back when it starts another epoch. The soak itself
(``mmfeed bench soak``, slow here): both loaders' workers hold the same objects of every suspected kind after epoch
3 and after epoch 10, and no file descriptor or shared-memory segment more.
"""

import ctypes
import gc

import numpy as np
import pytest
import torch

from mmfeed.codecs._pyav import PyAVReader
from mmfeed.codecs.demux import frames_of, open_container, packets_of, probe
from mmfeed.loaders import heap
from mmfeed.testing import frame_pattern, write_video


def heap_in_use() -> int:
    """Bytes in use on the C heap (glibc's mallinfo2), after a collection."""
    gc.collect()
    libc = ctypes.CDLL(None)
    fields = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc.mallinfo2.restype = type("Mallinfo2", (ctypes.Structure,), {"_fields_": fields})
    return int(libc.mallinfo2().uordblks)


needs_glibc = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc's mallinfo2")


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = tmp_path_factory.mktemp("soak") / "v.mp4"
    return str(write_video(path, frame_pattern(120, height=48, width=64), codec="h264", gop=2))


def growth_per_call(fn, calls: int = 1500) -> float:
    """Heap bytes in use that ``calls`` calls of ``fn`` leave behind, per call (after a warm-up)."""
    for _ in range(200):
        fn()
    before = heap_in_use()
    for _ in range(calls):
        fn()
    return (heap_in_use() - before) / calls


@needs_glibc
def test_a_reader_that_seeks_per_read_keeps_no_heap_per_seek(video):
    info = probe(video)
    reader = PyAVReader(video, info)
    rng = np.random.default_rng(0)

    def read() -> None:
        i = int(rng.integers(1, info.num_frames))
        reader.decode(np.array([i - 1, i]))

    seeks = reader.seeks
    per_read = growth_per_call(read)
    assert reader.seeks - seeks >= 1500  # each read seeked: the path that leaked
    assert per_read < 16, f"{per_read:.0f} heap bytes kept per seek"
    reader.close()


@needs_glibc
def test_generators_dropped_half_way_leave_no_packet_buffer(video):
    container = open_container(video)
    stream = container.streams.video[0]

    def first_frame() -> None:
        container.seek(0, stream=stream)
        next(frames_of(container, stream))

    def first_packet() -> None:
        container.seek(0, stream=stream)
        for _ in packets_of(container, stream):
            break

    assert growth_per_call(first_frame) < 16
    assert growth_per_call(first_packet) < 16
    container.close()


class EpochSteps(torch.utils.data.Dataset):
    """Item i: the planned dataset's call for step ``keys[i] = (epoch, step)``, then how many times this process
    gave its free heap back so far."""

    def __init__(self, keys):
        self.keys = keys

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        heap.epoch_began(self.keys[i][0])
        return heap.trims


KEYS = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0), (5, 0), (5, 1)]


def test_a_worker_gives_its_free_heap_back_when_it_starts_another_epoch():
    loader = torch.utils.data.DataLoader(EpochSteps(KEYS), batch_size=None, num_workers=1)
    assert [int(t) for t in loader] == [0, 0, 1, 1, 1, 2, 3, 3]  # the first epoch has nothing to give back
    assert [int(t) for t in loader] == [0, 0, 1, 1, 1, 2, 3, 3]  # a new worker counts from its own start


def test_the_training_process_keeps_its_heap():
    before = heap.trims
    assert [int(t) for t in torch.utils.data.DataLoader(EpochSteps(KEYS), batch_size=None)] == [before] * len(KEYS)


def test_the_shuffle_keeps_the_keys_of_the_last_few_epochs_only():
    from mmfeed.packing import shuffle

    first = shuffle.index_shuffle(np.arange(100), 100, seed=3, epoch=0)
    for epoch in range(300):  # a long fine-tuning run's epochs, two orders each (a ClassPlan's streams)
        shuffle.index_shuffle(np.arange(100), 100, seed=3, epoch=epoch)
        shuffle.index_shuffle(np.arange(100), 100, seed=3, epoch=epoch, stream=2)
    assert len(shuffle._recent) <= 4 and (3, 299) in shuffle._recent
    again = shuffle.index_shuffle(np.arange(100), 100, seed=3, epoch=0)  # recomputed: the same order
    assert np.array_equal(first, again) and sorted(again.tolist()) == list(range(100))


# ------------------------------------------------------------------------------------------------------ the soak

IN_FLIGHT = {"torch.Tensor": 64, "mmfeed.packing.batch.PackedBatch": 2,
             "mmfeed.packing.metadata.Layout": 8 + 1, "mmfeed.packing.metadata.Metadata": 8 + 1}
"""Objects of a batch a worker may be building or handing over when it is asked (at most this many); the layouts
and metadata of the last 8 batch shapes a process keeps (``mmfeed.loaders.planned.steps``), and a batch's own."""
MAIN_BATCHES = 2 * 2 + 1
"""Batches the training process may hold when it is asked: the 2 workers' prefetch_factor (2) each, received and
queued (the planned loader keeps the next epoch's first ones in flight across the boundary), and the loop's own."""
BOUNDED = {"torch.multiprocessing.reductions.StorageWeakRef"}
"""torch's own cache of the storages a process shared, which it prunes past 128 entries."""
PER_WORKER = (2 + 1) * (2 + 4)
"""The pooled buffers a worker may keep: 2 cameras and a batch's small arrays (``SMALL_KEY``), ``per_key`` each
(prefetch_factor 2 + 4). A pool grows where a worker met a stall (the training process held more batches than
usual, at an epoch's boundary): bounded, not constant."""
POOLED = 2 * PER_WORKER
"""The pooled buffers the training process may map: those of 2 workers."""
BUFFER = "mmfeed.loaders.shm._Buffer"
"""A worker's pooled buffer, as the soak counts objects by type."""


@pytest.fixture(scope="module")
def soak_data(tmp_path_factory):
    from mmfeed.bench.soak import write_datasets

    return write_datasets(tmp_path_factory.mktemp("soak"), episodes=8)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["windows", "packed"])
def test_ten_epochs_keep_the_same_objects_descriptors_and_shared_memory(soak_data, path):
    from mmfeed.bench.soak import run_path

    result = run_path(path, soak_data, 10, probe=True, baseline_epoch=3)
    pooled = result["pooled"]["last"] - result["pooled"]["baseline"]  # the buffers the training process gained
    assert result["baseline_epoch"] == 3 and len(result["epochs"]) == 10
    workers = [name for name in result["summary"] if name.startswith("worker")]
    assert len(workers) == 2
    for name, counts in result["suspects"].items():
        before, after = counts["baseline"], counts["last"]
        assert any(kind.startswith("mmfeed.") for kind in after), name  # the library's objects are counted
        for kind in sorted(set(before) | set(after)):
            if kind in BOUNDED:
                assert after.get(kind, 0) <= 2 * 128, (name, kind, after.get(kind))
            elif kind in IN_FLIGHT:
                bound = MAIN_BATCHES if name == "main" and kind.endswith("PackedBatch") else IN_FLIGHT[kind]
                assert after.get(kind, 0) <= bound, (name, kind, after.get(kind))
            elif name != "main" and kind == BUFFER:
                assert after.get(kind, 0) <= PER_WORKER, (name, kind, before.get(kind), after.get(kind))
            elif name != "main" and kind == "torch.storage.UntypedStorage":
                # one storage a pooled buffer: more only where the pool grew
                grown = after.get(BUFFER, 0) - before.get(BUFFER, 0)
                assert after.get(kind, 0) - before.get(kind, 0) == grown, (name, kind, before, after)
            elif name == "main" and kind == "torch.storage.UntypedStorage":
                # one storage a pooled buffer: more only where a worker's pool grew, within its bound
                assert after.get(kind, 0) - before.get(kind, 0) == pooled, (kind, before, after, result["pooled"])
                assert result["pooled"]["last"] <= POOLED, result["pooled"]
            else:
                assert before.get(kind, 0) == after.get(kind, 0), (name, kind, before.get(kind), after.get(kind))
    for name, summary in result["summary"].items():
        # each pooled buffer holds a descriptor and a shared-memory file open in its worker and in the training
        # process, which count its storages at the moment they count descriptors; a worker's pool may have
        # grown between the two counts
        if name == "main":
            low = high = pooled
        else:
            low, high = 0, PER_WORKER - result["suspects"][name]["baseline"].get(BUFFER, 0)
        for key in ("fds", "shm"):
            assert low <= summary[key]["end"] - summary[key]["start"] <= high, (name, key, summary[key], low, high)
    if path == "windows" and result["epochs"][-1]["processes"]["worker 0"]["malloc"] is not None:
        # the C heap in use (mallinfo2) of workers that sit idle between epochs (the windows view does not chain
        # epochs): 8 episodes, ~180 windows per worker and epoch; a dropped demux generator per seek kept ~70 KB
        # an epoch
        for name in workers:
            used = [r["processes"][name]["malloc"]["uordblks"] for r in result["epochs"]]
            assert used[-1] - used[2] < 256 << 10, (name, [(u - used[2]) >> 10 for u in used])
    if path == "packed":  # each worker gave its free heap back at each epoch it began since epoch 3
        for name in workers:
            trims = [r["processes"][name]["heap_trims"] for r in result["epochs"]]
            assert trims[-1] - trims[2] >= 6, (name, trims)
