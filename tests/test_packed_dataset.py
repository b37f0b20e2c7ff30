"""Planned, packed batches from real files: every token's payload is the frame or step the window rule names.

Shards hold a 15 fps camera beside a 30 Hz control clock (and a second camera at 30 fps); the frame index burned
into each picture and the episodes' own arrays are the truth. The rule checked is the one of
:mod:`mmfeed.packing.windows`, written out again here: the asked time ``t / fps + delta`` gets the latest frame at
or before it, ``floor((tau + tol) * rate)``, clamped into the episode and flagged in ``<feature>_is_pad`` outside it.
"""

import math
from collections import Counter

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.planned.dataset import PLAN_VERSION, PlanSampler
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.packing.mixture import mix_counts
from mmfeed.testing import make_episodes, read_index, write_lerobot, write_webdataset

CAM, WRIST, STATE = "observation.images.cam_high", "observation.images.cam_wrist", "observation.state"
TOL = 1e-4
# Deltas ascending per feature, so a document's frames of one feature come in delta order (the layout puts
# them in time order). -0.05 s is no multiple of either camera's period.
DELTAS = {CAM: [-2 / 15, -1 / 15, 0.0], WRIST: [-0.05, 0.0], STATE: [-1 / 30, 0.0], "next.reward": [0.0],
          "action": [i / 30 for i in range(4)]}
SPEC = WindowSpec.from_delta_timestamps(DELTAS)
LAYOUT = TokenLayout(tokens_per_frame={CAM: 8, WRIST: 4})


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(4, seed=5, min_length=10, max_length=18, cameras=("cam_high", "cam_wrist"),
                         camera_fps={"cam_high": 15.0})


@pytest.fixture(scope="module")
def source(tmp_path_factory, episodes):
    out = tmp_path_factory.mktemp("packed")
    write_webdataset(out, episodes, episodes_per_shard=2)
    return open_dataset(out)


def rule(t, delta, *, length, fps, rate, frames):
    """``(frame index, is_pad)`` of one asked time, by the rule of packing/windows.py, element by element."""
    tau = t / fps + delta
    pad = tau < -TOL or tau > (length - 1) / fps + TOL
    return min(max(math.floor((tau + TOL) * rate), 0), frames - 1), pad


def truth_of(ep, feature, *, first=0):
    """The episode's values of ``feature`` and its rate and frame count; video values are the burned-in
    indices (``first``: the index of the episode's first frame, the global row in a LeRobot video)."""
    if feature.startswith("observation.images."):
        camera = feature.rsplit(".", 1)[1]
        return first + np.arange(ep.num_frames(camera)), ep.camera_fps[camera], ep.num_frames(camera)
    return ep.arrays()[feature], ep.fps, ep.length


def split(batch, key, counts):
    """A flat payload cut into its documents' pieces, given each document's item count."""
    return np.split(batch.data[key].numpy(), np.cumsum(counts)[:-1])


def check_document(got, pads, ep, t, deltas, *, first=0):
    """A document's pieces (feature -> values, video as burned-in indices) are the frames the rule names."""
    for feature, ds in deltas.items():
        values, rate, frames = truth_of(ep, feature, first=first)
        want = [rule(t, d, length=ep.length, fps=ep.fps, rate=rate, frames=frames) for d in ds]
        np.testing.assert_array_equal(got[feature], values[[j for j, _ in want]], err_msg=feature)
        assert pads[feature].tolist() == [p for _, p in want], (feature, t)


