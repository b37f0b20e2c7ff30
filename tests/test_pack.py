"""Offline packing: pack(), PackPlan and the ALGORITHMS registry, checked against tests/naive.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from mmfeed.packing import ALGORITHMS, PackPlan, lower_bound, pack
from mmfeed.testing.strategies import capacities, lengths

NAIVE = {"nf": naive.next_fit, "ffd": naive.first_fit_decreasing, "bfd": naive.best_fit_decreasing}


def check_partition(plan: PackPlan, lens: np.ndarray, capacity: int, max_per_bin: int | None = None) -> None:
    """Every item that fits lands in exactly one row, oversize items in none; rows within capacity, none empty."""
    lens = np.asarray(lens, dtype=np.int64)
    assert plan.bin_of.shape == lens.shape
    assert ((plan.bin_of == -1) == (lens > capacity)).all()
    assert plan.num_oversize == int((lens > capacity).sum())
    rows = plan.bins()
    assert len(rows) == plan.num_bins
    flat = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    assert sorted(flat.tolist()) == np.flatnonzero(lens <= capacity).tolist()  # none lost, none duplicated
    for b, row in enumerate(rows):
        assert row.size >= 1  # no empty row
        assert (plan.bin_of[row] == b).all()
        assert lens[row].sum() <= capacity
        if max_per_bin is not None:
            assert row.size <= max_per_bin


def test_registry_holds_the_contract_algorithms():
    assert {"nf", "ffd", "bfd"} <= set(ALGORITHMS)


def test_doc_example_bfd_rows_in_placement_order():
    plan = pack([5, 3, 7, 1], capacity=8)
    assert plan.bin_of.tolist() == [1, 1, 0, 0]
    assert [r.tolist() for r in plan.bins()] == [[2, 3], [0, 1]]  # decreasing length within a row
    assert plan.efficiency == 1.0 and plan.num_bins == 2


def test_next_fit_keeps_input_order_within_rows():
    plan = pack([3, 3, 3, 7, 1], capacity=8, algorithm="nf")
    assert [r.tolist() for r in plan.bins()] == [[0, 1], [2], [3, 4]]


@pytest.mark.parametrize(
    "bad, match",
    [
        ([1, -2], "-2"),
        ([1.5, 2], "1.5"),
        ([True, False], "boolean"),
        ([[1, 2]], "1-D"),
        (["a"], "dtype"),
        ([float("nan")], "nan"),
    ],
)
def test_invalid_lengths_raise_valueerror_naming_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        pack(bad, 8)


@pytest.mark.parametrize("capacity", [0, -3, 8.0, True, "8"])
def test_invalid_capacity_raises(capacity):
    with pytest.raises(ValueError, match="capacity"):
        pack([1, 2], capacity)


def test_unknown_algorithm_and_bad_max_per_bin_raise():
    with pytest.raises(ValueError, match="'worst'.*bfd"):
        pack([1], 8, algorithm="worst")
    with pytest.raises(ValueError, match="max_per_bin"):
        pack([1], 8, max_per_bin=0)


def test_integer_valued_floats_and_unsigned_are_accepted():
    assert pack(np.array([3.0, 5.0]), 8).num_bins == 1
    assert pack(np.array([3, 5], dtype=np.uint16), 8).num_bins == 1


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_empty_input_and_only_oversize_give_no_rows(algorithm):
    empty = pack([], 8, algorithm)
    assert empty.num_bins == 0 and empty.bins() == [] and empty.efficiency == 0.0
    over = pack([9, 10], 8, algorithm)
    assert over.num_bins == 0 and over.num_oversize == 2 and over.bin_of.tolist() == [-1, -1]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_zero_length_items_land_in_exactly_one_row(algorithm):
    plan = pack([0, 0, 5, 0], 8, algorithm)
    check_partition(plan, np.array([0, 0, 5, 0]), 8)
    assert plan.num_bins == 1
    assert pack([0, 0], 8, algorithm).num_bins == 1  # a row of zero-length items is still a row


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_oversize_items_get_minus_one_and_are_counted(algorithm):
    lens = np.array([9, 3, 100, 8, 5])
    plan = pack(lens, 8, algorithm)
    check_partition(plan, lens, 8)
    assert plan.num_oversize == 2 and plan.placed_tokens == 16


def test_plan_arrays_are_read_only_and_the_input_stays_writable():
    lens = np.array([4, 4, 4], dtype=np.int64)
    plan = pack(lens, 8)
    with pytest.raises(ValueError):
        plan.bin_of[0] = 5
    with pytest.raises(ValueError):
        plan.lengths[0] = 5
    lens[0] = 3  # the plan holds a read-only view; the caller's array is not frozen
    assert plan.lengths.tolist() == [3, 4, 4] and plan.bin_of.tolist() == [0, 0, 1]


@pytest.mark.kernels
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_kernels_equal_naive_on_random_inputs(algorithm):
    """bin_of is identical to the plain-list reference (including tie-breaking and max_per_bin)."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        capacity = int(rng.integers(1, 40))
        lens = rng.integers(0, capacity + 4, int(rng.integers(0, 40)))
        k = None if rng.random() < 0.5 else int(rng.integers(1, 5))
        plan = pack(lens, capacity, algorithm, max_per_bin=k)
        assert plan.bin_of.tolist() == NAIVE[algorithm](lens.tolist(), capacity, k)
        check_partition(plan, lens, capacity, k)


