"""Windows in time and the token layout: each feature at its own rate, LeRobot's clamping, chunks, prices."""

import math

import naive
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmfeed.packing.layout import TokenLayout
from mmfeed.packing.windows import (
    WindowSpec,
    check_stream_frames,
    chunk_frames,
    clamp_to_stream,
    episode_chunks,
    episode_windows,
    fewest_frames,
    frames_at_rate,
    window_indices,
)

RATES = st.sampled_from([5.0, 10.0, 15.0, 29.97, 30.0, 50.0, 60.0])


def lerobot_query(idx, ep_end, deltas):
    """LeRobot's rule, written out: clamp into [0, ep_end - 1], pad where the raw index falls outside."""
    query = [max(0, min(ep_end - 1, idx + d)) for d in deltas]
    pad = [(idx + d < 0) or (idx + d >= ep_end) for d in deltas]
    return query, pad


@given(length=st.integers(1, 40), steps=st.lists(st.integers(-60, 60), min_size=1, max_size=8), fps=RATES)
def test_at_the_control_clock_windows_are_lerobots(length, steps, fps):
    """Deltas that are multiples of 1 / fps, every feature at fps: exactly LeRobot's indices and is_pad flags."""
    idx, pad = window_indices([k / fps for k in steps], anchor_steps=np.arange(length), fps=fps, length=length,
                              rate=fps, frames=length)
    for t in range(length):
        query, flags = lerobot_query(t, length, steps)
        assert idx[t].tolist() == query
        assert pad[t].tolist() == flags


@given(length=st.integers(1, 80), fps=RATES, rate=RATES,
       deltas=st.lists(st.floats(-3.0, 3.0, allow_nan=False), min_size=1, max_size=6))
def test_each_feature_gets_the_latest_frame_at_or_before_the_asked_time(length, fps, rate, deltas):
    """Never a frame from the future: inside the episode, frame j is at or before the asked time and frame j + 1
    is after it (or does not exist); outside it, the time is flagged and clamped to the first or last frame."""
    frames = int(frames_at_rate(length, fps, rate))
    tol = 1e-4
    idx, pad = window_indices(deltas, anchor_steps=np.arange(length), fps=fps, length=length, rate=rate,
                              frames=frames, tolerance_s=tol)
    last_s = (length - 1) / fps
    for t in range(length):
        for k, d in enumerate(deltas):
            tau = t / fps + d
            j = int(idx[t, k])
            assert 0 <= j < frames
            if tau < -tol:
                assert pad[t, k] and j == 0
            elif tau > last_s + tol:
                assert pad[t, k] and j == min(frames - 1, math.floor((tau + tol) * rate))
            else:
                assert not pad[t, k]
                assert j / rate <= tau + tol + 1e-9
                assert j == frames - 1 or (j + 1) / rate > tau + tol - 1e-9


def test_a_15_fps_camera_beside_a_50_hz_clock_gives_distinct_frames():
    """Four history frames of a 15 fps camera, asked for at its own period, are four different frames."""
    length = 200
    frames = int(frames_at_rate(length, 50.0, 15.0))
    assert frames == math.floor(199 / 50 * 15) + 1
    deltas = [-3 / 15, -2 / 15, -1 / 15, 0.0]
    idx, pad = window_indices(deltas, anchor_steps=np.arange(length), fps=50.0, length=length, rate=15.0,
                              frames=frames)
    inside = ~pad.any(axis=1)
    assert inside.sum() > 150
    assert (np.diff(idx[inside], axis=1) == 1).all()  # distinct and consecutive camera frames
    # The anchor frame is the latest camera frame at or before the anchor step's time.
    assert idx[inside, -1].tolist() == [math.floor(t / 50 * 15 + 1e-6) for t in np.flatnonzero(inside)]
    # The first anchors ask for times before the episode: flagged, clamped to frame 0.
    assert pad[0].tolist() == [True, True, True, False] and idx[0].tolist() == [0, 0, 0, 0]


@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=5), fps=RATES, rate=RATES,
       max_length=st.integers(1, 25))
