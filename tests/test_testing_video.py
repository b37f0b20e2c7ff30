"""The synthetic test videos carry their frame index through real encoders and decoders."""

import av
import numpy as np
import pytest

from mmfeed.testing import frame_pattern, read_index, write_video


def test_pattern_index_reads_back_exactly():
    frames = frame_pattern(40, height=48, width=64, start=1000, seed=3)
    assert frames.dtype == np.uint8 and frames.shape == (40, 48, 64, 3)
    assert read_index(frames).tolist() == list(range(1000, 1040))


@pytest.mark.parametrize("codec,gop", [("h264", 30), ("h264", 2), ("av1", 2)])
def test_index_survives_lossy_codec(tmp_path, codec, gop):
    frames = frame_pattern(20, height=48, width=64, start=5)
    path = write_video(tmp_path / f"v_{codec}.mp4", frames, codec=codec, gop=gop)
    with av.open(path) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert decoded.shape == frames.shape
    assert read_index(decoded).tolist() == list(range(5, 25))


def test_write_video_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="codec"):
        write_video(tmp_path / "x.mp4", frame_pattern(2, height=48, width=64), codec="mpeg9")
    with pytest.raises(ValueError, match="even"):
        write_video(tmp_path / "x.mp4", np.zeros((2, 47, 64, 3), np.uint8))


def test_read_index_of_no_frames_is_empty():
    assert read_index(np.zeros((0, 48, 64, 3), np.uint8)).tolist() == []
