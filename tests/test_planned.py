"""The one planned dataset over episodes held in memory: exact epochs, windows view, transforms, mixtures, shapes.

Real files go through the same code in tests/test_loaders_v2.py; here the episodes are arrays so that the plan,
the layout and the loader can be checked on many epochs and world sizes in seconds.
"""

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Normalize, Packing, PlanConfig, TokenLayout, WindowSpec
from mmfeed.loaders.planned.collate import sample_generator
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.loaders.sources.concat import ConcatSource
from mmfeed.testing import make_episodes, read_index

from replay import replayed, resumed_elsewhere

CAM = "observation.images.cam_high"
WRIST = "observation.images.cam_wrist"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-1 / 15, 0.0], "observation.state": [0.0],
                                         "action": [i / 30 for i in range(4)]})
LAYOUT = TokenLayout(tokens_per_frame={CAM: 8, WRIST: 8})


def array_source(n=4, seed=0, cameras=("cam_high",), name="arrays", **kwargs):
    eps = make_episodes(n, seed=seed, min_length=8, max_length=16, cameras=cameras, camera_fps={"cam_high": 15.0},
                        height=16, width=32, **kwargs)
    return ArraySource([{**e.features(), "task": e.task, "fps": e.fps, "rates": e.rates()} for e in eps], name=name)


def packing(**kwargs):
    return Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(capacity=96, rows_per_batch=2), **kwargs)


def samples_of(batches):
    return np.concatenate([b.metadata["sample"].numpy() for b in batches])


def test_an_epoch_uses_every_window_once_across_ranks():
    src = array_source()
    n = int(src.lengths.sum())
    for world in (1, 2, 3):
        datasets = [packing(seed=4).dataset(src, rank=r, world_size=world) for r in range(world)]
        steps = {d.num_steps(0) for d in datasets}
        assert len(steps) == 1  # every rank runs the same number of steps
        seen = np.concatenate([samples_of(d[0, s] for s in range(d.num_steps(0))) for d in datasets])
        dropped = datasets[0].plan(0).dropped
        assert sorted(np.concatenate([seen, dropped]).tolist()) == list(range(n))


def test_packed_samples_are_the_windows_view_samples():
    """Each document of a packed batch holds exactly what ds.windows(spec)[i] holds for its sample."""
    src = array_source()
    view = src.windows(SPEC)
    ds = packing().dataset(src)
    counts = {f: len(d) for f, d in SPEC.deltas.items()}
    for step in range(ds.num_steps(0)):
        batch = ds[0, step]
        for d, sample in enumerate(batch.metadata["sample"].tolist()):
            want = view[sample]
            for feature, k in counts.items():
                got = batch.data[feature][d * k : (d + 1) * k]
                # the layout puts a sample's frames of one feature in time order, which is window order here
                assert torch.equal(got, want[feature])
                assert torch.equal(batch.data[f"{feature}_is_pad"][d * k : (d + 1) * k], want[f"{feature}_is_pad"])
        assert batch.metadata["start_step"].tolist() == [view.locate(s)[1] for s in batch.metadata["sample"].tolist()]


