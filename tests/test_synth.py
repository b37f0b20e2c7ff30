"""Synthetic episodes and their writers: webdataset shards read back by webdataset, LeRobot v3.0 by pyarrow + PyAV."""

import io
import json

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset

from mmfeed.loaders.stores.index import INDEX_FILENAME
from mmfeed.testing import SyntheticEpisode, make_episodes, read_index, write_lerobot, write_webdataset
from mmfeed.testing.synth_lerobot import QUANTILES

ARRAYS = ["observation.state", "action", "observation.velocity", "next.reward", "next.done"]


def _decode(data_or_path) -> tuple[np.ndarray, list[float], list[bool]]:
    """All frames of an mp4 (bytes or path) with their presentation times and keyframe flags, by PyAV."""
    source = io.BytesIO(data_or_path) if isinstance(data_or_path, bytes) else str(data_or_path)
    with av.open(source) as container:
        frames = list(container.decode(video=0))
    return (
        np.stack([f.to_ndarray(format="rgb24") for f in frames]),
        [float(f.time) for f in frames],
        [bool(f.key_frame) for f in frames],
    )


# ------------------------------------------------------------------------------------------------ episodes


def test_episodes_are_seeded_and_prefix_stable():
    a = make_episodes(4, seed=7, min_length=20, max_length=40)
    b = make_episodes(2, seed=7, min_length=20, max_length=40)
    c = make_episodes(4, seed=8, min_length=20, max_length=40)
    for x, y in zip(a, b):  # episode i depends only on (seed, i)
        assert x.episode_id == y.episode_id and x.task == y.task and x.camera_seeds == y.camera_seeds
        fx, fy = x.features(), y.features()
        assert list(fx) == list(fy) and all(np.array_equal(fx[k], fy[k]) for k in fx)
    assert not np.array_equal(a[0].state, c[0].state)
    assert [e.episode_id for e in a] == [f"episode_{i:06d}" for i in range(4)]


def test_episode_shapes_lengths_and_smooth_trajectories():
    eps = make_episodes(12, seed=1, min_length=20, max_length=60, state_dim=6, action_dim=4)
    lengths = [e.length for e in eps]
    assert all(20 <= n <= 60 for n in lengths) and len(set(lengths)) > 1, "lengths vary within the bounds"
    for e in eps:
        assert isinstance(e, SyntheticEpisode)
        assert e.state.dtype == np.float32 and e.state.shape == (e.length, 6)
        assert e.action.dtype == np.float32 and e.action.shape == (e.length, 4)
        # actions are the next-step change of the state: state[t] + action[t] == state[t + 1]
        np.testing.assert_allclose(e.state[:-1, :4] + e.action[:-1], e.state[1:, :4], atol=1e-5)
        assert np.abs(np.diff(e.state, axis=0)).max() < 0.5, "trajectories are smooth at 30 fps"
        assert e.task and isinstance(e.task, str)
        arrays = e.arrays()
        assert list(arrays) == ARRAYS and arrays["observation.state"] is e.state and arrays["action"] is e.action
        np.testing.assert_array_equal(arrays["observation.velocity"], e.action * np.float32(30.0))
        np.testing.assert_allclose(arrays["next.reward"], -np.abs(e.state).sum(axis=1), rtol=1e-6)
        assert arrays["next.reward"].dtype == np.float32 and arrays["next.reward"].shape == (e.length,)
        assert arrays["next.done"].dtype == bool and np.flatnonzero(arrays["next.done"]).tolist() == [e.length - 1]
        assert list(e.features()) == ARRAYS + ["observation.images.cam_high", "observation.images.cam_wrist"]
        assert e.rates() == {}


def test_cameras_differ_in_colour_but_carry_the_same_index():
    (e,) = make_episodes(1, seed=3, min_length=20, max_length=20)
    assert list(e.cameras) == ["cam_high", "cam_wrist"]
    high, wrist = e.cameras["cam_high"], e.cameras["cam_wrist"]
    assert high.shape == wrist.shape == (20, 48, 64, 3) and high.dtype == np.uint8
    assert not np.array_equal(high, wrist)
    assert read_index(high).tolist() == read_index(wrist).tolist() == list(range(20))
    assert read_index(e.frames("cam_high", start=100)).tolist() == list(range(100, 120))


