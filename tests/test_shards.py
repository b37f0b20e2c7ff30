"""Shards v2 on real files: ShardWriter round trips, the index and its stats, WebDatasetSource, v1 shards, errors."""

import io
import json
import os
import pickle

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset
from mmfeed.codecs import encode_video
from mmfeed.loaders.conversion.writer import ShardWriter
from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.loaders.transport.errors import SampleError
from mmfeed.loaders.stores.index import (
    INDEX_FILENAME,
    build_index,
    dataset_stats,
    feature_columns,
    read_shard_index,
    write_index,
)
from mmfeed.loaders.transport.tar import iter_shard, read_member
from mmfeed.loaders.formats.webdataset.source import WebDatasetSource
from mmfeed.packing.windows import frames_at_rate

from mmfeed.testing import frame_pattern, make_episodes, read_index, write_webdataset, write_webdataset_v1

FPS, CAM_FPS = 50.0, 15.0
LENGTHS = (40, 31, 52)


def _episode(i: int, length: int) -> dict:
    """Features of every dtype and step shape, dotted names, a 50 Hz video, a 15 fps camera and mp4 bytes."""
    rng = np.random.default_rng(i)
    cam = int(frames_at_rate(length, FPS, CAM_FPS))
    return {
        "observation.state": rng.standard_normal((length, 3)).astype(np.float32),
        "next.reward": rng.standard_normal(length),  # float64 [T]
        "action.chunk": rng.integers(-2**40, 2**40, size=(length, 2, 2)),  # int64 [T, 2, 2]
        "next.done": np.arange(length) == length - 1,  # bool [T]
        "raw.counts": rng.integers(0, 65535, size=(length, 3)).astype(np.uint16),
        "observation.images.top": frame_pattern(length, height=32, width=64, seed=i),
        "observation.images.wrist": frame_pattern(cam, height=32, width=64, start=100, seed=9),
        "observation.images.side": encode_video(frame_pattern(length, height=32, width=64, seed=5), fps=FPS, gop=8),
    }


RATES = {"observation.images.wrist": CAM_FPS}


def _write(out, gop: int = 10) -> tuple[list[dict], ShardWriter]:
    episodes = [_episode(i, n) for i, n in enumerate(LENGTHS)]
    with ShardWriter(out, gop=gop, episodes_per_shard=2) as writer:
        for i, features in enumerate(episodes):
            writer.write(features, fps=FPS, task=f"task {i % 2}", rates=RATES)
    return episodes, writer


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    episodes, writer = _write(out)
    return out, episodes, writer


def test_round_trip_every_feature(written):
    out, episodes, writer = written
    assert [os.path.basename(s) for s in writer.shards] == ["shard-000000.tar", "shard-000001.tar"]
    assert writer.index_path == os.path.join(out, INDEX_FILENAME)
    src = WebDatasetSource(out)
    assert len(src) == 3 and src.lengths.tolist() == list(LENGTHS) and src.tasks == ["task 0", "task 1"]
    assert src.features["observation.images.wrist"].fps == CAM_FPS
    assert src.features["action.chunk"].shape == (2, 2) and src.features["next.done"].dtype == "bool"
    assert src.features["observation.images.side"].shape == (32, 64, 3)
    for e, want in enumerate(episodes):
        got = src.episode(e)
        assert got["episode_id"] == f"episode_{e:06d}" and got["fps"] == FPS and got["task"] == f"task {e % 2}"
        for name, value in want.items():
            if isinstance(value, bytes) or value.dtype == np.uint8:
                frames = int(src.frames(name)[e])
                assert got[name].shape == (frames, 32, 64, 3)
                start = 100 if name.endswith("wrist") else 0
                assert read_index(got[name]).tolist() == list(range(start, start + frames)), name
            else:
                assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name
        assert int(src.frames("observation.images.wrist")[e]) == len(want["observation.images.wrist"])
        assert src.rates("observation.images.wrist")[e] == CAM_FPS and src.rates("next.reward")[e] == FPS


def test_mp4_bytes_are_kept_and_frames_read_into_given_outputs(written):
    out, episodes, _ = written
    table = read_shard_index(os.path.join(out, INDEX_FILENAME))
    side = feature_columns(table)["observation.images.side"]
    for e, shard in enumerate(table["shard"].to_pylist()):
        raw = read_member(os.path.join(out, shard), side["offset"][e], side["size"][e])
        assert raw == episodes[e]["observation.images.side"]
    src = WebDatasetSource(out)
    buffer = np.zeros((3, 32, 64, 3), np.uint8)
    request = EpisodeRequest(1, {"observation.images.top": np.array([7, 2, 7]), "action.chunk": np.array([3])},
                             out={"observation.images.top": buffer})
    [got] = pickle.loads(pickle.dumps(src)).read_many([request])
    assert got["observation.images.top"] is buffer and read_index(buffer).tolist() == [7, 2, 7]
    assert np.array_equal(got["action.chunk"], episodes[1]["action.chunk"][[3]])
    with pytest.raises(IndexError, match="feature 'observation.images.wrist'"):
        past_the_end = np.array([len(episodes[0]["observation.images.wrist"])])
        src.read_many([EpisodeRequest(0, {"observation.images.wrist": past_the_end})])


