"""Episode sources read back what the writers wrote: webdataset shards and LeRobot v3 directories."""

import numpy as np
import pytest

from mmfeed.loaders import open_dataset
from mmfeed.loaders.lerobot import LeRobotSource
from mmfeed.loaders.sources import ArraySource, EpisodeRequest
from mmfeed.loaders.webdataset import WebDatasetSource, expand_shards
from mmfeed.loaders.windows import WindowSpec
from mmfeed.testing import make_episodes, read_index, write_lerobot, write_webdataset


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(3, seed=11, min_length=12, max_length=24)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, episodes):
    out = tmp_path_factory.mktemp("wds")
    write_webdataset(out, episodes, episodes_per_shard=2, codec="h264", gop=30)
    return out


@pytest.fixture(scope="module", params=["av1", "h264"])
def lerobot(request, tmp_path_factory, episodes):
    out = tmp_path_factory.mktemp(f"lerobot_{request.param}")
    write_lerobot(out, episodes, codec=request.param, gop=2)
    return out


def test_webdataset_episode_equals_what_was_written(shards, episodes):
    ds = open_dataset(shards)
    assert isinstance(ds, WebDatasetSource) and len(ds) == len(episodes)
    for i, truth in enumerate(episodes):
        ep = ds.episode(i)
        np.testing.assert_array_equal(ep["proprio"], truth.proprio)
        np.testing.assert_array_equal(ep["action"], truth.action)
        assert ep["task"] == truth.task and ep["fps"] == truth.fps
        for camera in truth.camera_names:
            frames = ep[f"frames.{camera}"]
            assert frames.dtype == np.uint8 and frames.shape == (truth.length, truth.height, truth.width, 3)
            assert read_index(frames).tolist() == list(range(truth.length))


def test_lerobot_episode_equals_what_was_written(lerobot, episodes):
    ds = open_dataset(lerobot)
    assert isinstance(ds, LeRobotSource) and len(ds) == len(episodes)
    assert ds.cameras == list(episodes[0].camera_names)
    first = 0
    for i, truth in enumerate(episodes):
        ep = ds.episode(i)
        np.testing.assert_array_equal(ep["proprio"], truth.proprio)
        np.testing.assert_array_equal(ep["action"], truth.action)
        assert ep["task"] == truth.task
        # LeRobot videos hold all episodes back to back; the pattern carries the global frame index.
        for camera in truth.camera_names:
            assert read_index(ep[f"frames.{camera}"]).tolist() == list(range(first, first + truth.length))
        first += truth.length


@pytest.mark.parametrize("kind", ["webdataset", "lerobot"])
def test_windowed_reads_clamp_at_episode_edges(kind, shards, tmp_path, episodes):
    """A window's frames, states and actions are the clamped steps LeRobot's rule names, for every anchor."""
    if kind == "lerobot":
        root = write_lerobot(tmp_path / "lr", episodes[:2], codec="h264", gop=2)
        ds, offset = open_dataset(root), [0, episodes[0].length]
    else:
        ds, offset = open_dataset(shards), [0, 0]
    spec = WindowSpec(offsets={"frames.cam_high": (-2, 0), "proprio": (-1, 0), "action": tuple(range(6))})
    for e in range(2):
        length = episodes[e].length
        anchors = np.array([0, 1, length // 2, length - 3, length - 1])
        idx, pad = spec.indices(anchors, length)
        requests = [EpisodeRequest(e, {k: v[a] for k, v in idx.items()}) for a in range(len(anchors))]
        for a, got in enumerate(ds.read_many(requests)):
            t = anchors[a]
            expect_frames = np.clip(t + np.array([-2, 0]), 0, length - 1)
            assert read_index(got["frames.cam_high"]).tolist() == (expect_frames + offset[e]).tolist()
            np.testing.assert_array_equal(got["proprio"], episodes[e].proprio[np.clip([t - 1, t], 0, length - 1)])
            np.testing.assert_array_equal(got["action"], episodes[e].action[np.clip(t + np.arange(6), 0, length - 1)])
            assert pad["action"][a].tolist() == [(t + k) >= length for k in range(6)]


def test_camera_at_its_own_rate_is_aligned_by_time(tmp_path):
    """A 15 fps wrist camera beside a 30 fps control clock: step t sees the latest frame at or before t / 30 s."""
    eps = make_episodes(1, seed=2, min_length=20, max_length=20, camera_fps={"cam_wrist": 15.0})
    ds = open_dataset(write_webdataset(tmp_path / "rates", eps)[0])
    assert ds.camera_fps(0, "cam_wrist") == 15.0
    steps = np.arange(20)
    got = ds.read_many([EpisodeRequest(0, {"frames.cam_wrist": steps, "frames.cam_high": steps})])[0]
    assert read_index(got["frames.cam_wrist"]).tolist() == (steps // 2).tolist()
    assert read_index(got["frames.cam_high"]).tolist() == steps.tolist()


def test_array_source_reads_requested_steps():
    src = ArraySource([{"proprio": np.arange(10, dtype=np.float32)[:, None], "action": np.zeros((10, 1), np.float32)}])
    got = src.read_many([EpisodeRequest(0, {"proprio": np.array([9, 0, 0])})])[0]
    assert got["proprio"][:, 0].tolist() == [9.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="episode 0 .* 'action'"):
        ArraySource([{"proprio": np.zeros((3, 1))}])


def test_bad_paths_and_stale_index_are_named(shards, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        open_dataset(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no .tar shards"):
        expand_shards(tmp_path)
    assert len(expand_shards(str(shards / "shard-{000000..000001}.tar"))) == 2
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in shards.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    tar = sorted(copy.glob("*.tar"))[0]
    with open(tar, "ab") as fh:
        fh.write(b"\0" * 1024)
    with pytest.raises(ValueError, match="out of date.*mmfeed index"):
        open_dataset(copy)