def test_windowed_batches_carry_exactly_the_planned_frames(source, episodes):
    ds = Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(capacity=160, rows_per_batch=2), seed=3).dataset(source)
    features = list(DELTAS)
    seen, distinct = [], 0
    for step in range(ds.num_steps(0)):
        batch = ds[0, step]
        n = len(batch.metadata["sample"])
        assert batch.modalities == ["text", *features]
        for m, feature in enumerate(batch.modalities):  # tokens of each modality = its payload items x their price
            per_item = 1 if feature == "text" else LAYOUT.tokens(feature)
            assert int((batch.modality_ids == m).sum()) == per_item * len(batch.data[feature])
        pieces = {f: split(batch, f, [len(DELTAS[f])] * n) for f in features}
        flags = {f: split(batch, f"{f}_is_pad", [len(DELTAS[f])] * n) for f in features}
        for d in range(n):
            e, t = int(batch.metadata["episode"][d]), int(batch.metadata["start_step"][d])
            got = {f: read_index(v[d]) if f in (CAM, WRIST) else v[d] for f, v in pieces.items()}
            check_document(got, {f: v[d] for f, v in flags.items()}, episodes[e], t, DELTAS)
            if not flags[CAM][d].any():
                # the 15 fps camera's history, asked for at its own period, is three different frames
                assert np.all(np.diff(got[CAM]) == 1), (e, t, got[CAM])
                distinct += 1
            assert float(batch.metadata["start_time"][d]) == pytest.approx(t / episodes[e].fps)
        seen.extend(batch.metadata["sample"].tolist())
    assert distinct > 10
    # Every sample of the epoch is in exactly one batch, or listed as dropped; one sample per step.
    assert sorted(seen + ds.plan(0).dropped.tolist()) == list(range(len(ds.items)))
    assert len(ds.items) == sum(e.length for e in episodes)


def test_attention_steps_follow_the_layout(source):
    spec = WindowSpec.from_delta_timestamps({CAM: [-1 / 15, 0.0], STATE: [0.0], "action": [i / 30 for i in range(4)]})

    def first_document(**layout):
        ds = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}, **layout), window=spec,
                     plan=PlanConfig(capacity=128)).dataset(source)
        batch = ds[0, 0]
        sample = int(batch.metadata["sample"][0])
        text = len(ds.items.text[ds.items.table.tasks([sample])[0]])
        doc = batch.document_ids[0] == 0
        names = [batch.modalities[m] for m in batch.modality_ids[0][doc].tolist()]
        return text, batch.step_ids[0][doc].tolist(), names

    text, steps, names = first_document()
    # Text token-causal, then the frame at -1/15 s (8 tokens), then the frame at 0 with the state (9), then the
    # action chunk as one step (4).
    assert steps == list(range(text)) + [text] * 8 + [text + 1] * 9 + [text + 2] * 4
    assert names == ["text"] * text + [CAM] * 16 + [STATE] + ["action"] * 4
    text, steps, _ = first_document(causal_chunk=True)
    assert steps[text + 17:] == [text + 2, text + 3, text + 4, text + 5]
    text, steps, names = first_document(interleave_chunk=True)
    # the action at 0 s joins the block at 0 s; the later ones follow it, one chunk step
    assert steps == list(range(text)) + [text] * 8 + [text + 1] * 10 + [text + 2] * 3
    assert names[text + 16:] == [STATE, "action", "action", "action", "action"]


def test_static_shapes_give_one_shape_per_tensor_for_the_whole_epoch(source):
    capacity, rows = 96, 2
    ds = Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(capacity=capacity, rows_per_batch=rows),
                 static_shapes=True).dataset(source)
    shapes = set()
    for step in range(ds.num_steps(0)):
        b = ds[0, step]
        tensors = {**b.data, "cu_seqlens": b.cu_seqlens, "document_ids": b.document_ids, "step_ids": b.step_ids,
                   "modality_ids": b.modality_ids, "position_ids": b.position_ids}
        shapes.add(tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in tensors.items())))
        n = len(b.metadata["sample"])
        for m, feature in enumerate(b.modalities[1:], start=1):
            real = int((b.modality_ids == m).sum()) // LAYOUT.tokens(feature)
            # padded to the most a batch could hold; the padding flagged, the real items flagged by the window only
            assert len(b.data[feature]) == rows * capacity // LAYOUT.tokens(feature)
            assert b.data[f"{feature}_is_pad"][real:].all() and real == n * len(DELTAS[feature])
        cu = b.cu_seqlens.tolist()
        assert cu[: n + 1] == sorted(cu[: n + 1]) and set(cu[n:]) == {cu[n]}  # real boundaries, then repeats
        assert cu[n] == int((b.document_ids >= 0).sum())
    assert len(shapes) == 1


