"""The planner over any map-style dataset: packed batches of a user's own samples.

For language-model research code and any dataset whose samples are token sequences: give the dataset and each
sample's length (an array, or a function of the index); the epoch is planned exactly as for episode sources
(shuffle, pack into rows of ``capacity``, balance ranks) and each batch is collated into a PackedBatch whose
``data`` holds every tensor field of the samples concatenated along dim 0 in token order.

    >>> import torch
    >>> docs = [torch.arange(n) for n in (5, 3, 7, 2)]
    >>> ds = PackedMapDataset(docs, lengths=[5, 3, 7, 2], capacity=8, seed=0)
    >>> b = ds[0, 0]
    >>> b.capacity, int(b.cu_seqlens[-1]) == len(b.data["text"])
    (8, True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmfeed.packing.plan import Plan, PlanConfig, plan_epoch
from mmfeed.packing import PackedBatch

__all__ = ["PackedMapDataset"]


class PackedMapDataset(torch.utils.data.Dataset):
    """Packed batches over ``dataset`` (any object with ``__getitem__`` and ``__len__``).

    lengths: tokens of each sample, as an array or a function ``index -> int``.
    capacity, rows_per_batch, plan: the plan (see :class:`~mmfeed.packing.plan.PlanConfig`).
    seed, rank, world_size: the plan is a pure function of these and the epoch.
    Samples may be 1-D tensors (token ids, stored as ``data["text"]``, the batch's one modality) or dicts of tensors whose first dimension is the
    sample's length (each key concatenated); anything else goes to ``metadata["samples"]`` unchanged.
    """

    def __init__(self, dataset: Sequence, *, lengths: Sequence[int] | np.ndarray | Callable[[int], int],
                 capacity: int = 8192, rows_per_batch: int = 1, plan: PlanConfig | None = None, seed: int = 0,
                 rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
        self.dataset = dataset
        n = len(dataset)
        values = [lengths(i) for i in range(n)] if callable(lengths) else lengths
        self.lengths = np.asarray(values)
        if self.lengths.shape != (n,) or (n and not np.issubdtype(self.lengths.dtype, np.integer)):
            raise ValueError(f"lengths must give one integer per sample ({n}), got shape {self.lengths.shape}")
        if n and self.lengths.min() < 1:
            raise ValueError(f"sample {int(np.argmin(self.lengths))} has length {self.lengths.min()}; lengths must be >= 1")
        self.config = plan or PlanConfig(capacity=capacity, rows_per_batch=rows_per_batch)
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self._plan: tuple[int, Plan] | None = None

    def plan(self, epoch: int) -> Plan:
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, plan_epoch(self.lengths, self.config, seed=self.seed, epoch=epoch,
                                            world_size=self.world_size))
        return self._plan[1]

    def num_steps(self, epoch: int = 0) -> int:
        return self.plan(epoch).num_steps

    def __len__(self) -> int:
        return self.num_steps(0)

    def __getitem__(self, key: tuple[int, int] | int) -> PackedBatch:
        epoch, step = key if isinstance(key, tuple) else (0, key)
        plan = self.plan(int(epoch))
        if not 0 <= step < plan.num_steps:
            raise IndexError(f"step {step} out of range: epoch {epoch} has {plan.num_steps} steps")
        rows = plan.batch_rows(self.rank, int(step))
        order = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        samples = [self.dataset[int(i)] for i in order]
        data, extra = _concat(samples, order, self.lengths)
        capacity = plan.capacity or int(self.lengths[order].max(initial=1))
        metadata: dict[str, Any] = {"sample": torch.from_numpy(order.astype(np.int64))}
        if extra:
            metadata["samples"] = extra
        return PackedBatch.from_segments([self.lengths[r].tolist() for r in rows], capacity, data=data,
                                         metadata=metadata)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_plan"] = None
        return state


def _concat(samples: list, order: np.ndarray, lengths: np.ndarray) -> tuple[dict[str, torch.Tensor], list]:
    fields: dict[str, list[torch.Tensor]] = {}
    extra = []
    for i, sample in zip(order, samples):
        items = {"text": sample} if isinstance(sample, (torch.Tensor, np.ndarray)) else sample
        if not isinstance(items, Mapping):
            extra.append(sample)
            continue
        rest = {}
        for key, value in items.items():
            if isinstance(value, np.ndarray):
                value = torch.from_numpy(value)
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                if value.shape[0] != lengths[i]:
                    raise ValueError(f"sample {int(i)} field {key!r} has {value.shape[0]} entries but its length "
                                     f"is {int(lengths[i])}; lengths must match the samples")
                fields.setdefault(key, []).append(value)
            else:
                rest[key] = value
        if rest:
            extra.append(rest)
    return {k: torch.cat(v) for k, v in fields.items()}, extra
