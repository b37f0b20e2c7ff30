"""The shard index as flat arrays in one memory-mapped file per node (loaders/stores/index_arrays.py).

What a source reads from the mapped arrays equals what the full index reader derives; the second open maps the
cache instead of reading the parquet; a changed index is never answered from a stale cache; an index the fast
reader cannot vouch for goes through the full reader; forked workers share the mapped pages (their private
memory does not grow by the index) and a pickled source travels as the cache path.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmfeed.loaders import ShardWriter, open_dataset
from mmfeed.loaders.stores import index_arrays as ia
from mmfeed.loaders.stores.index import INDEX_FILENAME
from mmfeed.loaders.formats.webdataset.source import WebDatasetSource
from mmfeed.testing.synth_index import write_synthetic_index


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Each test its own cache directory."""
    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "index"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """3000 episodes in 30 (empty) shards; episodes 999, 1999 and 2999 change task half-way."""
    return write_synthetic_index(tmp_path_factory.mktemp("synthetic"), 3000)


def full_reader(path) -> ia.IndexArrays:
    """The arrays by the general path: the whole index read, every row's features checked."""
    return ia.IndexArrays(ia.derive(ia._read(path), path, members=False))


def same(a: ia.IndexArrays, b: ia.IndexArrays) -> None:
    assert a.ids.equals(b.ids) and a.shards == b.shards and a.tasks == b.tasks
    assert a.shard_stamps == b.shard_stamps and a.metadata == b.metadata
    for name in ("shard_of", "lengths", "fps", "task_of"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.runs.keys() == b.runs.keys()
    for e in a.runs:
        for x, y in zip(a.runs[e], b.runs[e]):
            np.testing.assert_array_equal(x, y)
    assert list(a.features) == list(b.features)
    for f in a.features:
        for key in ("kind", "dtype", "shape"):
            assert a.features[f][key] == b.features[f][key]
        for key in ("fps", "frames", "offset", "size"):
            np.testing.assert_array_equal(a.features[f][key], b.features[f][key], err_msg=f"{f} {key}")


def test_mapped_arrays_equal_the_full_reader(synthetic, cache):
    first = ia.index_arrays(synthetic)
    assert first.path is not None and os.path.dirname(first.path) == str(cache)
    same(first, full_reader(synthetic))
    assert sorted(first.runs) == [999, 1999, 2999] and (first.task_of[[999, 1999, 2999]] == -1).all()
    again = ia.index_arrays(synthetic)
    assert again.path == first.path
    same(again, first)


def test_second_open_reads_no_parquet(synthetic, monkeypatch):
    ia.index_arrays(synthetic)

    def refuse(*args, **kwargs):
        raise AssertionError("the parquet index was read although its arrays are cached")

    monkeypatch.setattr(pq, "ParquetFile", refuse)
    monkeypatch.setattr(pq, "read_table", refuse)
    src = WebDatasetSource(os.path.dirname(synthetic))
    assert len(src) == 3000 and src.episode_id(7) == "ep00000007"


def test_a_changed_index_is_derived_again(tmp_path):
    path = write_synthetic_index(tmp_path / "a", 200)
    before = ia.index_arrays(path)
    table = pq.read_table(path)
    lengths = table["length"].to_numpy() + 1
    pq.write_table(table.set_column(2, "length", pa.array(lengths)), path)
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    after = ia.index_arrays(path)
    assert after.path != before.path
    np.testing.assert_array_equal(after.lengths, lengths)


def test_shards_through_the_arrays_read_as_before(tmp_path):
    """Real shards with a task change and dotted names: a source over the mapped arrays reads what the index
    says (episode ids, task runs, stats, arrays), and from memory the same."""
    with ShardWriter(tmp_path / "s", episodes_per_shard=2) as w:
        for i in range(5):
            task = ["a", "a", "b", "b", "a"] if i == 3 else f"task {i % 2}"
            w.write({"observation.state": np.full((5, 2), i, np.float32), "action": np.arange(5.0)[:, None]},
                    fps=10.0, task=task)
    ds = open_dataset(tmp_path / "s")
    assert ds._index.path is not None
    assert ds.lengths.tolist() == [5] * 5 and ds.episode_tasks[3] == -1
    assert [ds.task(3, t) for t in range(5)] == ["a", "a", "b", "b", "a"]
    assert ds.episode_id(4) == "episode_000004" and "episode_000002" in ds.describe(2)
    np.testing.assert_array_equal(ds.episode(2)["observation.state"], np.full((5, 2), 2, np.float32))
    assert ds.stats["observation.state"]["mean"].tolist() == [2.0, 2.0]
    same(ds._index, full_reader(str(tmp_path / "s" / INDEX_FILENAME)))


def test_an_irregular_index_goes_through_the_full_reader(tmp_path):
    """Episodes listing their features in different orders: the fast reader declines, the result is the full
    reader's."""
    with ShardWriter(tmp_path / "s", episodes_per_shard=4) as w:
        w.write({"a": np.zeros((3, 1)), "b": np.ones((3, 1))}, fps=10.0)
        w.write({"a": np.zeros((4, 1)), "b": np.ones((4, 1))}, fps=10.0)
    path = str(tmp_path / "s" / INDEX_FILENAME)
    assert ia._read_regular(path) is not None
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[1]["features"] = rows[1]["features"][::-1]
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    assert ia._read_regular(path) is None
    same(ia.index_arrays(path), full_reader(path))
    assert open_dataset(tmp_path / "s").lengths.tolist() == [3, 4]


def test_unwritable_cache_still_opens(synthetic, tmp_path, monkeypatch, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("MMFEED_CACHE", str(blocked))
    arrays = ia.index_arrays(synthetic)
    assert arrays.path is None and len(arrays) == 3000
    assert "cannot cache the index arrays" in caplog.text


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """200k episodes: about 35 MB of index arrays."""
    return os.path.dirname(write_synthetic_index(tmp_path_factory.mktemp("big"), 200_000))


_COLD_OPEN = """
import json, os, sys
def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))
import pyarrow, mmfeed.loaders.formats.webdataset.source as w
before = anon()
src = w.WebDatasetSource(sys.argv[1])
print(json.dumps({"anon": anon() - before, "size": os.path.getsize(src._index.path)}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_a_cold_open_gives_back_the_memory_its_read_freed(big, tmp_path):
    """The first open on a node reads the parquet and derives the arrays (a few hundred MB of buffers at a million
    episodes), then maps the cached file: the process keeps the mapping, not the freed buffers. Its anonymous
    memory grows by less than twice the index arrays' size (about 30 MB at 200k episodes, imports' first use
    included; jemalloc kept 140 MB of freed pages before, 4x the arrays). A fresh process: its allocator's first
    read."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "MMFEED_CACHE": str(tmp_path / "fresh")}
    out = subprocess.run([sys.executable, "-c", _COLD_OPEN, big], capture_output=True, text=True, env=env,
                         check=True, timeout=120).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["size"] > 30e6
    assert got["anon"] < 2 * got["size"], got


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc smaps_rollup")
def test_forked_workers_share_the_mapped_index(big):
    """Two forked processes read every column of a 200k-episode index (~35 MB of arrays) the parent read too:
    none of the index file's pages is private to a worker (they are the cache file's, shared by every process
    that maps it), and its private memory in all grows by far less than the index (the rest is the copies on
    write of whatever the fork touches, such as a garbage collection); a pickled source is the path."""
    from mmfeed.bench.scale import _touch, _worker  # what `mmfeed bench scale` measures, here asserted

    src = WebDatasetSource(big)
    size = os.path.getsize(src._index.path)
    total = _touch(src)  # the parent (the training process) has read the index too
    ctx = mp.get_context("fork")
    growth = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(src, child))
        proc.start()
        growth.append(parent.recv())
        proc.join(30)
    assert size > 30e6
    assert all(g["index_private"] == 0 and g["private"] < 0.25 * size for g in growth), growth
    assert growth[0]["total"] == growth[1]["total"] == total > 0
    blob = pickle.dumps(src)
    assert len(blob) < 100 * len(src._shards) + 20_000, len(blob)  # the shard paths, nothing per episode
    back = pickle.loads(blob)
    assert back._index.path == src._index.path and back.episode_id(199_999) == "ep00199999"
