"""Mixtures by weight: how many samples of each dataset an epoch holds, and which ones.

Dataset ``i`` of a mixture holds ``sizes[i]`` samples (ids ``offset_i .. offset_i + sizes[i] - 1``, datasets back to
back). An epoch of ``total`` samples (default: all of them added up) takes ``counts[i]`` from dataset ``i`` in
proportion to the weights. Dataset ``i``'s draws are consecutive slices of an endless sequence of seeded
permutations of its ids, one permutation per pass over it, so every sample is used once per pass before any is
used again, however the weights divide the epochs; a pure function of ``(seed, epoch)``::

    >>> mix_counts(np.array([3.0, 1.0]), 8).tolist()
    [6, 2]
    >>> ids = weighted_draw(np.array([4, 4]), np.array([3.0, 1.0]), seed=0, epoch=0)
    >>> len(ids), int((ids < 4).sum())
    (8, 6)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

import numpy as np

__all__ = ["SizeWeights", "Weights", "mix_counts", "mixture_weights", "weighted_draw"]


@dataclass(frozen=True)
class SizeWeights:
    """Each dataset's weight is its size (samples) to the power ``alpha``: 1 is in proportion to size (every
    sample once), 0 an equal share for every dataset, between them a tempered mixture (large datasets drawn less
    than their size, small ones more, as Octo and openpi temper theirs). The string ``"size"`` means
    ``SizeWeights(1.0)``.

        >>> mixture_weights(SizeWeights(0.5), np.array([100, 25])).tolist()
        [10.0, 5.0]
    """

    alpha: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool)
                and np.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"SizeWeights alpha must be a finite number >= 0, got {self.alpha!r}")


Weights = Union[Sequence[float], SizeWeights, str, None]
"""A mixture's weights: one per dataset, ``"size"``, :class:`SizeWeights` or None (every sample once)."""


def mixture_weights(weights: Weights, sizes: np.ndarray) -> np.ndarray | None:
    """The float64 weight of each dataset of ``sizes`` (samples per dataset), or None where the weights are in
    proportion to size: that epoch is every sample once, planned without a draw."""
    if weights is None:
        return None
    if isinstance(weights, str):
        if weights != "size":
            raise ValueError(f"weights must be one number per dataset, 'size' or SizeWeights(alpha), got {weights!r}")
        weights = SizeWeights(1.0)
    if isinstance(weights, SizeWeights):
        if weights.alpha == 1.0:
            return None
        return np.asarray(sizes, dtype=np.float64) ** float(weights.alpha) * (np.asarray(sizes) > 0)
    return np.asarray(weights, dtype=np.float64)


def mix_counts(weights: np.ndarray, total: int) -> np.ndarray:
    """Samples per dataset out of ``total``, proportional to ``weights`` (largest remainder rounding)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not len(w) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {w.tolist()}")
    share = w / w.sum() * total
    counts = np.floor(share).astype(np.int64)
    extra = int(total) - int(counts.sum())
    counts[np.argsort(-(share - counts), kind="stable")[:extra]] += 1
    return counts


def weighted_draw(sizes: np.ndarray, weights: np.ndarray, *, seed: int, epoch: int,
                  total: int | None = None) -> np.ndarray:
    """The sample ids (int64) of one epoch of the mixture, grouped by dataset (the plan shuffles them)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) != len(np.atleast_1d(weights)):
        raise ValueError(f"give one weight per dataset: {len(sizes)} datasets, {len(np.atleast_1d(weights))} weights")
    counts = mix_counts(weights, int(sizes.sum()) if total is None else int(total))
    empty = (counts > 0) & (sizes == 0)
    if empty.any():
        raise ValueError(f"dataset {int(np.flatnonzero(empty)[0])} of the mixture has weight > 0 but no samples")
    offsets = np.cumsum(sizes) - sizes
    parts = []
    for i, (n, k) in enumerate(zip(sizes, counts)):
        if k == 0:
            continue
        first = int(epoch) * int(k)  # position of this epoch's first draw in dataset i's endless sequence
        passes = range(first // n, (first + k - 1) // n + 1)
        seq = np.concatenate([np.random.default_rng([int(seed), i, p]).permutation(int(n)) for p in passes])
        start = first - passes[0] * n
        parts.append(offsets[i] + seq[start : start + k])
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
