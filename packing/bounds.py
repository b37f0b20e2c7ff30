"""Lower bounds on the number of rows any packing needs, to judge how close a packer comes to optimal.

>>> from mmfeed.packing import lower_bound
>>> lower_bound([6, 6, 6, 2, 2, 2], capacity=10)   # three items over half a row need three rows
3
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mmfeed.packing._validate import as_capacity, as_lengths
from mmfeed.packing.bins import MAX_CAPACITY

__all__ = ["lower_bound"]


@njit(cache=True)
def _l2_kernel(lengths, capacity):
    """max(ceil(sum/C), L2, 1 if anything fits) by counting: O(n + C)."""
    counts = np.zeros(capacity + 2, dtype=np.int64)
    for i in range(lengths.size):
        if lengths[i] <= capacity:
            counts[lengths[i]] += 1
    # n_ge[v], s_ge[v]: number and total length of the items with length >= v (v in 0..capacity+1)
    n_ge = np.zeros(capacity + 2, dtype=np.int64)
    s_ge = np.zeros(capacity + 2, dtype=np.int64)
    for v in range(capacity, -1, -1):
        n_ge[v] = n_ge[v + 1] + counts[v]
        s_ge[v] = s_ge[v + 1] + counts[v] * v
    if n_ge[0] == 0:
        return 0
    best = max(1, (s_ge[0] + capacity - 1) // capacity)
    half = capacity // 2  # 2x <= C  <=>  x <= half
    for k in range(half + 1):
        hi = capacity - k + 1  # J1: x >= hi
        n1 = n_ge[hi]
        n2 = n_ge[half + 1] - n_ge[hi]  # J2: half < x < hi
        s2 = s_ge[half + 1] - s_ge[hi]
        s3 = s_ge[k] - s_ge[half + 1]  # J3: k <= x <= half
        extra = s3 - (n2 * capacity - s2)
        bound = n1 + n2 + (max(0, (extra + capacity - 1) // capacity))
        if bound > best:
            best = bound
    return best


def lower_bound(lengths: np.ndarray | list[int], capacity: int) -> int:
    """The fewest rows any packing of the items that fit could use: max(ceil(sum / capacity), Martello-Toth L2).

    Items longer than ``capacity`` are ignored (no packer places them). When any item fits the bound is at least
    1, since even zero-length items occupy a row. L2 (Martello & Toth, 1990) counts, for every threshold
    ``0 <= K <= capacity // 2``, the items over half a row (each needs its own row) plus the room the items of
    length in ``[K, capacity / 2]`` need beyond what those rows leave; computed from a length histogram in
    O(n + capacity).

    Raises:
        ValueError: invalid lengths or capacity (see :func:`mmfeed.packing.pack`).
    """
    cap = as_capacity(capacity)
    if cap > MAX_CAPACITY:
        raise ValueError(f"capacity {cap} is above {MAX_CAPACITY} tokens, the most the counting kernel takes")
    return int(_l2_kernel(as_lengths(lengths), cap))
