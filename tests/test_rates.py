"""Features at their own rates, end to end on real files: a 15 fps camera beside a 50 Hz control clock, written
by the ShardWriter, read by ds.windows and by the packed loader: distinct as-of frames, never one from the future,
and LeRobot's padding at the edges."""

import math

import numpy as np
import pytest

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, ShardWriter, TokenLayout, WindowSpec, open_dataset
from mmfeed.testing import frame_pattern, read_index

CAM = "observation.images.cam_high"
FPS, CAM_FPS = 50.0, 15.0
HISTORY = [-3 / 15, -2 / 15, -1 / 15, 0.0]
SPEC = WindowSpec.from_delta_timestamps({CAM: HISTORY, "observation.state": [-0.02, 0.0],
                                         "action": [i / 50 for i in range(10)]})
LENGTHS = (100, 37)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("rates")
    rng = np.random.default_rng(0)
    with ShardWriter(out, codec="h264", gop=10, episodes_per_shard=1) as writer:
        for length in LENGTHS:
            frames = math.floor((length - 1) / FPS * CAM_FPS + 1e-6) + 1
            writer.write({"observation.state": rng.standard_normal((length, 6)).astype(np.float32),
                          "action": np.arange(length, dtype=np.float32)[:, None].repeat(2, 1),
                          CAM: frame_pattern(frames, height=48, width=64)},
                         fps=FPS, task="stack the cups", rates={CAM: CAM_FPS})
    return open_dataset(out)


def expected_frames(t: int, length: int) -> tuple[list[int], list[bool]]:
    """The camera frames window ``t`` must read, written out: the latest frame at or before each asked time,
    clamped (and padded) outside the episode."""
    last = math.floor((length - 1) / FPS * CAM_FPS + 1e-6)
    frames, pads = [], []
    for d in HISTORY:
        tau = t / FPS + d
        pads.append(tau < -1e-4)
        frames.append(min(max(math.floor((tau + 1e-4) * CAM_FPS), 0), last))
    return frames, pads


def test_the_camera_runs_at_its_own_rate(dataset):
    assert dataset.features[CAM].fps == CAM_FPS and dataset.features["observation.state"].fps == FPS
    assert dataset.frames(CAM).tolist() == [math.floor((n - 1) / FPS * CAM_FPS + 1e-6) + 1 for n in LENGTHS]


def test_windows_read_distinct_as_of_frames_and_pad_at_the_edges(dataset):
    view = dataset.windows(SPEC)
    assert len(view) == sum(LENGTHS)
    distinct = 0
    for i in range(len(view)):
        item = view[i]
        e, t = item["episode_index"], item["frame_index"]
        frames, pads = expected_frames(t, LENGTHS[e])
        got = read_index(item[CAM].numpy()).tolist()
        assert got == frames and item[f"{CAM}_is_pad"].tolist() == pads
        # never a frame from the future: inside the episode each frame's time is at or before its asked time
        assert all(j / CAM_FPS <= t / FPS + d + 1e-4 for j, d, p in zip(got, HISTORY, pads) if not p)
        distinct += not any(pads) and len(set(got)) == len(HISTORY)
        actions = item["action"][:, 0].tolist()
        assert actions == [min(t + k, LENGTHS[e] - 1) for k in range(10)]
        assert item["action_is_pad"].tolist() == [t + k >= LENGTHS[e] for k in range(10)]
        assert item["observation.state_is_pad"].tolist() == [t == 0, False]
    assert distinct == sum(n - 10 for n in LENGTHS)  # every window past the first 0.2 s sees four frames


def test_the_packed_loader_reads_the_same_frames(dataset):
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 4}), window=SPEC,
                      plan=PlanConfig(capacity=256, rows_per_batch=2))
    seen = 0
    loader = DataLoader(dataset, packing=packing, num_workers=2)
    for batch in loader:
        frames = read_index(batch.data[CAM].numpy()).reshape(-1, len(HISTORY))
        pads = batch.data[f"{CAM}_is_pad"].numpy().reshape(-1, len(HISTORY))
        for d, (e, t) in enumerate(zip(batch.metadata["episode"].tolist(), batch.metadata["start_step"].tolist())):
            want, want_pad = expected_frames(t, LENGTHS[e])
            assert frames[d].tolist() == want and pads[d].tolist() == want_pad
            seen += 1
    assert seen + len(loader.dataset.plan(0).dropped) == sum(LENGTHS)
