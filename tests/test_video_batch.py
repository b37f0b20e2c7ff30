"""Coalesced batch decode returns exactly what one-by-one decode returns, decoding each needed GOP once."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.codecs import DecodeError, FrameRequest, VideoReaderCache, decode_batch, read_frames
from mmfeed.codecs._decord import decord_available
from mmfeed.codecs.demux import probe
from mmfeed.codecs.video import DecodeOptions, decode_requests, open_reader
from mmfeed.testing import frame_pattern, read_index, write_video

H, W, N = 48, 64, 90
BACKENDS = ["pyav"] + (["decord"] if decord_available() else [])


def indices_of(frames):
    """The frame indices the pixels spell (read_index does not take an empty batch)."""
    return read_index(frames).tolist() if len(frames) else []


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch")
    frames = frame_pattern(N, height=H, width=W, seed=1)
    return {
        "h264": write_video(root / "h264.mp4", frames, codec="h264", gop=30),
        "av1": write_video(root / "av1.mp4", frames[:40], codec="av1", gop=2),
        "h264_short": write_video(root / "short.mp4", frames[:20], codec="h264", gop=5),
    }


def _requests(data, videos, backend):
    names = ["h264", "h264_short"] + (["av1"] if backend == "pyav" else [])
    lengths = {"h264": N, "av1": 40, "h264_short": 20}
    reqs = []
    for _ in range(data.draw(st.integers(1, 6), label="n_requests")):
        name = data.draw(st.sampled_from(names))
        n = lengths[name]
        if data.draw(st.booleans(), label="clip"):
            start = data.draw(st.integers(0, n - 4))
            idx = list(range(start, min(n, start + data.draw(st.integers(1, 8)))))
        else:
            idx = data.draw(st.lists(st.integers(0, n - 1), min_size=0, max_size=5))
        reqs.append((videos[name], idx))
    return reqs


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15)
@given(data=st.data())
def test_batch_equals_one_by_one_decode(videos, backend, data):
    """Whatever the mix of files, clips, sparse, unsorted and repeated frames, the coalesced batch holds exactly
    the frames that separate read_frames calls return, request by request, in order."""
    reqs = _requests(data, videos, backend)
    with VideoReaderCache(max_open=2, backend=backend) as cache:
        batch = decode_batch(reqs, cache=cache)
    assert len(batch) == len(reqs)
    for (path, idx), got in zip(reqs, batch):
        want = read_frames(path, indices=idx, backend=backend)
        assert got.shape == want.shape and got.flags.c_contiguous
        assert np.array_equal(got, want)
        assert indices_of(got) == list(idx)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(0, N - 1), min_size=1, max_size=8), min_size=1, max_size=16))
def test_a_batch_decodes_the_least_any_decoder_must(videos, requests):
    """With one reference chain per GOP (no B-frames), frame k of a GOP needs every frame from the GOP's keyframe
    to k: a fresh batch decodes exactly, summed over the GOPs it touches, keyframe through last wanted frame."""
    wanted = np.unique(np.concatenate(requests))
    minimal = sum(int(wanted[wanted // 30 == g].max()) - 30 * int(g) + 1 for g in np.unique(wanted // 30))
    with VideoReaderCache(backend="pyav") as cache:
        out = decode_batch([(videos["h264"], r) for r in requests], cache=cache)
        assert [indices_of(o) for o in out] == requests
        assert cache.reader(videos["h264"]).frames_decoded == minimal


def test_each_gop_is_decoded_once_for_all_its_wanted_frames(videos):
    """Frames 3 and 10 (GOP 0) and 40, 41 (GOP 1) cost one pass through frames 0..10 and one seek to 30."""
    with VideoReaderCache(backend="pyav") as cache:
        out = decode_batch([(videos["h264"], [41, 10]), (videos["h264"], [3, 40, 10])], cache=cache)
        reader = cache.reader(videos["h264"])
        assert [read_index(o).tolist() for o in out] == [[41, 10], [3, 40, 10]]
        assert reader.seeks == 2
        assert reader.frames_decoded <= (10 + 1) + (41 - 30 + 1)
        # A later batch further on in the same GOP, running into the next GOP's first frames, carries on
        # decoding from where the reader stands: no seek, and no frame decoded twice.
        seeks, decoded = reader.seeks, reader.frames_decoded
        assert indices_of(decode_batch([(videos["h264"], [57, 61, 59])], cache=cache)[0]) == [57, 61, 59]
        assert reader.seeks == seeks and reader.frames_decoded - decoded == 61 - 41
        # Going back needs a seek to the keyframe of the wanted GOP.
        assert indices_of(decode_batch([(videos["h264"], [35])], cache=cache)[0]) == [35]
        assert reader.seeks == seeks + 1
        # Decoding to the end of the stream drains the decoder; seeking back afterwards still works.
        assert indices_of(cache.read(videos["h264"], [N - 1])) == [N - 1]
        assert indices_of(cache.read(videos["h264"], [1, 0])) == [1, 0]


def test_cache_reuses_open_files_and_closes_least_recently_used(videos):
    with VideoReaderCache(max_open=2, backend="pyav") as cache:
        for name in ["h264", "h264", "av1", "h264"]:
            cache.read(videos[name], [1])
        assert cache.opened == 2 and len(cache) == 2
        cache.read(videos["h264_short"], [1])  # av1 is the least recently used: closed
        cache.read(videos["h264"], [2])
        assert cache.opened == 3 and len(cache) == 2
        cache.read(videos["av1"], [2])
        assert cache.opened == 4
    assert len(cache) == 0


def test_cache_pickles_without_open_files_and_works_after(videos):
    cache = VideoReaderCache(max_open=3, backend="pyav", size=(24, 32))
    cache.read(videos["h264"], [0])
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone) == 0 and clone.options == cache.options and clone.max_open == 3
    assert clone.read(videos["h264"], [5]).shape == (1, 24, 32, 3)
    cache.close()
    clone.close()


def test_mixed_timestamp_and_index_requests_and_empty_ones(videos):
    path = videos["h264"]
    out = decode_batch(
        [
            FrameRequest(path, timestamps=[1.0, 0.5, 1.0]),
            (path, []),
            FrameRequest(videos["av1"], indices=[39, 0]),
            (path, np.array([2, 2], dtype=np.int32)),
        ]
    )
    assert [indices_of(o) for o in out] == [[30, 15, 30], [], [39, 0], [2, 2]]
    assert out[1].shape == (0, H, W, 3)


def test_batch_errors_name_the_file_and_bad_requests_name_the_fix(videos):
    with pytest.raises(DecodeError, match=r"short\.mp4: frame index 20 is out of range for a video of 20 frames"):
        decode_batch([(videos["h264"], [1]), (videos["h264_short"], [20])])
    with pytest.raises(TypeError, match="FrameRequest\\(path, timestamps=...\\)"):
        decode_batch([(videos["h264"], [0.5])])
    with pytest.raises(TypeError, match="FrameRequest or a \\(path, indices\\) pair"):
        decode_batch([videos["h264"]])
    with pytest.raises(ValueError, match="max_open"):
        VideoReaderCache(max_open=0)


def test_in_memory_sources_are_cached_while_referenced(videos):
    data = open(videos["h264_short"], "rb").read()
    with VideoReaderCache(backend="pyav") as cache:
        first = cache.read(data, [4, 0])
        again = cache.read(data, [19])
        assert cache.opened == 1
        assert indices_of(first) == [4, 0] and indices_of(again) == [19]
        assert np.array_equal(first, read_frames(videos["h264_short"], [4, 0], backend="pyav"))


def test_forked_worker_opens_its_own_readers(videos):
    """A cache used in the parent and inherited by fork() (not pickled) must not share the parent's open files."""
    import multiprocessing as mp

    cache = VideoReaderCache(backend="pyav")
    cache.read(videos["h264"], [50])  # the parent's reader now stands at frame 50
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(cache, videos["h264"], queue), daemon=True)
    child.start()
    got, opened = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert got == [3, 1] and opened == 2  # the inherited reader was dropped and a new one opened
    assert indices_of(cache.read(videos["h264"], [51])) == [51] and cache.opened == 1
    cache.close()


