"""The parquet shard index: rows match the episodes, (offset, size) give back each member's exact bytes."""

import io
import json
import os
import shutil
import tarfile
import tempfile

import fsspec
import numpy as np
import pyarrow as pa
import pytest
import webdataset
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.loaders.index import (
    INDEX_FILENAME,
    INDEX_SCHEMA,
    build_index,
    read_shard_index,
    read_member,
    resolve_shard,
    stale_shards,
    write_index,
)
from mmfeed.testing import make_episodes, write_webdataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    eps = make_episodes(4, seed=2, min_length=20, max_length=30, cameras=("cam_high",),
                        camera_fps={"cam_high": 15.0})
    return out, eps, write_webdataset(out, eps, episodes_per_shard=3, gop=10)


def _tar_members(shard: str) -> dict[str, bytes]:
    with tarfile.open(shard) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def _write_tar(path, samples) -> str:
    with open(path, "wb") as f, webdataset.TarWriter(f, encoder=False, mtime=0) as w:
        for sample in samples:
            w.write(sample)
    return str(path)


def _meta(drop: str = "", **overrides) -> bytes:
    meta = {"fps": 10.0, "length": 3, "task": "t", "cameras": []}
    meta.update(overrides)
    meta.pop(drop, None)
    return json.dumps(meta).encode()


def test_index_rows_match_the_episodes(shards):
    out, eps, paths = shards
    table = read_shard_index(out / INDEX_FILENAME)
    assert table.schema.equals(INDEX_SCHEMA, check_metadata=True), "stable column names and types"
    rows = table.to_pylist()
    assert [r["episode_id"] for r in rows] == [e.episode_id for e in eps]
    assert [r["shard"] for r in rows] == ["shard-000000.tar"] * 3 + ["shard-000001.tar"]
    for row, e in zip(rows, eps):
        assert (row["length"], row["fps"], row["task"]) == (e.length, 30.0, e.task)
        assert row["cameras"] == ["cam_high"] and row["camera_fps"] == [15.0]
        assert sorted(m["name"] for m in row["members"]) == ["action.npy", "cam_high.mp4", "meta.json", "proprio.npy"]
        shard = resolve_shard(out / INDEX_FILENAME, row["shard"])
        assert os.path.samefile(shard, paths[0 if row["shard"].endswith("0.tar") else 1])
        assert row["shard_size"] == os.path.getsize(shard) and row["shard_mtime_ns"] == os.stat(shard).st_mtime_ns


def test_every_member_reads_back_byte_exact_by_offset_and_size(shards):
    out, eps, _ = shards
    truth = {e.episode_id: e for e in eps}
    for row in read_shard_index(out / INDEX_FILENAME).to_pylist():
        shard = resolve_shard(out / INDEX_FILENAME, row["shard"])
        members = _tar_members(shard)
        for m in row["members"]:
            data = read_member(shard, m["offset"], m["size"])
            assert data == members[f"{row['episode_id']}.{m['name']}"]
            if m["name"] == "proprio.npy":
                np.testing.assert_array_equal(np.load(io.BytesIO(data)), truth[row["episode_id"]].proprio)


def test_index_is_deterministic(shards):
    out, _, paths = shards
    first, second = build_index(paths), build_index(list(paths))
    assert first.equals(second, check_metadata=True)
    assert read_shard_index(out / INDEX_FILENAME).equals(first), "write_index stores exactly build_index's table"


def test_index_works_through_fsspec_urls(shards):
    """The same shard read through an fsspec URL gives the same offsets and the same member bytes."""
    out, _, paths = shards
    fs = fsspec.filesystem("memory")
    with fs.open("/mmfeed-test/shard-000000.tar", "wb") as f:
        f.write(open(paths[0], "rb").read())
    url = "memory://mmfeed-test/shard-000000.tar"
    remote, local = build_index([url]).to_pylist(), build_index([paths[0]]).to_pylist()
    assert [r["shard"] for r in remote] == ["shard-000000.tar"] * 3
    assert [r["members"] for r in remote] == [r["members"] for r in local]
    m = remote[0]["members"][0]
    assert read_member(url, m["offset"], m["size"]) == read_member(paths[0], m["offset"], m["size"])
    index_url = write_index([url])
    assert index_url == "memory://mmfeed-test/" + INDEX_FILENAME and read_shard_index(index_url).num_rows == len(remote)
    fs.rm("/mmfeed-test", recursive=True)


