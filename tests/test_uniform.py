"""Windows planned without anything per window: the per-position shuffle, the arithmetic plan of samples of one
price, windows located from cumulative episode counts, and the public path over them (every sample exactly once
per epoch across ranks, also after an elastic resume at another world size)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed import DataLoader
from mmfeed.codecs import ByteTokenizer, FixedLengthTokenizer
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.packing.samples import EpisodeWindows
from mmfeed.loaders.planned.dataset import PLAN_VERSION, PlanSampler
from mmfeed.packing.classes import ClassPlan
from mmfeed.packing.shuffle import index_shuffle, shuffle_keys
from mmfeed.packing.uniform import UniformPlan, uniform_consumed, uniform_remainder
from mmfeed.packing.windows import episode_windows
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset
from mmfeed.testing.synth_index import write_synthetic_index

from naive import feistel_shuffle, uniform_batches

REMAINDERS = ("drop", "pad", "replicate")
STATE = "observation.state"
SPEC = WindowSpec.from_delta_timestamps({STATE: [-0.1, 0.0], "action": [0.0, 0.1, 0.2]})


# -- the shuffle ----------------------------------------------------------------------------------------------------
@pytest.mark.kernels
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32), epoch=st.integers(0, 50), data=st.data())
def test_index_shuffle_equals_the_feistel_reference(n, seed, epoch, data):
    positions = data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20)) if n else []
    keys = [int(k) for k in shuffle_keys(seed, epoch)]
    got = index_shuffle(np.array(positions, dtype=np.int64), n, seed=seed, epoch=epoch)
    assert got.tolist() == [feistel_shuffle(p, n, keys) for p in positions]


@pytest.mark.kernels
@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 20000), seed=st.integers(0, 1000), epoch=st.integers(0, 5))
def test_index_shuffle_is_a_permutation(n, seed, epoch):
    ids = index_shuffle(np.arange(n), n, seed=seed, epoch=epoch)
    assert np.array_equal(np.sort(ids), np.arange(n))


def test_the_shuffle_depends_on_seed_and_epoch_and_looks_random():
    n = 100_000
    base = index_shuffle(np.arange(n), n, seed=0, epoch=0)
    for other in (index_shuffle(np.arange(n), n, seed=0, epoch=1), index_shuffle(np.arange(n), n, seed=1, epoch=0)):
        assert (base == other).mean() < 0.001
        assert abs(np.corrcoef(base, other)[0, 1]) < 0.02
    assert abs(np.corrcoef(np.arange(n), base)[0, 1]) < 0.02  # no trace of the position left
    assert abs(np.corrcoef(base[:-1], base[1:])[0, 1]) < 0.02  # neighbours unrelated
    # random access: any positions give the ids the whole order has there
    picks = np.random.default_rng(0).integers(0, n, 500)
    assert np.array_equal(index_shuffle(picks, n, seed=0, epoch=0), base[picks])


def test_index_shuffle_rejects_positions_outside_the_domain():
    with pytest.raises(ValueError, match=r"positions must be integers in \[0, 10\)"):
        index_shuffle(np.array([3, 10]), 10, seed=0, epoch=0)
    with pytest.raises(ValueError, match="seed, epoch and stream"):
        index_shuffle(np.array([1]), 10, seed=-1, epoch=0)


# -- the arithmetic plan ------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 400), capacity=st.integers(1, 64), ranks=st.integers(1, 5), k=st.integers(1, 3),
       remainder=st.sampled_from(REMAINDERS), shuffle=st.booleans(), seed=st.integers(0, 99), data=st.data())
def test_the_uniform_plan_is_the_naive_deal_of_the_shuffled_order(n, capacity, ranks, k, remainder, shuffle, seed,
                                                                  data):
    price = data.draw(st.integers(1, capacity))
    config = PlanConfig(capacity=capacity, rows_per_batch=k, remainder=remainder, shuffle=shuffle)
    plan = UniformPlan(n, price, config, seed, 3, ranks)
    order = index_shuffle(np.arange(n), n, seed=seed, epoch=3).tolist() if shuffle else list(range(n))
    want = uniform_batches(order, capacity // price, ranks, k, remainder)
    assert plan.num_steps == (len(want[0]) if want else 0)
    for rank in range(ranks):
        for step in range(plan.num_steps):
            assert [r.tolist() for r in plan.batch_rows(rank, step)] == want[rank][step]
    got = [s for rank in range(ranks) for step in range(plan.num_steps) for s in plan.batch_samples(rank, step)]
    once = sorted(set(got))
    assert sorted(once + plan.dropped.tolist()) == list(range(n))  # every sample in a batch or dropped, once
    assert len(got) == len(once) + len(plan.replicated)  # only the listed replicas repeat
    if remainder != "drop":
        assert len(plan.dropped) == 0
    if plan.num_steps:
        slots = sum(len(r) for rank in range(ranks) for step in range(plan.num_steps)
                    for r in plan.batch_rows(rank, step))
        rows = sum(1 for rank in range(ranks) for step in range(plan.num_steps) for _ in plan.batch_rows(rank, step))
        assert plan.efficiency == pytest.approx(slots * price / (rows * capacity))
        steps = plan.steps
        assert steps.shape == (ranks, plan.num_steps, k)
        assert all(np.array_equal(steps[r, s], plan.step_rows(r, s)) for r in range(ranks)
                   for s in range(plan.num_steps))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 600), per_row=st.integers(1, 6), k=st.integers(1, 3), remainder=st.sampled_from(REMAINDERS),
       segments=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 40)), max_size=3), last=st.integers(1, 6))
def test_an_elastic_resume_continues_the_order_losing_and_repeating_nothing(n, per_row, k, remainder, segments,
                                                                            last):
    config = PlanConfig(capacity=12 * per_row, rows_per_batch=k, remainder=remainder)
    done, seen = [], []
    for world, steps in segments:
        plan = uniform_remainder(n, 12, config, seed=5, epoch=1, world_size=world, done=done)
        steps = min(steps, plan.num_steps)
        seen += [s for step in range(steps) for rank in range(world) for s in plan.batch_samples(rank, step)]
        done.append((world, steps))
    assert sorted(set(seen)) == uniform_consumed(n, 12, config, seed=5, epoch=1, done=done).tolist()
    rest = uniform_remainder(n, 12, config, seed=5, epoch=1, world_size=last, done=done)
    ran = [s for step in range(rest.num_steps) for rank in range(last) for s in rest.batch_samples(rank, step)]
    everything = set(seen) | set(ran) | set(rest.dropped.tolist())
    assert everything == set(range(n))
    if remainder == "drop":  # nothing repeats at all
        assert len(seen) + len(ran) + len(rest.dropped) == n
    alone = uniform_remainder(n, 12, config, seed=5, epoch=1, world_size=1, done=done)
    with pytest.raises(ValueError, match="longer than its plan"):
        uniform_remainder(n, 12, config, seed=5, epoch=1, world_size=1, done=[*done, (1, alone.num_steps + 1)])


# -- windows located per episode ----------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=20), stride=st.integers(1, 7), data=st.data())
def test_windows_located_from_cumulative_counts_are_episode_windows(lengths, stride, data):
    episode, anchor = episode_windows(np.array(lengths), stride=stride)
    windows = EpisodeWindows(np.array(lengths), stride)
    assert len(windows) == len(episode)
    if len(episode):
        ids = np.array(data.draw(st.lists(st.integers(0, len(episode) - 1), max_size=30)), dtype=np.int64)
        got_episode, got_anchor = windows.locate(ids)
        assert np.array_equal(got_episode, episode[ids]) and np.array_equal(got_anchor, anchor[ids])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("uniform")
    write_webdataset(root, make_episodes(6, seed=0, min_length=20, max_length=40), episodes_per_shard=3)
    return root


def packing(capacity: int = 64, tokenizer=None, **plan) -> Packing:
    return Packing(layout=TokenLayout(tokens_per_frame={}), window=SPEC,
                   plan=PlanConfig(capacity=capacity, rows_per_batch=2, **plan),
                   tokenizer=tokenizer or FixedLengthTokenizer(ByteTokenizer(), 8, pad_id=0))


def test_per_sample_columns_match_the_materialized_windows(shards):
    source = open_dataset(shards)
    table = packing().dataset(source).items.table
    episode, anchor = episode_windows(source.lengths)
    ids = np.array([0, 5, len(episode) - 1, 17, 17])
    got_episode, got_anchor = table.locate(ids)
    assert np.array_equal(got_episode, episode[ids]) and np.array_equal(got_anchor, anchor[ids])
    assert np.array_equal(table.groups, episode) and np.array_equal(table.locate(np.arange(len(table)))[1], anchor)
    assert np.array_equal(table.tasks(ids), source.episode_tasks[episode[ids]])
    assert (table.tokens == table.uniform_price).all() and np.array_equal(table.prices(ids), table.tokens[ids])
    assert (table.lengths(ids) == 1).all()


def test_whole_columns_equal_the_columns_per_sample_id_also_where_episodes_change_task(tmp_path):
    root = write_lerobot(tmp_path / "ds", make_episodes(5, seed=0, min_length=8, max_length=20), task_switch=True)
    source = open_dataset(root)
    assert (source.episode_tasks < 0).all()  # every episode changes task halfway
    table = Packing(layout=TokenLayout(tokens_per_frame={}), window=SPEC, stride=2).dataset(source).items.table
    ids = np.arange(len(table))
    assert np.array_equal(table.tokens, table.prices(ids)) and np.array_equal(table.groups, table.locate(ids)[0])
    episode, anchor = episode_windows(source.lengths, stride=2)
    assert np.array_equal(table.tasks(ids), [source.step_tasks(e)[a] for e, a in zip(episode, anchor)])
    lengths, prices = table.price_runs  # runs of one price: each episode cut where its task's length changes
    assert np.array_equal(np.repeat(prices, lengths), table.tokens)
    assert len(lengths) > len(source)


def test_prices_by_episode_plan_by_class_one_price_arithmetically_the_rest_sample_by_sample(shards):
    source = open_dataset(shards)
    texts = {len(t.encode()) for t in source.tasks}
    assert len(texts) > 1  # the fixture's tasks differ in length
    varied = packing(tokenizer=ByteTokenizer()).dataset(source)
    assert varied.items.table.uniform_price is None and isinstance(varied.plan(0), ClassPlan)
    assert type(packing(tokenizer=ByteTokenizer(), algorithm="nf").dataset(source).plan(0)).__name__ == "Plan"
    fixed = packing().dataset(source)
    # 2 state frames + 3 actions + 8 text ids
    assert fixed.items.table.uniform_price == 13 and isinstance(fixed.plan(0), UniformPlan)
    assert fixed.plan(0).per_row == 64 // 13
    # a weighted draw or episode blocks need per-sample plans
    assert type(packing(episode_block=2).dataset(source).plan(0)).__name__ == "Plan"


PLANS = pytest.mark.parametrize("tokenizer, kind", [(None, UniformPlan), (ByteTokenizer(), ClassPlan)],
                                ids=["one-price", "by-class"])


@PLANS
def test_batches_hold_the_windows_the_view_reads(shards, tokenizer, kind):
    source = open_dataset(shards)
    ds = packing(tokenizer=tokenizer).dataset(source, rank=1, world_size=2)
    assert isinstance(ds.plan(0), kind)
    view = source.windows(SPEC)
    batch = ds[0, 1]
    samples = batch.metadata["sample"].numpy()
    state = batch.data[STATE].numpy().reshape(len(samples), 2, -1)
    for d, s in enumerate(samples):
        assert np.array_equal(state[d], view[int(s)][STATE].numpy())
        assert view.locate(int(s)) == (int(batch.metadata["episode"][d]), int(batch.metadata["start_step"][d]))
    text = [len(source.task(e).encode()) if tokenizer else 8 for e in batch.metadata["episode"].tolist()]
    assert batch.data["text"].shape == (sum(text),)


@PLANS
def test_workers_and_an_elastic_resume_deliver_every_window_once(shards, tokenizer, kind):
    """Two ranks with 2 worker processes each run 3 steps; rank 0's saved state resumes 3 ranks; every sample of
    the epoch is delivered once (or listed as dropped)."""
    source = open_dataset(shards)
    pk = packing(tokenizer=tokenizer)
    seen, state = [], None
    for rank in range(2):
        ds = pk.dataset(source, rank=rank, world_size=2)
        loader = DataLoader(ds, num_workers=2)
        for i, batch in enumerate(loader):
            seen += batch.metadata["sample"].tolist()
            if i == 2:
                if rank == 0:
                    state = loader.state_dict()
                break
    for rank in range(3):
        ds = pk.dataset(source, rank=rank, world_size=3)
        loader = DataLoader(ds, num_workers=2)
        loader.load_state_dict(ds.reshard_state(state))
        seen += [s for batch in loader for s in batch.metadata["sample"].tolist()]
    rest = ds.plan(0, done=((2, 3),))
    assert isinstance(rest, kind)
    assert len(seen) == len(set(seen))
    assert sorted(seen + rest.dropped.tolist()) == list(range(len(ds.items)))


@pytest.fixture(scope="module")
def ten_million(tmp_path_factory):
    root = tmp_path_factory.mktemp("ten-million")
    write_synthetic_index(root, 40_000)  # 100-400 steps per episode: about 1e7 windows; tasks of 4 lengths
    return root


@pytest.mark.parametrize("tokenizer, kind, k", [(FixedLengthTokenizer(ByteTokenizer(), 48, pad_id=0), UniformPlan, 4),
                                                (ByteTokenizer(), ClassPlan, 16)], ids=["one-price", "by-class"])
@pytest.mark.slow  # a 40,000-episode index, 1e7 windows
def test_a_ten_million_window_epoch_holds_every_sample_once_across_ranks_and_after_a_resume(ten_million, tokenizer,
                                                                                           kind, k):
    source = open_dataset(ten_million)
    spec = WindowSpec.from_delta_timestamps({STATE: [0.0], "action": [i / 15 for i in range(16)]})
    pk = Packing(layout=TokenLayout(tokens_per_frame={}), window=spec,
                 plan=PlanConfig(capacity=4096, rows_per_batch=k), tokenizer=tokenizer)
    ds = pk.dataset(source, rank=0, world_size=64)
    n = len(ds.items)
    assert n == int(source.lengths.sum()) > 9_900_000
    plan = ds.plan(0)
    assert isinstance(plan, kind)
    if kind is UniformPlan:
        assert plan.per_row == 4096 // 65 and plan.num_steps == 619
    else:  # tasks of 4 text lengths, and episodes that change task cut into runs of one price
        assert len(plan.classes.prices) >= 4 and len(np.unique(ds.items.table.tokens)) == len(
            plan.classes.prices)

    def delivered(plan, world, steps):
        parts = [plan.batch_samples(rank, step) for step in range(steps) for rank in range(world)]
        return np.bincount(np.concatenate(parts), minlength=n)

    counts = delivered(plan, 64, plan.num_steps)
    counts[plan.dropped] += 1
    assert (counts == 1).all()
    # about half of its steps at 64 ranks, then the rest at 48 ranks
    first = delivered(plan, 64, plan.num_steps // 2)
    rest = pk.dataset(source, rank=0, world_size=48).plan(0, done=((64, plan.num_steps // 2),))
    counts = first + delivered(rest, 48, rest.num_steps)
    counts[rest.dropped] += 1
    assert (counts == 1).all()


def test_a_state_saved_by_the_previous_plan_version_is_refused(shards):
    ds = packing().dataset(open_dataset(shards))
    sampler = PlanSampler(ds)
    with pytest.raises(ValueError, match=f"plan version {PLAN_VERSION - 1}.*order changed"):
        sampler.load_state_dict({"epoch": 0, "start": 3, "plan_version": PLAN_VERSION - 1})
    loader = DataLoader(ds)
    next(iter(loader))
    state = loader.state_dict()
    state["order"]["state"]["plan_version"] = PLAN_VERSION - 1
    with pytest.raises(ValueError, match="order of samples changed"):
        ds.reshard_state(state)
