"""Planned, packed batches from real shards: every token's payload is the step the plan asked for."""

import numpy as np
import pytest

from mmfeed.loaders import TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.dataset import PackedEpisodeDataset, PlanSampler
from mmfeed.packing.plan import PlanConfig
from mmfeed.testing import make_episodes, read_index, write_webdataset

SPEC = WindowSpec(offsets={"frames.cam_high": (-1, 0), "proprio": (0,), "action": tuple(range(4))})
LAYOUT = TokenLayout(tokens_per_frame={"cam_high": 8}, tokens_per_proprio_step=1, tokens_per_action_step=1)


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(4, seed=5, min_length=10, max_length=18, cameras=("cam_high",))


@pytest.fixture(scope="module")
def source(tmp_path_factory, episodes):
    out = tmp_path_factory.mktemp("packed")
    write_webdataset(out, episodes, episodes_per_shard=2)
    return open_dataset(out)


def per_doc(batch, key, counts):
    """Split a flat payload into its documents' pieces, given each document's item count."""
    return np.split(batch.data[key].numpy(), np.cumsum(counts)[:-1])


def test_windowed_batches_carry_exactly_the_planned_steps(source, episodes):
    ds = PackedEpisodeDataset(source, layout=LAYOUT, window=SPEC, capacity=128, rows_per_batch=2, seed=3)
    seen = []
    for step in range(ds.num_steps(0)):
        batch = ds[0, step]
        n = batch.num_documents
        assert batch.modalities == ["text", "frames.cam_high", "proprio", "action"]
        # Every modality's token count is its payload's items times the tokens per item.
        counts = [int((batch.modality_ids == m).sum()) for m in range(4)]
        assert counts[0] == len(batch.data["text"])
        assert counts[1] == 8 * len(batch.data["frames.cam_high"])
        assert counts[2] == len(batch.data["proprio"]) and counts[3] == len(batch.data["action"])
        frames = per_doc(batch, "frames.cam_high", [2] * n)
        actions = per_doc(batch, "action", [4] * n)
        pads = per_doc(batch, "action_is_pad", [4] * n)
        proprio = per_doc(batch, "proprio", [1] * n)
        for d in range(n):
            e, t = int(batch.metadata["episode"][d]), int(batch.metadata["start_step"][d])
            truth, length = episodes[e], episodes[e].length
            assert read_index(frames[d]).tolist() == np.clip([t - 1, t], 0, length - 1).tolist()
            np.testing.assert_array_equal(proprio[d], truth.proprio[[t]])
            np.testing.assert_array_equal(actions[d], truth.action[np.clip(t + np.arange(4), 0, length - 1)])
            assert pads[d].tolist() == [t + k >= length for k in range(4)]
            assert float(batch.metadata["start_time"][d]) == pytest.approx(t / truth.fps)
        seen.extend(batch.metadata["sample"].tolist())
    plan = ds.plan(0)
    # Every sample of the epoch is in exactly one batch, or listed as dropped.
    assert sorted(seen + plan.dropped.tolist()) == list(range(len(ds.table)))
    assert len(ds.table) == sum(e.length for e in episodes)


def test_attention_steps_follow_the_layout(source):
    ds = PackedEpisodeDataset(source, layout=LAYOUT, window=SPEC, capacity=128, seed=0)
    batch = ds[0, 0]
    text = len(ds.table.text[int(batch.metadata["episode"][0])])
    doc0 = batch.document_ids[0] == 0
    steps = batch.step_ids[0][doc0].tolist()
    # Text token-causal, then the frame at t-1 (8 tokens), then frame t + proprio (9), then the action chunk (4).
    expected = list(range(text)) + [text] * 8 + [text + 1] * 9 + [text + 2] * 4
    assert steps == expected


