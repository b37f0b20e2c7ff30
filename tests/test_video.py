"""read_frames returns the frames asked for, in the order asked, from every backend that opens the file.

Real mp4 files are encoded with PyAV (tiny 64x48 frames whose pixels spell their own index) and read back; the
index decoded from the pixels is the ground truth for "the frame we got is the frame we asked for".
"""

import av
import numpy as np
import pytest
import torch

from mmfeed.codecs import DecodeError, choose_backend, probe, read_frames
from mmfeed.codecs._decord import decord_available
from mmfeed.testing import frame_pattern, read_index, write_video

H, W, N = 48, 64, 60
VIDEOS = {  # name -> (codec, gop, bframes)
    "h264_gop30": ("h264", 30, 0),
    "h264_gop2": ("h264", 2, 0),
    "av1_gop2": ("av1", 2, 0),
    "h264_bframes": ("h264", 10, 2),
    "hevc_open_gop": ("hevc", 10, 0),  # x265's defaults: B-frames and open GOPs (leading pictures)
}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("videos")
    frames = frame_pattern(N, height=H, width=W)
    return {
        name: write_video(root / f"{name}.mp4", frames, codec=codec, gop=gop, bframes=bf)
        for name, (codec, gop, bf) in VIDEOS.items()
    }


def backends_for(name):
    """Every backend that can open the video: PyAV always, decord for H.264 when installed."""
    out = ["pyav"]
    if VIDEOS[name][0] == "h264" and decord_available():
        out.append("decord")
    return out


CASES = [(name, backend) for name in VIDEOS for backend in backends_for(name)]


def sequential_pyav(path):
    with av.open(path) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


@pytest.mark.parametrize("name,backend", CASES)
def test_index_read_from_pixels_equals_index_asked_in_order_with_repeats(videos, name, backend):
    asked = [0, 59, 31, 30, 29, 1, 1, 45, 2, 58, 59, 0]
    frames = read_frames(videos[name], indices=asked, backend=backend)
    assert frames.shape == (len(asked), H, W, 3) and frames.dtype == np.uint8
    assert read_index(frames).tolist() == asked


@pytest.mark.parametrize("name,backend", CASES)
def test_frames_equal_pyav_sequential_decode(videos, name, backend):
    reference = sequential_pyav(videos[name]).astype(np.int16)
    every = read_frames(videos[name], backend=backend)  # no selection: every frame
    assert every.shape == reference.shape
    assert np.abs(every.astype(np.int16) - reference).mean() < 1
    picks = np.random.default_rng(7).integers(0, N, size=10)
    some = read_frames(videos[name], indices=picks, backend=backend)
    assert np.abs(some.astype(np.int16) - reference[picks]).mean() < 1


def test_probe_counts_frames_from_packets_and_flags_keyframes(videos):
    info = probe(videos["h264_gop30"])
    assert info.num_frames == N and (info.width, info.height) == (W, H) and info.fps == pytest.approx(30)
    assert info.keyframes().tolist() == [0, 30]
    assert info.gop_start.tolist() == [0] * 30 + [30] * 30
    assert info.duration == pytest.approx(N / 30)
    bf = probe(videos["h264_bframes"])  # decode order differs from presentation order: pts still sorted
    assert np.all(np.diff(bf.pts) > 0) and bf.keyframes().tolist() == [0, 10, 20, 30, 40, 50]
    assert probe(videos["av1_gop2"]).codec == "av1"


def test_auto_picks_pyav_and_decord_only_by_name(videos):
    assert choose_backend(probe(videos["av1_gop2"])) == "pyav"
    assert choose_backend(probe(videos["h264_gop30"])) == "pyav"
    assert choose_backend(probe(videos["h264_gop30"]), "decord") == "decord"
    with pytest.raises(ValueError, match="unknown video backend 'opencv'"):
        read_frames(videos["h264_gop30"], [0], backend="opencv")


@pytest.mark.parametrize("backend", ["pyav", "decord"])
def test_timestamps_pick_episode_frames_in_concatenated_video(tmp_path, backend):
    """LeRobot v3 layout: episodes back to back in one file; frame i of episode e is at from_timestamp + i / fps,
    and the times survive float32 storage and summation noise."""
    if backend == "decord" and not decord_available():
        pytest.skip("decord is not installed")
    fps, lengths = 30, [17, 25, 9, 21]
    path = write_video(tmp_path / "concat.mp4", frame_pattern(sum(lengths), height=H, width=W), fps=fps, gop=10)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rng = np.random.default_rng(3)
    for ep, (start, length) in enumerate(zip(starts, lengths)):
        from_ts = np.float32(start / fps)  # LeRobot keeps from_timestamp as float32 in parquet
        i = rng.integers(0, length, size=6)
        ts = (np.float64(from_ts) + i / fps + rng.uniform(-1e-6, 1e-6, size=6)).astype(np.float32)
        got = read_frames(path, timestamps=ts.astype(np.float64), backend=backend)
        assert read_index(got).tolist() == (start + i).tolist(), f"episode {ep}"


