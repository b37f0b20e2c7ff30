"""Decode reuse (``PlanConfig(reuse=k)``): spans of k consecutive windows of one episode shuffled whole. k = 1 is
exactly the plan without the option; for any k every sample comes once an epoch, each span's windows are
consecutive samples of one episode laid out together, and a loader over real video decodes fewer frames per
sample delivered, with exact resume."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.codecs._pyav import decode_totals
from mmfeed.loaders import DataLoader, Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.packing import plan_epoch, plan_remainder
from mmfeed.packing.plan import consumed_samples
from mmfeed.testing import make_episodes, write_lerobot

from replay import replayed

CAM = "observation.images.cam_high"  # the camera make_episodes(cameras=("cam_high",)) writes


def groups_of(lengths: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(lengths)), lengths)


@pytest.mark.parametrize("mode", ["fixed", "bucket", "pack"])
def test_reuse_1_is_the_plan_without_it(mode):
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 60, 300)
    groups = groups_of([30] * 10)
    base = dict(mode=mode, batch_size=8, capacity=128, algorithm="bfd" if mode == "pack" else "nf")
    for world in (1, 3):
        a = plan_epoch(tokens, PlanConfig(**base), seed=3, epoch=1, world_size=world, groups=groups)
        b = plan_epoch(tokens, PlanConfig(**base, reuse=1), seed=3, epoch=1, world_size=world, groups=groups)
        assert np.array_equal(a.steps, b.steps) and np.array_equal(a.row_samples, b.row_samples)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=12), k=st.integers(1, 8),
       batch=st.integers(1, 9), world=st.integers(1, 3), remainder=st.sampled_from(["drop", "pad"]),
       seed=st.integers(0, 99))
def test_every_sample_once_and_each_span_consecutive_in_one_episode(lengths, k, batch, world, remainder, seed):
    groups = groups_of(lengths)
    n = len(groups)
    config = PlanConfig(mode="fixed", batch_size=batch, reuse=k, remainder=remainder)
    plan = plan_epoch(np.ones(n, np.int64), config, seed=seed, epoch=0, world_size=world, groups=groups)
    again = plan_epoch(np.ones(n, np.int64), config, seed=seed, epoch=0, world_size=world, groups=groups)
    assert np.array_equal(plan.steps, again.steps)  # a pure function of (seed, epoch)
    handed = [plan.batch_samples(r, s) for s in range(plan.num_steps) for r in range(world)]
    flat = np.concatenate([*handed, plan.dropped]) if handed else plan.dropped
    assert sorted(flat.tolist()) == list(range(n))  # each sample once: handed out or listed dropped
    # the order the plan cuts into batches: spans of k consecutive ids of one episode, none split apart
    rows = [plan.row_samples[plan.row_offsets[i]:plan.row_offsets[i + 1]] for i in range(len(plan.row_offsets) - 1)]
    order = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    first = np.r_[0, np.cumsum(lengths)[:-1]]
    span = {i: (int(g), (i - int(first[g])) // k) for i, g in enumerate(groups)}
    runs: list[list[int]] = []
    for i in order.tolist():
        if runs and span[runs[-1][-1]] == span[i]:
            runs[-1].append(i)
        else:
            runs.append([i])
    assert len(runs) == len({span[i] for i in order.tolist()})  # each span in one run
    for ids in runs:
        assert np.all(np.diff(ids) == 1) and len(ids) <= k


def test_an_elastic_resume_hands_out_every_sample_once():
    groups = groups_of([17, 5, 30, 9])
    tokens = np.ones(len(groups), np.int64)
    config = PlanConfig(mode="fixed", batch_size=4, reuse=4)
    done = [(2, 3)]
    seen = consumed_samples(tokens, config, seed=1, epoch=0, done=done, groups=groups)
    rest = plan_remainder(tokens, config, seed=1, epoch=0, world_size=3, done=done, groups=groups)
    ran = [rest.batch_samples(r, s) for s in range(rest.num_steps) for r in range(3)]
    assert sorted(np.concatenate([seen, *ran, rest.dropped]).tolist()) == list(range(len(groups)))


def test_conflicting_options_are_refused():
    with pytest.raises(ValueError, match="reuse must be an integer >= 1"):
        PlanConfig(reuse=0)
    with pytest.raises(ValueError, match="choose one"):
        PlanConfig(mode="fixed", reuse=2, episode_block=2)
    with pytest.raises(ValueError, match="sorts samples by length"):
        PlanConfig(mode="pack", reuse=2)
    with pytest.raises(ValueError, match="needs groups"):
        plan_epoch(np.ones(4, np.int64), PlanConfig(mode="fixed", reuse=2), seed=0, epoch=0)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("reuse") / "lerobot"
    write_lerobot(path, make_episodes(4, cameras=("cam_high",), min_length=18, max_length=30, seed=5), gop=2)
    return path


def loader(root, k: int, workers: int = 0) -> DataLoader:
    window = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], "action": [0.0, 1 / 30]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 4}), window=window, seed=0,
                      plan=PlanConfig(mode="fixed", batch_size=8, reuse=k))
    return DataLoader(open_dataset(root), packing=packing, num_workers=workers)


def test_a_loader_decodes_less_per_sample_and_resumes_exactly(root):
    per_sample = {}
    for k in (1, 4):
        before, samples = decode_totals()["frames_decoded"], 0
        for batch in loader(root, k):
            samples += batch.num_documents
        per_sample[k] = (decode_totals()["frames_decoded"] - before) / samples
    assert per_sample[4] < 0.8 * per_sample[1], per_sample
    value = lambda b: torch.cat([b.metadata["sample"], b.data[CAM].flatten()[:64].long()])  # noqa: E731
    replayed(lambda w: loader(root, 4, w), value, resumes=((0, 2), (2, 3)))


def test_the_reuse_bench_reports_each_k(root, tmp_path):
    """``python -m mmfeed.bench.reuse``: per k the rates, decodes per delivered frame and the diversity."""
    from mmfeed.bench.reuse import diversity, main

    groups = np.array([0, 0, 0, 1, 1, 2])
    assert diversity(groups, [np.array([4, 0, 1, 3]), np.array([5, 2])]) == {"episodes_per_batch": 2.0,
                                                                            "spans_per_batch": 2.0}
    out = tmp_path / "reuse.json"
    assert main(["--root", str(root), "--ks", "1,4", "--rounds", "1", "--steps", "2", "--json", str(out)]) == 0
    rows = {r["k"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[1]["samples_per_s_ratio"] == 1.0 and rows[4]["decoded_per_delivered"] < rows[1]["decoded_per_delivered"]
    assert rows[4]["spans_per_batch"] < rows[1]["spans_per_batch"]
