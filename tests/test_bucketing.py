"""bucket_boundaries / bucket_batches: quantile edges, exact partition, padded-token budget, seeded shuffle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from mmfeed.packing import bucket_batches, bucket_boundaries
from mmfeed.testing.strategies import lengths


def check(batches, lens, edges, max_tokens):
    """Every item within budget lands in exactly one batch; each batch is one bucket and within budget."""
    flat = sorted(i for b in batches for i in b.tolist())
    assert flat == np.flatnonzero(lens <= max_tokens).tolist()
    bucket = np.searchsorted(edges, lens, side="left")
    for b in batches:
        assert b.size >= 1 and b.dtype == np.int64
        assert b.size * max(int(np.maximum(lens[b], 1).max()), 1) <= max_tokens
        assert len(set(bucket[b].tolist())) == 1


def test_doc_example_and_edges():
    lens = np.array([3, 9, 4, 10, 2, 8])
    edges = bucket_boundaries(lens, 2)
    assert edges.tolist() == [4, 10]
    assert [b.tolist() for b in bucket_batches(lens, edges, 20, shuffle=False)] == [[0, 2, 4], [1, 3], [5]]
    assert bucket_boundaries(lens, 1).tolist() == [10]
    assert bucket_boundaries([5, 5, 5], 4).tolist() == [5]  # repeated quantiles merge


@pytest.mark.kernels
def test_unshuffled_batches_equal_naive_greedy():
    rng = np.random.default_rng(6)
    for _ in range(40):
        lens = rng.integers(0, 60, int(rng.integers(1, 80)))
        edges = bucket_boundaries(lens, int(rng.integers(1, 6)))
        budget = int(rng.integers(60, 300))
        got = [b.tolist() for b in bucket_batches(lens, edges, budget, shuffle=False)]
        bucket = np.searchsorted(edges, lens, side="left").tolist()
        order = sorted(range(lens.size), key=lambda i: (bucket[i], i))
        assert got == naive.greedy_batches(order, lens.tolist(), bucket, budget)


@pytest.mark.kernels
@settings(max_examples=60)
@given(lengths(min_size=1, max_size=120, max_length=100), st.integers(1, 8), st.integers(1, 400), st.integers(0, 3))
def test_property_partition_and_budget(lens, num_buckets, budget, epoch):
    edges = bucket_boundaries(lens, num_buckets)
    batches = bucket_batches(lens, edges, budget, seed=1, epoch=epoch, on_oversize="skip")
    check(batches, lens, edges, budget)


def test_shuffle_is_seeded():
    lens = np.random.default_rng(0).integers(1, 500, 2000)
    edges = bucket_boundaries(lens, 8)
    a = [b.tolist() for b in bucket_batches(lens, edges, 2048, seed=3, epoch=0)]
    assert a == [b.tolist() for b in bucket_batches(lens, edges, 2048, seed=3, epoch=0)]
    assert a != [b.tolist() for b in bucket_batches(lens, edges, 2048, seed=3, epoch=1)]
    check(bucket_batches(lens, edges, 2048, seed=3, epoch=1), lens, edges, 2048)


def test_items_over_budget_raise_or_are_skipped():
    lens = np.array([5, 50, 7])
    with pytest.raises(ValueError, match="1 items are longer than max_tokens=20"):
        bucket_batches(lens, [10, 50], 20)
    batches = bucket_batches(lens, [10, 50], 20, on_oversize="skip", shuffle=False)
    assert [b.tolist() for b in batches] == [[0, 2]]


def test_items_past_the_last_edge_form_their_own_bucket_and_zero_lengths_count_one():
    batches = bucket_batches([3, 30, 0, 0], [10], 40, shuffle=False)
    assert [b.tolist() for b in batches] == [[0, 2, 3], [1]]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="strictly increasing"):
        bucket_batches([1, 2], [5, 5], 10)
    with pytest.raises(ValueError, match="num_buckets"):
        bucket_boundaries([1, 2], 0)
    with pytest.raises(ValueError, match="at least one"):
        bucket_boundaries([], 3)
    with pytest.raises(ValueError, match="on_oversize"):
        bucket_batches([1], [1], 10, on_oversize="truncate")