def test_timestamp_between_frames_needs_tolerance(videos):
    path = videos["h264_gop30"]
    half = (10 + 0.4) / 30
    with pytest.raises(DecodeError, match=r"h264_gop30\.mp4.*no frame within"):
        read_frames(path, timestamps=[half], backend="pyav")
    assert read_index(read_frames(path, timestamps=[half], tolerance_s=0.02, backend="pyav")).tolist() == [10]


@pytest.mark.parametrize("name,backend", CASES)
def test_out_of_range_and_negative_indices_name_file_index_and_length(videos, name, backend):
    for bad in (N, N + 100, -1):
        with pytest.raises(DecodeError, match=rf"{name}\.mp4: frame index {bad} .* video of {N} frames") as info:
            read_frames(videos[name], indices=[0, bad], backend=backend)
        assert info.value.index == bad and info.value.num_frames == N and isinstance(info.value, ValueError)


def test_timestamp_beyond_duration_names_time_and_duration(videos):
    with pytest.raises(DecodeError, match=r"h264_gop30\.mp4.*time 2\.500000 s.*60 frames") as info:
        read_frames(videos["h264_gop30"], timestamps=[0.0, 2.5])
    assert info.value.timestamp == 2.5 and info.value.duration == pytest.approx(2.0)
    with pytest.raises(DecodeError, match="time -0.100000 s"):
        read_frames(videos["h264_gop30"], timestamps=[-0.1])


def _audio_only(path):
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        for i in range(8):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return str(path)


@pytest.mark.parametrize("backend", ["auto", "pyav", "decord"])
def test_unreadable_files_raise_decode_error_naming_the_file(videos, tmp_path, backend):
    if backend == "decord" and not decord_available():
        pytest.skip("decord is not installed")
    data = open(videos["h264_gop30"], "rb").read()
    (tmp_path / "zero.mp4").write_bytes(b"")
    (tmp_path / "half.mp4").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.mp4").write_bytes(np.random.default_rng(0).bytes(4000))
    cases = {
        "zero.mp4": "empty",
        "half.mp4": "not a readable video",
        "garbage.mp4": "not a readable video",
        "audio.mp4": "no video stream",
        "missing.mp4": "no such video file",
    }
    _audio_only(tmp_path / "audio.mp4")
    for fname, why in cases.items():
        with pytest.raises(DecodeError, match=why) as info:
            read_frames(tmp_path / fname, indices=[0], backend=backend)
        assert fname in str(info.value) and info.value.path.endswith(fname)


@pytest.mark.skipif(not decord_available(), reason="decord is not installed")
def test_decord_refuses_av1_with_a_clear_error(videos):
    with pytest.raises(DecodeError, match=r"av1_gop2\.mp4: decord cannot open AV1.*backend='pyav'"):
        read_frames(videos["av1_gop2"], indices=[0], backend="decord")


@pytest.mark.skipif(not decord_available(), reason="decord is not installed")
def test_open_gop_video_goes_to_pyav_because_decord_seeks_it_wrongly(videos):
    """decord 0.6 returns frame 15 for frame 11 of this file; mmfeed keeps such files away from it."""
    info = probe(videos["hevc_open_gop"])
    assert info.codec == "hevc" and info.open_gop and not probe(videos["h264_bframes"]).open_gop
    assert choose_backend(info) == "pyav"
    with pytest.raises(DecodeError, match=r"hevc_open_gop\.mp4: decord returns wrong frames .* open GOPs"):
        read_frames(videos["hevc_open_gop"], indices=[11], backend="decord")
    assert read_index(read_frames(videos["hevc_open_gop"], indices=[11, 29, 3])).tolist() == [11, 29, 3]


@pytest.mark.parametrize("name,backend", [c for c in CASES if c[0] in ("h264_gop30", "av1_gop2")])
def test_resize_at_decode_then_crop(videos, name, backend):
    full = read_frames(videos[name], indices=[4, 40], backend="pyav").astype(np.float32)
    small = read_frames(videos[name], indices=[4, 40], backend=backend, size=(24, 32))
    assert small.shape == (2, 24, 32, 3) and small.flags.c_contiguous
    pooled = full.reshape(2, 24, 2, 32, 2, 3).mean(axis=(2, 4))
    assert np.abs(small.astype(np.float32) - pooled).mean() < 12  # a real downscale of the same frames
    cropped = read_frames(videos[name], indices=[4, 40], backend=backend, size=(24, 32), crop=(2, 3, 10, 20))
    assert cropped.shape == (2, 10, 20, 3) and cropped.flags.c_contiguous
    assert np.array_equal(cropped, small[:, 2:12, 3:23])
    with pytest.raises(ValueError, match="does not fit"):
        read_frames(videos[name], indices=[0], backend=backend, crop=(40, 0, 10, 10))


