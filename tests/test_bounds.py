"""lower_bound: max(ceil(sum / C), Martello-Toth L2) over the items that fit, checked against the formula."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import naive
from mmfeed.packing import lower_bound, pack
from mmfeed.testing.strategies import capacities, lengths


def test_examples():
    assert lower_bound([], 10) == 0
    assert lower_bound([11, 12], 10) == 0  # nothing fits, nothing to place
    assert lower_bound([0, 0], 10) == 1  # zero-length items still take a row
    assert lower_bound([6, 6, 6, 2, 2, 2], 10) == 3  # three items over half a row
    assert lower_bound([6, 6, 6, 4, 4, 4], 10) == 3
    assert lower_bound([7, 7, 7, 3, 3, 3, 3], 10) == 4  # ceil(33 / 10) = 4
    assert lower_bound([51] * 5 + [10] * 5, 100) == 5  # sum bound says 4: five items over half need five rows


def test_l2_with_a_positive_threshold_beats_the_sum_bound():
    """[60, 60, 45, 45, 45] in rows of 100: the sum says 3; K = 45 counts two items over 55 plus 135 tokens of
    items in [45, 50] that cannot join them, so 4 (and 4 is optimal)."""
    lens = [60, 60, 45, 45, 45]
    assert lower_bound(lens, 100) == 4 == naive.optimal_bins(lens, 100)


def test_invalid_input():
    with pytest.raises(ValueError, match="capacity"):
        lower_bound([1], 0)
    with pytest.raises(ValueError, match="-1"):
        lower_bound([1, -1], 5)


@pytest.mark.kernels
def test_equals_naive_on_random_inputs():
    rng = np.random.default_rng(5)
    for _ in range(200):
        capacity = int(rng.integers(1, 50))
        lens = rng.integers(0, capacity + 5, int(rng.integers(0, 40)))
        assert lower_bound(lens, capacity) == naive.lower_bound_l2(lens.tolist(), capacity)


@pytest.mark.kernels
@settings(max_examples=80)
@given(lengths(max_size=40, max_length=60), capacities(max_value=50))
def test_property_bound_is_naive_and_below_every_packing(lens, capacity):
    bound = lower_bound(lens, capacity)
    assert bound == naive.lower_bound_l2(lens.tolist(), capacity)
    assert bound <= min(pack(lens, capacity, a).num_bins for a in ("nf", "ffd", "bfd"))


@pytest.mark.kernels
def test_bound_never_exceeds_brute_force_optimum():
    rng = np.random.default_rng(9)
    for _ in range(100):
        capacity = int(rng.integers(2, 25))
        lens = rng.integers(1, capacity + 1, int(rng.integers(1, 8))).tolist()
        assert lower_bound(lens, capacity) <= naive.optimal_bins(lens, capacity)
