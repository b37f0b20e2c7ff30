"""Offline bin packing of item lengths into rows of ``capacity`` tokens: next fit, first fit / best fit decreasing.

All algorithms take the same integer inputs and return a :class:`PackPlan`::

    >>> from mmfeed.packing import pack
    >>> plan = pack([5, 3, 7, 1], capacity=8, algorithm="bfd")
    >>> plan.bin_of.tolist(), plan.num_bins
    ([1, 1, 0, 0], 2)
    >>> [row.tolist() for row in plan.bins()]   # 7 then 1 in row 0; 5 then 3 in row 1
    [[2, 3], [0, 1]]

Conventions shared by every kernel (and by the twins in ``tests/naive.py``):

- Items longer than ``capacity`` are not placed: ``bin_of`` is -1 and they are counted in ``num_oversize``.
- Zero-length items are placed like any other item (they cost no space), so every placed item lands in exactly
  one row and no row is empty (a row holds >= 1 item; a row may hold only zero-length items).
- ``ffd`` and ``bfd`` place items in decreasing length, ties by increasing index, found with a counting sort
  (O(n + capacity), no comparison sort). ``nf`` places them in input order.
- ``bfd`` puts each item into the open row with the least remaining space that still fits it; among rows with
  equal remaining space, the one that received an item most recently (a LIFO stack per remaining-space value).
  The smallest fitting remaining space is found in an index over remaining-space values (a 64-ary bitset tree,
  O(log64 capacity) per query), never by scanning rows: O(n + capacity) in all.
- ``ffd`` puts each item into the lowest-numbered open row that fits it, found by descending a max-segment tree
  over rows (O(log rows) per query).
- Both handle a run of equal lengths L a row at a time: the row chosen for the first item of the run stays the
  best (first) fit while it has room, so it takes ``min(space // L, items left)`` of them at once. The result is
  exactly the item-by-item rule; only the number of queries drops.
- ``max_per_bin=k``: a row that holds k items is closed and receives no more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import config, njit
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

from mmfeed.packing._validate import as_capacity, as_int, as_lengths, check_choice

__all__ = sorted(["ALGORITHMS", "PackPlan", "pack"])

_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_NO_LIMIT = np.iinfo(np.int64).max
MAX_CAPACITY = 2**24  # the counting kernels hold arrays of capacity + 1 entries

# ----------------------------------------------------------------------------------------------------------------
# A 64-ary bitset tree over the integers [0, nbits): set, clear, next set bit >= x, previous set bit <= x.
# Level 0 holds one bit per value; a bit of level l+1 is set when its 64-bit word of level l is non-zero.

if config.DISABLE_JIT:  # pure-Python stand-ins for the LLVM intrinsics (the kernels run as Python)

    def _lowbit(word):  # index of the lowest set bit
        word = int(word)
        return (word & -word).bit_length() - 1

    def _highbit(word):  # index of the highest set bit
        return int(word).bit_length() - 1

else:

    @njit(inline="always")
    def _lowbit(word):
        return np.int64(trailing_zeros(word))

    @njit(inline="always")
    def _highbit(word):
        return np.int64(63) - np.int64(leading_zeros(word))


def bitset_new(nbits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An empty bitset tree over ``[0, nbits)``: (words, level offsets, words per level)."""
    sizes = [max(1, (nbits + 63) // 64)]
    while sizes[-1] > 1:
        sizes.append((sizes[-1] + 63) // 64)
    offsets = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
    return np.zeros(sum(sizes), dtype=np.uint64), offsets, np.asarray(sizes, dtype=np.int64)


# The bitset operations are written out inside each kernel loop rather than called as helper functions: here a
# helper taking the arrays measured ~20 ns per query against ~2 ns written out (numba keeps reference counting
# around such calls).


# ----------------------------------------------------------------------------------------------------------------
# Kernels. Each takes (lengths int64[n], capacity, max_per_bin) and returns (bin_of int64[n], num_bins).
# Row numbers are int32 inside the kernels (n < 2**31 items, checked by pack()).


@njit(cache=True)
def _nf_kernel(lengths, capacity, max_per_bin):
    n = lengths.size
    bin_of = np.empty(n, dtype=np.int64)
    num_bins = 0
    free = -1  # remaining space of the current row; -1 before the first row
    count = 0
    for i in range(n):
        length = lengths[i]
        if length > capacity:
            bin_of[i] = -1
            continue
        if length > free or count >= max_per_bin:
            num_bins += 1
            free = capacity
            count = 0
        free -= length
        count += 1
        bin_of[i] = num_bins - 1
    return bin_of, num_bins


@njit(cache=True)
def _counts(lengths, capacity, max_per_bin):
    """Items per length (those that fit), and an upper bound on the rows any-fit packing opens."""
    counts = np.zeros(capacity + 1, dtype=np.int64)
    for i in range(lengths.size):
        if lengths[i] <= capacity:
            counts[lengths[i]] += 1
    return counts, _max_bins(counts, capacity, max_per_bin)


@njit(cache=True)
def _max_bins(counts, capacity, max_per_bin):
    """An upper bound on the rows any-fit packing opens for items counted per length.

    No two open rows of an any-fit packer are both at most half full, so rows <= 2 * tokens / capacity + 1,
    plus the rows closed by ``max_per_bin``.
    """
    nfit = 0
    tokens = 0
    for length in range(capacity + 1):
        nfit += counts[length]
        tokens += counts[length] * length
    closed = nfit // max_per_bin if max_per_bin < nfit else 0
    return max(1, min(nfit, 2 * tokens // capacity + 2 + closed))


@njit(cache=True)
def _scatter_back(lengths, capacity, counts, assigned):
    """bin_of[i] from the bins assigned in decreasing-length order (ties by index) -> O(n + capacity)."""
    cursor = np.empty(capacity + 1, dtype=np.int64)
    acc = 0
    for length in range(capacity, -1, -1):
        cursor[length] = acc
        acc += counts[length]
    bin_of = np.empty(lengths.size, dtype=np.int64)
    for i in range(lengths.size):
        length = lengths[i]
        if length > capacity:
            bin_of[i] = -1
        else:
            bin_of[i] = assigned[cursor[length]]
            cursor[length] += 1
    return bin_of


@njit(cache=True)
def _bfd_kernel(lengths, capacity, max_per_bin, bits, off, nwords):
    """Best fit decreasing (see :func:`_bfd_sorted`), rows mapped back to the items' input positions."""
    counts, max_bins = _counts(lengths, capacity, max_per_bin)
    assigned, num_bins = _bfd_sorted(counts, max_bins, capacity, max_per_bin, bits, off, nwords)
    return _scatter_back(lengths, capacity, counts, assigned), num_bins


@njit(cache=True)
def _bfd_sorted(counts, max_bins, capacity, max_per_bin, bits, off, nwords):
    """Best fit decreasing of the items counted per length (``counts[L]`` items of length L), one run of equal
    lengths at a time: the row of every item in decreasing-length order (int32), and the number of rows.

    Within a run of items of length L, the smallest fitting space s only grows: the row popped from s takes
    min(s // L, items left) items in a row (after each it is still the best fit), then falls below L. So the
    kernel scans the present spaces upward from L once per run instead of querying once per item. The result is
    exactly the item-by-item BFD of ``tests/naive.py``.
    """
    assigned = np.empty(counts.sum(), dtype=np.int32)
    head = np.full(capacity + 1, -1, dtype=np.int32)  # top row of the stack of rows with that much space left
    below = np.empty(max_bins, dtype=np.int32)  # next row down in the same stack
    limited = max_per_bin < counts.sum()  # else no row can reach the limit
    items = np.zeros(max_bins if limited else 1, dtype=np.int64)
    top = off.size - 1
    num_bins = 0
    j = 0
    for length in range(capacity, -1, -1):
        c = counts[length]
        start = length
        while c > 0:
            # space = smallest set value >= start in the bitset tree, or -1
            space = -1
            pos = start
            w = pos >> 6
            if w < nwords[0]:
                word = bits[w] & (_ALL << np.uint64(pos & 63))
                if word != 0:
                    space = (w << 6) + _lowbit(word)
            if space < 0:
                lev = 0
                while lev < top:
                    lev += 1
                    pos = w + 1
                    w = pos >> 6
                    if w >= nwords[lev]:
                        break
                    word = bits[off[lev] + w] & (_ALL << np.uint64(pos & 63))
                    if word != 0:
                        pos = (w << 6) + _lowbit(word)
                        while lev > 0:
                            lev -= 1
                            pos = (pos << 6) + _lowbit(bits[off[lev] + pos])
                        space = pos
                        break
            if space < 0:  # no open row fits: open rows, each taking as many of the run as fit
                per = capacity // length if length > 0 else c
                per = min(per, max_per_bin)
                while c > 0:
                    q = min(per, c)
                    b = np.int32(num_bins)
                    num_bins += 1
                    for _ in range(q):
                        assigned[j] = b
                        j += 1
                    c -= q
                    if limited:
                        items[b] = q
                        if q >= max_per_bin:
                            continue
                    left = capacity - q * length
                    below[b] = head[left]
                    if head[left] < 0:  # set bit `left`
                        pos = left
                        for lev in range(top + 1):
                            w = off[lev] + (pos >> 6)
                            was = bits[w]
                            bits[w] = was | (np.uint64(1) << np.uint64(pos & 63))
                            if was != 0:
                                break
                            pos >>= 6
                    head[left] = b
                break
            while c > 0 and head[space] >= 0:
                b = head[space]
                head[space] = below[b]
                per = space // length if length > 0 else c
                if limited:
                    per = min(per, max_per_bin - items[b])
                q = min(per, c)
                for _ in range(q):
                    assigned[j] = b
                    j += 1
                c -= q
                if limited:
                    items[b] += q
                    if items[b] >= max_per_bin:
                        continue
                left = space - q * length
                below[b] = head[left]
                if head[left] < 0:  # set bit `left`
                    pos = left
                    for lev in range(top + 1):
                        w = off[lev] + (pos >> 6)
                        was = bits[w]
                        bits[w] = was | (np.uint64(1) << np.uint64(pos & 63))
                        if was != 0:
                            break
                        pos >>= 6
                head[left] = b
            if head[space] < 0:  # clear bit `space`
                pos = space
                for lev in range(top + 1):
                    w = off[lev] + (pos >> 6)
                    now = bits[w] & ~(np.uint64(1) << np.uint64(pos & 63))
                    bits[w] = now
                    if now != 0:
                        break
                    pos >>= 6
            start = space + 1
    return assigned, num_bins


@njit(cache=True)
def _ffd_kernel(lengths, capacity, max_per_bin):
    """First fit decreasing (see :func:`_ffd_sorted`), rows mapped back to the items' input positions."""
    counts, max_bins = _counts(lengths, capacity, max_per_bin)
    assigned, num_bins = _ffd_sorted(counts, max_bins, capacity, max_per_bin)
    return _scatter_back(lengths, capacity, counts, assigned), num_bins


@njit(cache=True)
def _ffd_sorted(counts, max_bins, capacity, max_per_bin):
    """First fit decreasing of the items counted per length: the row of every item in decreasing-length order.
    Like BFD, the first fitting row takes min(space // L, left) items of a run at once."""
    assigned = np.empty(counts.sum(), dtype=np.int32)
    leaves = 1
    while leaves < max_bins:
        leaves *= 2
    tree = np.full(2 * leaves, -1, dtype=np.int32)  # max remaining space in each subtree; -1 = no open row
    limited = max_per_bin < counts.sum()  # else no row can reach the limit
    items = np.zeros(max_bins if limited else 1, dtype=np.int64)
    num_bins = 0
    j = 0
    for length in range(capacity, -1, -1):
        c = counts[length]
        while c > 0:
            if tree[1] >= length:
                node = 1
                while node < leaves:
                    node *= 2
                    if tree[node] < length:
                        node += 1
                b = node - leaves
                space = tree[node]
            else:
                b = num_bins
                num_bins += 1
                node = b + leaves
                space = capacity
            per = space // length if length > 0 else c
            if limited:
                per = min(per, max_per_bin - items[b])
            q = min(per, c)
            for _ in range(q):
                assigned[j] = b
                j += 1
            c -= q
            left = space - q * length
            if limited:
                items[b] += q
                if items[b] >= max_per_bin:
                    left = -1
            tree[node] = left
            node //= 2
            while node >= 1:
                best = max(tree[2 * node], tree[2 * node + 1])
                if tree[node] == best:
                    break
                tree[node] = best
                node //= 2
    return assigned, num_bins


@njit(cache=True)
def _rows_kernel(bin_of, lengths, num_bins, capacity, decreasing):
    """Row offsets and item indices per row, in placement order (counting sorts by length, then by row)."""
    n = bin_of.size
    offsets = np.zeros(num_bins + 1, dtype=np.int64)
    for i in range(n):
        if bin_of[i] >= 0:
            offsets[bin_of[i] + 1] += 1
    for b in range(num_bins):
        offsets[b + 1] += offsets[b]
    order = np.arange(n)
    if decreasing:  # decreasing length, ties by index: placed items have lengths <= capacity
        start = np.zeros(capacity + 2, dtype=np.int64)
        for i in range(n):
            if bin_of[i] >= 0:
                start[capacity - lengths[i] + 1] += 1
        for v in range(capacity + 1):
            start[v + 1] += start[v]
        order = np.empty(offsets[num_bins], dtype=np.int64)
        for i in range(n):
            if bin_of[i] >= 0:
                order[start[capacity - lengths[i]]] = i
                start[capacity - lengths[i]] += 1
    cursor = offsets[:-1].copy()
    items = np.empty(offsets[num_bins], dtype=np.int64)
    for t in range(order.size):
        i = order[t]
        b = bin_of[i]
        if b >= 0:
            items[cursor[b]] = i
            cursor[b] += 1
    return offsets, items


# ----------------------------------------------------------------------------------------------------------------
# Registry: name -> kernel wrapper with the identical signature (lengths int64[n], capacity, max_per_bin) ->
# (bin_of, num_bins). _DECREASING records which ones place items in decreasing-length order (for bins()).

PackKernel = Callable[[np.ndarray, int, int], tuple[np.ndarray, int]]
ALGORITHMS: dict[str, PackKernel] = {}
_DECREASING: dict[str, bool] = {}


def _register(name: str, decreasing: bool) -> Callable[[PackKernel], PackKernel]:
    def deco(fn: PackKernel) -> PackKernel:
        ALGORITHMS[name] = fn
        _DECREASING[name] = decreasing
        return fn

    return deco


@_register("nf", decreasing=False)
def next_fit(lengths: np.ndarray, capacity: int, max_per_bin: int) -> tuple[np.ndarray, int]:
    """Next fit: keep one open row, open a new one when the next item does not fit (keeps input order)."""
    bin_of, num_bins = _nf_kernel(lengths, capacity, max_per_bin)
    return bin_of, int(num_bins)


@_register("ffd", decreasing=True)
def first_fit_decreasing(lengths: np.ndarray, capacity: int, max_per_bin: int) -> tuple[np.ndarray, int]:
    """First fit decreasing: longest item first, into the lowest-numbered row it fits."""
    bin_of, num_bins = _ffd_kernel(lengths, capacity, max_per_bin)
    return bin_of, int(num_bins)


@_register("bfd", decreasing=True)
def best_fit_decreasing(lengths: np.ndarray, capacity: int, max_per_bin: int) -> tuple[np.ndarray, int]:
    """Best fit decreasing: longest item first, into the row with the least space left that fits it."""
    bits, off, nwords = bitset_new(capacity + 1)
    bin_of, num_bins = _bfd_kernel(lengths, capacity, max_per_bin, bits, off, nwords)
    return bin_of, int(num_bins)


def pack_counts(counts: np.ndarray, capacity: int, algorithm: str = "bfd") -> tuple[np.ndarray, int]:
    """Pack items given only as counts per length (``counts[L]`` items of length L, ``L <= capacity``) with a
    decreasing algorithm ("bfd" or "ffd"): the row of each item in decreasing-length order (int32
    ``[counts.sum()]``; items of equal length are interchangeable), and the number of rows. Exactly the rows
    :func:`pack` gives the same items, listed in the order those algorithms place them."""
    cap = as_capacity(capacity)
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if counts.shape != (cap + 1,) or (counts < 0).any():
        raise ValueError(f"counts must be {cap + 1} non-negative integers (lengths 0..capacity)")
    if not _DECREASING.get(algorithm, False):
        raise ValueError(f"pack_counts needs a decreasing algorithm, got {algorithm!r}")
    max_bins = _max_bins(counts, cap, _NO_LIMIT)
    if algorithm == "bfd":
        bits, off, nwords = bitset_new(cap + 1)
        assigned, num_bins = _bfd_sorted(counts, max_bins, cap, _NO_LIMIT, bits, off, nwords)
    else:
        assigned, num_bins = _ffd_sorted(counts, max_bins, cap, _NO_LIMIT)
    return assigned, int(num_bins)


def split_rows(items: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """``[items[offsets[r]:offsets[r + 1]] for r ...]`` (views), faster than ``np.split`` for many rows."""
    bounds = offsets.tolist()
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(frozen=True, eq=False)
class PackPlan:
    """The result of :func:`pack`: which row each item went to.

    Attributes:
        bin_of: int64 [n], the row of each item; -1 for items longer than ``capacity``.
        num_bins: number of rows.
        capacity: tokens per row.
        lengths: int64 [n], the item lengths that were packed (a read-only view of the input when that already
            was a contiguous int64 array: do not modify it while the plan is in use).
        algorithm: the registry name that made the plan.
    """

    bin_of: np.ndarray
    num_bins: int
    capacity: int
    lengths: np.ndarray
    algorithm: str = "bfd"

    @property
    def num_oversize(self) -> int:
        """Items left out (``bin_of == -1``) because they are longer than ``capacity``."""
        return int(np.count_nonzero(self.bin_of < 0))

    @property
    def placed_tokens(self) -> int:
        """Tokens of all placed items."""
        return int(self.lengths[self.bin_of >= 0].sum())

    @property
    def efficiency(self) -> float:
        """Placed tokens / (num_bins * capacity); 0.0 for a plan with no rows (nothing placed, nothing to credit)."""
        if self.num_bins == 0:
            return 0.0
        return self.placed_tokens / (self.num_bins * self.capacity)

    def bin_loads(self) -> np.ndarray:
        """int64 [num_bins]: tokens in each row."""
        placed = self.bin_of >= 0
        return np.bincount(self.bin_of[placed], weights=self.lengths[placed], minlength=self.num_bins).astype(np.int64)

    def bins(self) -> list[np.ndarray]:
        """Item indices of each row (int64 arrays), in the order the algorithm placed them."""
        offsets, items = _rows_kernel(
            self.bin_of, self.lengths, self.num_bins, self.capacity, _DECREASING.get(self.algorithm, False)
        )
        return split_rows(items, offsets)


def pack(
    lengths: np.ndarray | list[int], capacity: int, algorithm: str = "bfd", *, max_per_bin: int | None = None
) -> PackPlan:
    """Pack items of the given lengths into as few rows of ``capacity`` tokens as the algorithm manages.

    Args:
        lengths: 1-D non-negative integers (tokens per item).
        capacity: tokens per row, >= 1.
        algorithm: a key of :data:`ALGORITHMS` ("nf", "ffd", "bfd").
        max_per_bin: at most this many items per row (None: no limit).

    Raises:
        ValueError: negative, fractional, boolean or non-1-D lengths; capacity < 1; unknown algorithm;
            max_per_bin < 1.

    >>> pack([4, 4, 9], capacity=8).bin_of.tolist()
    [0, 0, -1]
    """
    lens = as_lengths(lengths)
    cap = as_capacity(capacity)
    check_choice("algorithm", algorithm, ALGORITHMS)
    limit = _NO_LIMIT if max_per_bin is None else as_int("max_per_bin", max_per_bin, 1)
    if algorithm != "nf" and cap > MAX_CAPACITY:
        raise ValueError(f"capacity {cap} is above {MAX_CAPACITY} tokens, the most the counting kernels take")
    if lens.size >= 2**31:
        raise ValueError(f"pack() takes fewer than 2**31 items, got {lens.size}; pack the data in chunks")
    bin_of, num_bins = ALGORITHMS[algorithm](lens, cap, limit)
    bin_of.setflags(write=False)
    view = lens.view()
    view.setflags(write=False)
    return PackPlan(bin_of=bin_of, num_bins=num_bins, capacity=cap, lengths=view, algorithm=algorithm)

