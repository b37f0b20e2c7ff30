"""The optional torchcodec backend: the same frames as PyAV, by index and end to end through open_dataset.

Every test that decodes with torchcodec skips, with the loader's reason, when torchcodec does not load in this
process (not installed, or FFmpeg's shared libraries not on LD_LIBRARY_PATH; see mmfeed.codecs._torchcodec for the
recipe). At the native size torchcodec's frames must equal PyAV's rgb24 frames exactly.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.codecs import DecodeError, DecodeOptions, VideoReaderCache, decode_batch, probe, read_frames
from mmfeed.codecs._torchcodec import TorchCodecReader, link_pyav_ffmpeg, torchcodec_available, torchcodec_error
from mmfeed.codecs.video import BACKENDS, choose_backend
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.testing import frame_pattern, make_episodes, read_index, write_lerobot, write_video, write_webdataset

needs_torchcodec = pytest.mark.skipif(not torchcodec_available(), reason=str(torchcodec_error()))
CAM = "observation.images.cam_high"
WRIST = "observation.images.cam_wrist"
VIDEOS = {"h264_gop30": ("h264", 30), "av1_gop2": ("av1", 2)}


@pytest.fixture(scope="module", params=sorted(VIDEOS))
def video(request, tmp_path_factory):
    codec, gop = VIDEOS[request.param]
    path = tmp_path_factory.mktemp(request.param) / "v.mp4"
    return write_video(path, frame_pattern(75, height=48, width=64), codec=codec, gop=gop)


def test_registered_by_name_but_never_chosen_by_auto(video):
    """torchcodec is a backend by name; "auto" stays PyAV (torchcodec is optional, so it cannot be the default)."""
    assert BACKENDS["torchcodec"] is TorchCodecReader
    assert choose_backend(probe(video)) == "pyav"
    assert choose_backend(probe(video), "torchcodec") == "torchcodec"


def test_mmfeed_does_not_import_torchcodec_unless_asked():
    code = ("import sys, mmfeed, mmfeed.codecs, mmfeed.loaders; from mmfeed.codecs import DecodeOptions; "
            "DecodeOptions(backend='torchcodec'); print('torchcodec' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_yuv420_is_refused_up_front():
    with pytest.raises(ValueError, match="backend 'torchcodec' cannot deliver frame_format='yuv420'"):
        DecodeOptions(backend="torchcodec", frame_format="yuv420")


@pytest.mark.skipif(importlib.util.find_spec("torchcodec") is None, reason="torchcodec is not installed")
def test_the_link_recipe_makes_torchcodec_load(tmp_path):
    """The module docstring's recipe: PyAV's FFmpeg linked under the standard sonames, that folder alone on
    LD_LIBRARY_PATH of a fresh python, and torchcodec loads and decodes."""
    try:
        standard = link_pyav_ffmpeg(tmp_path / "ffmpeg")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert {name.split(".so")[0] for name in standard} == {
        "libavutil", "libavcodec", "libavformat", "libavdevice", "libavfilter", "libswscale", "libswresample"}
    for soname, target in standard.items():
        assert os.path.realpath(tmp_path / "ffmpeg" / soname) == os.path.realpath(target)
    video = write_video(tmp_path / "v.mp4", frame_pattern(6, height=48, width=64))
    code = ("import sys; from mmfeed.codecs import read_frames; from mmfeed.testing import read_index; "
            "print(read_index(read_frames(sys.argv[1], [5, 1], backend='torchcodec')).tolist())")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path / "ffmpeg")}
    done = subprocess.run([sys.executable, "-c", code, video], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[5, 1]"


@pytest.mark.skipif(torchcodec_available(), reason="torchcodec loads here")
def test_unavailable_torchcodec_is_a_decode_error_that_says_why(video):
    with pytest.raises(DecodeError, match="backend 'torchcodec' is unavailable") as err:
        read_frames(video, [0], backend="torchcodec")
    assert str(torchcodec_error()) in str(err.value) and err.value.path == video


@needs_torchcodec
def test_frames_equal_pyav_exactly(video):
    """Every frame, and a random request in any order with repeats, bit-identical to PyAV's rgb24 frames."""
    every = read_frames(video, backend="torchcodec")
    assert every.shape == (75, 48, 64, 3) and every.dtype == np.uint8
    np.testing.assert_array_equal(every, read_frames(video, backend="pyav"))
    assert read_index(every).tolist() == list(range(75))
    rng = np.random.default_rng(0)
    asked = rng.integers(0, 75, size=20)
    got = read_frames(video, asked, backend="torchcodec")
    np.testing.assert_array_equal(got, read_frames(video, asked, backend="pyav"))
    assert read_index(got).tolist() == asked.tolist()
    by_time = read_frames(video, timestamps=[2.0, 0.5, 1 / 30], backend="torchcodec")
    assert read_index(by_time).tolist() == [60, 15, 1]


