"""Device transforms (``DataLoader(..., device=..., device_transform=fn)``): batched ops after the copy, seeded per
sample as worker transforms are, equal to the worker-side ones on the CPU, replayed after a resume, timed as their
own phase."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.codecs.colour import yuv420_to_rgb
from mmfeed.loaders import (CameraDropout, Compose, Normalize, Packing, PlanConfig, StepTimer, TokenLayout,
                            WindowSpec, open_dataset)
from mmfeed.loaders.planned.device_transforms import (BatchSamples, ColorJitter, DeviceCameraDropout, DeviceCompose,
                                                      DeviceNormalize, NormalizeImages, RandomResizedCrop, Resize,
                                                      YUVToRGB)
from mmfeed.loaders.planned.steps import sample_generator
from mmfeed.loaders.planned.transforms import DeltaActions
from mmfeed.packing import PackedBatch
from mmfeed.testing import make_episodes, write_webdataset

CAM, WRIST = "observation.images.cam_high", "observation.images.wrist"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-2 / 15, 0.0], WRIST: [0.0], "observation.state": [-1 / 30, 0.0],
                                         "action": [i / 30 for i in range(4)]})
LAYOUT = TokenLayout(tokens_per_frame={CAM: 8, WRIST: 4})


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("wds") / "wds"
    write_webdataset(out, make_episodes(4, seed=3, min_length=10, max_length=16, height=16, width=32,
                                        cameras=("cam_high", "wrist")), episodes_per_shard=2)
    return str(out)


def packing(transform=None, static_shapes=False, seed=2):
    return Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(capacity=96, rows_per_batch=2), seed=seed,
                   transform=transform, static_shapes=static_shapes)


def batches(loader, n=None):
    out = []
    for k, b in enumerate(loader):
        if n is not None and k == n:
            break
        out.append(b)
    return out


def assert_same(a: PackedBatch, b: PackedBatch):
    assert sorted(a.data) == sorted(b.data)
    for key in a.data:
        x, y = a.data[key], b.data[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert torch.equal(x, y), key
    assert torch.equal(a.metadata["sample"], b.metadata["sample"])


@pytest.mark.parametrize("static_shapes", [False, True])
def test_on_cpu_the_device_transforms_equal_the_worker_transforms(shards, static_shapes):
    source = open_dataset(shards)
    worker = DataLoader(source, packing=packing(Compose(Normalize(source), CameraDropout(0.5)), static_shapes))
    device = DataLoader(source, packing=packing(None, static_shapes), device="cpu",
                        device_transform=DeviceCompose(DeviceNormalize(source), DeviceCameraDropout(0.5)))
    plain = DataLoader(source, packing=packing(None, static_shapes))
    for epoch in range(2):
        a, b, c = batches(worker), batches(device), batches(plain)
        assert len(a) == len(b) == len(c) > 2
        for x, y in zip(a, b):
            assert_same(x, y)
    # the transforms did something: frames dropped and states normalized, unlike the plain batches
    assert any(int(x.data[f"{f}_is_pad"].sum()) > int(y.data[f"{f}_is_pad"].sum()) for x, y in zip(b, c)
               for f in (CAM, WRIST))
    assert not torch.equal(b[0].data["observation.state"], c[0].data["observation.state"])


def test_the_camera_dropout_of_one_batch_is_the_worker_one_sample_by_sample():
    """A batch built by hand: each document's cameras drawn from its own generator as CameraDropout draws them."""
    frames = torch.arange(6 * 2 * 2 * 3, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(6, 2, 2, 3) + 1
    pad = torch.tensor([False, False, True, False, True, True])  # document 2 holds only padding of "a"
    batch = PackedBatch.from_segments([[3, 3], [3]], 8, segments=[[[(1, 2), (2, 1)], [(1, 2), (2, 1)]],
                                                               [[(1, 2), (2, 1)]]],
                                      modalities=["text", "a", "b"],
                                      data={"a": frames, "a_is_pad": pad, "b": frames[:3].clone(),
                                            "b_is_pad": torch.zeros(3, dtype=torch.bool)},
                                      metadata={"sample": torch.tensor([11, 5, 9])})
    drop = DeviceCameraDropout(0.6)
    samples = BatchSamples.of(batch, seed=4, epoch=1)
    assert samples.document_of("a").tolist() == [0, 0, 1, 1, 2, 2] and samples.document_of("b").tolist() == [0, 1, 2]
    out = drop(batch, samples)
    for d, sample in enumerate([11, 5, 9]):
        one = {"a": frames[2 * d:2 * d + 2], "a_is_pad": pad[2 * d:2 * d + 2], "b": frames[d:d + 1],
               "b_is_pad": torch.zeros(1, dtype=torch.bool)}
        want = CameraDropout(0.6)(one, sample_generator(4, 1, sample))
        assert torch.equal(out.data["a"][2 * d:2 * d + 2], want["a"])
        assert torch.equal(out.data["a_is_pad"][2 * d:2 * d + 2], torch.as_tensor(want["a_is_pad"]))
        assert torch.equal(out.data["b"][d:d + 1], want["b"])
    assert 0 < int(out.data["a_is_pad"].sum() + out.data["b_is_pad"].sum()) - int(pad.sum()) < 9  # some, not all


def test_a_resumed_loader_replays_the_device_transformed_batches(shards):
    source = open_dataset(shards)
    chain = DeviceCompose(DeviceNormalize(source), DeviceCameraDropout(0.5), ColorJitter(0.4, 0.4, 0.4),
                          RandomResizedCrop((8, 12), scale=(0.3, 1.0)))
    first = DataLoader(source, packing=packing(), device="cpu", device_transform=chain)
    batches(first)  # epoch 1
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    rest = list(it)
    again = DataLoader(source, packing=packing(), device="cpu", device_transform=chain, prefetch=0)
    again.load_state_dict(state)
    replay = batches(again)
    assert len(replay) == len(rest) > 0
    for x, y in zip(rest, replay):
        assert_same(x, y)
        assert x.data[CAM].shape[1:] == (8, 12, 3)
    # another epoch draws other crops and colours
    third = batches(again)
    assert not torch.equal(third[0].data[CAM], rest[0].data[CAM]) or len(third[0].data[CAM]) == 0


def test_chained_epochs_seed_each_batch_with_its_own_epoch(shards):
    """With persistent workers the next epoch's batches pass the prefetcher before the loop ends this one: each
    is still transformed with its own epoch."""
    source = open_dataset(shards)
    kw = dict(packing=packing(), device="cpu", device_transform=DeviceCompose(ColorJitter(0.5, 0.5, 0.5)))
    chained = DataLoader(source, num_workers=1, persistent_workers=True, **kw)
    got = [batches(chained) for _ in range(3)]
    fresh = DataLoader(source, **kw)
    want = [batches(fresh) for _ in range(3)]
    for a, b in zip(got, want):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)