@pytest.mark.kernels
@settings(max_examples=60)
@given(lengths(max_size=60, max_length=70), capacities(max_value=64), st.sampled_from(sorted(ALGORITHMS)))
def test_property_partition_and_naive_equality(lens, capacity, algorithm):
    plan = pack(lens, capacity, algorithm)
    check_partition(plan, lens, capacity)
    assert plan.bin_of.tolist() == NAIVE[algorithm](lens.tolist(), capacity)
    assert plan.num_bins >= lower_bound(lens, capacity)  # no packing beats a lower bound


@pytest.mark.kernels
@pytest.mark.parametrize("capacity", [7, 100, 1000, 8191, 8193])
def test_capacities_not_powers_of_two_and_larger_inputs(capacity):
    """Bitset word edges (64, 4096) and odd capacities: still a partition, still naive-equal on a sample."""
    rng = np.random.default_rng(capacity)
    lens = rng.integers(0, capacity + 2, 300)
    for algorithm in ("ffd", "bfd"):
        plan = pack(lens, capacity, algorithm)
        check_partition(plan, lens, capacity)
        assert plan.bin_of.tolist() == NAIVE[algorithm](lens.tolist(), capacity)


@pytest.mark.kernels
@pytest.mark.parametrize("algorithm", ["ffd", "bfd"])
def test_at_most_one_row_at_most_half_full(algorithm):
    """Any-fit packers never leave two rows both <= half full (the second's items would fit the first)."""
    rng = np.random.default_rng(3)
    for _ in range(40):
        capacity = int(rng.integers(2, 200))
        lens = rng.integers(1, capacity + 1, int(rng.integers(1, 200)))
        loads = pack(lens, capacity, algorithm).bin_loads()
        assert int((2 * loads <= capacity).sum()) <= 1


@pytest.mark.kernels
@pytest.mark.parametrize("algorithm", ["ffd", "bfd"])
def test_within_eleven_ninths_of_brute_force_optimum(algorithm):
    """FFD/BFD use at most 11/9 OPT + 6/9 rows (Dosa 2007), checked against brute force for n <= 8."""
    rng = np.random.default_rng(11)
    for _ in range(150):
        capacity = int(rng.integers(2, 30))
        lens = rng.integers(1, capacity + 1, int(rng.integers(1, 9))).tolist()
        opt = naive.optimal_bins(lens, capacity)
        rows = pack(lens, capacity, algorithm).num_bins
        assert opt <= rows <= math.floor(11 / 9 * opt + 6 / 9)
        assert lower_bound(lens, capacity) <= opt


@pytest.mark.kernels
def test_max_per_bin_caps_documents_per_row():
    lens = np.ones(10, dtype=np.int64)
    for algorithm in sorted(ALGORITHMS):
        plan = pack(lens, 100, algorithm, max_per_bin=3)
        check_partition(plan, lens, 100, 3)
        assert plan.num_bins == 4


@pytest.mark.kernels
def test_deterministic_and_bfd_near_lower_bound():
    """Same input, same plan; on 2,000 lognormal lengths BFD is within 1% of the lower bound."""
    rng = np.random.default_rng(0)
    lens = np.clip(rng.lognormal(np.log(60), 1.0, 2000).astype(np.int64), 1, 1024)
    a, b = pack(lens, 1024), pack(lens.copy(), 1024)
    assert np.array_equal(a.bin_of, b.bin_of)
    assert a.num_bins <= 1.01 * lower_bound(lens, 1024)
    assert a.efficiency > 0.98


def test_bench_quick_runs_and_writes_json(tmp_path):
    from mmfeed.bench.packing import main

    out = tmp_path / "bench.json"
    assert main(["--quick", "--json", str(out)]) == 0
    import json

    data = json.loads(out.read_text())
    names = {row["name"] for row in data["rows"]}
    assert any(name.startswith("bfd") for name in names) and "settings" in data and "environment" in data
    for row in data["rows"]:
        assert set(row) == {"name", "value", "unit", "baseline", "ratio", "target", "ok"}


def test_capacity_above_the_counting_limit_is_refused_except_for_next_fit():
    from mmfeed.packing.bins import MAX_CAPACITY

    with pytest.raises(ValueError, match="above"):
        pack([1, 2], MAX_CAPACITY + 1, "bfd")
    assert pack([1, 2], MAX_CAPACITY + 1, "nf").num_bins == 1
