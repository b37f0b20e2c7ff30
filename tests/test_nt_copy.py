"""The streaming-store frame copy writes exactly what ``dst[...] = src`` writes (the bytes of tests/naive.py's row
copy), for any alignment, row stride and size around the vector width and the streaming threshold."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import naive

from mmfeed.codecs import nt_copy
from mmfeed.codecs.nt_copy import STREAM_MIN_BYTES, copy_into


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), width=st.integers(1, 700), channels=st.sampled_from([1, 3]),
       pad=st.integers(0, 33), shift=st.integers(0, 31), left=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_copy_equals_numpy_assignment(rows, width, channels, pad, shift, left, seed):
    rng = np.random.default_rng(seed)
    # a source whose rows are contiguous but strided (a crop, or a plane with padded lines)
    big = rng.integers(0, 256, (rows, (width + left) * channels + pad), dtype=np.uint8)
    src = big[:, left * channels: (width + left) * channels].reshape(rows, width, channels)
    # a destination at any byte offset, with guard bytes that must stay untouched
    flat = np.zeros(src.nbytes + shift + 64, np.uint8)
    dst = flat[shift: shift + src.nbytes].reshape(src.shape)
    threshold, nt_copy.STREAM_MIN_BYTES = nt_copy.STREAM_MIN_BYTES, 0  # every size through the streaming path
    try:
        copy_into(dst, src)
    finally:
        nt_copy.STREAM_MIN_BYTES = threshold
    assert dst.tobytes() == naive.naive_row_copy(src)
    assert not flat[:shift].any() and not flat[shift + src.nbytes:].any()


def test_large_frames_take_the_streaming_path_and_blocks_of_frames_too():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 240, 320, 3), dtype=np.uint8)
    assert frames[0].nbytes >= STREAM_MIN_BYTES
    out = np.zeros_like(frames)
    copy_into(out[1], frames[2])  # one frame
    assert np.array_equal(out[1], frames[2]) and not out[0].any() and not out[2].any()
    copy_into(out, frames)  # a block of consecutive frames (the frame store's window copy)
    assert np.array_equal(out, frames)
    odd = frames[:, ::2]  # rows not contiguous in the first axis' items: numpy copies it
    target = np.zeros_like(odd)
    copy_into(target, odd)
    assert np.array_equal(target, odd)
