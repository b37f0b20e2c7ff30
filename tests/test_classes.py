"""Samples of a few prices planned without anything per sample: packing by counts in run-length form, samples
found by class from runs, and the class plan (every sample once per epoch across ranks, also after an elastic
resume at another world size; equal steps; each step dealt by cost)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.packing import PlanConfig, pack
from mmfeed.packing.classes import ClassPlan, PriceClasses, class_remainder, pack_classes

from naive import best_fit_decreasing, first_fit_decreasing, lpt_max, rows_from_bin_of

REMAINDERS = ("drop", "pad", "replicate")


def expanded(prices: list[int], counts: list[int]) -> list[int]:
    return [p for p, n in zip(prices, counts) for _ in range(n)]


def naive_rows(prices: list[int], counts: list[int], capacity: int, algorithm: str) -> list[tuple[int, ...]]:
    """Each row of the naive packing of the samples listed one by one, as its count of every class."""
    items = expanded(prices, counts)
    fit = first_fit_decreasing if algorithm == "ffd" else best_fit_decreasing
    rows = rows_from_bin_of(fit(items, capacity)).values()
    return [tuple(sum(1 for i in row if items[i] == p) for p in prices) for row in rows]


@st.composite
def price_counts(draw, capacity):
    prices = sorted(draw(st.sets(st.integers(1, capacity), min_size=0, max_size=6)), reverse=True)
    counts = [draw(st.integers(0, 40)) for _ in prices]
    return prices, counts


# -- packing by counts ---------------------------------------------------------------------------------------------
@pytest.mark.kernels
@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 60), data=st.data())
def test_ffd_by_counts_gives_the_rows_ffd_gives_the_samples_one_by_one(capacity, data):
    prices, counts = data.draw(price_counts(capacity))
    patterns, repeats = pack_classes(np.array(prices, np.int64), np.array(counts, np.int64), capacity, "ffd")
    rows = Counter()  # groups of one content may repeat: count rows
    for p, r in zip(patterns.tolist(), repeats.tolist()):
        rows[tuple(p)] += r
    assert rows == Counter(naive_rows(prices, counts, capacity, "ffd"))
    assert (repeats > 0).all() and (patterns.sum(axis=1) > 0).all()


@pytest.mark.kernels
@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 60), data=st.data())
def test_bfd_by_counts_gives_as_many_rows_with_the_same_free_space_as_bfd(capacity, data):
    prices, counts = data.draw(price_counts(capacity))
    patterns, repeats = pack_classes(np.array(prices, np.int64), np.array(counts, np.int64), capacity, "bfd")
    want = naive_rows(prices, counts, capacity, "bfd")
    free = sorted(capacity - t for t, r in zip((patterns @ np.array(prices, np.int64)).tolist(), repeats.tolist())
                  for _ in range(r)) if prices else []
    assert int(repeats.sum()) == len(want)
    assert free == sorted(capacity - sum(x * p for x, p in zip(row, prices)) for row in want)
    assert (patterns * repeats[:, None]).sum(axis=0).tolist() == counts  # every sample in a row, once


def test_pack_classes_is_run_length_at_scale_and_checks_its_input():
    prices = np.arange(1200, 900, -7)  # 43 prices, a million samples
    counts = np.full(prices.size, 25_000)
    for algorithm in ("bfd", "ffd"):
        patterns, repeats = pack_classes(prices, counts, 8192, algorithm)
        assert len(repeats) < 10 * prices.size and int((patterns * repeats[:, None]).sum()) == counts.sum()
        assert int(repeats.sum()) == pack(np.repeat(prices, counts), 8192, algorithm).num_bins
    with pytest.raises(ValueError, match="decreasing"):
        pack_classes([3, 5], [1, 1], 8)
    with pytest.raises(ValueError, match="in \\[1, 8\\]"):
        pack_classes([9, 5], [1, 1], 8)
    with pytest.raises(ValueError, match="algorithm"):
        pack_classes([5], [1], 8, "nf")


# -- samples by class ------------------------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(runs=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 5)), max_size=15))
def test_the_samples_of_a_class_are_its_runs_ids_in_order(runs):
    lengths, prices = [n for n, _ in runs], [p for _, p in runs]
    classes = PriceClasses.from_runs(np.array(lengths, np.int64), np.array(prices, np.int64))
    price_of = [p for n, p in runs for _ in range(n)]
    assert classes.prices.tolist() == sorted({p for n, p in runs if n}, reverse=True)
    assert classes.num_samples == len(price_of)
    for c, price in enumerate(classes.prices.tolist()):
        want = [i for i, p in enumerate(price_of) if p == price]
        assert classes.members(c).tolist() == want
        assert classes.counts[c] == len(want)


# -- the plan ------------------------------------------------------------------------------------------------------
@st.composite
def class_setups(draw):
    capacity = draw(st.integers(4, 40))
    runs = draw(st.lists(st.tuples(st.integers(0, 30), st.integers(1, capacity + 3)), max_size=12))
    return capacity, [n for n, _ in runs], [p for _, p in runs]


@settings(max_examples=120, deadline=None)
@given(setup=class_setups(), ranks=st.integers(1, 4), k=st.integers(1, 3), remainder=st.sampled_from(REMAINDERS),
       shuffle=st.booleans(), algorithm=st.sampled_from(["bfd", "ffd"]), seed=st.integers(0, 99))
def test_every_sample_is_in_one_batch_or_dropped_and_rows_fit(setup, ranks, k, remainder, shuffle, algorithm, seed):
    capacity, lengths, prices = setup
    config = PlanConfig(capacity=capacity, rows_per_batch=k, remainder=remainder, shuffle=shuffle,
                        algorithm=algorithm)
    plan = ClassPlan(PriceClasses.from_runs(np.array(lengths, np.int64), np.array(prices, np.int64)), config, seed,
                     2, ranks)
    price_of = np.array([p for n, p in zip(lengths, prices) for _ in range(n)], np.int64)
    rows = [plan.batch_rows(rank, step) for step in range(plan.num_steps) for rank in range(ranks)]
    assert all(len(b) == k for b in rows) or remainder == "pad"  # every rank a full batch unless padded
    flat = [r for b in rows for r in b]
    assert all(price_of[r].sum() <= capacity and len(r) for r in flat)  # every row fits and holds a sample
    got = np.concatenate(flat) if flat else np.zeros(0, np.int64)
    once = np.unique(got)
    assert sorted(once.tolist() + plan.dropped.tolist()) == list(range(len(price_of)))
    assert len(got) == len(once) + len(plan.replicated)  # only the listed replicas repeat
    assert set(plan.dropped.tolist()) >= set(np.flatnonzero(price_of > capacity).tolist())
    if remainder != "drop":
        assert (price_of[plan.dropped] > capacity).all()
    if flat:
        assert plan.efficiency == pytest.approx(sum(int(price_of[r].sum()) for r in flat) / (len(flat) * capacity))
        steps = plan.steps
        assert steps.shape == (ranks, plan.num_steps, k)
        assert all(np.array_equal(steps[r, s], plan.step_rows(r, s)) for r in range(ranks)
                   for s in range(plan.num_steps))
    # the rows are the packing of the counts, whatever the order
    fit = price_of[price_of <= capacity]
    if fit.size and remainder == "pad":
        assert len(flat) == pack(fit, capacity, algorithm).num_bins


def test_rows_and_samples_run_in_a_shuffled_order_that_depends_on_seed_and_epoch():
    classes = PriceClasses.from_runs(np.full(200, 50), np.tile([11, 13, 17, 19], 50))
    config = PlanConfig(capacity=64, rows_per_batch=2)

    def order(seed, epoch):
        plan = ClassPlan(classes, config, seed, epoch, 4)
        return np.concatenate([plan.batch_samples(r, s) for s in range(plan.num_steps) for r in range(4)])

    base = order(0, 0)
    assert np.array_equal(base, order(0, 0))  # a pure function
    for other in (order(0, 1), order(1, 0)):
        assert (base[: len(other)] == other[: len(base)]).mean() < 0.01
    assert abs(np.corrcoef(np.arange(len(base)), base)[0, 1]) < 0.05  # no trace of the index order left
    first = ClassPlan(classes, config, 0, 0, 4)
    episodes = {int(s) // 50 for r in range(4) for s in first.batch_samples(r, 0)}
    assert len(episodes) >= 10  # a step draws from many episodes of every price


def test_each_step_is_dealt_by_cost_no_worse_than_lpt():
    lengths = np.random.default_rng(0).integers(100, 400, 300)
    prices = np.random.default_rng(1).integers(200, 1500, 300)
    config = PlanConfig(capacity=4096, rows_per_batch=4)
    plan = ClassPlan(PriceClasses.from_runs(lengths, prices), config, 0, 0, 16)
    price_of = np.repeat(prices, lengths)
    for step in range(0, plan.num_steps, 7):
        loads, costs = [], []
        for rank in range(16):
            row_costs = [float(price_of[r].sum() + 0.67 * (price_of[r] ** 2).sum() / 4096)
                         for r in plan.batch_rows(rank, step)]
            loads.append(sum(row_costs))
            costs += row_costs
        assert max(loads) <= lpt_max(costs, 16, 4) + 1e-6
        assert np.mean(loads) / max(loads) > 0.99
        assert np.allclose(plan.rank_costs()[:, step], loads)


@settings(max_examples=80, deadline=None)
@given(setup=class_setups(), k=st.integers(1, 3), remainder=st.sampled_from(REMAINDERS),
       segments=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 30)), max_size=3), last=st.integers(1, 5))
def test_an_elastic_resume_continues_the_rows_losing_and_repeating_nothing(setup, k, remainder, segments, last):
    capacity, lengths, prices = setup
    classes = PriceClasses.from_runs(np.array(lengths, np.int64), np.array(prices, np.int64))
    config = PlanConfig(capacity=capacity, rows_per_batch=k, remainder=remainder)
    done, seen = [], []
    for world, steps in segments:
        plan = class_remainder(classes, config, seed=5, epoch=1, world_size=world, done=done)
        steps = min(steps, plan.num_steps)
        seen += [s for step in range(steps) for rank in range(world) for s in plan.batch_samples(rank, step)]
        done.append((world, steps))
    rest = class_remainder(classes, config, seed=5, epoch=1, world_size=last, done=done)
    ran = [s for step in range(rest.num_steps) for rank in range(last) for s in rest.batch_samples(rank, step)]
    assert set(seen) | set(ran) | set(rest.dropped.tolist()) == set(range(classes.num_samples))
    if remainder == "drop":  # nothing repeats at all
        assert len(seen) + len(ran) + len(rest.dropped) == classes.num_samples
    alone = class_remainder(classes, config, seed=5, epoch=1, world_size=1, done=done)
    with pytest.raises(ValueError, match="longer than its plan"):
        class_remainder(classes, config, seed=5, epoch=1, world_size=1, done=[*done, (1, alone.num_steps + 1)])


def test_a_class_plan_pickles_and_threads_share_its_deals():
    import pickle
    from concurrent.futures import ThreadPoolExecutor

    plan = ClassPlan(PriceClasses.from_runs(np.full(40, 30), np.tile([9, 11, 14, 17], 10)), PlanConfig(capacity=64),
                     0, 0, 4)
    want = [[plan.batch_samples(r, s).tolist() for r in range(4)] for s in range(plan.num_steps)]
    back = pickle.loads(pickle.dumps(plan))
    with ThreadPoolExecutor(4) as pool:  # steps asked at once from threads, the deal cache churning
        got = list(pool.map(lambda s: [back.batch_samples(r, s % back.num_steps).tolist() for r in range(4)],
                            range(4 * plan.num_steps)))
    assert got == [want[s % plan.num_steps] for s in range(4 * plan.num_steps)]


def test_a_class_plan_needs_a_decreasing_packing_over_the_whole_epoch():
    classes = PriceClasses.from_runs([5], [3])
    for config in (PlanConfig(algorithm="nf"), PlanConfig(mode="fixed"), PlanConfig(episode_block=2)):
        with pytest.raises(ValueError, match="class plan"):
            ClassPlan(classes, config, 0, 0)
    with pytest.raises(ValueError, match="run lengths must be >= 0"):
        PriceClasses.from_runs([-1], [3])
