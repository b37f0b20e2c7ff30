"""Nothing outlives a loader: after its epoch ends, a break out of the loop, deleting it mid-epoch (persistent
workers too), no worker process, no shared-memory entry and no temporary directory of the loader's is left, and
the same process can open the same (remote) dataset again. Memory stays flat over ten epochs of persistent
workers, with buffer recycling on and off. (Ctrl-C is tests/test_faults.py's.)"""

import gc
import multiprocessing
import os
import tempfile
import time

import pytest
import torch

from dist_job import packing
from http_server import serve
from mmfeed import DataLoader
from mmfeed.loaders import open_dataset
from mmfeed.testing import make_episodes, write_webdataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shutdown")
    write_webdataset(out / "d", make_episodes(6, seed=3, min_length=10, max_length=20, cameras=("cam_high",),
                                              height=32, width=32), episodes_per_shard=3)
    return out


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A temporary directory of this test's own: what the loader or its workers create lands there (and nothing
    of another process running at the same time does)."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setenv("TMPDIR", str(where))
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


def leftovers() -> tuple[set[str], set[str]]:
    """Shared-memory entries and temporary directories that exist now."""
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    return shm, set(os.listdir(tempfile.gettempdir()))


def rss_kib(pids) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (FileNotFoundError, StopIteration, ProcessLookupError):
            pass
    return total


def assert_gone(workers, before) -> None:
    """Within a few seconds: every worker process ended, no new shared memory or temporary directory."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(w.is_alive() for w in workers):
        gc.collect()
        time.sleep(0.05)
    assert not [w.pid for w in workers if w.is_alive()], "worker processes outlived their loader"
    shm, tmp = leftovers()
    assert not {n for n in shm - before[0] if n.startswith(("torch_", "psm_", "mp-", "mmfeed"))}
    assert not tmp - before[1], f"left in the temporary directory: {sorted(tmp - before[1])}"


@pytest.mark.parametrize("how", ["end", "break", "delete", "persistent-delete"])
def test_no_worker_shared_memory_or_temp_dir_outlives_a_loader(shards, how, private_tmp):
    before = leftovers()
    loader = DataLoader(open_dataset(shards / "d"), packing=packing(), num_workers=2,
                        persistent_workers=how == "persistent-delete")
    it = iter(loader)
    first = next(it)
    workers = multiprocessing.active_children()
    assert len(workers) >= 2
    del first
    if how == "end":
        for _ in it:
            pass
    elif how == "break":
        for _ in it:
            break
    del it
    if how in ("delete", "persistent-delete", "break"):
        del loader
    assert_gone(workers, before)


def test_the_same_remote_dataset_opens_again_after_a_loader_with_workers(shards):
    with serve(shards) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/d/mmfeed-index.parquet"
        counts = []
        for _ in range(3):  # each round: open, load an epoch with workers, let it go
            start = time.monotonic()
            counts.append(sum(1 for _ in DataLoader(open_dataset(url), packing=packing(), num_workers=2)))
            assert time.monotonic() - start < 30
    assert len(set(counts)) == 1 and counts[0] > 0


@pytest.mark.slow
@pytest.mark.parametrize("recycle", [True, False])
def test_memory_stays_flat_over_ten_epochs_of_persistent_workers(shards, recycle):
    """RSS of the loop and its workers grows by less than 10% from the end of epoch 2 to the end of epoch 10."""
    loader = DataLoader(open_dataset(shards / "d"), packing=packing(), num_workers=2, persistent_workers=True,
                        recycle_buffers=recycle)
    sizes = []
    for _ in range(10):
        for batch in loader:
            del batch
        sizes.append(rss_kib([os.getpid()] + [p.pid for p in multiprocessing.active_children()]))
    growth = (sizes[-1] - sizes[1]) / sizes[1]
    assert growth < 0.10, f"RSS per epoch (KiB): {sizes}"


class _Litter:
    """Garbage with a finalizer that says in which process it ran."""

    def __init__(self, path) -> None:
        self.path, self.cycle = path, self

    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


class _Collecting(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        gc.collect()  # a worker's collector runs (as it will, sooner or later)
        return i


def test_garbage_left_before_the_workers_fork_is_collected_here_not_in_them(tmp_path):
    """Unreachable objects of the training process (a decoder in a reference cycle, say) are finalized in it,
    never in a DataLoader worker that inherited them when it forked, though the workers' collectors run."""
    log = tmp_path / "finalized"
    gc.disable()  # the cycle stays uncollected until someone collects
    try:
        _Litter(log)
        assert list(DataLoader(_Collecting(), batch_size=2, num_workers=2)) != []
    finally:
        gc.enable()
    gc.collect()  # this process's collector runs (as it will, sooner or later)
    assert log.read_text().split() == [str(os.getpid())]