def test_whole_episode_chunks_hold_every_frame_of_every_feature_once(source, episodes):
    tokens = {CAM: 4, WRIST: 2, STATE: 1, "action": 1}
    layout = TokenLayout(tokens_per_frame=tokens, interleave_chunk=True)
    ds = Packing(layout=layout, max_length=8, plan=PlanConfig(capacity=256, shuffle=False)).dataset(source)
    assert ds.plan(0).dropped.size == 0 and int(ds.items.table.lengths(np.arange(len(ds.items))).max()) <= 8
    chunks = {}
    for step in range(ds.num_steps(0)):
        batch = ds[0, step]
        assert batch.modalities == ["text", *tokens]
        n = len(batch.metadata["sample"])
        docs = [batch.document_ids == d for d in range(n)]
        # each document's frames of each feature, counted from its tokens
        counts = {f: [int((batch.modality_ids[doc] == batch.modalities.index(f)).sum()) // k for doc in docs]
                  for f, k in tokens.items()}
        pieces = {f: split(batch, f, counts[f]) for f in tokens}
        for d in range(n):
            e, start = int(batch.metadata["episode"][d]), int(batch.metadata["start_step"][d])
            chunks.setdefault(e, []).append((start, {f: v[d] for f, v in pieces.items()}))
            assert not any(batch.data[f"{f}_is_pad"].any() for f in tokens)
    assert sorted(chunks) == list(range(len(episodes)))
    for e, parts in chunks.items():
        parts.sort(key=lambda p: p[0])
        ep = episodes[e]
        for feature in tokens:
            got = np.concatenate([p[1][feature] for p in parts])
            if feature in (CAM, WRIST):
                got = read_index(got)
            # the consecutive chunks of the episode hold its every frame of every feature exactly once, in order
            np.testing.assert_array_equal(got, truth_of(ep, feature)[0], err_msg=f"episode {e} {feature}")


def test_every_video_feature_read_must_be_priced(source):
    with pytest.raises(ValueError, match=rf"video feature '{WRIST}' has no price"):
        Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), window=SPEC).dataset(source)
    with pytest.raises(ValueError, match="'observation.nope', which the dataset does not have"):
        Packing(layout=LAYOUT, window=WindowSpec.from_delta_timestamps({"observation.nope": [0.0]})).dataset(source)


def test_sampler_resumes_at_a_step():
    src = ArraySource([{STATE: np.zeros((n, 1), np.float32), "action": np.zeros((n, 1), np.float32)}
                       for n in (4, 6, 9)])
    ds = Packing(window=WindowSpec.from_delta_timestamps({"action": [0.0, 1 / 30]}),
                 plan=PlanConfig(capacity=8)).dataset(src)
    sampler = PlanSampler(ds, epoch=2, start=3)
    assert len(sampler) == ds.num_steps(2) - 3
    assert list(sampler) == [(2, s) for s in range(3, ds.num_steps(2))]
    assert list(sampler) == [(3, s) for s in range(ds.num_steps(3))]  # the next pass is the next epoch
    assert sampler.state_dict() == {"epoch": 4, "plan_version": PLAN_VERSION}


def loader_documents(loader, deltas, has=lambda dataset, feature: True):
    """Every document the loader hands out: (sample, dataset, episode, start step, {key: tensor}); ``has``
    says whether documents of a dataset hold a feature."""
    for batch in loader:
        n = len(batch.metadata["sample"])
        dataset = batch.metadata.get("dataset", torch.zeros(n, dtype=torch.int64)).tolist()
        offsets = {f: 0 for f in deltas}
        for d in range(n):
            doc = {}
            for f, ds in deltas.items():
                if not has(dataset[d], f):
                    continue
                k = len(ds)
                doc[f] = batch.data[f][offsets[f] : offsets[f] + k]
                doc[f"{f}_is_pad"] = batch.data[f"{f}_is_pad"][offsets[f] : offsets[f] + k]
                offsets[f] += k
            yield (int(batch.metadata["sample"][d]), dataset[d], int(batch.metadata["episode"][d]),
                   int(batch.metadata["start_step"][d]), doc)
        assert all(offsets[f] == len(batch.data[f]) for f in deltas if f in batch.data)