def test_consecutive_chunks_hold_every_frame_of_every_feature_once(lengths, fps, rate, max_length):
    episode, start, length = episode_chunks(np.array(lengths), max_length)
    lengths = np.array(lengths)
    frames = frames_at_rate(lengths, fps, rate)
    first, count = chunk_frames(start, start + length, length=lengths[episode], fps=fps, rate=rate)
    for e in range(len(lengths)):
        mine = episode == e
        covered = np.concatenate([np.arange(f, f + c) for f, c in zip(first[mine], count[mine])])
        assert covered.tolist() == list(range(frames[e]))


# A stream as recorded: up to two frames short of what the clock implies (one is accepted, two are refused but
# read the same way), exactly as implied, or longer (it ran on after the last step).
SHORTFALL = st.integers(-3, 2)


@pytest.mark.kernels
@given(length=st.integers(1, 80), fps=RATES, rate=RATES, shortfall=SHORTFALL, tol=st.sampled_from([0.0, 1e-4, 1e-3]),
       deltas=st.lists(st.floats(-3.0, 3.0, allow_nan=False), min_size=1, max_size=6))
def test_window_indices_are_the_naive_frame_by_frame_rule(length, fps, rate, shortfall, tol, deltas):
    """Each asked time reads the latest implied frame at or before it; a time outside the episode, or whose frame
    the stream lacks, is padding and reads the nearest frame the stream holds (never one it lacks)."""
    implied = naive.implied_frames(length, fps, rate)
    assert int(frames_at_rate(length, fps, rate)) == implied
    frames = max(1, implied - shortfall)
    idx, pad = window_indices(deltas, anchor_steps=np.arange(length), fps=fps, length=length, rate=rate,
                              frames=frames, tolerance_s=tol)
    assert ((0 <= idx) & (idx < frames)).all()
    for t in range(length):
        for k, d in enumerate(deltas):
            want = naive.window_frame(t, d, fps=fps, length=length, rate=rate, frames=frames, tol=tol)
            assert (int(idx[t, k]), bool(pad[t, k])) == want, (t, d)


@pytest.mark.kernels
@given(episodes=st.lists(st.tuples(st.integers(0, 60), RATES, RATES, SHORTFALL), min_size=1, max_size=5),
       tol=st.sampled_from([0.0, 1e-4, 1e-3]), seed=st.integers(0, 2**16),
       deltas=st.lists(st.floats(-3.0, 3.0, allow_nan=False), min_size=1, max_size=6))
def test_window_indices_of_a_batch_are_each_samples_own(episodes, tol, seed, deltas):
    """A batch of anchors from episodes of their own lengths, clocks, rates and streams (as a shuffled batch's
    windows are, each argument ``[N]``) reads, sample by sample, what the naive rule gives that sample alone."""
    rng = np.random.default_rng(seed)
    length = np.array([e[0] for e in episodes])
    fps, rate = np.array([e[1] for e in episodes]), np.array([e[2] for e in episodes])
    implied = np.array([naive.implied_frames(int(n), f, r) for n, f, r in zip(length, fps, rate)])
    frames = np.maximum(1, implied - np.array([e[3] for e in episodes]))
    which = rng.integers(0, len(episodes), 12)
    anchors = rng.integers(0, np.maximum(length[which], 1))
    idx, pad = window_indices(deltas, anchor_steps=anchors, fps=fps[which], length=length[which],
                              rate=rate[which], frames=frames[which], tolerance_s=tol)
    assert idx.shape == pad.shape == (len(which), len(deltas))
    for i, (e, t) in enumerate(zip(which.tolist(), anchors.tolist())):
        for k, d in enumerate(deltas):
            want = naive.window_frame(t, d, fps=fps[e], length=int(length[e]), rate=rate[e], frames=int(frames[e]),
                                      tol=tol)
            assert (int(idx[i, k]), bool(pad[i, k])) == want, (e, t, d)


@given(length=st.integers(1, 80), fps=RATES, rate=RATES, shortfall=SHORTFALL,
       deltas=st.lists(st.floats(-3.0, 3.0, allow_nan=False), min_size=1, max_size=6))