def test_output_is_contiguous_and_shares_memory_with_torch(videos):
    frames = read_frames(videos["h264_gop2"], indices=[3, 1, 3])
    assert frames.flags.c_contiguous and frames.flags.writeable
    tensor = torch.from_numpy(frames)
    assert tensor.data_ptr() == frames.ctypes.data and tensor.shape == (3, H, W, 3)


def test_threads_and_in_memory_bytes_give_the_same_frames(videos):
    path = videos["h264_gop30"]
    one = read_frames(path, indices=[33, 5], backend="pyav")
    assert np.array_equal(read_frames(path, indices=[33, 5], backend="pyav", threads=2), one)
    data = open(path, "rb").read()
    assert np.array_equal(read_frames(data, indices=[33, 5], backend="pyav"), one)
    assert read_index(read_frames(data, indices=[33, 5])).tolist() == [33, 5]
    with pytest.raises(DecodeError, match="<0 bytes in memory>"):
        read_frames(b"", indices=[0])


@pytest.mark.parametrize("name", ["h264_gop30", "av1_gop2"])
def test_pyav_reader_recovers_when_the_decoder_passed_or_ended_before_the_target(videos, name):
    # A decoder that is not where the reader believes (an inexact seek, frames that need an earlier GOP) passes
    # the target or ends without producing it; the reader seeks back and still returns the frame asked for.
    from mmfeed.codecs._pyav import PyAVReader

    path = videos[name]
    info = probe(path)
    reader = PyAVReader(path, info)
    try:
        got = []
        for ahead, target in ((40, 35), (N - 1, N - 1)):
            reader.decode(np.array([ahead]))  # the live decode stands at `ahead` (the last frame: at its end)
            reader._pos = int(info.gop_start[target]) - 1  # but the reader believes it is just before the GOP
            seeks = reader.seeks
            got.append(reader.decode(np.array([target]))[0])
            assert reader.seeks > seeks  # it had to seek back
        assert read_index(np.stack(got)).tolist() == [35, N - 1]
        assert np.array_equal(np.stack(got), read_frames(path, indices=[35, N - 1], backend="pyav"))
    finally:
        reader.close()


def test_bad_arguments_raise_value_or_type_errors_naming_the_fix(videos):
    path = videos["h264_gop30"]
    with pytest.raises(TypeError, match="timestamps="):
        read_frames(path, indices=[0.5])
    with pytest.raises(ValueError, match="not both"):
        read_frames(path, indices=[0], timestamps=[0.0])
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        read_frames(path, indices=[0], threads=0)
    with pytest.raises(ValueError, match="size must be"):
        read_frames(path, indices=[0], size=(24,))
    assert read_frames(path, indices=[]).shape == (0, H, W, 3)


def _faststart_copy(src, dst):
    with av.open(src) as inp, av.open(str(dst), "w", options={"movflags": "faststart"}) as out:
        stream = inp.streams.video[0]
        ostream = out.add_stream_from_template(stream)
        for packet in inp.demux(stream):
            if packet.dts is not None:
                packet.stream = ostream
                out.mux(packet)
    return str(dst)


def test_truncated_faststart_file_counts_only_stored_frames_and_never_returns_wrong_ones(videos, tmp_path):
    """With the index at the front, a cut file still opens: its length is what its packets hold, frames before
    the cut decode correctly, frames past it are out of range, and the damaged frame raises or decodes right."""
    full = _faststart_copy(videos["h264_gop30"], tmp_path / "fast.mp4")
    data = open(full, "rb").read()
    (tmp_path / "cut.mp4").write_bytes(data[: len(data) // 2])
    cut = str(tmp_path / "cut.mp4")
    n = probe(cut).num_frames
    assert 2 <= n < N
    for backend in backends_for("h264_gop30"):
        with pytest.raises(DecodeError, match=rf"cut\.mp4: frame index {N - 1} is out of range.* {n} frames"):
            read_frames(cut, indices=[N - 1], backend=backend)
    assert read_index(read_frames(cut, indices=[n - 2, 0], backend="pyav")).tolist() == [n - 2, 0]
    try:
        last = read_frames(cut, indices=[n - 1], backend="pyav")
    except DecodeError as exc:
        assert "cut.mp4" in str(exc) and exc.index == n - 1
    else:
        assert read_index(last).tolist() == [n - 1]
