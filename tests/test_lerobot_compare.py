"""mmfeed's LeRobot windows against LeRobot's rule: the comparison logic always, real LeRobot when a venv has it.

Both sides name features alike: the ``delta_timestamps`` LeRobot gets are the window mmfeed reads. Set
``MMFEED_LEROBOT_PYTHON=/path/to/venv/bin/python`` (a venv with ``lerobot`` installed) to run the real comparison;
otherwise that test skips and says why.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mmfeed.bench.lerobot_compare import (check_small, compare_samples, delta_timestamps, edge_indices,
                                          ground_truth, mmfeed_samples)
from mmfeed.bench.loader import LoaderBench
from mmfeed.loaders import WindowSpec
from mmfeed.loaders.sources.lerobot import LeRobotSource
from mmfeed.testing import make_episodes, write_lerobot

FPS = 30.0
CAM = "observation.images.cam_high"
DELTA = {CAM: [-2 / FPS, 0.0], "observation.state": [-1 / FPS, 0.0], "action": [i / FPS for i in range(6)]}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Three short single-camera episodes: windows reach past both ends of every episode."""
    episodes = make_episodes(3, seed=3, cameras=("cam_high",), min_length=5, max_length=9, height=48, width=64)
    root = write_lerobot(tmp_path_factory.mktemp("lerobot") / "ds", episodes)
    indices = np.arange(sum(ep.length for ep in episodes))
    return episodes, root, DELTA, indices


def test_delta_timestamps_are_the_window_under_the_datasets_own_names(small):
    """The delta_timestamps given to LeRobot and the window mmfeed reads are one mapping: same feature names,
    same seconds, and every name is a feature of the LeRobot directory as LeRobot wrote it (no translation)."""
    _, root, delta, _ = small
    spec = WindowSpec.from_delta_timestamps(delta)
    assert delta_timestamps(spec) == delta
    assert WindowSpec.from_delta_timestamps(delta_timestamps(spec)) == spec
    bench = LoaderBench(format="lerobot", history=2, horizon=50).window()
    assert delta_timestamps(bench)[CAM] == [-1 / FPS, 0.0] and len(delta_timestamps(bench)["action"]) == 50
    assert set(bench.features) <= set(LeRobotSource(root).features)


def test_edge_indices_cover_every_episode_edge():
    """Every episode's first and last sample (and those a window can clamp at) are picked, all within range."""
    bounds = np.array([0, 5, 12, 20])
    picks = edge_indices(bounds, (-2, 3), extra=4, seed=0)
    assert set(bounds[:-1]) <= set(picks) and set(bounds[1:] - 1) <= set(picks)
    assert {1, 2, 8, 9, 10} <= set(picks)  # two steps of history after a start, three of future before an end
    assert picks.min() >= 0 and picks.max() < 20 and np.all(np.diff(picks) > 0)


def test_mmfeed_reads_equal_lerobots_rule_on_its_own_directory(small):
    """On every sample, mmfeed's clamped reads and pad flags equal LeRobot's rule computed from the episodes."""
    episodes, root, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    ours = mmfeed_samples(root, delta, indices)
    report = compare_samples(truth, ours, list(delta))
    assert report["ok"], report["problems"]
    assert set(report["keys"]) >= {CAM, "observation.state", "action", f"{CAM}_is_pad", "episode_index"}
    assert truth["action_is_pad"][-1].tolist() == [False] + [True] * 5  # the last step: only the anchor is real
    assert truth[f"{CAM}_is_pad"][0].tolist() == [True, False]


def test_any_feature_is_compared_under_its_own_name(small):
    """A feature beyond state and action (the reward, a scalar per step) is read and compared like the others."""
    episodes, root, _, indices = small
    delta = {"next.reward": [-1 / FPS, 0.0, 1 / FPS]}
    truth = ground_truth(episodes, delta, indices, FPS)
    ours = mmfeed_samples(root, delta, indices)
    report = compare_samples(truth, ours, list(delta))
    assert report["ok"], report["problems"]
    assert ours["next.reward"].shape == (len(indices), 3) and report["keys"]["next.reward"]["equal"]


def test_comparison_catches_a_flag_a_frame_and_one_ulp(small):
    """A flipped pad flag, a frame from the wrong step and a state one ulp off are each reported by key."""
    episodes, root, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    cases = {
        "action_is_pad": lambda d: d["action_is_pad"].__setitem__((0, 0), True),
        CAM: lambda d: d[CAM].__setitem__((3, 1), d[CAM][4, 1]),
        "observation.state": lambda d: d["observation.state"].__setitem__(
            (2, 1, 0), np.nextafter(d["observation.state"][2, 1, 0], np.float32(10))),
    }
    for key, spoil in cases.items():
        bad = {k: v.copy() for k, v in truth.items()}
        spoil(bad)
        report = compare_samples(truth, bad, list(delta))
        assert not report["ok"]
        assert [p.split(":")[0] for p in report["problems"]] == [key]


def test_comparison_reports_a_missing_key_and_a_shape_change(small):
    """A key absent on one side, or a window of another length, is a problem, never a silent pass."""
    episodes, root, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    bad = {k: v for k, v in truth.items() if k != "observation.state_is_pad"}
    bad["action"] = truth["action"][:, :5]
    problems = compare_samples(truth, bad, list(delta))["problems"]
    assert any(p.startswith("action: shape") for p in problems)
    assert any(p.startswith("observation.state_is_pad: missing") for p in problems)


def test_real_lerobot_returns_what_mmfeed_returns(lerobot_python):
    """Real LeRobotDataset (torchcodec) and mmfeed agree on every sample of a two-camera directory: frames
    (same pattern index, pixels), state, action, reward, every *_is_pad flag, episode and frame index, and task
    text, with the same feature names on both sides."""
    backend = os.environ.get("MMFEED_LEROBOT_BACKEND", "torchcodec")
    result = check_small(lerobot_python, video_backend=backend, lib_dirs=[])
    assert result["lerobot_vs_mmfeed"]["ok"], result["lerobot_vs_mmfeed"]["problems"]
    assert result["truth_vs_lerobot"]["ok"], result["truth_vs_lerobot"]["problems"]
    assert result["tasks_equal"]
    assert result["child"]["num_samples"] == result["samples"]