def test_webdataset_library_reads_the_shards(written):
    out, episodes, writer = written
    samples = list(webdataset.WebDataset([str(s) for s in writer.shards], shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"episode_{e:06d}" for e in range(3)]
    for sample, want in zip(samples, episodes):
        assert {"observation.state.npy", "next.reward.npy", "observation.images.top.mp4", "meta.json"} <= set(sample)
        assert np.array_equal(np.load(io.BytesIO(sample["observation.state.npy"])), want["observation.state"])
        assert sample["observation.images.side.mp4"] == want["observation.images.side"]
        meta = json.loads(sample["meta.json"])
        assert meta["rates"] == RATES and meta["length"] == len(want["next.done"])
    keys = [key for key, _, _ in iter_shard(writer.shards[0])]
    _, members, meta = next(iter_shard(writer.shards[1]))
    assert keys == ["episode_000000", "episode_000001"] and meta["fps"] == FPS
    assert np.array_equal(np.load(io.BytesIO(members["next.reward.npy"])), episodes[2]["next.reward"])


def test_writing_twice_gives_identical_bytes(written, tmp_path):
    out, _, first = written
    _, again = _write(tmp_path)
    for a, b in zip(first.shards, again.shards):
        assert open(a, "rb").read() == open(b, "rb").read()
    a_index, b_index = pq.read_table(first.index_path), pq.read_table(again.index_path)
    assert a_index.drop(["shard_mtime_ns"]).equals(b_index.drop(["shard_mtime_ns"]))
    assert a_index.schema.metadata == b_index.schema.metadata
    for a, b in zip(first.shards, again.shards):  # same shards, same mtimes: the index file is the same bytes too
        os.utime(b, ns=(os.stat(a).st_atime_ns, os.stat(a).st_mtime_ns))
    write_index(again.shards, again.index_path)
    assert open(first.index_path, "rb").read() == open(again.index_path, "rb").read()


def test_index_stats_are_the_stats_over_all_episodes(written):
    out, episodes, _ = written
    src = WebDatasetSource(out)
    arrays = [n for n, v in episodes[0].items() if not isinstance(v, bytes) and v.dtype != np.uint8]
    assert sorted(src.stats) == sorted(arrays)
    for name in arrays:
        x = np.concatenate([ep[name] for ep in episodes]).astype(np.float64)
        x = x.reshape(len(x), -1) if x.ndim == 1 else x
        s = src.stats[name]
        np.testing.assert_allclose(s["mean"], x.mean(0), rtol=1e-12, atol=1e-12 * np.abs(x).max())
        np.testing.assert_allclose(s["std"], x.std(0), rtol=1e-10)
        assert np.array_equal(s["min"], x.min(0)) and np.array_equal(s["max"], x.max(0))
        assert s["count"].tolist() == [float(sum(LENGTHS))]
    table = read_shard_index(os.path.join(out, INDEX_FILENAME))
    merged = dataset_stats(table.slice(1), from_rows=True)["observation.state"]
    x = np.concatenate([ep["observation.state"] for ep in episodes[1:]]).astype(np.float64)
    np.testing.assert_allclose(merged["mean"], x.mean(0), rtol=1e-12)


def test_index_without_writer_meta_computes_the_same(written, tmp_path):
    """build_index reads npy data and probes mp4s when meta.json has no ``features``, and gets the same."""
    out, episodes, writer = written
    from_writer = read_shard_index(writer.index_path)
    assert build_index(writer.shards).equals(from_writer)  # no index: built in memory, equal to the written one
    assert build_index(writer.shards).schema.metadata == from_writer.schema.metadata
    shard = tmp_path / "hand-000000.tar"
    with open(shard, "wb") as f, webdataset.TarWriter(f, encoder=False) as tar:
        for e, features in enumerate(episodes):
            sample = {"__key__": f"ep{e}", "meta.json": json.dumps(
                {"fps": FPS, "length": LENGTHS[e], "task": f"task {e % 2}", "rates": RATES}).encode()}
            for name, value in features.items():
                if isinstance(value, bytes):
                    sample[f"{name}.mp4"] = value
                elif value.dtype == np.uint8:
                    rate = RATES.get(name, FPS)
                    sample[f"{name}.mp4"] = encode_video(value, fps=rate, gop=10)
                else:
                    buffer = io.BytesIO()
                    np.save(buffer, value)
                    sample[f"{name}.npy"] = buffer.getvalue()
            tar.write(sample)
    by_hand = build_index([shard])
    a, b = feature_columns(by_hand), feature_columns(from_writer)
    assert list(a) == list(b)
    for name in a:
        for field in ("kind", "dtype", "shape", "fps", "frames", "member"):
            assert np.array_equal(a[name][field], b[name][field]), (name, field)
    assert by_hand["stats"].to_pylist() == from_writer["stats"].to_pylist()
    assert json.loads(by_hand.schema.metadata[b"mmfeed"]) == json.loads(from_writer.schema.metadata[b"mmfeed"])
    src = WebDatasetSource(str(shard))
    assert np.array_equal(src.episode(2)["raw.counts"], episodes[2]["raw.counts"])


def test_shards_read_through_fsspec_urls(written):
    """An index and shards behind fsspec URLs: built, written and read back by range requests."""
    out, episodes, writer = written
    fs = fsspec.filesystem("memory")
    urls = []
    for path in writer.shards:
        urls.append(f"memory://mmfeed-shards-test/{os.path.basename(path)}")
        with fs.open(urls[-1].removeprefix("memory://"), "wb") as f:
            f.write(open(path, "rb").read())
    try:
        index_url = write_index(urls)
        assert index_url == "memory://mmfeed-shards-test/" + INDEX_FILENAME
        remote, local = read_shard_index(index_url), read_shard_index(writer.index_path)
        assert remote["shard"].to_pylist() == local["shard"].to_pylist()
        got = WebDatasetSource(index_url).episode(2)
        assert np.array_equal(got["next.reward"], episodes[2]["next.reward"])
        assert read_index(got["observation.images.top"]).tolist() == list(range(LENGTHS[2]))
    finally:
        fs.rm("/mmfeed-shards-test", recursive=True)


def test_v1_shards_read_as_features(tmp_path):
    eps = make_episodes(3, seed=1, cameras=("cam_high", "cam_wrist"), camera_fps={"cam_wrist": 15.0},
                        min_length=20, max_length=30)
    write_webdataset_v1(tmp_path, eps, episodes_per_shard=2, gop=10, index=False)
    src = WebDatasetSource(tmp_path)  # no index: the tar headers are indexed in memory
    assert sorted(src.features) == ["action", "cam_high", "cam_wrist", "proprio"]
    assert src.features["cam_wrist"].fps == 15.0 and src.features["cam_high"].kind == "video"
    for e, ep in enumerate(eps):
        got = src.episode(e)
        assert np.array_equal(got["proprio"], ep.state) and np.array_equal(got["action"], ep.action)
        assert read_index(got["cam_wrist"]).tolist() == list(range(ep.num_frames("cam_wrist")))
    np.testing.assert_allclose(src.stats["proprio"]["mean"], np.concatenate([ep.state for ep in eps]).mean(0),
                               rtol=1e-6)
    # an index file of the first version is refused with the command that rebuilds it
    old = tmp_path / "old-index.parquet"
    pq.write_table(pa.table({"episode_id": ["a"]}).replace_schema_metadata(
        {"mmfeed": json.dumps({"format": "mmfeed-webdataset-index", "version": 1})}), old)
    with pytest.raises(ValueError, match="version 1.*mmfeed index"):
        WebDatasetSource(old)
    write_index(sorted(map(str, tmp_path.glob("*.tar"))))  # rebuilt: the v1 shards get a current index
    assert sorted(WebDatasetSource(tmp_path).features) == sorted(src.features)


def test_write_webdataset_of_synthetic_episodes(tmp_path):
    eps = make_episodes(3, fps=50.0, camera_fps={"cam_wrist": 15.0}, min_length=20, max_length=30)
    shards = write_webdataset(tmp_path, eps, episodes_per_shard=2, gop=10)
    src = WebDatasetSource(tmp_path)
    assert len(shards) == 2 and sorted(src.features) == sorted(eps[0].features())
    got = src.episode(1)
    assert np.array_equal(got["observation.state"], eps[1].state)
    wrist = "observation.images.cam_wrist"
    assert read_index(got[wrist]).tolist() == list(range(eps[1].num_frames("cam_wrist")))


def _corrupt(tmp_path, how: str, *, described: bool = True) -> str:
    """One episode whose mp4 member is empty, garbage or shorter than meta.json says; with ``described`` its
    meta.json carries the writer's ``features`` (the index then trusts it without probing)."""
    good = encode_video(frame_pattern(10, height=32, width=64), fps=10.0, gop=5)
    data = {"empty": b"", "garbage": bytes(range(256)) * 8, "short": good}[how]
    meta = {"fps": 10.0, "length": 20, "task": "t"}
    if described:
        meta["features"] = {"cam.top": {"kind": "video", "dtype": "uint8", "shape": [32, 64, 3], "frames": 20}}
    shard = str(tmp_path / "shard-000000.tar")
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(20, np.float32))
    with open(shard, "wb") as f, webdataset.TarWriter(f, encoder=False) as tar:
        tar.write({"__key__": "ep_a", "cam.top.mp4": data, "x.npy": buffer.getvalue(),
                   "meta.json": json.dumps(meta).encode()})
    return shard


