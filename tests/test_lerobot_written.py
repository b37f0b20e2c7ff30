"""The pictures ``bench/lerobot_written.py`` hands LeRobot to encode (the script itself runs in LeRobot's venv; its
frame drawing is plain numpy, checked here)."""

from __future__ import annotations

import numpy as np
import pytest

from mmfeed.bench.lerobot_written import frames


@pytest.mark.parametrize("content", ["wave", "blocks", "scene"])
def test_frames_are_240x320_rgb_and_drawn_the_same_every_time(content):
    first = frames(content, 5, 40, np.random.default_rng(0))
    again = frames(content, 5, 40, np.random.default_rng(0))
    assert len(first) == 5
    for a, b in zip(first, again):
        assert a.shape == (240, 320, 3) and a.dtype == np.uint8
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])  # the picture moves


def test_scene_is_a_still_table_with_only_the_gripper_square_moving():
    pictures = frames("scene", 30, 0, np.random.default_rng(0))
    gripper = np.array([200, 60, 40], np.uint8)
    on = [np.all(p == gripper, axis=-1) for p in pictures]
    for mask in on:
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        assert mask.sum() == 32 * 32 and np.ptp(rows) == 31 and np.ptp(cols) == 31  # one 32x32 square
    for a, b, in_a, in_b in zip(pictures, pictures[1:], on, on[1:]):
        changed = np.any(a != b, axis=-1)
        assert not (changed & ~(in_a | in_b)).any()  # outside the square's old and new places nothing changes
        assert changed.any()
