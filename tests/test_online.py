"""OnlinePacker / pack_stream: partition, the tests/naive.py rule, bounded delay and exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from mmfeed.packing import OnlinePacker, pack, pack_stream
from mmfeed.testing.strategies import lengths


def run(lens, capacity, window, max_delay=None, chunk=7):
    """Rows of an uninterrupted run that pushes in chunks of `chunk` items, then flushes."""
    packer = OnlinePacker(capacity, window=window, max_delay=max_delay)
    rows = []
    for start in range(0, len(lens), chunk):
        rows += [r.tolist() for r in packer.push_many(lens[start : start + chunk])]
    return rows + packer.flush(), packer


def test_doc_examples():
    assert list(pack_stream(enumerate([5, 3, 7, 1, 4, 4]), capacity=8, window=4)) == [[2, 3], [0, 1], [4, 5]]
    p = OnlinePacker(8, window=2)
    assert (p.push(10, 5), p.push(11, 7), p.flush()) == ([], [[11]], [[10]])


def test_stream_on_range_and_partition():
    """Every item (ids from range()) lands in exactly one row; every row fits and holds >= 1 item."""
    lens = [1 + (7 * i) % 13 for i in range(200)]
    rows = list(pack_stream(((i, lens[i]) for i in range(200)), capacity=16, window=10))
    assert sorted(i for row in rows for i in row) == list(range(200))
    assert all(row and sum(lens[i] for i in row) <= 16 for row in rows)


@pytest.mark.kernels
def test_kernel_equals_naive_rule_on_random_streams():
    rng = np.random.default_rng(2)
    for _ in range(80):
        capacity = int(rng.integers(1, 30))
        n = int(rng.integers(0, 50))
        items = list(zip(rng.permutation(1000)[:n].tolist(), rng.integers(0, capacity + 4, n).tolist()))
        window, delay = int(rng.integers(1, 12)), int(rng.integers(1, 20))
        packer = OnlinePacker(capacity, window=window, max_delay=delay)
        got = [row for item in items for row in packer.push(*item)] + packer.flush()
        rows, oversize, _ = naive.online_pack(items, capacity, window, delay)
        assert got == rows
        assert packer.oversize_ids == oversize


@pytest.mark.kernels
def test_last_pair_search_equals_naive_on_quantized_lengths():
    """Lengths in clusters (like frames x tokens) leave gaps that a last pair can fill better than one item."""
    rng = np.random.default_rng(12)
    for _ in range(40):
        n, capacity, unit = int(rng.integers(20, 120)), int(rng.integers(50, 200)), int(rng.integers(10, 40))
        lens = (rng.integers(1, 5, n) * unit + rng.integers(0, 5, n)).tolist()
        window, delay = int(rng.integers(2, 30)), int(rng.integers(5, 60))
        got = list(pack_stream(enumerate(lens), capacity, window=window, max_delay=delay))
        assert got == naive.online_pack(list(enumerate(lens)), capacity, window, delay)[0]


@pytest.mark.kernels
@settings(max_examples=50)
@given(lengths(max_size=80, max_length=40), st.integers(1, 40), st.integers(1, 15), st.integers(1, 30))
def test_property_partition_and_naive(lens, capacity, window, delay):
    items = list(enumerate(lens.tolist()))
    rows = list(pack_stream(items, capacity, window=window, max_delay=delay))
    assert rows == naive.online_pack(items, capacity, window, delay)[0]
    placed = sorted(i for row in rows for i in row)
    assert placed == [i for i, x in items if x <= capacity]  # none lost or duplicated, oversize left out
    assert all(row and sum(lens[i] for i in row) <= capacity for row in rows)


@pytest.mark.kernels
def test_every_item_emitted_within_max_delay_pushes_and_buffer_stays_bounded():
    rng = np.random.default_rng(4)
    lens = rng.integers(1, 50, 600)
    window, delay = 40, 25  # delay < window: the age limit, not the buffer, forces rows here
    packer = OnlinePacker(100, window=window, max_delay=delay)
    emitted_at = {}
    for seq, length in enumerate(lens.tolist()):
        for row in packer.push(None, length):
            for item in row:
                emitted_at[item] = seq
        assert packer.pending < window
    for item, seq in emitted_at.items():
        assert seq - item <= delay
    tail = {i for row in packer.flush() for i in row}
    assert all(len(lens) - 1 - i < delay for i in tail)  # what the flush emits had not yet waited max_delay
    assert len(emitted_at) + len(tail) == len(lens)


@pytest.mark.kernels
@pytest.mark.parametrize("cut", [0, 1, 13, 150, 299, 300])
def test_resume_at_cut_points_gives_the_uninterrupted_rows(cut):
    rng = np.random.default_rng(8)
    lens = rng.integers(0, 70, 300)
    full, _ = run(lens.tolist(), 64, window=20, max_delay=35)
    first = OnlinePacker(64, window=20, max_delay=35)
    rows = [r.tolist() for r in first.push_many(lens[:cut])]
    state = json.loads(json.dumps(first.state_dict()))  # plain ints and lists only
    second = OnlinePacker(64, window=20, max_delay=35)
    second.load_state_dict(state)
    rows += [r.tolist() for r in second.push_many(lens[cut:], ids=np.arange(cut, 300))] + second.flush()
    assert rows == full
    assert second.rows_emitted == len(full) and second.pushed == 300


def test_state_mismatch_and_bad_arguments_raise():
    state = OnlinePacker(64, window=5).state_dict()
    with pytest.raises(ValueError, match="capacity"):
        OnlinePacker(32, window=5).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        OnlinePacker(64, window=5).load_state_dict({"version": 99})
    with pytest.raises(ValueError, match="window"):
        OnlinePacker(64, window=0)
    with pytest.raises(ValueError, match="ids must match"):
        OnlinePacker(64).push_many([1, 2], ids=[1])
    with pytest.raises(ValueError, match="-4"):
        OnlinePacker(64).push(0, -4)


def test_oversize_items_are_counted_not_buffered():
    packer = OnlinePacker(10, window=3)
    rows = packer.push_many([4, 11, 6, 30]) + [np.array(r) for r in packer.flush()]
    assert [r.tolist() for r in rows] == [[2, 0]]
    assert packer.oversize_ids == [1, 3] and packer.num_oversize == 2


def test_large_window_comes_close_to_offline_bfd():
    """With a buffer of 2,000 items, 30,000 lognormal lengths need at most 0.5% more rows than offline BFD."""
    rng = np.random.default_rng(0)
    lens = np.clip(rng.lognormal(np.log(600), 1.0, 30_000).astype(np.int64), 1, 8192)
    packer = OnlinePacker(8192, window=2000)
    rows = len(packer.push_many(lens)) + len(packer.flush())
    assert rows <= 1.005 * pack(lens, 8192).num_bins