def test_a_short_stream_changes_only_the_flags_and_frames_it_lacks(length, fps, rate, shortfall, deltas):
    """Against the stream the clock implies, one that ended early flags exactly the times whose frame it lacks
    (and reads its last frame there); one that ran on reads and flags exactly as the implied one does."""
    implied = int(frames_at_rate(length, fps, rate))
    frames = max(1, implied - shortfall)
    args = dict(anchor_steps=np.arange(length), fps=fps, length=length, rate=rate)
    full_idx, full_pad = window_indices(deltas, frames=implied, **args)
    idx, pad = window_indices(deltas, frames=frames, **args)
    lacking = full_idx >= frames
    assert (pad == (full_pad | lacking)).all()
    assert (idx == np.where(lacking, frames - 1, full_idx)).all()


@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=5), fps=RATES, rate=RATES,
       max_length=st.integers(1, 25), shortfall=SHORTFALL)
def test_chunks_of_a_short_stream_read_its_last_frame_flagged(lengths, fps, rate, max_length, shortfall):
    """Chunk counts (their price) depend on the clock only; a frame the stream lacks reads its last frame,
    flagged, as the naive frame-by-frame rule says."""
    episode, start, length = episode_chunks(np.array(lengths), max_length)
    lengths = np.array(lengths)
    first, count = chunk_frames(start, start + length, length=lengths[episode], fps=fps, rate=rate)
    for k, e in enumerate(episode):
        frames = max(1, naive.implied_frames(int(lengths[e]), fps, rate) - shortfall)
        j = np.arange(first[k], first[k] + count[k])
        read, missing = clamp_to_stream(j, frames)
        want = naive.chunk_reads(int(start[k]), int(start[k] + length[k]), fps=fps, length=int(lengths[e]), rate=rate,
                                 frames=frames)
        assert list(zip(j.tolist(), read.tolist(), missing.tolist())) == want


@given(length=st.integers(1, 400), fps=RATES, rate=RATES)
def test_a_stream_may_end_one_frame_period_early_and_no_more(length, fps, rate):
    """The boundary, exactly: a stream whose last frame is one frame period before the clock's last frame is
    accepted, one two periods before is refused with a message naming the feature, the counts and the rule."""
    need = int(frames_at_rate(length, fps, rate))
    fewest = int(fewest_frames(length, fps, rate))
    assert fewest == max(need - 1, 1)
    for n in (fewest, need, need + 1, need + 5):
        check_stream_frames(n, length=length, fps=fps, rate=rate, where="feature 'cam'")
    if need > 1:
        # in time: the last frame (n - 1) / rate is one frame period before the clock's last, (need - 1) / rate
        assert math.isclose((need - 1) / rate - (fewest - 1) / rate, 1 / rate)
    with pytest.raises(ValueError) as err:
        check_stream_frames(fewest - 1, length=length, fps=fps, rate=rate, where="feature 'cam'")
    message = str(err.value)
    assert f"feature 'cam': {fewest - 1} frames" in message and f"need {need}" in message
    assert f"at least {fewest}" in message and "one frame period early" in message


def test_a_15_fps_camera_one_frame_short_beside_a_50_hz_clock():
    """48 steps at 50 Hz imply 15 frames of a 15 fps camera (the last at 14 / 15 s <= 0.94 s); a recording of
    14 is kept: windows asking for 14 / 15 s or later read frame 13, flagged."""
    assert int(frames_at_rate(48, 50.0, 15.0)) == 15
    idx, pad = window_indices([-1 / 15, 0.0], anchor_steps=np.array([43, 46, 47]), fps=50.0, length=48, rate=15.0,
                              frames=14)
    # anchors at 0.86, 0.92 and 0.94 s: frames 11, 12 | 12, 13 | 13, 14 -> 14 is missing
    assert idx.tolist() == [[11, 12], [12, 13], [13, 13]]
    assert pad.tolist() == [[False, False], [False, False], [False, True]]


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
        steps = np.concatenate([np.arange(s, s + k) for s, k in zip(start[mine], length[mine])]) if mine.any() else []
        assert list(steps) == list(range(n))


