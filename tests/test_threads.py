"""One source shared by loaders in several threads (num_workers=0): each thread gets exactly the batches it gets
alone, and nothing hangs or crashes (decoders are per thread, caches locked)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from dist_job import CAM, packing
from mmfeed import DataLoader
from mmfeed.loaders import WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

THREADS = 3


@pytest.fixture(scope="module", params=["webdataset", "lerobot"])
def source(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    eps = make_episodes(5, seed=6, min_length=20, max_length=40, cameras=("cam_high",), height=32, width=32,
                        camera_fps={"cam_high": 15.0} if request.param == "webdataset" else None)
    if request.param == "webdataset":
        write_webdataset(out, eps, episodes_per_shard=2, gop=8)
    else:
        write_lerobot(out / "lr", eps, codec="h264", gop=8)
        out = out / "lr"
    return open_dataset(out)


def frames(batches):
    return [(b.metadata["sample"].tolist(), b.data[CAM].clone()) for b in batches]


def same(a, b) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_loaders_in_several_threads_share_one_source(source):
    alone = frames(DataLoader(source, packing=packing()))
    results, errors = {}, []

    def run(i):
        try:
            results[i] = frames(DataLoader(source, packing=packing()))
        except Exception as err:  # reported below: a thread's exception would otherwise vanish
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a loader thread hung"
    assert not errors, errors
    assert all(same(results[i], alone) for i in range(THREADS))


def test_windows_read_from_a_thread_pool_equal_those_read_in_turn(source):
    view = source.windows(WindowSpec.from_delta_timestamps({CAM: [-1 / 15, 0.0], "action": [0.0, 1 / 30]}))
    order = list(range(0, len(view), 3)) * 2
    in_turn = [view[i] for i in order]
    with ThreadPoolExecutor(THREADS) as pool:
        pooled = list(pool.map(view.__getitem__, order))
    for a, b in zip(in_turn, pooled):
        assert torch.equal(a[CAM], b[CAM]) and torch.equal(a["action"], b["action"])
