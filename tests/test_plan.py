"""The epoch plan: a pure function of prices, (seed, epoch) and world size; every sample exactly once."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive

from mmfeed.packing.plan import PlanConfig, plan_epoch, worker_steps

sizes = st.lists(st.integers(1, 300), min_size=0, max_size=120).map(lambda xs: np.array(xs, dtype=np.int64))


def accounted(plan) -> np.ndarray:
    """Sample ids in any batch of any rank, plus the dropped ones, minus one copy of each replicated one."""
    used = [plan.batch_samples(r, s) for r in range(plan.world_size) for s in range(plan.num_steps)]
    everything = np.concatenate([*used, plan.dropped, np.zeros(0, np.int64)])
    return np.sort(everything), used


@settings(max_examples=80)
@given(tokens=sizes, capacity=st.integers(1, 400), world=st.integers(1, 5), rows=st.integers(1, 3),
       mode=st.sampled_from(["pack", "bucket", "fixed"]), seed=st.integers(0, 3), block=st.integers(0, 3),
       episodes=st.integers(1, 9))
def test_every_sample_is_planned_once_or_counted_as_dropped(tokens, capacity, world, rows, mode, seed, block,
                                                            episodes):
    """No sample is lost or duplicated silently: batches plus dropped are exactly the samples, once each."""
    cfg = PlanConfig(capacity=capacity, rows_per_batch=rows, mode=mode, batch_size=3,
                     episode_block=block if mode != "bucket" else 0)
    groups = np.arange(len(tokens)) % episodes
    plan = plan_epoch(tokens, cfg, seed=seed, epoch=1, world_size=world, groups=groups)
    everything, used = accounted(plan)
    assert everything.tolist() == list(range(len(tokens)))
    # Every rank runs the same number of steps, and no rank's step is empty unless the plan pads.
    assert plan.steps.shape[:2] == (world, plan.num_steps)
    for r in range(world):
        for s in range(plan.num_steps):
            assert len(plan.batch_samples(r, s)) >= 1
    if mode == "pack":
        for row in range(plan.num_rows):
            assert 1 <= tokens[plan.row(row)].sum() <= capacity
        assert (plan.steps >= 0).all() and plan.steps.shape[2] == rows
        assert set(plan.dropped.tolist()) >= set(np.flatnonzero(tokens > capacity).tolist())


def test_replicate_policy_completes_the_last_step_and_lists_the_repeats():
    tokens = np.full(10, 50, dtype=np.int64)  # 10 rows of one sample each
    plan = plan_epoch(tokens, PlanConfig(capacity=60, remainder="replicate"), seed=0, epoch=0, world_size=4)
    used = np.concatenate([plan.batch_samples(r, s) for r in range(4) for s in range(plan.num_steps)])
    assert plan.num_steps == 3 and len(plan.dropped) == 0 and len(plan.replicated) == 2
    assert np.sort(np.concatenate([np.arange(10), plan.replicated])).tolist() == np.sort(used).tolist()


def test_plan_is_a_pure_function_of_seed_and_epoch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 500, size=2000)
    cfg = PlanConfig(capacity=1024, rows_per_batch=2)
    a = plan_epoch(tokens, cfg, seed=7, epoch=3, world_size=4)
    b = plan_epoch(tokens.copy(), cfg, seed=7, epoch=3, world_size=4)
    c = plan_epoch(tokens, cfg, seed=7, epoch=4, world_size=4)
    assert np.array_equal(a.steps, b.steps) and np.array_equal(a.row_samples, b.row_samples)
    assert not np.array_equal(a.batch_samples(0, 0), c.batch_samples(0, 0))
    assert a.efficiency > 0.95


def test_ranks_are_cost_balanced_beyond_a_shuffled_deal():
    """Per step, the mean rank cost over the max rank cost stays close to 1 (ranks wait for the slowest)."""
    rng = np.random.default_rng(1)
    tokens = np.clip(rng.lognormal(np.log(600), 0.9, 20_000).astype(np.int64), 1, 8192)
    plan = plan_epoch(tokens, PlanConfig(capacity=8192, rows_per_batch=4), seed=0, epoch=0, world_size=8)
    cost = plan.rank_costs()
    assert (cost.mean(axis=0) / cost.max(axis=0)).mean() > 0.95


def test_fixed_mode_without_shuffle_keeps_index_order():
    plan = plan_epoch(np.ones(10, np.int64), PlanConfig(mode="fixed", batch_size=3, shuffle=False), seed=0, epoch=0)
    assert [plan.batch_samples(0, s).tolist() for s in range(plan.num_steps)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert plan.dropped.tolist() == [9] and plan.capacity == 0


@given(steps=st.integers(0, 50), workers=st.integers(1, 6), start=st.integers(0, 10))
def test_workers_split_the_remaining_steps_round_robin(steps, workers, start):
    """Workers together load each step from the cursor on exactly once, in torch's round-robin order."""
    parts = [worker_steps(steps, workers, w, start=start) for w in range(workers)]
    merged = sorted(np.concatenate(parts).tolist())
    assert merged == list(range(start, steps))
    for w, part in enumerate(parts):
        assert all((s - start) % workers == w for s in part)


