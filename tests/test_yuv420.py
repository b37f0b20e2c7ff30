"""frame_format="yuv420": I420 planes from the decoder, through the loader's shared memory, to RGB on the device.

The conversion (mmfeed.codecs.colour) reproduces swscale's x86 arithmetic, so on x86 it must give PyAV's rgb24 of
the same planes (mmfeed's RGB path) within one level, in fact bit for bit, on real H.264 and AV1 video.
"""

import itertools
import os
import platform

import av
import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.codecs import DecodeOptions, read_frames
from mmfeed.codecs.colour import MATRICES, yuv420_planes, yuv420_to_rgb, yuv420_to_rgb_torch
from mmfeed.codecs.encode import encode_video
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

X86 = platform.machine().lower() in ("x86_64", "amd64")
on_x86 = pytest.mark.skipif(not X86, reason="PyAV's rgb24 is swscale's x86 (SSSE3) arithmetic only on x86; other "
                                            "CPUs run other code (see test_torch_arithmetic_is_bt601)")
CAM = "observation.images.cam_high"


def natural(n: int, height: int, width: int, seed: int) -> np.ndarray:
    """Frames with what camera images have: smooth colour gradients that move, hard-edged coloured objects
    (saturated chroma edges) and sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    discs = [(rng.uniform(0, height), rng.uniform(0, width), rng.uniform(3, height / 4), rng.uniform(0, 255, 3),
              rng.uniform(-2, 2, 2)) for _ in range(6)]
    out = np.empty((n, height, width, 3), np.float32)
    for t in range(n):
        for c in range(3):
            out[t, ..., c] = 128 + 100 * np.sin(xx / (17 + 5 * c) + yy / (23 - 3 * c) + t / 4 + c)
        for cy, cx, r, colour, (vy, vx) in discs:
            out[t][(yy - cy - vy * t) ** 2 + (xx - cx - vx * t) ** 2 < r * r] = colour
        out[t] += rng.normal(0, 6, (height, width, 3))
    return np.clip(out, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module", params=["h264", "av1"])
def video(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("yuv") / f"{request.param}.mp4"
    path.write_bytes(encode_video(natural(8, 96, 128, seed=1), fps=30.0, codec=request.param, gop=4))
    return str(path)


def level_diff(a, b) -> int:
    return int(np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).max())


def pyav_rgb(planes: np.ndarray, **reformat) -> np.ndarray:
    """PyAV's rgb24 of I420 frames, one swscale call per frame (the unscaled converter)."""
    return np.stack([av.VideoFrame.from_ndarray(p, format="yuv420p").reformat(format="rgb24", **reformat).to_ndarray()
                     for p in planes])


def test_rgb_path_is_pyavs_rgb24(video):
    """The reference: mmfeed's RGB path (one reformatter per file, one swscale thread per call) gives exactly
    PyAV's own rgb24 of each frame, with and without a decode-time size."""
    with av.open(video) as container:
        frames = list(container.decode(video=0))
    assert np.array_equal(read_frames(video), np.stack([f.to_ndarray(format="rgb24") for f in frames]))
    sized = np.stack([f.reformat(width=64, height=48, format="rgb24").to_ndarray() for f in frames])
    assert np.array_equal(read_frames(video, size=(48, 64)), sized)


@on_x86
def test_conversion_matches_the_rgb_path_on_real_video(video):
    """Without a decode-time size: planes [N, H*3/2, W], half the bytes, and RGB from them on torch (the device's
    code, here on the CPU) and from swscale equal what the RGB decode path gives, frame for frame."""
    wanted = [7, 0, 3, 3, 5]
    rgb = read_frames(video, wanted)
    planes = read_frames(video, wanted, frame_format="yuv420")
    assert planes.shape == (5, 144, 128) and planes.dtype == np.uint8 and planes.nbytes * 2 == rgb.nbytes
    torch_rgb = yuv420_to_rgb_torch(torch.from_numpy(planes))
    assert torch_rgb.shape == (5, 96, 128, 3) and torch_rgb.dtype == torch.uint8
    assert level_diff(torch_rgb, rgb) <= 1
    assert level_diff(yuv420_to_rgb(planes), rgb) <= 1  # numpy: swscale itself
    assert (np.abs(rgb.astype(int) - rgb.mean()) > 40).mean() > 0.1, "the content has colour, not flat grey"


@on_x86
def test_conversion_matches_pyav_for_every_matrix_and_range(video):
    planes = read_frames(video, [1, 6], frame_format="yuv420")
    names = {"bt601": "ITU601", "bt709": "ITU709", "fcc": "FCC", "smpte240m": "SMPTE240M", "bt2020": "BT2020"}
    assert set(names) == set(MATRICES)
    for matrix, sws in names.items():
        for full in (False, True):
            want = pyav_rgb(planes, src_colorspace=sws, src_color_range="JPEG" if full else "MPEG")
            got = yuv420_to_rgb_torch(torch.from_numpy(planes), matrix=matrix, full_range=full)
            assert level_diff(got, want) <= 1, (matrix, full)