def test_lerobot_windows_view_equals_the_packed_loaders_documents(tmp_path):
    """On LeRobot v3 files, ``ds.windows(spec)[i]`` holds exactly what the packed loader (with worker
    processes) lays out for sample ``i``: every feature and every ``_is_pad`` flag."""
    eps = make_episodes(3, seed=7, min_length=10, max_length=14, cameras=("cam_high",))
    root = write_lerobot(tmp_path / "lerobot", eps, codec="h264", gop=4)
    deltas = {CAM: [-0.1, -0.05, 0.0], STATE: [-1 / 30, 0.0], "next.done": [0.0], "action": [i / 30 for i in range(4)]}
    spec = WindowSpec.from_delta_timestamps(deltas)
    source = open_dataset(root)
    view = source.windows(spec)
    loader = DataLoader(source, packing=Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), window=spec,
                                                plan=PlanConfig(capacity=128, rows_per_batch=2), seed=1),
                        num_workers=2)
    starts = np.concatenate([[0], np.cumsum([e.length for e in eps])])
    seen = []
    for sample, _, episode, step, doc in loader_documents(loader, deltas):
        want = view[sample]
        assert (want["episode_index"], want["frame_index"]) == (episode, step)
        assert set(doc) == {k for k in want if k not in ("task", "episode_index", "frame_index")}
        for key, value in doc.items():
            assert value.dtype == want[key].dtype and torch.equal(value, want[key]), (sample, key)
        got = {f: read_index(doc[f].numpy()) if f == CAM else doc[f].numpy() for f in deltas}
        check_document(got, {f: doc[f"{f}_is_pad"] for f in deltas}, eps[episode], step, deltas,
                       first=int(starts[episode]))
        seen.append(sample)
    assert sorted(seen + loader.dataset.plan(0).dropped.tolist()) == list(range(len(view)))


def test_a_mixture_of_a_lerobot_dir_and_shards_with_a_second_camera(tmp_path):
    """open_dataset([lerobot, shards]) weighted 3:1: each dataset's share of the epoch follows the weights and
    every document's payloads are its own dataset's frames and steps (the wrist camera only where it exists)."""
    a_eps = make_episodes(3, seed=1, min_length=10, max_length=14, cameras=("cam_high",))
    b_eps = make_episodes(3, seed=2, min_length=10, max_length=14, cameras=("cam_high", "cam_wrist"),
                          camera_fps={"cam_high": 15.0})
    a = write_lerobot(tmp_path / "lerobot", a_eps, codec="h264", gop=4)
    write_webdataset(tmp_path / "shards", b_eps, episodes_per_shard=2)
    mix = open_dataset([a, tmp_path / "shards"])
    assert mix.present(WRIST).tolist() == [False] * 3 + [True] * 3
    deltas = {CAM: [-1 / 15, 0.0], WRIST: [0.0], STATE: [0.0], "action": [0.0, 1 / 30]}
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 8, WRIST: 4}),
                      window=WindowSpec.from_delta_timestamps(deltas),
                      plan=PlanConfig(capacity=128, rows_per_batch=2), weights=[3.0, 1.0], seed=2)
    loader = DataLoader(mix, packing=packing)
    starts = np.concatenate([[0], np.cumsum([e.length for e in a_eps])])
    per_dataset = Counter()
    for _, dataset, episode, step, doc in loader_documents(loader, deltas, lambda d, f: f != WRIST or d == 1):
        local = episode - (0 if dataset == 0 else len(a_eps))
        ep = (a_eps if dataset == 0 else b_eps)[local]
        assert (WRIST in doc) == (dataset == 1)
        want = {f: d for f, d in deltas.items() if f in doc}
        got = {f: read_index(doc[f].numpy()) if f in (CAM, WRIST) else doc[f].numpy() for f in want}
        check_document(got, {f: doc[f"{f}_is_pad"] for f in want}, ep, step, want,
                       first=int(starts[local]) if dataset == 0 else 0)
        per_dataset[dataset] += 1
    dataset = loader.dataset
    drawn = dataset.epoch_samples(0)
    dropped = Counter(mix.dataset_of[dataset.items.table.groups[drawn[dataset.plan(0).dropped]]].tolist())
    sizes = np.bincount(mix.dataset_of[dataset.items.table.groups])
    assert [per_dataset[d] + dropped[d] for d in (0, 1)] == mix_counts(np.array([3.0, 1.0]), sizes.sum()).tolist()
    assert per_dataset[0] > 0 and per_dataset[1] > 0