def test_camera_at_its_own_rate_covers_the_episode_span():
    (e,) = make_episodes(1, seed=0, min_length=21, max_length=21, camera_fps={"cam_wrist": 15.0})
    assert e.num_frames("cam_high") == 21
    # frames at j / 15 s within [0, 20 / 30 s]: j = 0 .. 10
    assert e.num_frames("cam_wrist") == 11 and e.cameras["cam_wrist"].shape[0] == 11
    np.testing.assert_allclose(e.frame_times("cam_wrist"), np.arange(11) / 15.0)
    assert e.rates() == {"observation.images.cam_wrist": 15.0}
    assert e.features()["observation.images.cam_wrist"].shape == (11, 48, 64, 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"cameras": ("cam.high",)}, "cam.high"),
        ({"cameras": ("proprio",)}, "proprio"),
        ({"min_length": 30, "max_length": 20}, "max_length"),
        ({"camera_fps": {"cam_side": 10.0}}, "cam_side"),
        ({"height": 8}, "too small"),
        ({"tasks": ()}, "tasks"),
        ({"fps": 0}, "fps"),
    ],
)
def test_make_episodes_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_episodes(2, **kwargs)


# ------------------------------------------------------------------------------------------------ webdataset


@pytest.fixture(scope="module")
def wds(tmp_path_factory):
    out = tmp_path_factory.mktemp("wds")
    eps = make_episodes(3, seed=5, min_length=20, max_length=32, camera_fps={"cam_wrist": 15.0})
    return out, eps, write_webdataset(out, eps, episodes_per_shard=2, codec="h264", gop=30)


def test_shards_are_named_and_sized_as_asked(wds):
    out, eps, shards = wds
    assert [p.rsplit("/", 1)[-1] for p in shards] == ["shard-000000.tar", "shard-000001.tar"]
    assert (out / INDEX_FILENAME).exists(), "the parquet index is written beside the shards"
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "no temporary files are left behind"


def test_webdataset_reads_back_every_episode_exactly(wds):
    """Every feature is a member under its own name; meta.json describes them; the library reads them back."""
    _, eps, shards = wds
    truth = {e.episode_id: e for e in eps}
    samples = list(webdataset.WebDataset(shards, shardshuffle=False))
    assert [s["__key__"] for s in samples] == [e.episode_id for e in eps]
    for s in samples:
        e = truth[s["__key__"]]
        assert set(s) - {"__key__", "__url__", "__local_path__"} == {
            *(f"{name}.npy" for name in ARRAYS), "observation.images.cam_high.mp4",
            "observation.images.cam_wrist.mp4", "meta.json"}
        for name, values in e.arrays().items():
            got = np.load(io.BytesIO(s[f"{name}.npy"]))
            assert got.dtype == values.dtype and np.array_equal(got, values), name
        meta = json.loads(s["meta.json"])
        assert {k: meta[k] for k in ("fps", "length", "task", "rates")} == {
            "fps": 30.0, "length": e.length, "task": e.task, "rates": {"observation.images.cam_wrist": 15.0}}
        described = meta["features"]
        assert sorted(described) == sorted(e.features())
        assert described["observation.state"]["dtype"] == "float32" and described["next.done"]["shape"] == []
        for camera in e.camera_names:
            feature = f"observation.images.{camera}"
            assert described[feature] == {"kind": "video", "dtype": "uint8", "shape": [48, 64, 3],
                                          "frames": e.num_frames(camera)}
            frames, times, _ = _decode(s[f"{feature}.mp4"])
            # pattern index = frame number within the episode's stream
            assert read_index(frames).tolist() == list(range(e.num_frames(camera)))
            np.testing.assert_allclose(times, e.frame_times(camera), atol=1e-6)
            assert np.abs(frames.astype(int) - e.cameras[camera]).mean() < 6, "near-lossless H.264"


def test_write_webdataset_rejects_duplicate_ids(tmp_path):
    (e,) = make_episodes(1, min_length=20, max_length=20)
    with pytest.raises(ValueError, match="episode_000000"):
        write_webdataset(tmp_path, [e, e])


# ------------------------------------------------------------------------------------------------ LeRobot v3.0


@pytest.fixture(scope="module", params=["av1", "h264"])
def lerobot(request, tmp_path_factory):
    eps = make_episodes(3, seed=11, min_length=20, max_length=30, cameras=("cam_high", "cam_wrist"),
                        tasks=("stack the cups", "wipe the table"))
    root = write_lerobot(tmp_path_factory.mktemp(f"lerobot_{request.param}"), eps, codec=request.param)
    return request.param, eps, root


