"""mmfeed's LeRobot windows against LeRobot's rule: the comparison logic always, real LeRobot when a venv has it.

Set ``MMFEED_LEROBOT_PYTHON=/path/to/venv/bin/python`` (a venv with ``lerobot`` installed) to run the real
comparison; otherwise that test skips and says why.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from mmfeed.bench.lerobot_compare import (check_small, compare_samples, delta_timestamps_for,
                                          edge_indices, ground_truth, mmfeed_samples)
from mmfeed.loaders import WindowSpec
from mmfeed.testing import make_episodes, write_lerobot

FPS = 30.0
OFFSETS = {"frames.cam_high": (-2, 0), "proprio": (-1, 0), "action": tuple(range(6))}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Three short single-camera episodes: windows reach past both ends of every episode."""
    episodes = make_episodes(3, seed=3, cameras=("cam_high",), min_length=5, max_length=9, height=48, width=64)
    root = write_lerobot(tmp_path_factory.mktemp("lerobot") / "ds", episodes)
    delta = delta_timestamps_for(OFFSETS, FPS)
    indices = np.arange(sum(ep.length for ep in episodes))
    return episodes, root, delta, indices


def test_delta_timestamps_round_trip_to_the_same_window():
    """LeRobot-named delta_timestamps made from step offsets map back to exactly those offsets."""
    delta = delta_timestamps_for(OFFSETS, FPS)
    assert sorted(delta) == ["action", "observation.images.cam_high", "observation.state"]
    assert WindowSpec.from_delta_timestamps(delta, FPS).offsets == OFFSETS


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
    assert truth["action_is_pad"][-1].tolist() == [False] + [True] * 5  # the last step: only the anchor is real
    assert truth["observation.images.cam_high_is_pad"][0].tolist() == [True, False]


def test_comparison_catches_a_flag_a_frame_and_one_ulp(small):
    """A flipped pad flag, a frame from the wrong step and a state one ulp off are each reported by key."""
    episodes, root, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    cases = {
        "action_is_pad": lambda d: d["action_is_pad"].__setitem__((0, 0), True),
        "observation.images.cam_high": lambda d: d["observation.images.cam_high"].__setitem__(
            (3, 1), d["observation.images.cam_high"][4, 1]),
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
    (same pattern index, pixels), state, action, every *_is_pad flag, episode and frame index, and task text."""
    result = check_small(lerobot_python, video_backend=os.environ.get("MMFEED_LEROBOT_BACKEND", "torchcodec"), lib_dirs=[])
    assert result["lerobot_vs_mmfeed"]["ok"], result["lerobot_vs_mmfeed"]["problems"]
    assert result["truth_vs_lerobot"]["ok"], result["truth_vs_lerobot"]["problems"]
    assert result["tasks_equal"]
    assert result["child"]["num_samples"] == result["samples"]