def test_torch_arithmetic_is_bt601(video):
    """On any CPU: the conversion is BT.601 limited range (the exact float formula, within swscale's rounding)."""
    planes = read_frames(video, [2], frame_format="yuv420")
    y, u, v = (p.double().numpy() for p in yuv420_planes(torch.from_numpy(planes)))
    u, v = (np.repeat(np.repeat(c, 2, axis=-2), 2, axis=-1) - 128 for c in (u, v))
    luma, k = (y - 16) * 255 / 219, 255 / 224
    exact = np.stack([luma + 1.402 * k * v, luma - 0.344136 * k * u - 0.714136 * k * v, luma + 1.772 * k * u], -1)
    assert level_diff(yuv420_to_rgb_torch(torch.from_numpy(planes)), np.clip(np.round(exact), 0, 255)) <= 3


@on_x86
def test_decode_time_size(video):
    """With a size, swscale scales inside the decoder to yuv420p; converting those planes gives PyAV's rgb24 of
    them. The RGB path scales straight to RGB (its own chroma filtering, luma above 8 bits), so the two differ by
    a level or two on average: a gap a 4:2:0 frame cannot close, bounded here (a wrong plane order or matrix
    gives tens of levels)."""
    planes = read_frames(video, [0, 4], size=(48, 64), frame_format="yuv420")
    assert planes.shape == (2, 72, 64)
    got = yuv420_to_rgb_torch(torch.from_numpy(planes)).numpy()
    assert level_diff(got, pyav_rgb(planes)) <= 1
    direct = read_frames(video, [0, 4], size=(48, 64)).astype(np.int16)
    assert np.abs(got.astype(np.int16) - direct).mean() < 4
    swapped = planes.copy()
    swapped[:, 48:60], swapped[:, 60:] = planes[:, 60:], planes[:, 48:60]
    assert np.abs(yuv420_to_rgb(swapped).astype(np.int16) - direct).mean() > 8
    # A size equal to the stored one is no scaling: the decoder's planes as they are.
    same = read_frames(video, [0, 4], size=(96, 128), frame_format="yuv420")
    assert np.array_equal(same, read_frames(video, [0, 4], frame_format="yuv420"))


@on_x86
def test_odd_half_height_and_crop(tmp_path):
    """H/2 odd (U ends half-way through a row of the [H*3/2, W] array) and a crop cut plane by plane."""
    path = tmp_path / "v.mp4"
    path.write_bytes(encode_video(natural(3, 50, 70, seed=2), fps=30.0, gop=2))
    planes = read_frames(str(path), frame_format="yuv420")
    assert planes.shape == (3, 75, 70)
    assert level_diff(yuv420_to_rgb_torch(torch.from_numpy(planes)), read_frames(str(path))) <= 1
    crop = read_frames(str(path), [1], frame_format="yuv420", crop=(4, 6, 20, 30))
    assert crop.shape == (1, 30, 30)
    assert np.array_equal(yuv420_to_rgb(crop)[0], yuv420_to_rgb(planes[1])[4:24, 6:36])


def test_decord_and_odd_sizes_are_refused(video):
    with pytest.raises(ValueError, match="backend 'decord' cannot deliver frame_format='yuv420'"):
        DecodeOptions(backend="decord", frame_format="yuv420")
    with pytest.raises(ValueError, match="decord"):
        read_frames(video, [0], backend="decord", frame_format="yuv420")
    with pytest.raises(ValueError, match="even frame size"):
        read_frames(video, [0], size=(47, 64), frame_format="yuv420")
    with pytest.raises(ValueError, match="even crop"):
        DecodeOptions(crop=(1, 0, 8, 8), frame_format="yuv420")
    with pytest.raises(ValueError, match="frame_format must be one of"):
        DecodeOptions(frame_format="nv12")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("yuvdata")
    write_webdataset(root / "shards", make_episodes(4, seed=3, min_length=10, max_length=16, cameras=("cam_high",),
                                                    camera_fps={"cam_high": 15.0}), episodes_per_shard=2)
    write_lerobot(root / "lerobot", make_episodes(2, seed=4, min_length=8, max_length=10, cameras=("cam_high",)),
                  codec="av1")
    return str(root / "shards"), str(root / "lerobot")


PACKING = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}),
                  window=WindowSpec.from_delta_timestamps({CAM: [-2 / 15, 0.0], "observation.state": [0.0],
                                                           "action": [i / 30 for i in range(5)]}),
                  plan=PlanConfig(capacity=96, rows_per_batch=2), seed=1)