@pytest.mark.parametrize("how", ["empty", "garbage", "short"])
def test_bad_video_member_names_shard_key_and_feature(tmp_path, how):
    shard = _corrupt(tmp_path, how)
    src = WebDatasetSource(shard)
    with pytest.raises(SampleError) as err:
        src.episode(0)
    message = str(err.value)
    assert shard in message and "'ep_a'" in message and "'cam.top'" in message
    if how == "short":
        assert "10 frames" in message and "promises 20" in message


@pytest.mark.parametrize("how", ["empty", "garbage", "short"])
def test_bad_video_without_writer_meta_fails_indexing(tmp_path, how):
    shard = _corrupt(tmp_path, how, described=False)
    with pytest.raises(ValueError) as err:
        build_index([shard])
    message = str(err.value)
    assert shard in message and "'ep_a'" in message and "ep_a.cam.top.mp4" in message
    if how == "short":
        assert "10 frames" in message and "need 20" in message


def test_write_refuses_inconsistent_episodes(tmp_path):
    with ShardWriter(tmp_path) as w:
        with pytest.raises(ValueError, match=r"feature 'b' has 12 steps but feature 'a' has 10"):
            w.write({"a": np.zeros(10), "b": np.zeros((12, 2))}, fps=10.0)
        with pytest.raises(ValueError, match=r"feature 'cam': 1 frames, but 10 steps at 10 fps need 3 .* at least 2"):
            w.write({"a": np.zeros(10), "cam": np.zeros((1, 32, 64, 3), np.uint8)}, fps=10.0, rates={"cam": 3.0})
        with pytest.raises(ValueError, match="'meta'"):
            w.write({"meta": np.zeros(3)}, fps=10.0)
        with pytest.raises(ValueError, match="key 'a.b'"):
            w.write({"a": np.zeros(3)}, fps=10.0, key="a.b")
        assert w.write({"a": np.zeros(3)}, fps=10.0) == "episode_000000"
        with pytest.raises(ValueError, match="already written"):
            w.write({"a": np.zeros(3)}, fps=10.0, key="episode_000000")
    assert WebDatasetSource(tmp_path).lengths.tolist() == [3]
    with pytest.raises(FileExistsError):
        ShardWriter(tmp_path)
    with pytest.raises(ValueError, match="episode_000000.*episode_000001"):
        with ShardWriter(tmp_path / "mixed") as w:
            w.write({"a": np.zeros((3, 2), np.float32)}, fps=10.0)
            w.write({"a": np.zeros((3, 2), np.float64)}, fps=10.0)