def test_the_timer_reports_the_transform_phase(shards):
    source = open_dataset(shards)
    timer = StepTimer()
    loader = DataLoader(source, packing=packing(), device="cpu", timer=timer,
                        device_transform=DeviceCompose(ColorJitter(0.3), Resize(8)))
    n = len(batches(loader))
    report = timer.report()
    assert len(timer.transform_s) == n and all(t > 0 for t in timer.transform_s)
    assert report["transform_s"]["mean"] > 0 and report["phases"]["transform"] == report["transform_s"]["mean"]
    assert "transform " in timer.summary().splitlines()[1]
    plain = StepTimer()
    batches(DataLoader(source, packing=packing(), device="cpu", timer=plain))
    assert plain.report()["transform_s"] is None and plain.report()["phases"]["transform"] is None


def test_slow_device_transforms_are_named_the_bottleneck():
    from mmfeed.loaders.observe.diagnosis import diagnose

    named = diagnose(0.5, 0.01, None, {"decode": 0.02}, 2, transform_s=0.05, cores=4)
    assert named["stage"] == "transform" and "device='cuda'" in named["recommendation"]
    assert diagnose(0.5, 0.01, None, {"decode": 0.02}, 2, transform_s=0.001, cores=4)["stage"] == "decode"


def test_yuv420_frames_convert_on_the_device_side(tmp_path):
    out = tmp_path / "wds"
    write_webdataset(out, make_episodes(2, seed=1, min_length=8, max_length=10, height=16, width=32,
                                        cameras=("cam_high",)), episodes_per_shard=2)
    spec = WindowSpec.from_delta_timestamps({CAM: [0.0], "action": [0.0]})
    pack = Packing(layout=TokenLayout(tokens_per_frame={CAM: 4}), window=spec,
                   plan=PlanConfig(capacity=64, rows_per_batch=2))
    yuv = open_dataset(str(out), frame_format="yuv420")
    loader = DataLoader(yuv, packing=pack, device="cpu", device_transform=YUVToRGB())
    raw = DataLoader(yuv, packing=pack)
    for x, y in zip(batches(loader), batches(raw)):
        assert x.data[CAM].shape[1:] == (16, 32, 3)
        assert torch.equal(x.data[CAM], yuv420_to_rgb(y.data[CAM]))