@needs_torchcodec
def test_in_memory_bytes_and_coalesced_batches(video):
    """mp4 bytes (as read from a tar member) decode like the path; a coalesced batch through a reader cache
    fills each request's output with its own frames."""
    data = open(video, "rb").read()
    asked = np.array([70, 3, 3, 40])
    np.testing.assert_array_equal(read_frames(memoryview(data), asked, backend="torchcodec"),
                                  read_frames(video, asked, backend="pyav"))
    with VideoReaderCache(max_open=1, backend="torchcodec") as cache:
        got = decode_batch([(data, [9, 0, 74]), (data, [31, 9])], cache=cache)
        assert isinstance(cache.reader(data), TorchCodecReader)
    assert [read_index(g).tolist() for g in got] == [[9, 0, 74], [31, 9]]


@needs_torchcodec
def test_resized_inside_torchcodec_close_to_pyav(video):
    """A size goes to torchcodec's Resize transform: the asked shape, the right frames, and within 20 levels of
    PyAV's resize (measured bound: torchcodec scales after the RGB conversion, PyAV while converting)."""
    for size in ((24, 32), (96, 128)):
        got = read_frames(video, [0, 37, 74], backend="torchcodec", size=size)
        ref = read_frames(video, [0, 37, 74], backend="pyav", size=size)
        assert got.shape == (3, *size, 3)
        assert read_index(got).tolist() == [0, 37, 74]
        diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
        assert diff.max() <= 20 and diff.mean() <= 6, (size, diff.max(), diff.mean())


@needs_torchcodec
def test_failures_are_decode_errors_naming_file_and_frame(video):
    info = probe(video)
    reader = TorchCodecReader(video, info)
    try:
        with pytest.raises(DecodeError, match="frame 75") as err:
            reader.decode(np.array([2, 75]))
        assert (err.value.path, err.value.index, err.value.num_frames) == (video, 75, 75)
    finally:
        reader.close()
    with pytest.raises(DecodeError, match="cannot open"):
        TorchCodecReader(b"not a video at all" * 64, info)


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(3, seed=7, min_length=10, max_length=20, height=48, width=64)


@needs_torchcodec
def test_open_dataset_lerobot_av1_end_to_end(tmp_path, episodes):
    """A LeRobot v3 AV1 directory opened with backend="torchcodec": every frame of every episode is PyAV's frame
    and the frame whose burned-in index is the global row index; a DataLoader batch equals PyAV's batch."""
    root = write_lerobot(tmp_path / "ds", episodes, codec="av1", gop=2)
    mine, theirs = open_dataset(root, backend="torchcodec"), open_dataset(root, backend="pyav")
    requests = [EpisodeRequest(e, {CAM: np.arange(n), WRIST: np.arange(n)[::-1]})
                for e, n in enumerate(mine.lengths.tolist())]
    start = 0
    for request, got, ref in zip(requests, mine.read_many(requests), theirs.read_many(requests)):
        n = len(request.indices[CAM])
        assert read_index(got[CAM]).tolist() == list(range(start, start + n))
        for feature in (CAM, WRIST):
            np.testing.assert_array_equal(got[feature], ref[feature])
        start += n
    spec = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], "action": [0.0, 1 / 30]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), window=spec,
                      plan=PlanConfig(capacity=64, rows_per_batch=2), seed=3)
    batch, ref = (next(iter(DataLoader(src, packing=packing))) for src in (mine, theirs))
    assert batch.data[CAM].shape[0] > 0
    for key in (CAM, f"{CAM}_is_pad", "action"):
        torch.testing.assert_close(batch.data[key], ref.data[key], rtol=0, atol=0)


@needs_torchcodec
def test_open_dataset_webdataset_h264_from_tar_members(tmp_path, episodes):
    """Shards hand the reader mp4 bytes from tar members; torchcodec's frames equal PyAV's."""
    write_webdataset(tmp_path / "shards", episodes, codec="h264", gop=30)
    mine, theirs = (open_dataset(str(tmp_path / "shards"), backend=b) for b in ("torchcodec", "pyav"))
    requests = [EpisodeRequest(e, {CAM: np.arange(n)[::2]}) for e, n in enumerate(mine.lengths.tolist())]
    for e, (got, ref) in enumerate(zip(mine.read_many(requests), theirs.read_many(requests))):
        np.testing.assert_array_equal(got[CAM], ref[CAM])
        assert read_index(got[CAM]).tolist() == read_index(episodes[e].frames("cam_high")[::2]).tolist()
