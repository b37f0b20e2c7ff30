"""Direct RGB conversion (mmfeed.codecs._sws): swscale writing a decoded frame straight into the batch.

It must give PyAV's reformat pixels bit for bit, or decline (the reader then converts through reformat), and it
must never write outside the frame it was given: the direct path is checked against reformat once per layout,
on the real frame, in a guarded scratch array.
"""

import itertools

import av
import numpy as np
import pytest
from av.video.reformatter import VideoReformatter

from mmfeed.codecs import _sws
from mmfeed.codecs._pyav import PyAVReader
from mmfeed.codecs._sws import DirectRGB, swscale_library
from mmfeed.codecs.demux import probe
from mmfeed.codecs.encode import encode_video

needs_lib = pytest.mark.skipif(swscale_library() is None, reason="libswscale is not reachable through ctypes here")
SENTINEL = 0xA5


@pytest.fixture(autouse=True)
def fresh_verdicts():
    """Each test judges its layouts afresh (verdicts are kept for the whole process)."""
    _sws._verdicts.clear()
    yield
    _sws._verdicts.clear()


def random_frame(width: int, height: int, fmt: str, rng: np.random.Generator, colorspace: int = 2,
                 color_range: int = 0) -> av.VideoFrame:
    frame = av.VideoFrame(width, height, fmt)
    for plane in frame.planes:
        data = np.frombuffer(plane, np.uint8)
        if fmt.endswith("10le"):  # 10-bit samples in 16-bit words
            data[:] = np.frombuffer(rng.integers(0, 1024, data.size // 2, dtype=np.uint16).tobytes(), np.uint8)
        else:
            data[:] = rng.integers(0, 256, data.size, dtype=np.uint8)
    frame.colorspace, frame.color_range = colorspace, color_range
    return frame


def reference(width: int, height: int):
    reformatter = VideoReformatter()

    def convert(frame: av.VideoFrame) -> np.ndarray:
        plane = reformatter.reformat(frame, format="rgb24", width=width, height=height, threads=1).planes[0]
        return np.frombuffer(plane, np.uint8).reshape(height, plane.line_size)[:, : width * 3].reshape(
            height, width, 3).copy()
    return convert


def guarded(height: int, width: int, misalign: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A 64-byte aligned (plus ``misalign``) [H, W, 3] view with sentinel bytes on both sides, and the whole."""
    size = height * width * 3
    raw = np.full(size + 256, SENTINEL, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + 64 + misalign
    return raw[start : start + size].reshape(height, width, 3), raw


def outside(view: np.ndarray, raw: np.ndarray) -> np.ndarray:
    start = view.ctypes.data - raw.ctypes.data
    return np.concatenate([raw[:start], raw[start + view.nbytes :]])


@needs_lib
@pytest.mark.parametrize("fmt", ["yuv420p", "yuvj420p", "yuv444p", "nv12", "yuv420p10le"])
def test_direct_equals_reformat_or_declines(fmt):
    """Every layout: the direct pixels are reformat's, bit for bit, or the frame is declined with its array
    untouched; nothing is ever written outside the frame. The common layouts are taken."""
    rng = np.random.default_rng(0)
    taken = []
    for (sw, sh), size, (cs, rg), misalign in itertools.product(
            [(320, 240), (64, 48), (24, 16), (100, 60), (130, 98)], [None, (224, 224), (32, 16), (50, 30)],
            [(2, 0), (1, 1), (5, 2), (9, 1)], [0, 16, 8]):
        w, h = (sw, sh) if size is None else size
        frame = random_frame(sw, sh, fmt, rng, cs, rg)
        convert = reference(w, h)
        direct = DirectRGB()
        for _ in range(2):  # the first frame of a layout is checked, the second takes the checked path
            out, raw = guarded(h, w, misalign)
            did = direct.convert_into(frame, out, convert)
            if did:
                np.testing.assert_array_equal(out, convert(frame))
            else:
                assert (raw == SENTINEL).all()
            assert (outside(out, raw) == SENTINEL).all()
        direct.close()
        taken.append(((sw, sh), (w, h), misalign, did))
    for (sw, sh), (w, h), misalign, did in taken:
        if w % 16 or misalign % 16:
            assert not did, (sw, sh, w, h, misalign)  # rows that SIMD converters may overrun are never taken
    assert any(did for *_, did in taken if _[0] == (320, 240) and _[1] == (320, 240))


def test_the_libraries_are_pyavs_own_even_beside_decords():
    """decord maps FFmpeg libraries of its own (other major versions); the ones driven are those PyAV reports."""
    pytest.importorskip("decord")
    import decord  # noqa: F401

    lib = swscale_library()
    if lib is None:
        pytest.skip("libswscale is not reachable through ctypes here")
    for library, name in zip(lib, ("libswscale", "libavutil")):
        got = getattr(library, name[3:] + "_version")()
        assert (got >> 16, (got >> 8) & 0xFF, got & 0xFF) == tuple(av.library_versions[name])
        assert "decord" not in library._name


@needs_lib
def test_a_layout_that_fails_its_check_is_declined():
    """The check is what admits a layout: against a reference it disagrees with, the layout is refused (for the
    process) and the destination is left alone."""
    frame = random_frame(64, 32, "yuv420p", np.random.default_rng(1))
    wrong = lambda f: np.zeros((32, 64, 3), np.uint8)  # noqa: E731
    for direct in (DirectRGB(), DirectRGB()):
        out, raw = guarded(32, 64)
        assert not direct.convert_into(frame, out, wrong)
        assert (raw == SENTINEL).all()
        assert not direct.convert_into(frame, out, reference(64, 32))  # refused: not checked again
    _sws._verdicts.clear()
    direct = DirectRGB()
    out, raw = guarded(32, 64)
    assert direct.convert_into(frame, out, reference(64, 32))
    np.testing.assert_array_equal(out, reference(64, 32)(frame))
    direct.close()
    assert not direct.convert_into(frame, out, reference(64, 32))  # closed: back to reformat


def tagged_video(tmp_path, colorspace: str, color_range: str, codec: str = "libx264", pix_fmt: str = "yuv420p"):
    """A real H.264 file whose stream is tagged with a matrix and a range."""
    rng = np.random.default_rng(2)
    path = tmp_path / f"{colorspace}_{color_range}_{pix_fmt}.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=30)
        stream.width, stream.height, stream.pix_fmt = 320, 240, pix_fmt
        stream.codec_context.colorspace = getattr(av.video.reformatter.Colorspace, colorspace)
        stream.codec_context.color_range = getattr(av.video.reformatter.ColorRange, color_range)
        stream.options = {"g": "4", "bf": "0"}
        yy, xx = np.mgrid[0:240, 0:320]
        for t in range(8):
            img = np.stack([(xx + 9 * t) % 256, (yy * 2 + t) % 256, (xx + yy) % 256], axis=-1).astype(np.uint8)
            img = np.clip(img.astype(int) + rng.integers(-20, 20, img.shape), 0, 255).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return str(path)


@needs_lib
@pytest.mark.parametrize("colorspace,color_range,pix_fmt", [("ITU709", "MPEG", "yuv420p"),
                                                            ("ITU601", "JPEG", "yuv420p"),
                                                            ("ITU709", "JPEG", "yuvj420p")])
def test_reader_frames_identical_with_and_without_direct(tmp_path, colorspace, color_range, pix_fmt):
    """A PyAV reader with the direct path gives the frames it gave through reformat, on real tagged H.264 files
    and an AV1 one, at the stored size and scaled (where H.264's chroma sits left, AV1's centred), and it did
    take the direct path."""
    paths = [tagged_video(tmp_path, colorspace, color_range, pix_fmt=pix_fmt)]
    yy, xx = np.mgrid[0:240, 0:320]
    frames = np.stack([np.stack([(xx * 4 + t) % 256, (yy * 5) % 256, (xx + yy + 30 * t) % 256], -1)
                       for t in range(6)]).astype(np.uint8)
    av1 = tmp_path / "av1.mp4"
    av1.write_bytes(encode_video(frames, fps=30.0, codec="av1", gop=2))
    paths.append(str(av1))
    for path in paths:
        info = probe(path)
        for size in (None, (32, 48), (224, 224)):
            direct = PyAVReader(path, info, size=size)
            plain = PyAVReader(path, info, size=size)
            plain._direct.close()  # reformat only
            idx = np.arange(0, info.num_frames, 1)
            got, want = direct.decode(idx), plain.decode(idx)
            np.testing.assert_array_equal(got, want)
            assert direct._direct.taken, f"{path} {size}: the direct path was never taken"
            direct.close()
            plain.close()


@needs_lib
def test_flat_first_frames_leave_the_siting_open(tmp_path):
    """Grey frames (flat chroma) cannot tell the chroma sitings apart: a scaled layout converts them through
    reformat and settles on the stream's siting at the first coloured frame; every frame equals reformat's."""
    yy, xx = np.mgrid[0:96, 0:128]
    colour = np.stack([(xx * 4) % 256, (yy * 5) % 256, (xx + yy) % 256], -1).astype(np.uint8)
    frames = np.stack([np.full((96, 128, 3), 90, np.uint8)] * 3 + [np.roll(colour, t, 1) for t in range(5)])
    path = tmp_path / "grey_then_colour.mp4"
    path.write_bytes(encode_video(frames, fps=30.0, codec="h264", gop=4))
    info = probe(str(path))
    direct, plain = PyAVReader(str(path), info, size=(48, 64)), PyAVReader(str(path), info, size=(48, 64))
    plain._direct.close()
    taken = []
    for i in range(info.num_frames):
        np.testing.assert_array_equal(direct.decode(np.array([i])), plain.decode(np.array([i])))
        taken.append(direct._direct.taken)
    assert taken[2] == 0 and taken[-1] > 0, taken
    assert list(direct._direct._sitings.values()) == [(0, 128)]  # H.264: left (one layout, whatever the alignment)