def test_frame_size_resizes_in_the_decoder(written):
    out, _, _ = written
    src = WebDatasetSource(out, frame_size=(16, 32))
    assert src.features["observation.images.top"].shape == (16, 32, 3)
    assert src.frame_shape(0, "observation.images.wrist") == (16, 32)
    [got] = src.read_many([EpisodeRequest(0, {"observation.images.top": np.array([0, 5]),
                                              "observation.images.wrist": np.array([1])})])
    assert got["observation.images.top"].shape == (2, 16, 32, 3)
    assert got["observation.images.wrist"].shape == (1, 16, 32, 3)
    one = WebDatasetSource(out, frame_size={"observation.images.wrist": (16, 32)})
    assert one.features["observation.images.top"].shape == (32, 64, 3)
    [got] = one.read_many([EpisodeRequest(0, {"observation.images.top": np.array([3]),
                                              "observation.images.wrist": np.array([1])})])
    assert got["observation.images.top"].shape == (1, 32, 64, 3)
    assert read_index(got["observation.images.top"]).tolist() == [3]
    assert got["observation.images.wrist"].shape == (1, 16, 32, 3)
    with pytest.raises(ValueError, match="names .observation.state., which is not a video or image feature"):
        WebDatasetSource(out, frame_size={"observation.state": (16, 32)})