def test_windows_view_is_lerobot_shaped_and_reads_each_feature_at_its_rate():
    src = array_source(n=2)
    view = src.windows(SPEC)
    assert len(view) == int(src.lengths.sum())
    item = view[3]
    assert set(item) == {CAM, f"{CAM}_is_pad", "observation.state", "observation.state_is_pad", "action",
                         "action_is_pad", "task", "episode_index", "frame_index"}
    assert item[CAM].dtype == torch.uint8 and item[CAM].shape == (2, 16, 32, 3)
    # anchor step 3 at 30 Hz is t = 0.1 s: the 15 fps camera's frames at or before 0.0333 s and 0.1 s
    assert read_index(item[CAM].numpy()).tolist() == [0, 1]
    assert item["episode_index"] == 0 and item["frame_index"] == 3
    assert view[0][f"{CAM}_is_pad"].tolist() == [True, False]
    last = view[len(view) - 1]
    assert last["action_is_pad"].tolist() == [False, True, True, True]
    loader = DataLoader(view, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    batch = next(iter(loader))
    assert batch["action"].shape == (4, 4, 14)


def brightness(sample, generator):
    """A random augmentation: shift every frame by a random amount drawn from the sample's generator."""
    shift = int(torch.randint(0, 50, (1,), generator=generator))
    return {**sample, CAM: (sample[CAM].to(torch.int16) + shift).clamp(0, 255).to(torch.uint8)}


@pytest.mark.slow
def test_a_transform_is_the_same_for_any_number_of_workers_and_replays_after_resume():
    src = array_source()
    plain = replayed(lambda w: DataLoader(src, packing=packing(seed=2, transform=brightness), num_workers=w),
                     lambda b: b.data[CAM].clone(), resumes=((0, 2), (2, 1)))
    assert len(plain) > 2
    untouched = [b.data[CAM] for b in DataLoader(src, packing=packing(seed=2))]
    assert not all(torch.equal(a, b) for a, b in zip(plain, untouched))  # the transform did something


def test_sample_generators_depend_on_seed_epoch_and_sample_only():
    draw = lambda *key: torch.rand(3, generator=sample_generator(*key)).tolist()  # noqa: E731
    assert draw(0, 1, 7) == draw(0, 1, 7)
    assert len({tuple(draw(*k)) for k in [(0, 1, 7), (1, 1, 7), (0, 2, 7), (0, 1, 8)]}) == 4


def test_a_transform_may_not_change_the_number_of_frames():
    src = array_source(n=1)
    drop = lambda s, g: {**s, "action": s["action"][:1]}  # noqa: E731
    with pytest.raises(ValueError, match="number of frames of 'action'"):
        packing(transform=drop).dataset(src)[0, 0]


def test_normalize_matches_hand_computed_stats():
    src = array_source()
    state = np.concatenate([src._episodes[e]["observation.state"] for e in range(len(src))]).astype(np.float64)
    assert np.allclose(src.stats["observation.state"]["mean"], state.mean(0))
    assert np.allclose(src.stats["observation.state"]["std"], state.std(0))
    sample = src.windows(SPEC)[5]
    x = sample["observation.state"].double()
    lo, hi = torch.from_numpy(state.min(0)), torch.from_numpy(state.max(0))
    by_mode = {
        "mean_std": (x - torch.from_numpy(state.mean(0))) / (torch.from_numpy(state.std(0)) + 1e-8),
        "min_max": 2 * (x - lo) / (hi - lo + 1e-8) - 1,
    }
    for mode, want in by_mode.items():
        got = Normalize(src.stats, mode=mode)(sample, None)
        assert torch.allclose(got["observation.state"].double(), want, atol=1e-5)
        assert torch.equal(got[CAM], sample[CAM])  # video is left alone
    q = {"observation.state": {"q01": lo.numpy(), "q99": hi.numpy()}}
    assert torch.allclose(Normalize(q, mode="quantile")(sample, None)["observation.state"].double(),
                          by_mode["min_max"], atol=1e-5)
    with pytest.raises(ValueError, match="needs 'q01' and 'q99'"):
        Normalize(src.stats, mode="quantile", features=["observation.state"])
    with pytest.raises(ValueError, match="mode"):
        Normalize(src.stats, mode="zscore")
    through_loader = next(iter(DataLoader(src, packing=packing(transform=Normalize(src.stats)))))
    assert abs(float(through_loader.data["observation.state"].mean())) < 1.0


def mixture():
    one = array_source(n=3, seed=1, cameras=("cam_high",), name="one")
    two = array_source(n=4, seed=2, cameras=("cam_high", "cam_wrist"), name="two")
    return ConcatSource([one, two])


def test_a_mixture_reads_each_dataset_with_its_own_features():
    mix = mixture()
    assert set(mix.features) >= {CAM, WRIST} and mix.present(WRIST).tolist() == [False] * 3 + [True] * 4
    spec = WindowSpec.from_delta_timestamps({CAM: [0.0], WRIST: [0.0], "action": [0.0, 1 / 30]})
    ds = Packing(layout=LAYOUT, window=spec, plan=PlanConfig(capacity=64, rows_per_batch=2)).dataset(mix)
    tokens = ds.items.table.tokens
    from_one = mix.dataset_of[ds.items.table.groups] == 0
    assert set(tokens[from_one].tolist()) <= {8 + 2 + t for t in range(40)}  # no wrist frames priced
    for step in range(ds.num_steps(0)):
        batch = ds[0, step]
        n_wrist = int((batch.metadata["dataset"] == 1).sum())
        assert len(batch.data[WRIST]) == n_wrist  # empty in a batch of the first dataset alone
        assert batch.data[WRIST].shape[1:] == (16, 32, 3) and len(batch.data[f"{WRIST}_is_pad"]) == n_wrist
        assert int((batch.modality_ids == batch.modalities.index(WRIST)).sum()) == 8 * n_wrist


def test_a_mixed_batch_decodes_each_camera_in_place_for_the_samples_that_have_it():
    """A camera only one dataset has still gets one payload buffer, sliced among the samples that read it (the
    others take none), and every frame lands where the batch holds it."""
    from mmfeed.loaders.planned.collate import _IN_ORDER, _decode_in_place
    from mmfeed.loaders.sources.requests import window_requests

    mix = mixture()
    spec = WindowSpec.from_delta_timestamps({CAM: [0.0], WRIST: [-1 / 30, 0.0], "action": [0.0]})
    episodes, anchors = np.array([0, 3, 1, 5]), np.array([2, 4, 0, 7])
    requests = [r for r, _ in window_requests(mix, spec, episodes, anchors)]
    plans = [({f: _IN_ORDER for f in r.indices}, None, None) for r in requests]  # every feature in read order
    placed, buffers = _decode_in_place(mix, requests, plans)
    assert set(buffers) == {CAM, WRIST}
    assert len(buffers[CAM]) == 4 and len(buffers[WRIST]) == 2 * 2  # only the two samples of dataset "two"
    assert [WRIST in p.out for p in placed] == [False, True, False, True]
    read = mix.read_many(placed)
    for request, got in zip(placed, read):
        for feature, out in request.out.items():
            want = mix.read_many([window_requests(mix, spec, np.array([request.episode]),
                                                  anchors[list(episodes).index(request.episode)][None])[0][0]])[0]
            assert np.array_equal(got[feature], want[feature]) and np.shares_memory(out, buffers[feature])


def test_a_mixture_refuses_one_name_with_two_shapes():
    one = array_source(n=1, name="one")
    other = array_source(n=1, name="other", state_dim=3)
    with pytest.raises(ValueError, match=r"'observation.state'.*one.*other"):
        ConcatSource([one, other])


def test_weights_set_each_datasets_share_and_every_sample_waits_for_its_pass():
    mix = mixture()
    ds = packing(weights=[3.0, 1.0]).dataset(mix)
    of = mix.dataset_of[ds.items.table.groups]
    sizes = np.bincount(of)
    seen = {0: [], 1: []}
    for epoch in range(6):
        drawn = ds.epoch_samples(epoch)
        counts = np.bincount(of[drawn], minlength=2)
        assert abs(counts[0] / counts.sum() - 0.75) < 0.01
        for d in (0, 1):
            seen[d].extend(drawn[of[drawn] == d].tolist())
    for d in (0, 1):  # each full pass over a dataset uses each of its samples once
        passes = len(seen[d]) // sizes[d]
        for p in range(passes):
            assert sorted(seen[d][p * sizes[d] : (p + 1) * sizes[d]]) == np.flatnonzero(of == d).tolist()


def test_a_mixture_resumes_at_another_world_size_with_nothing_lost_or_repeated():
    mix = mixture()
    p = packing(seed=3, weights=[1.0, 2.0])
    before = [DataLoader(mix, packing=p) for _ in range(2)]
    for rank, loader in enumerate(before):  # as torchrun would build them
        loader.dataset.rank, loader.dataset.world_size = rank, 2
    batches = resumed_elsewhere(before, lambda rank: DataLoader(p.dataset(mix, rank=rank, world_size=3)), 3)
    drawn = before[0].dataset.epoch_samples(0)
    plan = p.dataset(mix, world_size=3).plan(0, ((2, 2),))
    used = np.concatenate([samples_of(batches), drawn[plan.dropped]])
    assert sorted(used.tolist()) == sorted(drawn.tolist())


def test_static_shapes_give_one_shape_per_tensor_for_the_whole_epoch_and_compile_once():
    src = array_source(n=6)
    ds = packing(static_shapes=True).dataset(src)
    shapes, padded = set(), 0
    for step in range(ds.num_steps(0)):
        b = ds[0, step]
        shapes.add((tuple(b.cu_seqlens.shape), *sorted((k, tuple(v.shape)) for k, v in b.data.items())))
        # cu_seqlens is padded with empty documents; the count stays the real one
        assert b.num_documents == len(b.metadata["sample"]) <= len(b.cu_seqlens) - 1
        assert int(b.cu_seqlens[-1]) == int((b.document_ids >= 0).sum())
        padded += b.num_documents < len(b.cu_seqlens) - 1
    assert len(shapes) == 1 and padded

    import torch._dynamo

    torch._dynamo.reset()
    calls = {"n": 0}

    def backend(gm, example_inputs):
        calls["n"] += 1
        return gm.forward

    @torch.compile(backend=backend, dynamic=False)
    def step(cu, state, pad, ids):
        return (state.sum(-1) * ~pad).sum() + cu[-1] + (ids >= 0).sum()

    for s in range(ds.num_steps(0)):
        b = ds[0, s]
        step(b.cu_seqlens, b.data["observation.state"], b.data["observation.state_is_pad"], b.document_ids)
    assert calls["n"] == 1


def test_normalize_leaves_video_frames_alone_in_either_frame_format():
    """Per-channel image stats (LeRobot writes them, shape (3, 1, 1)) never touch uint8 frames: RGB
    [K, H, W, 3] or yuv420 planes [K, H * 3 // 2, W]; a uint8 array feature [K, D] is normalized."""
    stats = {f: {"mean": np.full((3, 1, 1), 100.0), "std": np.full((3, 1, 1), 50.0)} for f in ("rgb", "yuv")}
    stats["grip"] = {"mean": np.array([1.0]), "std": np.array([2.0])}
    sample = {"rgb": torch.zeros(2, 4, 6, 3, dtype=torch.uint8), "yuv": torch.zeros(2, 6, 6, dtype=torch.uint8),
              "grip": torch.full((2, 1), 3, dtype=torch.uint8)}
    out = Normalize(stats)(sample, None)
    assert out["rgb"] is sample["rgb"] and out["yuv"] is sample["yuv"]
    assert torch.allclose(out["grip"], torch.ones(2, 1))


def test_batches_of_one_shape_share_its_layout_but_not_their_tensors():
    """A fixed-mode plan gives every batch the same layout: it is made once per process, its attention metadata
    once it is met again, and each batch still holds its own metadata (a batch changed in place changes no later
    batch); every batch equals the one a fresh process (no layout kept) builds. A batch of another shape gets a
    layout of its own; the memo keeps a bounded number of layouts, and no metadata over its byte bound."""
    from mmfeed.loaders.planned import steps

    def one_task():  # every document the same tokens: the task's text is one length
        eps = make_episodes(6, seed=0, min_length=8, max_length=16, cameras=("cam_high",),
                            camera_fps={"cam_high": 15.0}, height=16, width=32)
        return ArraySource([{**e.features(), "task": "pick", "fps": e.fps, "rates": e.rates()} for e in eps])

    names = ("document_ids", "position_ids", "step_ids", "modality_ids", "cu_seqlens")
    fixed = Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(mode="fixed", batch_size=4, shuffle=True))
    dataset = DataLoader(one_task(), packing=fixed).dataset
    steps_ = range(min(5, len(dataset)))
    for keep_bytes in (1 << 20, 0):
        steps._LAYOUTS = steps._Layouts(keep_bytes=keep_bytes)
        made = []
        for k in steps_:
            batch = dataset[0, k]
            made.append({name: getattr(batch, name).clone() for name in names})
            for name in names:
                getattr(batch, name).fill_(7)  # each batch changed in place once it is made
        (kept,) = steps._LAYOUTS._kept.values()  # one layout for them all
        assert kept.met == len(steps_) - 1 and (kept.meta is not None) == (keep_bytes > 0)
        for k in steps_:
            steps._LAYOUTS = steps._Layouts()  # as a fresh process builds it
            fresh = dataset[0, k]
            for name in names:
                assert torch.equal(made[k][name], getattr(fresh, name)), (k, name)
    other = Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(mode="fixed", batch_size=3, shuffle=True))
    steps._LAYOUTS = steps._Layouts(size=1)
    DataLoader(one_task(), packing=fixed).dataset[0, 0]
    DataLoader(one_task(), packing=other).dataset[0, 0]
    assert len(steps._LAYOUTS._by_key) == len(steps._LAYOUTS._kept) == 1  # bounded: the older shape let go