def test_lerobot_info_matches_the_files(lerobot):
    codec, eps, root = lerobot
    info = json.load(open(f"{root}/meta/info.json"))
    total = sum(e.length for e in eps)
    assert info["codebase_version"] == "v3.0" and info["robot_type"] == "synthetic" and info["fps"] == 30
    assert (info["total_episodes"], info["total_frames"]) == (3, total)
    assert info["total_tasks"] == len({e.task for e in eps})
    assert info["splits"] == {"train": "0:3"}
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    assert (info["chunks_size"], info["data_files_size_in_mb"], info["video_files_size_in_mb"]) == (1000, 100, 200)
    feats = info["features"]
    assert list(feats) == [*ARRAYS[1::-1], *ARRAYS[2:], "observation.images.cam_high", "observation.images.cam_wrist",
                           "timestamp", "frame_index", "episode_index", "index", "task_index"]
    motors = [f"motor_{i}" for i in range(14)]
    for name in ("observation.state", "action", "observation.velocity"):
        assert feats[name] == {"dtype": "float32", "shape": [14], "names": motors}, name
    assert feats["next.reward"] == {"dtype": "float32", "shape": [1], "names": None}
    assert feats["next.done"] == {"dtype": "bool", "shape": [1], "names": None}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        assert feats[name] == {"dtype": "int64", "shape": [1], "names": None}
    assert feats["timestamp"] == {"dtype": "float32", "shape": [1], "names": None}
    for camera in ("cam_high", "cam_wrist"):
        ft = feats[f"observation.images.{camera}"]
        assert ft["dtype"] == "video" and ft["shape"] == [48, 64, 3] and ft["names"] == ["height", "width", "channels"]
        assert ft["info"]["video.codec"] == codec and ft["info"]["video.fps"] == 30
        assert ft["info"]["video.pix_fmt"] == "yuv420p" and ft["info"]["video.g"] == 2
        path = info["video_path"].format(video_key=f"observation.images.{camera}", chunk_index=0, file_index=0)
        with av.open(f"{root}/{path}") as c:
            assert c.streams.video[0].codec_context.codec.canonical_name == codec


def test_lerobot_episode_table_is_contiguous_with_lerobot_dtypes(lerobot):
    _, eps, root = lerobot
    table = pq.read_table(f"{root}/meta/episodes/chunk-000/file-000.parquet")
    int64 = ["episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index",
             "dataset_to_index", "meta/episodes/chunk_index", "meta/episodes/file_index"]
    for name in int64:
        assert str(table.schema.field(name).type) == "int64", name
    assert str(table.schema.field("tasks").type) == "list<element: string>"
    for camera in ("cam_high", "cam_wrist"):
        key = f"videos/observation.images.{camera}"
        assert str(table.schema.field(f"{key}/chunk_index").type) == "int64"
        assert str(table.schema.field(f"{key}/file_index").type) == "int64"
        assert str(table.schema.field(f"{key}/from_timestamp").type) == "double"
        assert str(table.schema.field(f"{key}/to_timestamp").type) == "double"
    for name in ARRAYS:  # per-episode stats of every array, as LeRobot keeps them
        assert {f"stats/{name}/{stat}" for stat in ("min", "max", "mean", "std", "count", *QUANTILES)} <= set(
            table.column_names), name
    assert not [c for c in table.column_names if c.startswith("stats/observation.images")]
    rows = table.to_pylist()
    assert [r["episode_index"] for r in rows] == [0, 1, 2]
    assert [r["length"] for r in rows] == [e.length for e in eps]
    assert [r["tasks"] for r in rows] == [[e.task] for e in eps]
    assert rows[0]["dataset_from_index"] == 0
    for prev, row in zip(rows, rows[1:]):
        assert row["dataset_from_index"] == prev["dataset_to_index"], "episodes tile the dataset index"
    for row in rows:
        assert row["dataset_to_index"] - row["dataset_from_index"] == row["length"]
        span = row["videos/observation.images.cam_high/from_timestamp"]
        assert span == pytest.approx(row["dataset_from_index"] / 30, abs=1e-9)
        assert row["videos/observation.images.cam_high/to_timestamp"] == pytest.approx(row["dataset_to_index"] / 30)


