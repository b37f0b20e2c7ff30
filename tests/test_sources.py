"""Episode sources read what the writers wrote, window by window: webdataset shards, LeRobot v3 directories,
arrays in memory, and open_dataset over all of them.

Whole-episode round trips of every feature are in tests/test_shards.py (shards) and tests/test_lerobot_source.py
(LeRobot); here are the windows at episode edges, streams at their own rate, ArraySource and the paths.
"""

import math
import os
import shutil

import numpy as np
import pytest
from mmfeed.loaders import WindowSpec, open_dataset
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.loaders.sources.concat import ConcatSource
from mmfeed.loaders.formats.lerobot.source import LeRobotSource
from mmfeed.loaders.formats.webdataset.source import WebDatasetSource, expand_shards

from mmfeed.testing import frame_pattern, make_episodes, read_index, write_lerobot, write_webdataset

CAM, WRIST, STATE = "observation.images.cam_high", "observation.images.cam_wrist", "observation.state"


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(3, seed=11, min_length=12, max_length=20)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The same episodes' arrays, the wrist camera at 15 fps beside the 30 Hz clock."""
    out = tmp_path_factory.mktemp("wds")
    eps = make_episodes(3, seed=11, min_length=12, max_length=20, camera_fps={"cam_wrist": 15.0})
    write_webdataset(out, eps, episodes_per_shard=2, codec="h264", gop=30)
    return out, eps


