"""Length bucketing, the alternative to packing for models that cannot take packed rows.

Items of similar length are batched together so that padding to the longest item wastes little. Boundaries come
from the data (quantiles); batches are filled greedily under a token budget that counts padding:
``batch_size * max_len_in_batch <= max_tokens``.

>>> import numpy as np
>>> from mmfeed.packing import bucket_batches, bucket_boundaries
>>> lengths = np.array([3, 9, 4, 10, 2, 8])
>>> edges = bucket_boundaries(lengths, 2)
>>> edges.tolist()
[4, 10]
>>> [b.tolist() for b in bucket_batches(lengths, edges, max_tokens=20, shuffle=False)]
[[0, 2, 4], [1, 3], [5]]
"""

from __future__ import annotations

import logging

import numpy as np
from numba import njit

from mmfeed.packing._validate import as_int, as_lengths, check_choice
from mmfeed.packing.bins import split_rows

__all__ = sorted(["OVERSIZE_POLICIES", "bucket_batches", "bucket_boundaries"])

log = logging.getLogger(__name__)

#: What bucket_batches does with items longer than max_tokens (no batch can hold them).
OVERSIZE_POLICIES = {
    "raise": "raise ValueError naming how many and the longest",
    "skip": "leave them out of every batch and log a warning; find them with np.flatnonzero(lengths > max_tokens)",
}


def bucket_boundaries(lengths: np.ndarray | list[int], num_buckets: int) -> np.ndarray:
    """int64 upper edges of up to ``num_buckets`` length buckets, at the data's quantiles ``i / num_buckets``.

    Bucket b holds lengths in ``(edges[b-1], edges[b]]``; the last edge is the longest length, so every item has
    a bucket. Repeated quantiles merge, so fewer than ``num_buckets`` edges may come back.
    """
    lens = as_lengths(lengths)
    count = as_int("num_buckets", num_buckets, 1)
    if lens.size == 0:
        raise ValueError("bucket_boundaries needs at least one length to estimate quantiles from")
    qs = np.arange(1, count + 1) / count
    edges = np.quantile(lens, qs, method="inverted_cdf").astype(np.int64)
    edges[-1] = lens.max()
    return np.unique(edges)


@njit(cache=True)
def _greedy_kernel(order, lengths, bucket, max_tokens):
    """Offsets of batches over ``order``: a batch ends at a bucket change or when the padded cost would exceed."""
    n = order.size
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    num = 0
    size = 0
    longest = 0
    for t in range(n):
        i = order[t]
        length = max(lengths[i], 1)
        if size > 0 and (bucket[i] != bucket[order[t - 1]] or (size + 1) * max(longest, length) > max_tokens):
            num += 1
            offsets[num] = t
            size = 0
            longest = 0
        size += 1
        longest = max(longest, length)
    if size > 0:
        num += 1
        offsets[num] = n
    return offsets[: num + 1]


def bucket_batches(
    lengths: np.ndarray | list[int],
    boundaries: np.ndarray | list[int],
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    on_oversize: str = "raise",
) -> list[np.ndarray]:
    """Batches (int64 arrays of item indices) of same-bucket items with ``len(batch) * max_len <= max_tokens``.

    Each item counts as at least one token, so a batch never holds more than ``max_tokens`` items. With
    ``shuffle`` the items within each bucket and the order of the batches are shuffled by ``(seed, epoch)``;
    without it items keep index order and batches come bucket by bucket. Every item that fits is in exactly one
    batch; items longer than the last boundary form an extra bucket. Items longer than ``max_tokens`` follow
    ``on_oversize`` (a key of :data:`OVERSIZE_POLICIES`).
    """
    lens = as_lengths(lengths)
    edges = as_lengths(boundaries, name="boundaries")
    if edges.size and (np.diff(edges) <= 0).any():
        raise ValueError(f"boundaries must be strictly increasing, got {edges.tolist()[:10]}")
    budget = as_int("max_tokens", max_tokens, 1)
    check_choice("on_oversize", on_oversize, OVERSIZE_POLICIES)
    too_long = lens > budget
    if too_long.any():
        if on_oversize == "raise":
            raise ValueError(
                f"{int(too_long.sum())} items are longer than max_tokens={budget} (longest {int(lens.max())}); "
                "raise max_tokens, truncate them, or pass on_oversize='skip'"
            )
        log.warning("bucket_batches: skipping %d items longer than max_tokens=%d", int(too_long.sum()), budget)
    bucket = np.searchsorted(edges, lens, side="left").astype(np.int64)
    keep = np.flatnonzero(~too_long)
    rng = np.random.default_rng([as_int("seed", seed, 0), as_int("epoch", epoch, 0)])
    if shuffle:
        keep = rng.permutation(keep)
    order = keep[np.argsort(bucket[keep], kind="stable")]
    batches = split_rows(order, _greedy_kernel(order, lens, bucket, budget))
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches
