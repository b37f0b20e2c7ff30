"""The parquet shard index (v2): rows match the episodes, (offset, size) give back each member's exact bytes, and
every malformed input is named by shard and key.

Round trips through WebDatasetSource, stats, deterministic bytes and fsspec-hosted indexes are in
tests/test_shards.py; here is the index itself.
"""

import io
import json
import os
import shutil
import tarfile
import tempfile

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.loaders.stores.index import (INDEX_FILENAME, INDEX_SCHEMA, INDEX_VERSION, build_index, feature_columns,
                                          read_shard_index, resolve_shard, stale_shards, write_index)
from mmfeed.loaders.transport.tar import read_member, split_member
from mmfeed.testing import make_episodes, write_webdataset

CAM = "observation.images.cam_high"


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


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _meta(drop: str = "", **overrides) -> bytes:
    meta = {"fps": 10.0, "length": 3, "task": "t"}
    meta.update(overrides)
    meta.pop(drop, None)
    return json.dumps(meta).encode()


def test_index_rows_match_the_episodes(shards):
    out, eps, paths = shards
    table = read_shard_index(out / INDEX_FILENAME)
    assert table.schema.equals(INDEX_SCHEMA), "stable column names and types"
    info = json.loads(table.schema.metadata[b"mmfeed"])
    assert (info["format"], info["version"]) == ("mmfeed-webdataset-index", INDEX_VERSION)
    assert "observation.state" in info["stats"]
    rows = table.to_pylist()
    assert [r["episode_id"] for r in rows] == [e.episode_id for e in eps]
    assert [r["shard"] for r in rows] == ["shard-000000.tar"] * 3 + ["shard-000001.tar"]
    names = sorted(eps[0].features())
    for row, e in zip(rows, eps):
        assert (row["length"], row["fps"], row["task"]) == (e.length, 30.0, e.task)
        features = {f["name"]: f for f in row["features"]}
        assert sorted(features) == names
        cam = features[CAM]
        assert (cam["kind"], cam["dtype"], cam["shape"]) == ("video", "uint8", [48, 64, 3])
        assert (features[CAM]["fps"], features[CAM]["frames"]) == (15.0, e.num_frames("cam_high"))
        assert features[CAM]["member"] == f"{CAM}.mp4"
        state = features["observation.state"]
        assert (state["kind"], state["dtype"], state["shape"], state["fps"], state["frames"]) == (
            "array", "float32", [14], 30.0, e.length)
        assert features["next.done"]["dtype"] == "bool" and features["next.done"]["shape"] == []
        members = sorted(["meta.json", *(f["member"] for f in row["features"])])
        assert sorted(m["name"] for m in row["members"]) == members
        assert {s["name"] for s in row["stats"]} == set(e.arrays())  # every numeric array, no video
        shard = resolve_shard(out / INDEX_FILENAME, row["shard"])
        assert os.path.samefile(shard, paths[0 if row["shard"].endswith("0.tar") else 1])
        assert row["shard_size"] == os.path.getsize(shard) and row["shard_mtime_ns"] == os.stat(shard).st_mtime_ns
    columns = feature_columns(table)
    assert columns[CAM]["frames"].tolist() == [e.num_frames("cam_high") for e in eps]


def test_every_member_reads_back_byte_exact_by_offset_and_size(shards):
    out, eps, _ = shards
    truth = {e.episode_id: e for e in eps}
    for row in read_shard_index(out / INDEX_FILENAME).to_pylist():
        shard = resolve_shard(out / INDEX_FILENAME, row["shard"])
        members = _tar_members(shard)
        mine = sorted(n for n in members if n.split(".", 1)[0] == row["episode_id"])
        assert mine == sorted(f"{row['episode_id']}.{m['name']}" for m in row["members"])
        for m in row["members"]:
            assert read_member(shard, m["offset"], m["size"]) == members[f"{row['episode_id']}.{m['name']}"]
        for f in row["features"]:  # a feature's (offset, size) is its member's
            data = read_member(shard, f["offset"], f["size"])
            assert data == members[f"{row['episode_id']}.{f['member']}"]
            if f["kind"] == "array":
                np.testing.assert_array_equal(np.load(io.BytesIO(data)), truth[row["episode_id"]].arrays()[f["name"]])


def test_index_works_through_fsspec_urls(shards):
    """The same shard read through an fsspec URL gives the same features, offsets and member bytes."""
    _, _, paths = shards
    fs = fsspec.filesystem("memory")
    with fs.open("/mmfeed-index-test/shard-000000.tar", "wb") as f:
        f.write(open(paths[0], "rb").read())
    url = "memory://mmfeed-index-test/shard-000000.tar"
    try:
        remote, local = build_index([url]), build_index([paths[0]])
        assert remote["shard"].to_pylist() == ["shard-000000.tar"] * 3
        for column in ("episode_id", "length", "fps", "task", "features", "members", "stats", "shard_size"):
            assert remote[column].to_pylist() == local[column].to_pylist(), column
        for m in remote["members"][0].as_py():
            assert read_member(url, m["offset"], m["size"]) == read_member(paths[0], m["offset"], m["size"])
    finally:
        fs.rm("/mmfeed-index-test", recursive=True)


def test_missing_meta_names_shard_and_key(tmp_path):
    shard = _write_tar(tmp_path / "bad.tar", [{"__key__": "ep_a", "observation.state.npy": _npy(np.zeros((3, 2)))}])
    with pytest.raises(ValueError, match=r"'ep_a' in shard .*bad\.tar.* no ep_a\.meta\.json"):
        build_index([shard])


@pytest.mark.parametrize(
    "meta, match",
    [
        (b"{not json", "not valid UTF-8 JSON"),
        (b"\xff\xfe", "not valid UTF-8 JSON"),
        (b"[1, 2]", "JSON object"),
        (_meta(drop="length"), r"lacks \['length'\]"),
        (_meta(drop="fps"), r"lacks \['fps'\]"),
        (_meta(length=-1), "length must be an integer >= 0"),
        (_meta(length=2.5), "length must be an integer >= 0"),
        (_meta(fps=0), "fps must be a finite number > 0"),
        (_meta(rates="cam"), "rates must map feature -> fps"),
        (_meta(camera_fps=[1]), "camera_fps must map feature -> fps"),
        (_meta(rates={"cam": 0}), r"rates\['cam'\] must be a finite number > 0"),
        (_meta(fps=float("inf")), "fps must be a finite number > 0, got inf"),
        (_meta(rates={"cam": float("inf")}), r"rates\['cam'\] must be a finite number > 0"),
        (_meta(rates={"cam": 5.0}), r"names features \['cam'\] that have no member ep_b\.<feature>\.npy"),
        (_meta(task=3), "task must be a string"),
        (_meta(features=[]), "features a dict"),
        (_meta(features={"x": {"kind": "array"}}), r"member ep_b\.x\.npy: meta.json features entry .* is malformed"),
    ],
)
def test_malformed_meta_names_shard_and_key(tmp_path, meta, match):
    shard = _write_tar(tmp_path / "broken.tar", [{"__key__": "ep_b", "x.npy": _npy(np.zeros(3)), "meta.json": meta}])
    with pytest.raises(ValueError, match=match) as info:
        build_index([shard])
    assert "ep_b" in str(info.value) and "broken.tar" in str(info.value)


def test_rates_are_optional_and_default_to_the_control_clock(tmp_path):
    sample = {"__key__": "ep_c", "x.npy": _npy(np.zeros((3, 2), np.float32)), "y.npy": _npy(np.arange(2)),
              "notes.txt": b"not a feature", "meta.json": _meta(rates={"y": 5.0})}
    (row,) = build_index([_write_tar(tmp_path / "plain.tar", [sample])]).to_pylist()
    features = {f["name"]: (f["kind"], f["dtype"], f["shape"], f["fps"], f["frames"]) for f in row["features"]}
    # 3 steps at 10 fps span 0.2 s: a 5 fps stream holds 2 frames there
    assert features == {"x": ("array", "float32", [2], 10.0, 3), "y": ("array", "int64", [], 5.0, 2)}
    assert sorted(m["name"] for m in row["members"]) == ["meta.json", "notes.txt", "x.npy", "y.npy"]
    assert split_member("ep_c.observation.images.top.mp4") == ("ep_c", "observation.images.top", "mp4")


def test_duplicate_and_split_episode_ids_are_refused(tmp_path):
    sample = {"__key__": "ep_d", "meta.json": _meta(length=0)}
    a = _write_tar(tmp_path / "a.tar", [sample])
    b = _write_tar(tmp_path / "b.tar", [sample])
    with pytest.raises(ValueError, match=r"ep_d.*appears twice.*a\.tar.*b\.tar"):
        build_index([a, b])
    split = tmp_path / "split.tar"
    with tarfile.open(split, "w") as tar:
        for name in ("ep_e.meta.json", "ep_f.meta.json", "ep_e.x.npy"):
            data = _meta(length=0) if name.endswith("json") else _npy(np.zeros(0))
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match=r"split\.tar.*members of key 'ep_e' are not consecutive"):
        build_index([str(split)])


def test_read_member_refuses_ranges_past_the_end(shards):
    _, _, paths = shards
    size = os.path.getsize(paths[0])
    with pytest.raises(ValueError, match="truncated"):
        read_member(paths[0], size - 10, 20)
    with pytest.raises(ValueError, match="offset"):
        read_member(paths[0], -1, 5)
    assert read_member(paths[0], size - 10, 10) == open(paths[0], "rb").read()[-10:]


def test_stale_shards_flags_changed_and_missing_shards(shards, tmp_path):
    out, _, _ = shards
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