@pytest.mark.parametrize("kind", ["webdataset", "lerobot"])
def test_windows_at_episode_edges_are_clamped_and_flagged(kind, shards, tmp_path, episodes):
    """A window's frames, states and actions are the latest ones at or before each asked time, clamped into the
    episode and flagged outside it, for anchors at and near both edges."""
    if kind == "lerobot":
        ds = open_dataset(write_lerobot(tmp_path / "lr", episodes[:2], codec="h264", gop=2))
        eps, first = episodes[:2], [0, episodes[0].length]  # LeRobot frames carry the global row index
    else:
        (out, eps), first = shards, [0, 0]
        ds = open_dataset(out)
    deltas = {CAM: [-2 / 30, 0.0], WRIST: [-0.1, 0.0], STATE: [-1 / 30, 0.0], "action": [i / 30 for i in range(6)]}
    view = ds.windows(WindowSpec.from_delta_timestamps(deltas))
    starts = np.concatenate([[0], np.cumsum(ds.lengths)])
    for e in range(2):
        ep, length = eps[e], eps[e].length
        for t in (0, 1, length // 2, length - 3, length - 1):
            got = view[int(starts[e]) + t]
            assert (got["episode_index"], got["frame_index"], got["task"]) == (e, t, ep.task)
            for feature, asked in deltas.items():
                rate = ep.camera_fps[feature.rsplit(".", 1)[1]] if feature in (CAM, WRIST) else ep.fps
                frames = ep.num_frames(feature.rsplit(".", 1)[1]) if feature in (CAM, WRIST) else length
                taus = [t / ep.fps + d for d in asked]
                want = [min(max(math.floor((tau + 1e-4) * rate), 0), frames - 1) for tau in taus]
                pads = [tau < -1e-4 or tau > (length - 1) / ep.fps + 1e-4 for tau in taus]
                assert got[f"{feature}_is_pad"].tolist() == pads, (feature, t)
                if feature in (CAM, WRIST):
                    assert read_index(got[feature].numpy()).tolist() == [first[e] + j for j in want], (feature, t)
                else:
                    values = ep.state if feature == STATE else ep.action
                    np.testing.assert_array_equal(got[feature].numpy(), values[want])


def test_a_stream_at_its_own_rate_is_indexed_and_read_at_that_rate(shards):
    """A 15 fps wrist camera beside a 30 Hz clock: its rate and frame count come from the index, frame j is the
    j-th picture, and step t of the clock sees the latest frame at or before t / 30 s."""
    out, eps = shards
    ds = open_dataset(out)
    assert ds.features[WRIST].fps == 15.0 and ds.rates(WRIST).tolist() == [15.0] * 3
    assert ds.frames(WRIST).tolist() == [e.num_frames("cam_wrist") for e in eps]
    assert ds.frames(CAM).tolist() == ds.lengths.tolist() == [e.length for e in eps]
    n = eps[0].length
    got = ds.read_many([EpisodeRequest(0, {WRIST: np.arange(ds.frames(WRIST)[0])[::-1], CAM: np.arange(n)})])[0]
    assert read_index(got[WRIST]).tolist() == list(range(eps[0].num_frames("cam_wrist")))[::-1]
    assert read_index(got[CAM]).tolist() == list(range(n))
    view = ds.windows(WindowSpec.from_delta_timestamps({WRIST: [0.0], CAM: [0.0]}))
    for t in range(n):
        item = view[t]
        assert read_index(item[WRIST].numpy()).tolist() == [t // 2] and read_index(item[CAM].numpy()).tolist() == [t]


def arrays(n, length, *, rate=None, dims=3):
    """Episodes as dicts of arrays: a float state, an int action, a 16x32 camera (at ``rate``, burned-in index
    ``10 * e + j``) and a task."""
    rng = np.random.default_rng(n)
    out = []
    for e in range(n):
        frames = length if rate is None else math.floor((length - 1) / 30 * rate) + 1
        ep = {STATE: rng.standard_normal((length, dims)).astype(np.float32),
              "action": np.arange(length, dtype=np.int64) + 100 * e,
              CAM: frame_pattern(frames, height=16, width=32, start=10 * e), "task": f"task {e % 2}", "fps": 30.0}
        if rate is not None:
            ep["rates"] = {CAM: rate}
        out.append(ep)
    return out


def test_array_source_lists_features_rates_tasks_and_stats():
    eps = arrays(3, 9, rate=10.0)
    src = ArraySource(eps, name="mem")
    assert src.name == "mem" and len(src) == 3 and src.lengths.tolist() == [9] * 3 and src.fps.tolist() == [30.0] * 3
    assert src.features[CAM].kind == "video" and src.features[CAM].shape == (16, 32, 3)
    assert src.features[CAM].fps == 10.0 and src.rates(CAM).tolist() == [10.0] * 3
    assert src.frames(CAM).tolist() == [3] * 3 and src.frames(STATE).tolist() == [9] * 3
    state = src.features[STATE]
    assert (state.kind, state.dtype, state.shape) == ("array", "float32", (3,))
    assert src.features["action"].dtype == "int64" and src.features["action"].shape == ()
    assert src.tasks == ["task 0", "task 1"] and src.episode_tasks.tolist() == [0, 1, 0] and src.task(1) == "task 1"
    assert sorted(src.stats) == ["action", STATE]  # arrays only, video has none
    state = np.concatenate([e[STATE] for e in eps]).astype(np.float64)
    np.testing.assert_allclose(src.stats[STATE]["mean"], state.mean(0), rtol=1e-10)
    np.testing.assert_allclose(src.stats[STATE]["std"], state.std(0), rtol=1e-10)
    assert src.stats["action"]["max"].shape == () and float(src.stats["action"]["max"]) == 208.0  # the step shape
    assert src.describe(2) == "mem episode 2"


def test_array_source_reads_requested_frames_in_order_with_repeats():
    eps = arrays(2, 9, rate=10.0)
    src = ArraySource(eps)
    got = src.read_many([EpisodeRequest(1, {"action": np.array([8, 0, 0]), CAM: np.array([2, 0, 2])}),
                         EpisodeRequest(0, {STATE: np.array([], dtype=np.int64)})])
    assert got[0]["action"].tolist() == [108, 100, 100] and read_index(got[0][CAM]).tolist() == [12, 10, 12]
    assert got[1][STATE].shape == (0, 3) and set(got[1]) == {STATE}
    whole = src.episode(1)
    assert np.array_equal(whole[STATE], eps[1][STATE]) and whole["task"] == "task 1" and whole["fps"] == 30.0
    assert read_index(whole[CAM]).tolist() == [10, 11, 12]
    with pytest.raises(IndexError, match=r"arrays episode 0 feature 'observation.images.cam_high': frames 0\.\.3"):
        src.read_many([EpisodeRequest(0, {CAM: np.array([0, 3])})])
    with pytest.raises(KeyError, match="no feature 'depth'"):
        src.read_many([EpisodeRequest(0, {"depth": np.array([0])})])
    with pytest.raises(IndexError, match="episode 2 out of range"):
        src.episode(2)


def test_a_batch_of_requests_fails_as_its_first_bad_request_does():
    """read_many checks a batch's requests at once; any problem is raised as the first request it concerns would
    raise it on its own (its episode, feature and frames named), and a batch without one passes."""
    src = ArraySource(arrays(3, 6))
    good = [EpisodeRequest(e, {STATE: np.array([0, 5]), "action": np.array([2])}) for e in range(3)]
    src._check_requests(good)
    bad = {
        "frames": EpisodeRequest(1, {STATE: np.array([6])}),
        "negative": EpisodeRequest(2, {"action": np.array([-1, 0])}),
        "feature": EpisodeRequest(0, {"depth": np.array([0])}),
        "episode": EpisodeRequest(3, {STATE: np.array([0])}),
        "bool episode": EpisodeRequest(True, {STATE: np.array([0])}),
        "float frames": EpisodeRequest(0, {STATE: np.array([0.0, 9.0])}),
    }
    for name, request in bad.items():
        for at in range(len(good) + 1):
            batch = [*good[:at], request, *good[at:]]
            with pytest.raises(Exception) as alone:
                src._check_request(request)
            with pytest.raises(type(alone.value)) as together:
                src.read_many(batch)
            assert str(together.value) == str(alone.value), name
    two = [bad["frames"], bad["feature"]]  # the first in the batch is the one raised
    with pytest.raises(IndexError, match="episode 1 feature 'observation.state': frames 6..6"):
        src.read_many(two)
    with pytest.raises(KeyError, match="no feature 'depth'"):
        src.read_many(two[::-1])
    src._check_requests([EpisodeRequest(0, {STATE: np.array([1.0, 2.0])})])  # in range, whatever the dtype


def test_array_source_refuses_episodes_that_disagree():
    base = arrays(2, 6)
    with pytest.raises(ValueError, match="needs at least one episode"):
        ArraySource([])
    with pytest.raises(ValueError, match=r"episode 1 of source 'arrays' lacks features \['action'\]"):
        ArraySource([base[0], {k: v for k, v in base[1].items() if k != "action"}])
    with pytest.raises(ValueError, match=r"episode 1 of source 'arrays' feature 'observation.state' is float64 \[3\]"):
        ArraySource([base[0], {**base[1], STATE: base[1][STATE].astype(np.float64)}])
    with pytest.raises(ValueError, match=r"episode 0 .* different numbers of steps \[5, 6\]"):
        ArraySource([{**base[0], "action": base[0]["action"][:5]}])
    with pytest.raises(ValueError, match=r"episode 0 .* rates name \['depth'\]"):
        ArraySource([{**base[0], "rates": {"depth": 10.0}}])
    with pytest.raises(TypeError, match="episode 0 of source 'arrays' must be a dict"):
        ArraySource([[1, 2, 3]])


def test_open_dataset_opens_each_format_and_lists_of_them(shards, tmp_path, episodes):
    out, _ = shards
    root = write_lerobot(tmp_path / "lr", episodes[:1], codec="h264", gop=2)
    assert isinstance(open_dataset(out), WebDatasetSource) and isinstance(open_dataset(root), LeRobotSource)
    tars = sorted(str(p) for p in out.glob("*.tar"))
    one = open_dataset(tars)  # a list of shards is one dataset
    assert isinstance(one, WebDatasetSource) and len(one) == 3
    both = open_dataset([root, out])  # a list of datasets is a mixture
    assert isinstance(both, ConcatSource) and len(both) == 4 and both.dataset_of.tolist() == [0, 1, 1, 1]
    assert open_dataset([out]).name == open_dataset(out).name
    assert open_dataset(one) is one
    with pytest.raises(ValueError, match="already open"):
        open_dataset(one, backend="pyav")
    with pytest.raises(TypeError, match="takes a path"):
        open_dataset(42)


def test_a_mixture_takes_the_shared_options_and_each_format_its_own(shards, tmp_path, episodes):
    """Options both formats take reach both datasets; a format's own option reaches the datasets of that format;
    an option no dataset given takes is refused, naming the formats that take it."""
    out, _ = shards
    root = write_lerobot(tmp_path / "lr", episodes[:1], codec="h264", gop=2)
    mix = open_dataset([out, root], backend="pyav", frame_size=(24, 32), decoder_threads=2)
    assert mix.features[CAM].shape == (24, 32, 3)
    assert [mix.episode(e)[CAM].shape[1:] for e in (0, len(mix) - 1)] == [(24, 32, 3)] * 2  # both resized
    shards_source, lerobot_source = mix.sources
    assert (shards_source.backend, shards_source.decoder_threads) == ("pyav", 2)
    own = open_dataset([out, root], cache_episodes=3, check_index=False, tolerance_s=1e-3)
    assert own.sources[0].cache_episodes == 3 and own.sources[1].tolerance_s == 1e-3
    assert lerobot_source.tolerance_s == 1e-4  # LeRobot's default where the option was not given
    with pytest.raises(ValueError, match=r"'cache_episodes' applies to RLDS and webdataset shards only"
                                         r".*lr is LeRobot v3.*drop cache_episodes="):
        open_dataset(root, cache_episodes=3)
    with pytest.raises(ValueError, match=r"'tolerance_s' applies to LeRobot v3 only"):
        open_dataset([out, out], tolerance_s=1e-3)
    with pytest.raises(ValueError, match=r"no format takes option 'cache_episode'.*'cache_episodes'"):
        open_dataset([out, root], cache_episode=3)


def test_bad_paths_and_stale_index_are_named(shards, tmp_path):
    out, _ = shards
    with pytest.raises(FileNotFoundError, match="nowhere"):
        open_dataset(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no .tar shards"):
        expand_shards(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no such shard\(s\): \[.*shard-000002.tar"):
        expand_shards(str(out / "shard-{000000..000009}.tar"))
    assert len(expand_shards(str(out / "shard-{000000..000001}.tar"))) == 2
    assert expand_shards(str(out / "shard-*.tar")) == sorted(str(p) for p in out.glob("*.tar"))
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    tar = sorted(copy.glob("*.tar"))[0]
    with open(tar, "ab") as fh:
        fh.write(b"\0" * 1024)
    with pytest.raises(ValueError, match=rf"out of date .*{tar.name}.*mmfeed index"):
        open_dataset(copy)
    assert len(WebDatasetSource(copy, check_index=False)) == 3  # asked not to check, it reads on
    os.remove(copy / "mmfeed-index.parquet")
    assert len(open_dataset(copy)) == 3  # without an index the shards are indexed in memory


@pytest.mark.parametrize("kind", ["webdataset", "lerobot"])
def test_decoder_threads_decode_the_same_frames(kind, shards, tmp_path, episodes):
    """``decoder_threads=2`` opens each video with two FFmpeg threads (frame and slice threading) and yields the
    very frames one thread does; a bad count is refused at open."""
    root = shards[0] if kind == "webdataset" else write_lerobot(tmp_path / "lr", episodes, codec="av1", gop=2)
    one, two = open_dataset(root), open_dataset(root, decoder_threads=2)
    requests = [EpisodeRequest(e, {CAM: np.arange(0, int(one.frames(CAM)[e]), 3)}) for e in range(len(one))]
    for a, b in zip(one.read_many(requests), two.read_many(requests)):
        assert np.array_equal(a[CAM], b[CAM])
    caches = list(two._videos.values())
    assert caches and all(c.options.threads == 2 for c in caches)
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        open_dataset(root, decoder_threads=0)


def test_one_read_options_object_checked_once_and_refused_where_a_format_has_no_such_option(shards, tmp_path,
                                                                                            episodes):
    """Every format takes the same ReadOptions (or its fields as keywords); a value is checked when the options
    are made, before any file is opened; a format refuses an option it does not read, naming it and the fix."""
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource
    from mmfeed.loaders.sources.options import ReadOptions

    out, _ = shards
    root = write_lerobot(tmp_path / "lr", episodes[:1], codec="h264", gop=2)
    options = ReadOptions(frame_size=(24, 32), decoder_threads=2)
    assert options.given() == ["frame_size", "decoder_threads"]
    for source in (WebDatasetSource(out, options), LeRobotSource(root, options), open_dataset(root, **{
            "frame_size": (24, 32), "decoder_threads": 2})):
        assert source.features[CAM].shape == (24, 32, 3) and source.options.decoder_threads == 2
    with pytest.raises(ValueError, match=r"lr: option 'check_index' does not apply to LeRobot v3.*drop check_index="):
        LeRobotSource(root, check_index=False)
    with pytest.raises(ValueError, match="cache_episodes must be an int >= 1"):
        ReadOptions(cache_episodes=0)
    with pytest.raises(ValueError, match=r"frame_format must be one of"):
        open_dataset("/nowhere/at/all", frame_format="rgb48")  # refused before the path is looked at


def test_lru_get_many_answers_as_get_does_and_keeps_what_it_found_recent():
    """LRU.get_many gives each key's value (None where none is kept) and, as get does, makes those it found the
    most recently used: the next put drops the one it did not ask for."""
    from mmfeed.loaders.sources.base import LRU

    kept = LRU(3)
    for key in "abc":
        kept.put(key, key.upper())
    assert kept.get_many(["c", "x", "a"]) == ["C", None, "A"]
    kept.put("d", "D")  # "b" is now the least recently used
    assert kept.get("b") is None and [kept.get(k) for k in "acd"] == ["A", "C", "D"]