def test_image_ops_keep_shapes_and_ranges():
    gen = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (5, 12, 16, 3), generator=gen, dtype=torch.uint8)
    batch = PackedBatch.from_segments([[3, 2]], 8, segments=[[[(1, 3)], [(1, 2)]]], modalities=["text", "cam"],
                                      data={"cam": frames}, metadata={"sample": torch.tensor([0, 1])})
    samples = BatchSamples.of(batch, seed=0, epoch=0)
    assert Resize((6, 8))(batch, samples).data["cam"].shape == (5, 6, 8, 3)
    crop = RandomResizedCrop(4, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3))(batch, samples).data["cam"]
    assert crop.shape == (5, 4, 4, 3) and crop.dtype == torch.uint8
    same = ColorJitter()(batch, BatchSamples.of(batch, seed=0, epoch=0)).data["cam"]
    assert torch.equal(same, frames)  # all factors 1: the frames as they were
    # the same samples draw the same jitter; two documents draw their own
    a = ColorJitter(0.5, 0.5, 0.5)(batch, BatchSamples.of(batch, seed=0, epoch=0)).data["cam"]
    b = ColorJitter(0.5, 0.5, 0.5)(batch, BatchSamples.of(batch, seed=0, epoch=0)).data["cam"]
    assert torch.equal(a, b) and not torch.equal(a, frames)
    norm = NormalizeImages(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))(batch, samples).data["cam"]
    assert norm.dtype == torch.float32 and torch.allclose(norm, frames.float() / 127.5 - 1, atol=1e-6)


def test_device_normalize_equals_normalize_sample_by_sample():
    stats = {"state": {"mean": np.array([1.0, -2.0]), "std": np.array([2.0, 0.5])}}
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(1))
    batch = PackedBatch.from_segments([[3, 2]], 8, segments=[[[(1, 3)], [(1, 2)]]], modalities=["text", "state"],
                                      data={"state": x}, metadata={"sample": torch.tensor([0, 1])})
    out = DeviceNormalize(stats, leave={"state": [1]})(batch, BatchSamples.of(batch, seed=0, epoch=0))
    want = Normalize(stats, leave={"state": [1]})({"state": x}, None)["state"]
    assert torch.equal(out.data["state"], want)