def test_lerobot_tasks_parquet_has_the_pandas_layout(lerobot):
    _, eps, root = lerobot
    table = pq.read_table(f"{root}/meta/tasks.parquet")
    assert table.column_names == ["task_index", "task"]
    assert json.loads(table.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    tasks = dict(zip(table.column("task").to_pylist(), table.column("task_index").to_pylist()))
    assert sorted(tasks.values()) == list(range(len(tasks))) and set(tasks) == {e.task for e in eps}


def test_lerobot_data_rows_match_the_episodes(lerobot):
    _, eps, root = lerobot
    data = pq.read_table(f"{root}/data/chunk-000/file-000.parquet")
    tasks = pq.read_table(f"{root}/meta/tasks.parquet")
    task_index = dict(zip(tasks.column("task").to_pylist(), tasks.column("task_index").to_pylist()))
    total = sum(e.length for e in eps)
    assert data.num_rows == total
    assert str(data.schema.field("observation.state").type) == "fixed_size_list<element: float>[14]"
    assert str(data.schema.field("timestamp").type) == "float"
    for name in ("frame_index", "episode_index", "index", "task_index"):
        assert str(data.schema.field(name).type) == "int64"
    hf = json.loads(data.schema.metadata[b"huggingface"])["info"]["features"]
    assert hf["action"]["_type"] == "List" and hf["action"]["length"] == 14
    frame_index = data.column("frame_index").to_numpy()
    np.testing.assert_array_equal(data.column("index").to_numpy(), np.arange(total))
    np.testing.assert_array_equal(data.column("timestamp").to_numpy(), (frame_index / 30).astype(np.float32))
    state = np.stack(data.column("observation.state").to_numpy(zero_copy_only=False))
    action = np.stack(data.column("action").to_numpy(zero_copy_only=False))
    start = 0
    for e, ep in enumerate(eps):
        rows = slice(start, start + ep.length)
        np.testing.assert_array_equal(frame_index[rows], np.arange(ep.length))
        assert set(data.column("episode_index").to_numpy()[rows]) == {e}
        assert set(data.column("task_index").to_numpy()[rows]) == {task_index[ep.task]}
        np.testing.assert_array_equal(state[rows], ep.state)
        np.testing.assert_array_equal(action[rows], ep.action)
        for name, values in ep.arrays().items():
            column = data.column(name).combine_chunks()
            got = column.flatten().to_numpy().reshape(len(column), -1) if values.ndim == 2 else column.to_numpy(
                zero_copy_only=False)
            assert got.dtype == values.dtype and np.array_equal(got[rows], values), name
        start += ep.length


def test_lerobot_stats_cover_every_array_over_all_episodes(lerobot):
    _, eps, root = lerobot
    stats = json.load(open(f"{root}/meta/stats.json"))
    assert sorted(stats) == sorted([*ARRAYS, "timestamp", "frame_index", "episode_index", "index", "task_index"])
    for name in ARRAYS:
        x = np.concatenate([e.arrays()[name] for e in eps]).astype(np.float64)
        x = x.reshape(len(x), -1)
        s = stats[name]
        assert s["count"] == [len(x)]
        np.testing.assert_allclose(s["mean"], x.mean(0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(s["std"], x.std(0), rtol=1e-9, atol=1e-12)
        assert s["min"] == x.min(0).tolist() and s["max"] == x.max(0).tolist()
        for q, level in QUANTILES.items():
            np.testing.assert_allclose(s[q], np.quantile(x, level, axis=0), rtol=1e-9, atol=1e-12)


def test_lerobot_video_frames_sit_at_from_timestamp_plus_i_over_fps(lerobot):
    """Frame i of episode e, picked by presentation time, carries the global index dataset_from_index + i."""
    _, eps, root = lerobot
    rows = pq.read_table(f"{root}/meta/episodes/chunk-000/file-000.parquet").to_pylist()
    for camera in ("cam_high", "cam_wrist"):
        key = f"observation.images.{camera}"
        frames, times, keys = _decode(f"{root}/videos/{key}/chunk-000/file-000.mp4")
        times = np.asarray(times)
        assert len(frames) == sum(e.length for e in eps)
        for row in rows:
            for i in range(row["length"]):
                t = row[f"videos/{key}/from_timestamp"] + i / 30
                nearest = int(np.argmin(np.abs(times - t)))
                assert abs(times[nearest] - t) < 1e-4  # LeRobot's default tolerance
                assert read_index(frames[nearest]).item() == row["dataset_from_index"] + i
            assert keys[row["dataset_from_index"]], "each episode starts on a keyframe, as LeRobot concatenates"


def test_write_lerobot_rejects_streams_at_their_own_rate(tmp_path):
    eps = make_episodes(1, min_length=20, max_length=20, camera_fps={"cam_wrist": 15.0})
    with pytest.raises(ValueError, match="cam_wrist"):
        write_lerobot(tmp_path, eps)
    with pytest.raises(ValueError, match="integer"):
        write_lerobot(tmp_path, make_episodes(1, min_length=20, max_length=20, fps=29.97))
