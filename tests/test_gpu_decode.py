"""GPU decode: ``device="cuda"``, frames decoded by NVDEC and left on the GPU, through PyAV (``backend="pyav"`` or
``"auto"``) or torchcodec (``backend="torchcodec"``).

The option's checks run everywhere: ``device=`` with PyAV or torchcodec, not decord, only "cuda"/"cuda:N", never
with ``cache=`` or yuv420 frames, and on a machine that cannot decode onto a GPU (CPU torch, no torchcodec,
torchcodec's CPU build) a ValueError when the dataset is opened naming the option, everything missing and the fix.
A DataLoader worker process refuses to decode onto the GPU (checked in a real worker).

The tests that take ``gpu_backend`` run once per backend and skip where that backend cannot decode onto a GPU; on a
GPU they check the frames' device, dtype and layout, that every burned-in frame index reads back, and that the
frames equal the CPU path's (PyAV: the same decoder output converted with swscale's arithmetic) or lie within 2
levels of them (torchcodec's own bound for its CUDA frames against CPU ones: NVDEC/NPP convert YUV to RGB, not
swscale). CI has no GPU: they ran on an H100 by hand (``mmfeed bench gpu`` and these tests, see the README).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.codecs import DecodeError, DecodeOptions, VideoReaderCache, decode_batch, read_frames
from mmfeed.codecs._nvdec import pyav_cuda_error
from mmfeed.codecs._torchcodec import (
    CUDA_TORCHCODEC,
    check_device,
    cuda_decode_error,
    device_refusal,
    resize_on_device,
    torchcodec_available,
    torchcodec_has_cuda,
)
from mmfeed.codecs.video import gather_requests
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.transport.errors import SampleError
from mmfeed.testing import frame_pattern, make_episodes, read_index, write_lerobot, write_video

gpu_error = cuda_decode_error("cuda")
no_gpu = pytest.mark.skipif(gpu_error is None, reason="this machine decodes onto a GPU")
GPU_ERRORS = {"pyav": pyav_cuda_error("cuda"), "torchcodec": gpu_error}
CAM = "observation.images.cam_high"
VIDEOS = {"h264_gop30": ("h264", 30), "av1_gop2": ("av1", 2)}
ATOL = {"pyav": 0, "torchcodec": 2}
"""Levels GPU frames may differ from CPU frames: none through PyAV (the same decoder output, swscale's arithmetic);
2 through torchcodec (its own tests hold CUDA frames to this: NVDEC/NPP convert YUV to RGB)."""


@pytest.fixture(params=sorted(GPU_ERRORS))
def gpu_backend(request):
    """A backend that decodes onto the GPU here; the test skips for one that cannot, saying why."""
    if GPU_ERRORS[request.param] is not None:
        pytest.skip(f"GPU decode through {request.param} unavailable: {GPU_ERRORS[request.param]}")
    return request.param


@pytest.fixture(scope="module", params=sorted(VIDEOS))
def video(request, tmp_path_factory):
    codec, gop = VIDEOS[request.param]
    path = tmp_path_factory.mktemp(request.param) / "v.mp4"
    return write_video(path, frame_pattern(45, height=48, width=64), codec=codec, gop=gop)


@pytest.fixture(scope="module")
def lerobot_root(tmp_path_factory):
    episodes = make_episodes(2, seed=5, min_length=8, max_length=12, height=48, width=64)
    return write_lerobot(tmp_path_factory.mktemp("gpu") / "ds", episodes, codec="h264", gop=30)


# -- the option's checks (every machine) ----------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "cuda:", "cuda:x", "gpu", 0, "", None])
def test_device_is_cuda_or_cuda_n(device):
    if device is None:
        assert DecodeOptions(backend="torchcodec").device is None and ReadOptions().device is None
        return
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cuda:N'"):
        check_device(device)
    with pytest.raises(ValueError, match="device must be 'cuda' or 'cuda:N'"):
        DecodeOptions(backend="torchcodec", device=device)


def test_device_accepts_cuda_strings_and_torch_devices():
    assert [check_device(d) for d in ("cuda", "cuda:0", "cuda:12", torch.device("cuda", 1))] == \
        ["cuda", "cuda:0", "cuda:12", "cuda:1"]


def test_device_needs_a_backend_that_decodes_on_the_gpu(video, lerobot_root):
    """decord cannot: checked before the machine is, so the message is the same with or without a GPU."""
    with pytest.raises(ValueError, match="through PyAV or torchcodec only, but backend is 'decord'; pass "
                                         r"backend='pyav' \(or 'auto', or 'torchcodec'\)"):
        DecodeOptions(backend="decord", device="cuda")
    with pytest.raises(ValueError, match="through PyAV or torchcodec only"):
        read_frames(video, [0], backend="decord", device="cuda")
    with pytest.raises(ValueError, match="through PyAV or torchcodec only"):
        open_dataset(lerobot_root, backend="decord", device="cuda")


@pytest.mark.parametrize("backend", ["auto", "pyav", "torchcodec"])
def test_device_frames_are_rgb(backend):
    with pytest.raises(ValueError, match="device='cuda' delivers RGB frames on the GPU; frame_format='yuv420'"):
        DecodeOptions(backend=backend, device="cuda", frame_format="yuv420")


@pytest.mark.skipif(GPU_ERRORS["pyav"] is None, reason="this machine decodes onto a GPU through PyAV")
@pytest.mark.parametrize("backend", ["auto", "pyav"])
def test_without_a_gpu_pyav_device_fails_naming_what_is_missing(backend, video, lerobot_root):
    for call in (lambda: open_dataset(lerobot_root, backend=backend, device="cuda"),
                 lambda: read_frames(video, [0], backend=backend, device="cuda"),
                 lambda: VideoReaderCache(backend=backend, device="cuda:0")):
        with pytest.raises(ValueError, match=r"device='cuda(:0)?' cannot decode here: ") as err:
            call()
        message = str(err.value)
        assert message.endswith("leave device unset to decode on the CPU") and "torchcodec" not in message
        if not torch.cuda.is_available():
            assert "CUDA is not available to torch" in message and "CUDA build of torch" in message


def test_device_with_a_frame_cache_is_refused(tmp_path, lerobot_root):
    with pytest.raises(ValueError, match="cache= keeps decoded frames in host files; drop one of them"):
        open_dataset(lerobot_root, backend="torchcodec", device="cuda", cache=str(tmp_path / "frames"))


@no_gpu
def test_without_gpu_decode_opening_fails_naming_what_is_missing(video, lerobot_root):
    """A CPU machine (or one without torchcodec's CUDA build) fails at open time, not at the first read, and
    the message names the option, each missing piece and its fix."""
    for call in (lambda: open_dataset(lerobot_root, backend="torchcodec", device="cuda"),
                 lambda: read_frames(video, [0], backend="torchcodec", device="cuda"),
                 lambda: VideoReaderCache(backend="torchcodec", device="cuda:0")):
        with pytest.raises(ValueError, match=r"device='cuda(:0)?' cannot decode here: ") as err:
            call()
        message = str(err.value)
        assert message.endswith("leave device unset to decode on the CPU")
        if not torch.cuda.is_available():
            assert "CUDA is not available to torch" in message and "CUDA build of torch" in message
        if importlib.util.find_spec("torchcodec") is None:
            assert f"torchcodec is not installed: {CUDA_TORCHCODEC}" in message
        elif not torchcodec_has_cuda():
            assert f"is built without CUDA (PyPI's wheel is the CPU build): {CUDA_TORCHCODEC}" in message


@pytest.mark.skipif(importlib.util.find_spec("torchcodec") is None, reason="torchcodec is not installed")
def test_torchcodec_build_is_read_without_loading_it():
    """The CUDA check reads the install (version label, else the core library) and never imports torchcodec's
    native libraries, so it answers even where torchcodec does not load."""
    import subprocess
    import sys

    code = ("import sys; from mmfeed.codecs._torchcodec import torchcodec_has_cuda; print(torchcodec_has_cuda(), "
            "'torchcodec' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    has_cuda, imported = done.stdout.split()
    assert imported == "False"
    folder = os.path.dirname(importlib.util.find_spec("torchcodec").origin)
    with open(os.path.join(folder, "version.py")) as f:  # the version the install wrote (+cpu, +cu128, ...)
        assert has_cuda == str("+cu" in f.read())


class _RefusalInWorker(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> str:
        return str(device_refusal())


def test_a_dataloader_worker_process_refuses_device_decode():
    """In a real worker process the refusal names the supported ways; in the training process there is none."""
    assert device_refusal() is None
    for context in ("fork", "spawn"):
        got = list(torch.utils.data.DataLoader(_RefusalInWorker(), batch_size=None, num_workers=1,
                                               multiprocessing_context=context))
        assert all("not in a DataLoader worker process; use num_workers=0 or worker_mode='thread'" in g
                   for g in got), got


def test_device_frames_gathered_per_request_as_the_cpu_path_scatters(video):
    """The device path decodes a file's union once and gathers each request with index_select (into its own
    tensor when given); run on CPU tensors, it equals the CPU path's requests, repeats and order included."""
    wanted = [np.array([40, 3, 3]), np.array([7]), np.array([3, 40, 0]), np.array([], dtype=np.int64)]
    union = np.unique(np.concatenate(wanted))
    frames = torch.from_numpy(read_frames(video, union, backend="pyav"))
    own = torch.zeros((1, 48, 64, 3), dtype=torch.uint8)
    got = gather_requests(frames, wanted, [None, own, None, None])
    assert got[1] is own
    cpu = decode_batch([(video, w) for w in wanted])
    for g, c in zip(got, cpu):
        assert isinstance(g, torch.Tensor) and np.array_equal(g.numpy(), c)
    with pytest.raises(ValueError, match="3 frames given for a union of 4"):
        gather_requests(frames[:3], wanted, [None] * 4)


@pytest.mark.parametrize("size", [(24, 32), (96, 128)])
def test_device_resize_matches_the_cpu_resizes(video, size):
    """Device frames are resized after the decode (torchcodec 0.13's NVDEC path takes no transforms) with torch's
    bilinear antialiased interpolation; run here on CPU tensors: within 20 levels of PyAV's resize (the bound the
    torchcodec tests hold its own Resize to) and within 6 of torchcodec's Resize on the CPU (measured: at most 6,
    0.05-0.34 on average), the burned-in index intact."""
    native = torch.from_numpy(read_frames(video, backend="pyav"))
    got = resize_on_device(native, size)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (45, *size, 3) and got.is_contiguous()
    assert read_index(got.numpy()).tolist() == list(range(45))
    diff = (got.int() - torch.from_numpy(read_frames(video, backend="pyav", size=size)).int()).abs()
    assert diff.max() <= 20 and diff.float().mean() <= 6, (diff.max(), diff.float().mean())
    if torchcodec_available():
        theirs = torch.from_numpy(read_frames(video, backend="torchcodec", size=size))
        assert (got.int() - theirs.int()).abs().max() <= 6
    assert tuple(resize_on_device(native[:0], size).shape) == (0, *size, 3)


# -- on a GPU (skipped here) ----------------------------------------------------------------------------------------

def test_gpu_frames_on_the_device_close_to_cpu(video, gpu_backend):
    every = read_frames(video, backend=gpu_backend, device="cuda")
    assert isinstance(every, torch.Tensor) and every.device.type == "cuda"
    assert every.dtype == torch.uint8 and tuple(every.shape) == (45, 48, 64, 3) and every.is_contiguous()
    cpu = torch.from_numpy(read_frames(video, backend="pyav"))
    torch.testing.assert_close(every.cpu(), cpu, atol=ATOL[gpu_backend], rtol=0)
    assert read_index(every.cpu().numpy()).tolist() == list(range(45))
    asked = np.random.default_rng(0).integers(0, 45, size=12)
    got = read_frames(video, asked, backend=gpu_backend, device="cuda:0")
    assert got.device == torch.device("cuda", 0)
    assert read_index(got.cpu().numpy()).tolist() == asked.tolist()
    small = read_frames(video, asked, backend=gpu_backend, device="cuda", size=(24, 32))
    assert small.device.type == "cuda" and tuple(small.shape) == (12, 24, 32, 3)
    assert read_index(small.cpu().numpy()).tolist() == asked.tolist()


def test_gpu_batches_repeats_crops_and_outputs(video, gpu_backend):
    """A coalesced batch with repeats, a crop, and a request decoded into a device tensor of its own; a host
    array as output is refused (device frames never go back through host memory)."""
    with VideoReaderCache(max_open=1, backend=gpu_backend, device="cuda") as cache:
        out = torch.empty((2, 48, 64, 3), dtype=torch.uint8, device="cuda")
        a, b = cache.decode_batch([(video, [40, 3, 3]), FrameRequestOut(video, [7, 40], out)])
        assert b.data_ptr() == out.data_ptr()
        assert [read_index(x.cpu().numpy()).tolist() for x in (a, b)] == [[40, 3, 3], [7, 40]]
        with pytest.raises(ValueError, match="leaves frames on the GPU, but this request asks for them in a host"):
            cache.decode_batch([FrameRequestOut(video, [1], np.empty((1, 48, 64, 3), np.uint8))])
    with VideoReaderCache(max_open=1, backend=gpu_backend, device="cuda", crop=(8, 16, 32, 32)) as cache:
        got = decode_batch([(video, [5, 6])], cache=cache)[0]
    torch.testing.assert_close(got.cpu(), torch.from_numpy(read_frames(video, [5, 6], crop=(8, 16, 32, 32))),
                               atol=ATOL[gpu_backend], rtol=0)


ORDERS = {"torch first": "torch.zeros(1, device='cuda'); frames = read()",
          "decoder first": "frames = read(); torch.zeros(1, device='cuda')"}


@pytest.mark.skipif(GPU_ERRORS["pyav"] is not None, reason=f"GPU decode through pyav unavailable: {GPU_ERRORS['pyav']}")
@pytest.mark.parametrize("order", sorted(ORDERS))
def test_pyav_decodes_on_the_gpu_whether_torch_or_the_decoder_touches_it_first(order, video):
    """FFmpeg works in torch's own CUDA context, whichever of the two made it (in a fresh process each)."""
    import subprocess
    import sys

    code = ("import sys, torch, numpy as np; from mmfeed.codecs import read_frames; "
            f"read = lambda: read_frames({video!r}, [0, 1, 44], backend='pyav', device='cuda'); {ORDERS[order]}; "
            f"cpu = read_frames({video!r}, [0, 1, 44], backend='pyav'); "
            "sys.exit(0 if np.array_equal(frames.cpu().numpy(), cpu) else 3)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(video))
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.skipif(GPU_ERRORS["pyav"] is None, reason="this machine decodes onto a GPU through PyAV")
def test_a_gpu_decoder_that_cannot_open_is_named_apart_from_the_file(video, tmp_path):
    """Where FFmpeg cannot make its CUDA device, the error says the GPU decoder failed, not the file; a file that
    is not a video still says so."""
    from av.codec.hwaccel import HWAccel

    from mmfeed.codecs.demux import open_container

    accel = HWAccel("cuda", allow_software_fallback=False)
    with pytest.raises(DecodeError, match="could not open a decoder on the CUDA device for it: .*; leave device "
                                          "unset to decode on the CPU"):
        open_container(video, hwaccel=accel)
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video" * 100)
    with pytest.raises(DecodeError, match="not a readable video file"):
        open_container(str(junk), hwaccel=accel)


def FrameRequestOut(path, indices, out):
    from mmfeed.codecs import FrameRequest

    return FrameRequest(path, indices=indices, out=out)


def test_gpu_dataset_windows_and_loader_in_the_training_process(lerobot_root, gpu_backend):
    """open_dataset(device="cuda"): read_many and the windows view give device frames close to the CPU ones; the
    drop-in DataLoader batches them on the GPU with num_workers=0 and with worker threads; a worker process fails
    with the refusal."""
    gpu = open_dataset(lerobot_root, backend=gpu_backend, device="cuda")
    cpu = open_dataset(lerobot_root, backend="pyav")
    request = [EpisodeRequest(0, {CAM: np.arange(gpu.lengths[0])})]
    got, ref = gpu.read_many(request)[0][CAM], cpu.read_many(request)[0][CAM]
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), torch.from_numpy(ref), atol=ATOL[gpu_backend], rtol=0)
    spec = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], "action": [0.0]})
    for kwargs in ({}, {"num_workers": 2, "worker_mode": "thread"}):
        batch = next(iter(DataLoader(gpu.windows(spec), batch_size=4, **kwargs)))
        reference = next(iter(DataLoader(cpu.windows(spec), batch_size=4)))
        assert batch[CAM].device.type == "cuda" and batch["action"].device.type == "cpu"
        torch.testing.assert_close(batch[CAM].cpu(), reference[CAM], atol=ATOL[gpu_backend], rtol=0)
    with pytest.raises(SampleError, match=f"episode 0 feature '{CAM}' .* not in a DataLoader worker process"):
        next(iter(DataLoader(gpu.windows(spec), batch_size=4, num_workers=1, multiprocessing_context="spawn")))
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), window=spec,
                      plan=PlanConfig(capacity=64, rows_per_batch=2), seed=3)
    with pytest.raises(ValueError, match="the packed loader lays samples out in host"):
        DataLoader(gpu, packing=packing)
