"""The v2 LeRobot reader reads back, under their own names, every feature write_lerobot put in a LeRobot v3
directory."""

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.loaders.formats.lerobot.source import LeRobotSource, is_lerobot_dir
from mmfeed.testing import make_episodes, read_index, write_lerobot

CAM = "observation.images.cam_high"
DATA = "data/chunk-000/file-000.parquet"


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(3, seed=5, min_length=10, max_length=20, height=48, width=64)


@pytest.fixture(scope="module")
def root(tmp_path_factory, episodes):
    return write_lerobot(tmp_path_factory.mktemp("lerobot") / "ds", episodes)  # AV1, LeRobot's default


@pytest.fixture(scope="module")
def ds(root):
    return LeRobotSource(root)


def _parquet_rows(root, episode):
    """Every non-video column of one episode's rows, as numpy, straight from the data parquet."""
    table = pq.read_table(f"{root}/{DATA}")
    rows = table.filter(pa.compute.equal(table["episode_index"], episode))
    out = {}
    for name in rows.column_names:
        column = rows[name].combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            out[name] = column.flatten().to_numpy().reshape(len(column), column.type.list_size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def test_every_feature_of_info_json_is_listed_with_its_kind_dtype_shape_and_rate(root, ds):
    declared = json.load(open(f"{root}/meta/info.json"))["features"]
    assert list(ds.features) == list(declared)
    assert {"observation.velocity", "next.reward", "next.done"} <= set(ds.features)
    for name, spec in declared.items():
        f = ds.features[name]
        assert f.fps == 30.0, name
        if spec["dtype"] == "video":
            assert (f.kind, f.dtype, f.shape) == ("video", "uint8", (48, 64, 3)), name
        else:
            shape = () if spec["shape"] == [1] else tuple(spec["shape"])
            assert (f.kind, f.dtype, f.shape) == ("array", spec["dtype"], shape), name
    assert ds.features["next.done"].dtype == "bool" and ds.features["observation.state"].shape == (14,)
    assert ds.frame_shape(0, CAM) == (48, 64) and ds.frame_shape(0, "action") is None
    assert is_lerobot_dir(root) and not is_lerobot_dir(f"{root}/meta")


def test_metadata_lengths_tasks_and_stats(root, ds, episodes):
    assert len(ds) == 3 and ds.lengths.tolist() == [e.length for e in episodes]
    assert ds.lengths.dtype == np.int64 and ds.fps.tolist() == [30.0] * 3
    assert ds.tasks == list(dict.fromkeys(e.task for e in episodes))
    assert [ds.task(e) for e in range(3)] == [ep.task for ep in episodes]
    assert ds.episode_tasks.tolist() == [ds.tasks.index(ep.task) for ep in episodes]
    raw = json.load(open(f"{root}/meta/stats.json"))
    assert set(ds.stats) == set(raw)
    for feature, stats in raw.items():
        assert set(ds.stats[feature]) == set(stats) >= {"mean", "std", "min", "max", "count", "q01", "q99"}
        for name, value in stats.items():
            assert ds.stats[feature][name].dtype == np.float64
            np.testing.assert_array_equal(ds.stats[feature][name], np.asarray(value, dtype=np.float64))
    assert ds.describe(1) == f"{root} episode 1"


def test_episode_returns_every_feature_bit_exact(root, ds, episodes):
    for e, truth in enumerate(episodes):
        ep = ds.episode(e)
        rows = _parquet_rows(root, e)
        assert set(ds.features) <= set(ep) and ep["task"] == truth.task and ep["fps"] == 30.0
        for name, f in ds.features.items():
            if f.kind == "video":
                assert ep[name].dtype == np.uint8 and ep[name].shape == (truth.length, 48, 64, 3)
                assert read_index(ep[name]).tolist() == rows["index"].tolist(), name  # the global index
            else:
                assert ep[name].dtype == np.dtype(f.dtype) and ep[name].shape == (truth.length, *f.shape), name
                assert np.array_equal(ep[name], rows[name]), name
        for name, values in truth.arrays().items():
            assert ep[name].dtype == values.dtype and np.array_equal(ep[name], values), name
        assert ep["episode_index"].tolist() == [e] * truth.length


def test_read_many_returns_exactly_the_frames_asked_in_order(root, ds, episodes):
    picks = [np.array([3, 0, 3, 9, 1]), np.array([7, 7, 2]), np.array([], dtype=np.int64)]
    requests = [EpisodeRequest(e, {CAM: idx, "action": idx, "next.reward": idx, "index": idx})
                for e, idx in enumerate(picks)]
    out = np.zeros((3, 48, 64, 3), np.uint8)
    requests[1] = EpisodeRequest(1, requests[1].indices, out={CAM: out})
    got = ds.read_many(requests)
    first = np.concatenate([[0], np.cumsum([e.length for e in episodes])])
    for e, (idx, data) in enumerate(zip(picks, got)):
        assert read_index(data[CAM]).tolist() == (first[e] + idx).tolist()
        assert data["index"].tolist() == (first[e] + idx).tolist()
        assert np.array_equal(data["action"], episodes[e].action[idx]) and data["action"].shape == (len(idx), 14)
        assert np.array_equal(data["next.reward"], episodes[e].arrays()["next.reward"][idx])
    assert got[1][CAM] is out
    assert got[2][CAM].shape == (0, 48, 64, 3) and got[2]["action"].shape == (0, 14)


def test_tasks_that_change_within_an_episode_are_read_per_step(tmp_path, episodes):
    root = write_lerobot(tmp_path / "ds", episodes[:2], task_switch=True)
    ds = LeRobotSource(root)
    assert ds.episode_tasks.tolist() == [-1, -1]
    for e, truth in enumerate(episodes[:2]):
        written = _parquet_rows(root, e)["task_index"]
        steps = ds.step_tasks(e)
        assert steps.dtype == np.int64 and np.array_equal(steps, written) and len(set(steps.tolist())) == 2
        assert ds.task(e, 0) == truth.task
        assert ds.task(e, truth.length - 1) == f"{truth.task}, then return to the start"


def test_tasks_parquet_with_an_unnamed_index(tmp_path, episodes):
    """LeRobot's pandas layout may keep the task text as ``__index_level_0__``."""
    root = write_lerobot(tmp_path / "ds", episodes[:2], task_switch=True)
    table = pq.read_table(f"{root}/meta/tasks.parquet").replace_schema_metadata(None)
    reverse = pa.array(np.arange(table.num_rows)[::-1])
    shuffled = table.rename_columns(["task_index", "__index_level_0__"]).take(reverse)
    pq.write_table(shuffled, f"{root}/meta/tasks.parquet")
    assert LeRobotSource(root).tasks == table["task"].to_pylist()


def test_frame_size_resizes_in_the_decoder_and_the_features_say_so(root, episodes):
    ds = LeRobotSource(root, frame_size=(24, 32))
    assert ds.features[CAM].shape == (24, 32, 3) and ds.frame_shape(0, CAM) == (24, 32)
    frames = ds.read_many([EpisodeRequest(0, {CAM: np.arange(5)})])[0][CAM]
    assert frames.shape == (5, 24, 32, 3) and frames.dtype == np.uint8
    one = LeRobotSource(root, frame_size={CAM: (24, 32)})
    got = one.read_many([EpisodeRequest(0, {CAM: [0, 1], "observation.images.cam_wrist": [0, 1]})])[0]
    assert got[CAM].shape == (2, 24, 32, 3) and got["observation.images.cam_wrist"].shape == (2, 48, 64, 3)
    for bad in ("action", "observation.images.nope"):
        with pytest.raises(ValueError, match=bad):
            LeRobotSource(root, frame_size={bad: (24, 32)})


def test_images_stored_in_the_parquet_decode_bit_exact(tmp_path, episodes):
    root = write_lerobot(tmp_path / "ds", episodes[:2], use_videos=False)
    ds = LeRobotSource(root)
    assert ds.features[CAM].kind == "video" and ds.features[CAM].shape == (48, 64, 3)
    assert np.array_equal(ds.episode(1)[CAM], episodes[1].frames("cam_high", start=episodes[0].length))  # PNG
    small = LeRobotSource(root, frame_size=(24, 32)).read_many([EpisodeRequest(0, {CAM: [4, 2]})])[0][CAM]
    assert small.shape == (2, 24, 32, 3)
    assert ds.stats[CAM]["mean"].shape == (3, 1, 1)


def test_string_features_read_as_text(tmp_path, episodes):
    root = write_lerobot(tmp_path / "ds", episodes[:2])
    table = pq.read_table(f"{root}/{DATA}")
    notes = [f"step {i}" for i in range(table.num_rows)]
    pq.write_table(table.append_column("language_instruction", pa.array(notes)), f"{root}/{DATA}")
    info = json.load(open(f"{root}/meta/info.json"))
    info["features"]["language_instruction"] = {"dtype": "string", "shape": [1], "names": None}
    open(f"{root}/meta/info.json", "w").write(json.dumps(info))
    ds = LeRobotSource(root)
    assert ds.features["language_instruction"].kind == "text"
    got = ds.read_many([EpisodeRequest(1, {"language_instruction": [2, 0]})])[0]["language_instruction"]
    first = episodes[0].length
    assert got.tolist() == [f"step {first + 2}", f"step {first}"]


def test_pickled_source_reopens_its_files(ds, root):
    ds.read_many([EpisodeRequest(0, {CAM: [0], "action": [0]})])
    clone = pickle.loads(pickle.dumps(ds))
    assert not clone._data_cache and not clone._videos
    assert (read_index(clone.read_many([EpisodeRequest(2, {CAM: [1]})])[0][CAM]).tolist()
            == [int(ds.lengths[:2].sum()) + 1])


@pytest.fixture
def fresh(tmp_path):
    """A small directory of one camera that a test may break."""
    eps = make_episodes(2, seed=9, min_length=8, max_length=8, cameras=("cam_high",), height=48, width=64)
    return tmp_path / "ds", write_lerobot(tmp_path / "ds", eps)


def test_bad_requests_name_the_episode_and_the_feature(ds):
    with pytest.raises(IndexError, match=r"episode 1 feature 'action'.*frames 0\.\.99"):
        ds.read_many([EpisodeRequest(1, {"action": [0, 99]})])
    with pytest.raises(IndexError, match="episode 0 feature 'observation.images.cam_high'"):
        ds.read_many([EpisodeRequest(0, {CAM: [-1]})])
    with pytest.raises(KeyError, match="no feature 'observation.nope'"):
        ds.read_many([EpisodeRequest(0, {"observation.nope": [0]})])


def test_a_missing_data_file_is_named_with_episode_and_feature(fresh):
    path, root = fresh
    (path / DATA).unlink()
    ds = LeRobotSource(root)
    with pytest.raises(FileNotFoundError, match=rf"episode 1 feature 'action'.*{DATA}"):
        ds.read_many([EpisodeRequest(1, {"action": [0]})])


def test_rows_missing_from_the_data_file_are_named(fresh):
    path, root = fresh
    table = pq.read_table(path / DATA)
    pq.write_table(table.slice(0, 10), path / DATA)  # episode 1 keeps only its first 2 rows: its footer says so
    with pytest.raises(ValueError, match=rf"episode 1: rows 8\.\.16 .*outside its data file .*{DATA}, which holds "
                                         r"rows 0\.\.10"):
        LeRobotSource(root)
    index = table["index"].to_numpy().copy()
    index[10:] += 100  # all 16 rows there, 6 of episode 1's numbered as no episode's: found as the file is read
    pq.write_table(table.set_column(table.column_names.index("index"), "index", pa.array(index)), path / DATA)
    with pytest.raises(ValueError, match=rf"episode 1 feature 'observation.state'.*missing.*{DATA}"):
        LeRobotSource(root).read_many([EpisodeRequest(1, {"observation.state": [1, 5]})])
    # in a batch (rows gathered per data file for all its requests) the error still names the request's episode
    batch = [EpisodeRequest(0, {"observation.state": [0, 1]}), EpisodeRequest(1, {"observation.state": [0, 5]})]
    with pytest.raises(ValueError, match=rf"episode 1 feature 'observation.state'.*missing.*{DATA}"):
        LeRobotSource(root).read_many(batch)


def test_a_corrupt_video_is_named_with_its_path_and_episode(fresh):
    path, root = fresh
    video = path / "videos" / CAM / "chunk-000" / "file-000.mp4"
    video.write_bytes(b"\x00not a video" * 100)
    with pytest.raises(ValueError, match=rf"episode 1 feature '{CAM}' \(.*{video.name}\)"):
        LeRobotSource(root).read_many([EpisodeRequest(1, {CAM: [0]})])


def test_a_missing_episode_column_or_a_wrong_version_is_named(fresh):
    path, root = fresh
    info = json.load(open(path / "meta/info.json"))
    episodes_file = path / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(episodes_file)
    pq.write_table(table.drop_columns(["length"]), episodes_file)
    with pytest.raises(ValueError, match=r"no columns \['length'\]"):
        LeRobotSource(root)
    pq.write_table(table, episodes_file)
    open(path / "meta/info.json", "w").write(json.dumps({**info, "codebase_version": "v2.1"}))
    with pytest.raises(ValueError, match=r"codebase_version 'v2.1' but no meta/episodes.jsonl"):
        LeRobotSource(root)
    open(path / "meta/info.json", "w").write(json.dumps({**info, "codebase_version": "v1.6"}))
    with pytest.raises(ValueError, match=r"codebase_version 'v1.6'; mmfeed reads LeRobot v3.x and v2.x"):
        LeRobotSource(root)


def test_a_task_missing_from_tasks_parquet_names_the_episode(tmp_path, episodes):
    """Task ids are mapped column-wise (the meta/episodes task lists read as dictionary codes); a text the
    tasks table lacks still fails naming the episode and the text."""
    root = write_lerobot(tmp_path / "ds", episodes[:3])
    table = pq.read_table(f"{root}/meta/tasks.parquet")
    ds = LeRobotSource(root)
    missing = ds.task(1)
    first = next(e for e in range(3) if ds.task(e) == missing)
    keep = pa.array([t != missing for t in table["task"].to_pylist()])
    kept = table.filter(keep)
    assert kept.num_rows < table.num_rows
    kept = kept.set_column(kept.column_names.index("task_index"), "task_index", pa.array(range(kept.num_rows)))
    pq.write_table(kept, f"{root}/meta/tasks.parquet")
    with pytest.raises(ValueError, match=rf"episode {first}: task {missing!r} is not in"):
        LeRobotSource(root)


def _short_segment(tmp_path, missing: int):
    """Two 20-step H.264 episodes in one video file, episode 0's segment ``missing`` frames short (as a recorder
    that stopped early leaves it): the file's frames, and meta/episodes' from/to timestamps, say so."""
    import glob

    from mmfeed.codecs import encode_video
    from mmfeed.testing import frame_pattern

    eps = make_episodes(2, seed=1, cameras=("cam_high",), min_length=20, max_length=20, fps=30.0)
    root = write_lerobot(tmp_path / "short", eps, codec="h264", gop=2)
    seeds = [ep.camera_seeds["cam_high"] for ep in eps]
    keep = [i for i in range(40) if not 20 - missing <= i < 20]
    frames = np.concatenate([frame_pattern(1, height=48, width=64, start=i, seed=seeds[i >= 20]) for i in keep])
    video = glob.glob(f"{root}/videos/*/chunk-000/file-000.mp4")[0]
    with open(video, "wb") as f:
        f.write(encode_video(frames, fps=30.0, gop=2))
    path = f"{root}/meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    for column, shifts in ((f"videos/{CAM}/from_timestamp", (0, 1)), (f"videos/{CAM}/to_timestamp", (1, 1))):
        values = [v - s * missing / 30 for v, s in zip(table[column].to_pylist(), shifts)]
        table = table.set_column(table.column_names.index(column), column, pa.array(values))
    pq.write_table(table, path)
    return root


def test_a_camera_segment_a_frame_short_is_padded_never_read_from_the_next_episode(tmp_path):
    """meta/episodes says episode 0's video segment ends a frame early (to_timestamp): it holds 19 frames, its
    last window reads frame 18 again flagged as padding, and nothing reads episode 1's first frame, which
    follows in the file."""
    from mmfeed.loaders import WindowSpec

    ds = LeRobotSource(_short_segment(tmp_path, 1))
    assert ds.frames(CAM).tolist() == [19, 20] and ds.lengths.tolist() == [20, 20]
    assert read_index(ds.episode(0)[CAM]).tolist() == list(range(19))
    last = ds.windows(WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0]}))[19]
    assert read_index(last[CAM].numpy()).tolist() == [18, 18] and last[f"{CAM}_is_pad"].tolist() == [False, True]


def test_a_camera_segment_two_frames_short_names_the_episode_and_camera(tmp_path):
    with pytest.raises(ValueError, match=rf"episode 0 feature '{CAM}' .*18 frames.*at least 19"):
        LeRobotSource(_short_segment(tmp_path, 2))


def _one_by_one(ds, requests, feature):
    return [ds.read_many([EpisodeRequest(r.episode, r.indices)])[0][feature] for r in requests]


def test_a_batch_gives_each_request_what_reading_it_alone_gives(ds):
    """A batch's requests of one video file are decoded together (frames asked twice included): each request
    gets what reading it alone gives, also written into the outputs given, whether they lie back to back in one
    buffer (a batch's payload) or apart."""
    asked = [(0, [0, 1]), (2, [3, 4, 5]), (0, [1, 2]), (1, [7]), (2, [0])]
    requests = [EpisodeRequest(e, {CAM: np.asarray(i)}) for e, i in asked]
    alone = _one_by_one(ds, requests, CAM)
    got = ds.read_many(requests)  # no outputs given
    for frames, expected in zip(got, alone):
        np.testing.assert_array_equal(frames[CAM], expected)
    buffer = np.zeros((sum(len(i) for _, i in asked), *alone[0].shape[1:]), np.uint8)
    starts = np.cumsum([0] + [len(i) for _, i in asked])
    for outs in ([buffer[a:b] for a, b in zip(starts[:-1], starts[1:])],  # back to back: the batch's payload
                 [np.zeros_like(x) for x in alone]):  # scattered: each request's own
        buffer[:] = 0
        with_out = [EpisodeRequest(r.episode, r.indices, {CAM: o}) for r, o in zip(requests, outs)]
        for frames, out, expected in zip(ds.read_many(with_out), outs, alone):
            assert np.shares_memory(frames[CAM], out)
            np.testing.assert_array_equal(out, expected)


def test_a_failing_request_in_a_batch_is_named_by_its_own_episode(fresh):
    """Episode 1's camera segment is said to lie past the end of the file: decoding the batch's frames of that
    file fails, and the error names episode 1, not the batch's first episode."""
    path, root = fresh
    episodes_file = path / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(episodes_file)
    for column in (f"videos/{CAM}/from_timestamp", f"videos/{CAM}/to_timestamp"):
        times = table[column].to_numpy().copy()
        times[1] += 100.0
        table = table.set_column(table.schema.get_field_index(column), column, pa.array(times))
    pq.write_table(table, episodes_file)
    ds = LeRobotSource(root)
    assert ds.read_many([EpisodeRequest(0, {CAM: [0, 1]})])[0][CAM].shape[0] == 2
    with pytest.raises(ValueError, match=rf"episode 1 feature '{CAM}' \(.*file-000.mp4\) times .*no frame within"):
        ds.read_many([EpisodeRequest(0, {CAM: [0, 1]}), EpisodeRequest(1, {CAM: [2]})])