def test_bad_configs_are_named():
    with pytest.raises(ValueError, match="mode 'packed'"):
        PlanConfig(mode="packed")
    with pytest.raises(ValueError, match="algorithm 'xyz'"):
        PlanConfig(algorithm="xyz")
    with pytest.raises(ValueError, match="capacity"):
        PlanConfig(capacity=0)
    with pytest.raises(ValueError, match="tokens"):
        plan_epoch(np.array([1, 0]), PlanConfig(), seed=0, epoch=0)
    with pytest.raises(ValueError, match="world_size"):
        plan_epoch(np.array([1]), PlanConfig(), seed=0, epoch=0, world_size=0)


def test_episode_blocks_keep_each_step_within_a_few_episodes():
    """With blocks of 2 episodes, the samples of one step come from at most 2 episodes (plus a block boundary)."""
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(40), 50)
    tokens = rng.integers(100, 300, size=len(groups))
    cfg = PlanConfig(capacity=1024, rows_per_batch=2, episode_block=2)
    plan = plan_epoch(tokens, cfg, seed=0, epoch=0, world_size=2, groups=groups)
    spread = [len(np.unique(groups[np.concatenate([plan.batch_samples(r, s) for r in range(2)])]))
              for s in range(plan.num_steps)]
    assert max(spread) <= 4 and np.mean(spread) < 3
    full = plan_epoch(tokens, PlanConfig(capacity=1024, rows_per_batch=2), seed=0, epoch=0, world_size=2)
    assert plan.efficiency > full.efficiency - 0.03
    with pytest.raises(ValueError, match="groups"):
        plan_epoch(tokens, cfg, seed=0, epoch=0)


@pytest.mark.kernels
@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(1, 90), min_size=0, max_size=200), capacity=st.integers(1, 100),
       seed=st.integers(0, 3))
def test_counting_sort_rows_equal_the_argsort_construction(tokens, capacity, seed):
    """Rows by a counting sort on bin_of: the same CSR as a stable argsort of bin_of (samples of a row in
    shuffled order) and the same costs as row_costs, bit for bit."""
    from mmfeed.packing import pack, row_costs
    from mmfeed.packing.plan import _rows_by_counting

    t = np.asarray(tokens, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(t)).astype(np.int64)
    packed = pack(t[order], capacity)
    offsets, samples, costs = _rows_by_counting(packed.bin_of, order, t[order], packed.num_bins, float(capacity),
                                                0.67)
    placed = np.flatnonzero(packed.bin_of >= 0)
    by_row = placed[np.argsort(packed.bin_of[placed], kind="stable")]
    assert samples.tolist() == order[by_row].tolist()
    assert offsets.tolist() == [0, *np.cumsum(np.bincount(packed.bin_of[placed], minlength=packed.num_bins))]
    assert costs.tolist() == row_costs(t[order], packed.bin_of, capacity, alpha=0.67).tolist()


# The sorted pack path: samples by length, shuffled within a length, rows from the counts, each row shuffled.


@pytest.mark.kernels
@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(1, 40), min_size=0, max_size=150), capacity=st.integers(1, 45),
       state=st.integers(1, 2**63 - 1))
