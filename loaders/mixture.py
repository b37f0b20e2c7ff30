"""Weighted mixing of several planned datasets (different cameras, action sizes, tokenizers).

Each batch comes from one source, so tensors within a batch always agree in shape; over an epoch the sources
contribute steps in proportion to their weights, interleaved in a deterministic shuffle of ``(seed, epoch)``. A
source asked for more steps than one of its own epochs holds runs on into its next epoch (a fresh plan), and one
asked for fewer keeps its cursor for the next mixture epoch, so over time every source is read through evenly
and nothing is repeated before its epoch is done.

    >>> import numpy as np
    >>> mix_counts(np.array([3.0, 1.0]), 8).tolist()
    [6, 2]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mmfeed.loaders.dataset import PackedEpisodeDataset
from mmfeed.packing import PackedBatch

__all__ = ["MixtureDataset", "mix_counts"]


def mix_counts(weights: np.ndarray, total: int) -> np.ndarray:
    """Steps per source out of ``total``, proportional to ``weights`` (largest remainder rounding)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or not len(w) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {w.tolist()}")
    share = w / w.sum() * total
    counts = np.floor(share).astype(np.int64)
    extra = total - int(counts.sum())
    counts[np.argsort(-(share - counts), kind="stable")[:extra]] += 1
    return counts


class MixtureDataset(torch.utils.data.Dataset):
    """Batches of several :class:`PackedEpisodeDataset` (same rank and world size), mixed by weight.

    datasets, weights: the sources and their relative shares of steps.
    steps_per_epoch: steps of one mixture epoch (default: the sources' own epoch steps added up).
    seed: the interleaving shuffle.
    Items are ``(epoch, step)`` like the datasets', so :class:`~mmfeed.loaders.dataset.PlanSampler` drives it.
    """

    def __init__(self, datasets: Sequence[PackedEpisodeDataset], weights: Sequence[float], *,
                 steps_per_epoch: int | None = None, seed: int = 0) -> None:
        if len(datasets) != len(weights) or not datasets:
            raise ValueError(f"give one weight per dataset: {len(datasets)} datasets, {len(weights)} weights")
        ranks = {(d.rank, d.world_size) for d in datasets}
        if len(ranks) != 1:
            raise ValueError(f"all mixed datasets must share rank and world size, got {sorted(ranks)}")
        self.datasets = list(datasets)
        self.weights = np.asarray(weights, dtype=np.float64)
        mix_counts(self.weights, 1)  # validates
        self.steps_per_epoch = steps_per_epoch or sum(d.num_steps(0) for d in self.datasets)
        self.seed = int(seed)
        self._schedule: tuple[int, np.ndarray, np.ndarray] | None = None

    def num_steps(self, epoch: int = 0) -> int:
        return int(self.steps_per_epoch)

    def __len__(self) -> int:
        return self.num_steps(0)

    def schedule(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, global_step)`` of every step of mixture epoch ``epoch``; global steps count through a
        source's own epochs (see :meth:`locate`)."""
        if self._schedule is None or self._schedule[0] != epoch:
            counts = mix_counts(self.weights, self.steps_per_epoch)
            rng = np.random.default_rng([self.seed, int(epoch)])
            source = rng.permutation(np.repeat(np.arange(len(counts)), counts))
            cursor = np.zeros(len(counts), dtype=np.int64)
            cursor[:] = counts * epoch  # steps each source served in earlier mixture epochs
            rank_in_source = np.zeros(len(source), dtype=np.int64)
            for i in range(len(counts)):
                mine = source == i
                rank_in_source[mine] = cursor[i] + np.arange(int(mine.sum()))
            self._schedule = (epoch, source, rank_in_source)
        return self._schedule[1], self._schedule[2]

    def locate(self, source: int, global_step: int) -> tuple[int, int]:
        """The ``(epoch, step)`` of a source's ``global_step``-th step, walking through its epochs."""
        dataset, epoch = self.datasets[source], 0
        while True:
            steps = dataset.num_steps(epoch)
            if steps <= 0:
                raise ValueError(f"mixed dataset {source} ({dataset.source.name}) has an epoch with no steps")
            if global_step < steps:
                return epoch, global_step
            global_step -= steps
            epoch += 1

    def __getitem__(self, key: tuple[int, int] | int) -> PackedBatch:
        epoch, step = key if isinstance(key, tuple) else (0, key)
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} out of range: a mixture epoch has {self.steps_per_epoch} steps")
        source, global_step = self.schedule(int(epoch))
        s = int(source[step])
        return self.datasets[s][self.locate(s, int(global_step[step]))]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_schedule"] = None
        return state