def test_bad_arguments_give_clear_errors(shards):
    source = open_dataset(shards)
    with pytest.raises(ValueError, match="needs a planned dataset"):
        DataLoader(torch.arange(4), device="cpu", device_transform=DeviceCompose())
    with pytest.raises(ValueError, match="give device="):
        DataLoader(source, packing=packing(), device_transform=DeviceCompose())
    with pytest.raises(TypeError, match="must be a callable"):
        DataLoader(source, packing=packing(), device="cpu", device_transform="colour")
    loader = DataLoader(source, packing=packing(), device="cpu", device_transform=DeviceCompose())
    with pytest.raises(ValueError, match="keep a device"):
        loader.device = None
    with pytest.raises(ValueError, match="delta actions"):
        DeviceNormalize(source, delta=DeltaActions([0]))
    with pytest.raises(ValueError, match="scale must be"):
        RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="size must be"):
        Resize(0)
    with pytest.raises(ValueError, match="brightness must be"):
        ColorJitter(brightness=-1)
    with pytest.raises(TypeError, match="DeviceCompose takes"):
        DeviceCompose("resize")
    # a transform that drops payload entries is refused by name
    shrink = DataLoader(source, packing=packing(), device="cpu",
                        device_transform=lambda b, s: dataclasses.replace(b, data={**b.data, "action": b.data[
                            "action"][:1]}))
    with pytest.raises(ValueError, match="changed payload 'action'"):
        batches(shrink)
    wrong = DataLoader(source, packing=packing(), device="cpu", device_transform=lambda b, s: b.data)
    with pytest.raises(TypeError, match="must return the PackedBatch"):
        batches(wrong)
    # yuv420 planes handed to an RGB op: named
    planes = PackedBatch.from_segments([[1]], 2, segments=[[[(1, 1)]]], modalities=["text", "cam"],
                                       data={"cam": torch.zeros(1, 6, 4, dtype=torch.uint8)},
                                       metadata={"sample": torch.tensor([0])})
    with pytest.raises(ValueError, match="YUVToRGB"):
        Resize(2, features=["cam"])(planes, BatchSamples.of(planes, 0, 0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_device_transforms_equal_the_cpu_ones(shards):
    source = open_dataset(shards)
    chain = DeviceCompose(DeviceNormalize(source), DeviceCameraDropout(0.5))
    cpu = batches(DataLoader(source, packing=packing(), device="cpu", device_transform=chain))
    timer = StepTimer()
    gpu = batches(DataLoader(source, packing=packing(), device="cuda", device_transform=chain, timer=timer))
    for x, y in zip(cpu, gpu):
        assert all(t.device.type == "cuda" for t in y.data.values())
        for key in x.data:
            assert torch.allclose(x.data[key].float(), y.data[key].cpu().float(), atol=1e-5), key
    assert timer.report()["transform_s"]["mean"] > 0
    # the image ops: the same draws, resampling and rounding within one level of the CPU's
    images = DeviceCompose(ColorJitter(0.4, 0.4, 0.4), RandomResizedCrop(8, scale=(0.5, 1.0)))
    cpu = batches(DataLoader(source, packing=packing(), device="cpu", device_transform=images))
    gpu = batches(DataLoader(source, packing=packing(), device="cuda", device_transform=images))
    for x, y in zip(cpu, gpu):
        for key in (CAM, WRIST):
            assert (x.data[key].int() - y.data[key].cpu().int()).abs().max() <= 1, key


def test_a_mixture_of_robots_normalizes_and_drops_as_the_workers_do(tmp_path):
    """Each document normalized with its own dataset's stats, only on the dataset's own elements of a padded
    feature; cameras a dataset lacks are not counted as ones a sample has."""
    from mmfeed.testing.synth_embodiments import write_embodiments

    paths = write_embodiments(tmp_path, episodes=2, min_length=8, max_length=12)
    mix = open_dataset({n: paths[n] for n in ("franka", "aloha")}, pad_to={"action": 32, "observation.state": 32,
                                                                        "observation.velocity": 32})
    cams = ("observation.images.front", "observation.images.top", "observation.images.wrist")
    window = WindowSpec.from_delta_timestamps({**{c: [0.0] for c in cams}, "observation.state": [0.0],
                                               "action": [0.0, 1 / 30]})
    pack = Packing(layout=TokenLayout(tokens_per_frame={c: 2 for c in cams}), window=window,
                   plan=PlanConfig(capacity=64, rows_per_batch=2), seed=3)
    worker = DataLoader(mix, packing=dataclasses.replace(pack, transform=Compose(Normalize(mix), CameraDropout(0.5))))
    device = DataLoader(mix, packing=pack, device="cpu",
                        device_transform=DeviceCompose(DeviceNormalize(mix), DeviceCameraDropout(0.5)))
    a, b = batches(worker), batches(device)
    assert len(a) == len(b) > 1
    for x, y in zip(a, b):
        assert_same(x, y)
    assert len(set(torch.cat([x.metadata["dataset"] for x in b]).tolist())) == 2
