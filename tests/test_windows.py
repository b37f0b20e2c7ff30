"""Episode windows and token layout: clamping, padding flags, chunking, stream alignment, prices."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmfeed.loaders.layout import TokenLayout
from mmfeed.loaders.windows import WindowSpec, align_to_stream, episode_chunks, episode_windows


def lerobot_query(idx, ep_start, ep_end, deltas):
    """LeRobot's rule, written out: clamp into [ep_start, ep_end - 1], pad where the raw index falls outside."""
    query = [max(ep_start, min(ep_end - 1, idx + d)) for d in deltas]
    pad = [(idx + d < ep_start) or (idx + d >= ep_end) for d in deltas]
    return query, pad


@given(
    length=st.integers(1, 40),
    offsets=st.lists(st.integers(-60, 60), min_size=1, max_size=8),
)
def test_window_indices_follow_lerobot_clamping(length, offsets):
    """Every offset is clamped into the episode and flagged as padding exactly when it fell outside."""
    spec = WindowSpec(offsets={"action": tuple(offsets)})
    anchors = np.arange(length)
    idx, pad = spec.indices(anchors, length)
    for t in anchors:
        query, flags = lerobot_query(int(t), 0, length, offsets)
        assert idx["action"][t].tolist() == query
        assert pad["action"][t].tolist() == flags


def test_delta_timestamps_become_step_offsets_and_bad_ones_are_named():
    spec = WindowSpec.from_delta_timestamps({"frames.cam": [-0.1, 0.0], "action": [i / 10 for i in range(5)]}, fps=10)
    assert spec.offsets == {"frames.cam": (-1, 0), "action": (0, 1, 2, 3, 4)}
    lerobot = WindowSpec.from_delta_timestamps(
        {"observation.images.cam_high": [-0.1, 0.0], "observation.state": [0.0], "action": [0.0, 0.1]}, fps=10)
    assert lerobot.offsets == {"frames.cam_high": (-1, 0), "proprio": (0,), "action": (0, 1)}
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\].*0\.05"):
        WindowSpec.from_delta_timestamps({"action": [0.05]}, fps=10)
    with pytest.raises(ValueError, match="no offsets"):
        WindowSpec(offsets={"action": ()})


@given(st.lists(st.integers(0, 30), min_size=0, max_size=10), st.integers(1, 7))
def test_episode_windows_visit_every_stride_step_once(lengths, stride):
    """Each episode contributes anchors 0, stride, 2*stride, ... < length, in order, and nothing else."""
    episode, anchor = episode_windows(np.array(lengths, dtype=np.int64), stride=stride)
    expected = [(e, t) for e, n in enumerate(lengths) for t in range(0, n, stride)]
    assert list(zip(episode.tolist(), anchor.tolist())) == expected


@given(st.lists(st.integers(0, 50), min_size=0, max_size=10), st.integers(1, 12))
def test_episode_chunks_cover_each_episode_exactly(lengths, max_length):
    """Chunks of an episode are consecutive, none longer than max_length, and together cover every step once."""
    episode, start, length = episode_chunks(np.array(lengths, dtype=np.int64), max_length)
    assert (length >= 1).all() and (length <= max_length).all()
    for e, n in enumerate(lengths):
        mine = episode == e
        covered = np.concatenate([np.arange(s, s + k) for s, k in zip(start[mine], length[mine])] + [[]])
        assert covered.tolist() == list(range(n))


def test_align_to_stream_by_time():
    steps = np.arange(8)
    # A 15 fps camera beside a 30 fps control clock: the latest frame at or before each step's time.
    assert align_to_stream(steps, fps=30, stream_fps=15, stream_length=100).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert align_to_stream(steps, fps=30, stream_fps=15, stream_length=100, mode="nearest").tolist() == [
        0, 1, 1, 2, 2, 3, 3, 4]
    # Same rate is the identity, also where float time would round 0.99999 down; past the end is clamped.
    assert align_to_stream(np.arange(1000), fps=29.97, stream_fps=29.97, stream_length=1000).tolist() == list(range(1000))
    assert align_to_stream(np.array([50]), fps=10, stream_fps=10, stream_length=20).tolist() == [19]
    with pytest.raises(ValueError, match="mode"):
        align_to_stream(steps, fps=30, stream_fps=15, stream_length=10, mode="later")


def test_layout_prices_and_lays_out_a_vla_sample():
    layout = TokenLayout(tokens_per_frame={"high": 16, "wrist": 8}, tokens_per_proprio_step=2)
    spec = WindowSpec(offsets={"frames.wrist": (-1, 0), "frames.high": (0,), "proprio": (0,), "action": (0, 1, 2)})
    sample = layout.sample(spec, text_length=4)
    # Text first (one step per id), then time -1 (wrist only), then time 0 (high, wrist, proprio), then the chunk.
    assert [r[0] for r in sample.runs] == ["text", "frames.wrist", "frames.high", "frames.wrist", "proprio", "action"]
    assert sample.step_sizes == (1, 1, 1, 1, 8, 16 + 8 + 2, 3)
    assert sample.num_tokens == sum(sample.step_sizes) == int(layout.price(spec, np.array([4]))[0])
    causal = TokenLayout(tokens_per_frame={"high": 16, "wrist": 8}, causal_actions=True).sample(spec, 0)
    assert causal.step_sizes[-3:] == (1, 1, 1)
    assert layout.modalities() == ["text", "frames.high", "frames.wrist", "proprio", "action"]


def test_layout_rejects_what_it_cannot_price():
    with pytest.raises(ValueError, match=r"tokens_per_frame\['cam'\]"):
        TokenLayout(tokens_per_frame={"cam": 0})
    with pytest.raises(ValueError, match="camera 'side'"):
        TokenLayout(tokens_per_frame={"cam": 4}).price(WindowSpec(offsets={"frames.side": (0,)}), np.array([1]))
    with pytest.raises(ValueError, match="'depth'"):
        TokenLayout().sample(WindowSpec(offsets={"depth": (0,)}), 0)