def _read_in_child(cache, path, queue):
    result = (indices_of(cache.read(path, [3, 1])), cache.opened)
    cache.close()  # closes only what the child opened
    queue.put(result)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 39), min_size=0, max_size=6), min_size=1, max_size=4),
       st.sampled_from(["rgb24", "yuv420"]), st.booleans(), st.lists(st.booleans(), min_size=4, max_size=4))
def test_requests_into_given_outputs_hold_every_place_of_every_frame(videos, wanted, frame_format, crop, strided):
    """decode_requests writes each frame into every place that asks for it, repeats within and across requests
    included: into given outputs, contiguous (written straight into the first place, copied to the others) or
    strided (through the sink, every place), cropped or not, RGB or I420 planes; as read_frames returns them."""
    path = videos["av1"]
    options = DecodeOptions(backend="pyav", frame_format=frame_format, crop=(2, 4, 32, 48) if crop else None)
    info = probe(path)
    want = [read_frames(path, indices=w, backend="pyav", frame_format=frame_format, crop=options.crop)
            if w else None for w in wanted]
    step = next((x.shape[1:] for x in want if x is not None), None)
    if step is None:
        return
    outs = []
    for w, s in zip(wanted, strided):  # a strided output: every other frame of a larger array
        outs.append(np.zeros((2 * len(w), *step), np.uint8)[::2] if s else np.zeros((len(w), *step), np.uint8))
    reader = open_reader(path, options, info)
    try:
        got = decode_requests(reader, options, info, [np.asarray(w, np.int64) for w in wanted], outs)
    finally:
        reader.close()
    for w, g, o, x in zip(wanted, got, outs, want):
        assert g is o
        if w:
            assert np.array_equal(g, x)