def test_missing_meta_names_shard_and_key(tmp_path):
    shard = _write_tar(tmp_path / "bad.tar", [{"__key__": "ep_a", "proprio.npy": b"x"}])
    with pytest.raises(ValueError, match=r"ep_a.*bad\.tar"):
        build_index([shard])


@pytest.mark.parametrize(
    "meta, match",
    [
        (b"{not json", "not valid UTF-8 JSON"),
        (b"[1, 2]", "JSON object"),
        (_meta(drop="length"), "lacks fields"),
        (_meta(length=-1), "length"),
        (_meta(fps=0), "fps"),
        (_meta(cameras="cam"), "cameras"),
        (_meta(cameras=["cam"]), "cam.mp4"),
        (_meta(camera_fps=[1]), "camera_fps"),
    ],
)
def test_malformed_meta_names_shard_and_key(tmp_path, meta, match):
    shard = _write_tar(tmp_path / "broken.tar", [{"__key__": "ep_b", "meta.json": meta}])
    with pytest.raises(ValueError, match=match) as info:
        build_index([shard])
    assert "ep_b" in str(info.value) and "broken.tar" in str(info.value)


def test_camera_fps_is_optional_and_defaults_to_fps(tmp_path):
    sample = {"__key__": "ep_c", "cam.mp4": b"", "meta.json": _meta(cameras=["cam"])}
    shard = _write_tar(tmp_path / "plain.tar", [sample])
    (row,) = build_index([shard]).to_pylist()
    assert row["cameras"] == ["cam"] and row["camera_fps"] == [10.0]
    assert [m["size"] for m in row["members"] if m["name"] == "cam.mp4"] == [0]


def test_duplicate_episode_ids_across_shards_are_refused(tmp_path):
    sample = {"__key__": "ep_d", "meta.json": _meta()}
    a = _write_tar(tmp_path / "a.tar", [sample])
    b = _write_tar(tmp_path / "b.tar", [sample])
    with pytest.raises(ValueError, match=r"ep_d.*a\.tar.*b\.tar"):
        build_index([a, b])


def test_read_member_refuses_ranges_past_the_end(shards):
    _, _, paths = shards
    size = os.path.getsize(paths[0])
    with pytest.raises(ValueError, match="truncated"):
        read_member(paths[0], size - 10, 20)
    with pytest.raises(ValueError, match="offset"):
        read_member(paths[0], -1, 5)
    assert read_member(paths[0], size - 10, 10) == open(paths[0], "rb").read()[-10:]


def test_stale_shards_flags_changed_and_missing_shards(shards, tmp_path):
    out, _, paths = shards
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    index = copy / INDEX_FILENAME
    write_index(sorted(str(p) for p in copy.glob("*.tar")), index)
    assert stale_shards(index) == []
    with open(copy / "shard-000000.tar", "ab") as f:
        f.write(b"\0" * 512)
    os.remove(copy / "shard-000001.tar")
    assert sorted(os.path.basename(p) for p in stale_shards(index)) == ["shard-000000.tar", "shard-000001.tar"]


def test_read_index_refuses_other_parquet(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    with pytest.raises(ValueError, match="not an mmfeed shard index"):
        read_shard_index(tmp_path / "other.parquet")


@settings(max_examples=25)
@given(sizes=st.lists(st.integers(0, 1100), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_offsets_are_exact_for_any_member_sizes(sizes, seed):
    """Members of any size (0, block multiples, odd) each read back exactly from their (offset, size)."""
    rng = np.random.default_rng(seed)
    blobs = [rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() for n in sizes]
    with tempfile.TemporaryDirectory() as tmp:
        sample = {"__key__": "ep", "meta.json": _meta()}
        sample.update({f"part{i}.bin": b for i, b in enumerate(blobs)})
        shard = _write_tar(os.path.join(tmp, "s.tar"), [sample])
        (row,) = build_index([shard]).to_pylist()
        got = {m["name"]: read_member(shard, m["offset"], m["size"]) for m in row["members"]}
    assert got == {**{f"part{i}.bin": b for i, b in enumerate(blobs)}, "meta.json": _meta()}