def test_static_shapes_give_identical_tensor_shapes(source):
    ds = PackedEpisodeDataset(source, layout=LAYOUT, window=SPEC, capacity=96, rows_per_batch=2, static_shapes=True)
    shapes = {tuple((k, tuple(v.shape)) for k, v in sorted(ds[0, s].data.items())) for s in range(ds.num_steps(0))}
    assert len(shapes) == 1
    batch = ds[0, 0]
    real = batch.data["frames.cam_high_is_pad"].logical_not().sum()
    assert int((batch.modality_ids == 1).sum()) <= 8 * len(batch.data["frames.cam_high"])
    assert len(batch.data["frames.cam_high"]) == 2 * 96 // 8 and real > 0


def test_whole_episode_chunks_for_world_models(source, episodes):
    layout = TokenLayout(tokens_per_frame={"cam_high": 4}, interleave_actions=True)
    ds = PackedEpisodeDataset(source, layout=layout, max_length=8, plan=PlanConfig(capacity=256, shuffle=False))
    chunks = {}
    for step in range(ds.num_steps(0)):
        batch = ds[0, step]
        counts = [int(x) for x in ds.table.length[batch.metadata["sample"].numpy()]]
        for d, frames in enumerate(per_doc(batch, "frames.cam_high", counts)):
            e, start = int(batch.metadata["episode"][d]), int(batch.metadata["start_step"][d])
            assert read_index(frames).tolist() == list(range(start, start + counts[d]))
            chunks.setdefault(e, []).append((start, counts[d]))
    # The chunks of each episode cover it exactly, none longer than max_length.
    for e, pieces in chunks.items():
        covered = sorted(s + i for s, n in pieces for i in range(n))
        assert covered == list(range(episodes[e].length)) and max(n for _, n in pieces) <= 8


def test_sampler_resumes_at_a_step():
    from mmfeed.loaders import ArraySource

    src = ArraySource([{"proprio": np.zeros((n, 1), np.float32), "action": np.zeros((n, 1), np.float32)}
                       for n in (4, 6, 9)])
    ds = PackedEpisodeDataset(src, layout=TokenLayout(), window=WindowSpec(offsets={"action": (0, 1)}), capacity=8)
    sampler = PlanSampler(ds, epoch=2, start=3)
    assert len(sampler) == ds.num_steps(2) - 3
    assert list(sampler) == [(2, s) for s in range(3, ds.num_steps(2))]
    assert list(sampler) == [(3, s) for s in range(ds.num_steps(3))]  # the next pass is the next epoch
    assert sampler.state_dict() == {"epoch": 4}


def test_mixture_draws_steps_by_weight_and_reads_each_source_through(source, tmp_path):
    """Over an epoch each source gives its weighted share of steps; a source's steps never repeat before its
    own epoch is through, and every batch comes from one source."""
    from mmfeed.loaders.mixture import MixtureDataset

    other_eps = make_episodes(3, seed=9, min_length=8, max_length=12, cameras=("cam_high",), proprio_dim=6,
                              action_dim=3)
    write_webdataset(tmp_path / "other", other_eps)
    a = PackedEpisodeDataset(source, layout=LAYOUT, window=SPEC, capacity=128)
    b = PackedEpisodeDataset(open_dataset(tmp_path / "other"), layout=LAYOUT, window=SPEC, capacity=128)
    mix = MixtureDataset([a, b], [3.0, 1.0], steps_per_epoch=12, seed=0)
    src, global_step = mix.schedule(0)
    assert np.bincount(src).tolist() == [9, 3]
    for epoch in range(3):
        for step in range(12):
            batch = mix[epoch, step]
            width = batch.data["action"].shape[1]
            assert width == (14 if batch.metadata["source"] == a.source.name else 3)
    # Source b's steps run through its own epochs in order: 3 per mixture epoch.
    seen = [mix.locate(1, int(g)) for e in range(4) for g in mix.schedule(e)[1][mix.schedule(e)[0] == 1]]
    per_epoch = b.num_steps(0)
    assert seen[:per_epoch] == [(0, s) for s in range(per_epoch)]
    assert len(set(seen)) == len(seen)