def test_by_length_equals_the_sorted_ids_and_shuffles_within_each_length(tokens, capacity, state):
    from mmfeed.packing.plan import _by_length, _shuffle_segments

    t = np.asarray(tokens, dtype=np.int64)
    want, counts, over = naive.by_length(tokens, capacity)
    ids, got_counts, oversize = _by_length(t, capacity, np.uint64(state), False)
    assert ids.tolist() == want and got_counts.tolist() == counts and oversize.tolist() == over
    shuffled, _, _ = _by_length(t, capacity, np.uint64(state), True)
    starts = np.concatenate([[0], np.cumsum(counts[::-1])]).tolist()
    assert shuffled.tolist() == naive.shuffle_segments(want, starts, state)[0]
    seg = np.arange(10, dtype=np.int64)
    left = _shuffle_segments(seg, np.array([0, 4, 10]), np.uint64(state))
    assert seg.tolist() == naive.shuffle_segments(list(range(10)), [0, 4, 10], state)[0]
    assert int(left) == naive.shuffle_segments(list(range(10)), [0, 4, 10], state)[1]


@pytest.mark.kernels
@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(1, 90), min_size=0, max_size=200), capacity=st.integers(1, 100),
       algorithm=st.sampled_from(["bfd", "ffd"]), state=st.integers(1, 2**63 - 1), shuffle=st.booleans())
def test_rows_from_counts_are_the_rows_pack_gives(tokens, capacity, algorithm, state, shuffle):
    """pack_counts places exactly as pack() on the sorted lengths; _rows_sorted builds those rows (each a
    permutation of the naive row, sorted by id without shuffle) with row_costs' costs, bit for bit."""
    from mmfeed.packing import pack, row_costs
    from mmfeed.packing.bins import pack_counts
    from mmfeed.packing.plan import _by_length, _rows_sorted

    t = np.asarray(tokens, dtype=np.int64)
    ids, counts, _ = _by_length(t, capacity, np.uint64(state), shuffle)
    assigned, num_bins = pack_counts(counts, capacity, algorithm)
    lengths = t[ids]
    assert assigned.tolist() == pack(lengths, capacity, algorithm).bin_of.tolist()
    offsets, samples, costs = _rows_sorted(assigned, ids, counts, num_bins, float(capacity), 0.67,
                                           np.uint64(state), shuffle)
    want = naive.rows_from_places(assigned.tolist(), ids.tolist())
    got = [samples[offsets[b]:offsets[b + 1]].tolist() for b in range(num_bins)]
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    if not shuffle:
        assert got == [sorted(r) for r in want]
    row_of = np.repeat(np.arange(num_bins), np.diff(offsets))
    assert costs.tolist() == row_costs(t[samples], row_of, capacity, alpha=0.67).tolist()


def test_shuffle_off_packs_the_index_order_and_the_shuffle_keeps_the_same_rows_multiset():
    """Without shuffle the sorted path is the old construction (pack in index order, rows by increasing id);
    with it, the rows hold the same lengths, other samples."""
    from mmfeed.packing import pack

    rng = np.random.default_rng(4)
    tokens = rng.integers(1, 700, size=3000)
    cfg = PlanConfig(capacity=1024, rows_per_batch=2, shuffle=False)
    plan = plan_epoch(tokens, cfg, seed=0, epoch=0, world_size=2)
    packed = pack(tokens, 1024)
    want = sorted(sorted(r.tolist()) for r in packed.bins())
    assert sorted(plan.row(r).tolist() for r in range(plan.num_rows)) == want
    assert all(np.all(np.diff(plan.row(r)) > 0) for r in range(plan.num_rows))
    shuffled = plan_epoch(tokens, PlanConfig(capacity=1024, rows_per_batch=2), seed=0, epoch=0, world_size=2)
    assert sorted(sorted(tokens[shuffled.row(r)].tolist()) for r in range(shuffled.num_rows)) == \
        sorted(sorted(tokens[r].tolist()) for r in packed.bins())
    assert sorted(plan.row(r).tolist() for r in range(plan.num_rows)) != \
        sorted(sorted(shuffled.row(r).tolist()) for r in range(shuffled.num_rows))