def test_window_specs_take_seconds_per_feature_and_refuse_what_is_not():
    spec = WindowSpec.from_delta_timestamps({"observation.images.cam_high": [-1 / 15, 0.0], "action": [0.0, 0.02]})
    assert spec.features == ["observation.images.cam_high", "action"]
    assert spec.deltas["observation.images.cam_high"] == (-1 / 15, 0.0)
    assert spec.span_s() == (-1 / 15, 0.02)
    for bad, match in [({"action": ()}, "empty"), ({"action": [float("nan")]}, "finite"),
                       ({"action": [True]}, "finite"), ({"action": "0.1"}, "sequence"), ({}, "at least one")]:
        with pytest.raises((ValueError, TypeError), match=match):
            WindowSpec(deltas=bad)
    with pytest.raises(ValueError, match="tolerance_s"):
        WindowSpec(deltas={"action": [0.0]}, tolerance_s=-1)
    # steps given where seconds are expected: refused, not read as 0, 1, 2 ... seconds
    with pytest.raises(ValueError, match=r"deltas\['action'\] holds the integers \[1, 2, 3\].*seconds, not steps"):
        WindowSpec.from_delta_timestamps({"action": list(range(4))})
    assert WindowSpec(deltas={"action": (0, 1.0, np.float64(2.0))}).deltas["action"] == (0.0, 1.0, 2.0)


PIECES = st.dictionaries(
    st.sampled_from(["observation.images.cam_high", "observation.images.cam_wrist", "observation.state", "action"]),
    st.lists(st.sampled_from([-0.2, -0.1, -1 / 15, 0.0, 0.02, 0.1, 0.2]), min_size=1, max_size=5, unique=True),
    min_size=1)


@given(pieces=PIECES, text=st.integers(0, 12), causal=st.booleans(), interleave=st.booleans())
def test_a_sample_layout_holds_every_piece_once_and_its_price(pieces, text, causal, interleave):
    """Every frame of every feature appears in exactly one run, the runs add up to the price, the attention
    steps to the tokens, and observed pieces come in time order."""
    layout = TokenLayout(tokens_per_frame={"observation.images.cam_high": 6, "observation.images.cam_wrist": 4},
                         causal_chunk=causal, interleave_chunk=interleave)
    sample = layout.sample(pieces, text)
    counts = {f: len(t) for f, t in pieces.items()}
    assert sample.num_tokens == int(layout.price(counts, text)) == sum(sample.step_sizes)
    for feature, times in pieces.items():
        positions = sorted(p for f, first, tokens in sample.runs if f == feature
                           for p in range(first, first + tokens // layout.tokens(feature)))
        assert positions == list(range(len(times)))
    observed = [pieces[f][p] for f, p, _ in sample.runs if f not in ("text", "action")]
    assert observed == sorted(observed)


def test_pieces_observed_at_one_time_share_an_attention_step():
    layout = TokenLayout(tokens_per_frame={"cam": 4})
    sample = layout.sample({"cam": (-1 / 15, 0.0), "observation.state": (-0.02, 0.0), "action": (0.0, 0.02)}, 3)
    # 3 text steps, cam at -1/15, state at -0.02, cam + state at 0, the action chunk as one step
    assert sample.step_sizes == (1, 1, 1, 4, 1, 5, 2)
    causal = TokenLayout(tokens_per_frame={"cam": 4}, causal_chunk=True).sample(
        {"cam": (0.0,), "action": (0.0, 0.1)}, 0)
    assert causal.step_sizes == (4, 1, 1)
    joined = TokenLayout(tokens_per_frame={"cam": 4}, interleave_chunk=True).sample(
        {"cam": (0.0,), "action": (0.0, 0.1)}, 0)
    assert joined.step_sizes == (5, 1) and joined.runs[:2] == (("cam", 0, 4), ("action", 0, 1))
    with pytest.raises(ValueError, match="tokens_per_frame"):
        TokenLayout(tokens_per_frame={"cam": 0})
    with pytest.raises(TypeError, match="chunk_features"):
        TokenLayout(chunk_features="action")
