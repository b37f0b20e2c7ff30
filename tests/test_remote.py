"""Shards read over HTTP from a real server on 127.0.0.1: byte ranges through the bounded cache, the same
episodes and batches as from local files, a fraction of the bytes."""

import numpy as np
import pytest
import torch

from dist_job import CAM, packing
from http_server import serve
from mmfeed import DataLoader
from mmfeed.loaders import open_dataset
from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.loaders.stores.index import INDEX_FILENAME, read_shard_index
from mmfeed.loaders.transport.remote import RangeCache, default_cache
from mmfeed.testing import make_episodes, write_webdataset

def ids(batch) -> list[int]:
    return batch.metadata["sample"].tolist()


EPISODES = dict(cameras=("cam_high",), camera_fps={"cam_high": 15.0}, height=32, width=32)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Uneven shards (4 + 1 episodes of 6-40 steps), a 15 fps camera beside the 30 Hz clock."""
    out = tmp_path_factory.mktemp("remote")
    write_webdataset(out / "uneven", make_episodes(5, seed=4, min_length=6, max_length=40, **EPISODES),
                     episodes_per_shard=4)
    return out


@pytest.fixture(scope="module")
def http_shards(shards):
    """An HTTP server on 127.0.0.1 serving the shards folder; yields (base URL of the uneven shards, server)."""
    with serve(shards) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}/uneven", server


def tar_bytes(server) -> int:  # bytes of shards served so far
    return sum(n for method, path, n in server.served if method == "GET" and path.endswith(".tar"))


def members(shards):
    """(shard name, member name, offset, size) of every member in the index, in index order."""
    table = read_shard_index(shards / "uneven" / INDEX_FILENAME).to_pylist()
    return [(row["shard"], m["name"], m["offset"], m["size"]) for row in table for m in row["members"]]


@pytest.mark.parametrize("block_size", [0, 4096])
def test_range_cache_fetches_only_needed_ranges_and_stays_under_its_bound(http_shards, shards, block_size):
    """Every member read over HTTP equals the local bytes; a read costs one request for no more than its blocks;
    a repeated read costs none; the cache never holds more than max_bytes."""
    base, server = http_shards
    cache = RangeCache(max_bytes=12_000, block_size=block_size)
    served = tar_bytes(server)
    listed = members(shards)
    assert {name.rsplit(".", 1)[0] for _, name, _, _ in listed} >= {CAM, "observation.state", "action"}
    for shard, name, offset, size in listed:
        local = (shards / "uneven" / shard).read_bytes()[offset : offset + size]
        requests = cache.stats.requests
        assert cache.read(f"{base}/{shard}", offset, size) == local
        new_bytes, served = tar_bytes(server) - served, tar_bytes(server)
        assert cache.stats.requests - requests <= 1
        blocks = block_size * ((offset + size - 1) // block_size - offset // block_size + 1) if block_size else size
        assert new_bytes <= blocks
        assert cache.cached_bytes <= cache.max_bytes
        if size <= cache.max_bytes:
            again = cache.stats.requests
            assert cache.read(f"{base}/{shard}", offset, size) == local and cache.stats.requests == again
    total = sum(p.stat().st_size for p in (shards / "uneven").glob("*.tar"))
    assert cache.stats.fetched_bytes < total, "headers and padding are never fetched"


@pytest.mark.parametrize("how", ["index", "pattern"])
def test_open_dataset_over_http_reads_the_same_episodes(http_shards, shards, how):
    """open_dataset on the index URL, or on a brace pattern of shard URLs, gives the episodes the local shards
    give under the same feature names, pixels of the 15 fps camera included."""
    base, _ = http_shards
    remote = open_dataset(f"{base}/{INDEX_FILENAME}" if how == "index" else base + "/shard-{000000..000001}.tar")
    local = open_dataset(shards / "uneven")
    assert len(remote) == len(local) == 5 and remote.features == local.features
    assert np.array_equal(remote.lengths, local.lengths) and np.array_equal(remote.frames(CAM), local.frames(CAM))
    a, b = remote.episode(4), local.episode(4)
    assert a["task"] == b["task"] and set(a) == set(b) and CAM in a
    assert all(np.array_equal(a[k], b[k]) for k in b if k != "task")


def test_index_url_partial_read_fetches_a_fraction_of_the_shards(http_shards, shards, monkeypatch):
    """Opened from its index URL, one episode's arrays cost a small fraction of the shard bytes (range requests
    driven by the index), and the process cache stays under MMFEED_REMOTE_CACHE_BYTES."""
    base, server = http_shards
    monkeypatch.setenv("MMFEED_REMOTE_CACHE_BYTES", "8192")
    monkeypatch.setenv("MMFEED_REMOTE_BLOCK_BYTES", "2048")
    before = tar_bytes(server)
    ds = open_dataset(f"{base}/{INDEX_FILENAME}")
    steps = np.arange(int(ds.lengths[2]))
    request = EpisodeRequest(2, {"observation.state": steps, "action": steps})
    got = ds.read_many([request])[0]
    want = open_dataset(shards / "uneven").read_many([request])[0]
    assert set(got) == set(want) == {"observation.state", "action"}
    assert all(np.array_equal(got[k], want[k]) for k in want)
    total = sum(p.stat().st_size for p in (shards / "uneven").glob("*.tar"))
    assert tar_bytes(server) - before < total / 4
    assert default_cache().cached_bytes <= 8192


def test_packed_loader_over_http_with_a_worker_gives_the_local_batches(http_shards, shards):
    """mmfeed.DataLoader(index URL, packing=..., num_workers=1) at rank 1 of 2 yields the batches the local
    shards give: the same samples and the same payloads, video frames included."""
    base, _ = http_shards
    remote = DataLoader(packing().dataset(open_dataset(f"{base}/{INDEX_FILENAME}"), rank=1, world_size=2),
                        num_workers=1)
    local = DataLoader(packing().dataset(open_dataset(shards / "uneven"), rank=1, world_size=2))
    pairs = list(zip(remote, local, strict=True))
    assert len(pairs) == local.dataset.num_steps(0) > 0
    for a, b in pairs:
        assert ids(a) == ids(b) and a.data.keys() == b.data.keys() and CAM in a.data
        assert all(torch.equal(a.data[k], b.data[k]) for k in b.data)