def test_loader_with_workers_carries_half_the_bytes(datasets):
    """Through mmfeed.DataLoader with 2 workers: the same plan and tokens, video payloads [n, H*3/2, W] in shared
    memory at half the bytes of RGB, and RGB again after the conversion."""
    shards, _ = datasets
    source = open_dataset(shards, frame_format="yuv420")
    assert source.features[CAM].shape == (72, 64) and source.features[CAM].frame_format == "yuv420"
    assert source.features[CAM].frame_size == (48, 64) and source.frame_shape(0, CAM) == (48, 64)
    rgb = list(DataLoader(shards, packing=PACKING, num_workers=2))
    yuv = list(DataLoader(source, packing=PACKING, num_workers=2))
    assert len(rgb) == len(yuv) > 2
    for a, b in zip(rgb, yuv):
        assert torch.equal(a.cu_seqlens, b.cu_seqlens) and torch.equal(a.modality_ids, b.modality_ids)
        assert a.metadata["sample"].tolist() == b.metadata["sample"].tolist()
        x, y = a.data[CAM], b.data[CAM]
        assert x.shape == (len(x), 48, 64, 3) and y.shape == (len(x), 72, 64) and y.dtype == torch.uint8
        assert 2 * y.numel() * y.element_size() == x.numel() * x.element_size()
        assert y.untyped_storage().is_shared(), "frames come from the workers in shared memory"
        if X86:
            assert level_diff(yuv420_to_rgb(y), x) <= 1
        assert torch.equal(a.data["observation.state"], b.data["observation.state"])


def test_lerobot_and_mixture_sources(datasets):
    """LeRobot (AV1) and a mixture of both sources deliver yuv420 too; their features say so."""
    shards, lerobot = datasets
    mixture = open_dataset([shards, lerobot], frame_format="yuv420")
    assert mixture.features[CAM].shape == (72, 64) and mixture.frame_shape(len(mixture) - 1, CAM) == (48, 64)
    source = open_dataset(lerobot, frame_format="yuv420")
    planes = source.episode(0)[CAM]
    frames = open_dataset(lerobot).episode(0)[CAM]
    assert planes.shape == (len(frames), 72, 64)
    if X86:
        assert level_diff(yuv420_to_rgb(planes), frames) <= 1
    sized = open_dataset(lerobot, frame_format="yuv420", frame_size=(24, 32))
    assert sized.features[CAM].shape == (36, 32) and sized.episode(1)[CAM].shape[1:] == (36, 32)
    with pytest.raises(ValueError, match="even"):
        open_dataset(lerobot, frame_format="yuv420", frame_size=(25, 32))
    with pytest.raises(ValueError, match="decord"):
        open_dataset(shards, backend="decord", frame_format="yuv420")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_conversion_on_cuda(video):
    """On the device: the same bits as on the CPU, and as PyAV's rgb24 (x86 hosts)."""
    planes = torch.from_numpy(read_frames(video, frame_format="yuv420"))
    on_device = yuv420_to_rgb(planes.cuda())
    assert on_device.device.type == "cuda" and on_device.shape == (len(planes), 96, 128, 3)
    assert torch.equal(on_device.cpu(), yuv420_to_rgb_torch(planes))
    if X86:
        assert level_diff(on_device.cpu(), read_frames(video)) <= 1
    assert torch.equal(yuv420_to_rgb(planes.cuda()[None, ::2]).cpu()[0], on_device.cpu()[::2])


def test_batched_requests_write_planes_in_place_as_one_by_one(video, tmp_path):
    """A batch whose requests share frames (each shared frame copied to both), ask one frame once (its planes
    written straight into the request's output) and come with their own outputs gives the frames that decoding
    each request alone gives; at 320x240 too, where planes take the streaming copy."""
    from mmfeed.codecs.batch import FrameRequest, VideoReaderCache

    big = tmp_path / "big.mp4"
    big.write_bytes(encode_video(natural(6, 240, 320, seed=2), fps=30.0, codec="h264", gop=2))
    opts = DecodeOptions(frame_format="yuv420")
    for path, asks in ((video, [[0, 1], [1, 2], [5], [7, 3]]), (str(big), [[4, 5], [0], [5, 1]])):
        alone = [read_frames(path, np.array(ask), frame_format="yuv420") for ask in asks]
        outs = [np.zeros_like(a) for a in alone]
        with VideoReaderCache(options=opts) as cache:
            got = cache.decode_batch([FrameRequest(path, np.array(ask), out=o) for ask, o in zip(asks, outs)])
        for a, g, o in zip(alone, got, outs):
            assert g is o and np.array_equal(g, a)


def test_nv12_frames_convert_as_swscale_converts_them(video):
    """NVDEC's layout (interleaved chroma) converts to the same pixels as PyAV's rgb24 of the same frames; a frame
    decoded on the CPU goes into an NV12 slot as the GPU path's software fallback puts it there."""
    from mmfeed.codecs._nvdec import upload_nv12
    from mmfeed.codecs.colour import nv12_to_rgb_torch

    with av.open(video) as container:
        for frame in itertools.islice(container.decode(video=0), 3):
            slot = torch.empty((frame.height * 3 // 2, frame.width), dtype=torch.uint8)
            assert upload_nv12(frame, slot) is False
            assert np.array_equal(nv12_to_rgb_torch(slot).numpy(), frame.to_ndarray(format="rgb24"))
    with pytest.raises(ValueError, match=r"nv12 frames are \[..., H \* 3 // 2, W\] with H and W even"):
        nv12_to_rgb_torch(torch.zeros((5, 4), dtype=torch.uint8))
