"""Remote reads against a real HTTP server on 127.0.0.1 that fails on purpose: 500s and dropped connections are
retried and the epoch completes with nothing lost or repeated; a stalled server is an error naming the URL and
byte range within the timeout, never a hang; 4xx answers are not retried."""

import time

import numpy as np
import pytest

from dist_job import packing
from http_server import serve
from mmfeed import DataLoader
from mmfeed.loaders import open_dataset
from mmfeed.loaders.transport.remote import RangeCache, RemoteReadError, RetryPolicy, retryable
from mmfeed.testing import make_episodes, write_webdataset

FAST = RetryPolicy(attempts=5, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5.0)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults")
    write_webdataset(out / "d", make_episodes(4, seed=8, min_length=8, max_length=20, cameras=("cam_high",),
                                              height=32, width=32), episodes_per_shard=2)
    return out


def every(n: int, faults: tuple[str, ...]):
    """A fault on every n-th request for a shard's bytes, cycling through ``faults``."""
    seen = []

    def fault(number: int, path: str):
        if not path.endswith(".tar"):
            return None
        seen.append(number)
        return faults[(len(seen) // n) % len(faults)] if len(seen) % n == 0 else None

    return fault


def batches_of(url_or_dir, num_workers: int = 0):
    loader = DataLoader(open_dataset(url_or_dir), packing=packing(), num_workers=num_workers)
    return [(b.metadata["sample"].tolist(), b.data["observation.state"].numpy().copy()) for b in loader]


def test_a_flaky_server_costs_retries_not_the_epoch(shards, monkeypatch):
    """One shard request in three answers 500 or drops the connection half way: every batch still comes out,
    equal to the local one, in order: nothing lost, nothing repeated."""
    monkeypatch.setenv("MMFEED_REMOTE_BLOCK_BYTES", "0")  # one request per member: many requests, many faults
    monkeypatch.setenv("MMFEED_REMOTE_TIMEOUT_S", "5")
    local = batches_of(shards / "d")
    with serve(shards, fault=every(3, ("500", "drop"))) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/d/mmfeed-index.parquet"
        remote = batches_of(url, num_workers=2)
    assert {kind for kind, _ in server.faults} == {"500", "drop"} and len(server.faults) >= 4
    assert [ids for ids, _ in remote] == [ids for ids, _ in local]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(remote, local))
    seen = np.concatenate([ids for ids, _ in remote])
    assert len(seen) == len(set(seen.tolist()))


def test_retries_are_counted_and_the_bytes_are_exact(shards):
    with serve(shards, fault=every(2, ("500", "drop"))) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/d/shard-000000.tar"
        cache = RangeCache(max_bytes=0, block_size=0, retry=FAST)
        data = [cache.read(url, offset, 3000) for offset in range(0, 30000, 3000)]
    raw = (shards / "d" / "shard-000000.tar").read_bytes()
    assert data == [raw[o : o + 3000] for o in range(0, 30000, 3000)]
    assert cache.stats.retries == len(server.faults) >= 4 and cache.stats.requests == 10


def test_a_stalled_server_is_an_error_naming_url_and_range_not_a_hang(shards):
    policy = RetryPolicy(attempts=2, backoff_s=0.01, timeout_s=0.5)
    with serve(shards, fault=lambda n, path: "stall" if path.endswith(".tar") else None, stall_s=3) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/d/shard-000000.tar"
        start = time.monotonic()
        with pytest.raises(RemoteReadError, match=r"shard-000000\.tar bytes 100-199: 2 tries failed; last: "
                                                  r".*Timeout"):
            RangeCache(block_size=0, retry=policy).read(url, 100, 100)
        took = time.monotonic() - start
    assert took < 2.5, f"a stalled server held the read for {took:.1f} s"
    assert [kind for kind, _ in server.faults] == ["stall", "stall"]


def test_client_errors_are_not_retried(shards):
    with serve(shards, fault=lambda n, path: "404" if path.endswith(".tar") else None) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/d/shard-000000.tar"
        cache = RangeCache(block_size=0, retry=FAST)
        with pytest.raises(FileNotFoundError):
            cache.read(url, 0, 10)
    assert len(server.faults) == 1 and cache.stats.retries == 0


def test_what_is_retried_and_how_long_it_waits():
    class Answer(Exception):
        def __init__(self, status):
            self.status = status

    assert retryable(Answer(500)) and retryable(Answer(503)) and retryable(Answer(429))
    assert not retryable(Answer(404)) and not retryable(Answer(403))
    assert retryable(TimeoutError()) and retryable(ConnectionResetError())
    assert not retryable(FileNotFoundError()) and not retryable(ValueError())
    policy = RetryPolicy(backoff_s=0.1, max_backoff_s=0.3)
    assert [policy.wait(k) for k in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]
    for bad in ({"attempts": 0}, {"attempts": 1.5}, {"timeout_s": -1}, {"backoff_s": "1"}):
        with pytest.raises(ValueError, match="RetryPolicy"):
            RetryPolicy(**bad)
