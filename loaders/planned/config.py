"""``mmfeed.DataLoader(..., packing=Packing(...))``: everything that turns on planning and packing, in one place."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mmfeed.loaders.planned.errors import ErrorPolicy
from mmfeed.loaders.planned.filters import FrameFilter
from mmfeed.packing.mixture import SizeWeights, Weights
from mmfeed.packing.layout import TokenLayout
from mmfeed.packing.plan import PlanConfig
from mmfeed.packing.windows import WindowSpec

__all__ = ["Packing"]


@dataclass(frozen=True, kw_only=True)
class Packing:
    """How an episode source is sampled, planned and packed by ``mmfeed.DataLoader``.

    layout: token prices of each feature (:class:`~mmfeed.packing.layout.TokenLayout`).
    window: the features and times of windowed samples (:class:`~mmfeed.packing.windows.WindowSpec`); None
        samples whole episodes of the features the layout prices (split at ``max_length`` steps).
    stride: steps between window anchors (1: one sample per step, as LeRobot).
    max_length: longest whole-episode chunk, in steps.
    long_episodes: whole-episode chunks that do not fit a row are "split" (default) or "truncate"d.
    plan: capacity, rows per batch, mode, algorithm, ... (:class:`~mmfeed.packing.plan.PlanConfig`).
    seed: the plan's shuffle (and the transform's generators); rank and world size come from torch.distributed
        or torchrun's environment.
    static_shapes: every batch tensor, ``cu_seqlens`` included, has one shape for the whole epoch.
    tokenizer: ``encode(str) -> int32 ids`` for task text (default: UTF-8 bytes).
    errors: what a sample that cannot be loaded does (raise, skip or warn; see ErrorPolicy).
    transform: ``fn(sample, generator) -> sample`` run in the workers on each sample after decode (e.g.
        :class:`~mmfeed.loaders.planned.transforms.Normalize`).
    weights: for a mixture (a list of datasets), each dataset's share of an epoch's samples: one number per
        dataset, ``"size"`` (in proportion to size: every sample once) or
        :class:`~mmfeed.packing.mixture.SizeWeights` ``(alpha)``, each dataset's size (in samples) to the power
        alpha (0.5: large datasets tempered).
    frame_filter: per-episode ranges of steps to keep or drop (a JSON or parquet file, or a
        :class:`~mmfeed.loaders.planned.filters.FrameFilter`), applied in the plan: a window is anchored, a
        chunk cut, only at kept steps.
    """

    layout: TokenLayout = field(default_factory=TokenLayout)
    window: WindowSpec | None = None
    stride: int = 1
    max_length: int | None = None
    long_episodes: str = "split"
    plan: PlanConfig = field(default_factory=PlanConfig)
    seed: int = 0
    static_shapes: bool = False
    tokenizer: Any = None
    errors: ErrorPolicy = field(default_factory=ErrorPolicy)
    transform: Callable | None = None
    weights: Weights = None
    frame_filter: FrameFilter | str | os.PathLike | None = None

    def __post_init__(self) -> None:
        for name, kind in (("layout", TokenLayout), ("plan", PlanConfig), ("errors", ErrorPolicy)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"Packing.{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")
        if self.window is not None and not isinstance(self.window, WindowSpec):
            raise TypeError(f"Packing.window must be a WindowSpec or None, got {type(self.window).__name__}")
        if self.weights is not None and not isinstance(self.weights, (str, SizeWeights)):
            object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
        if isinstance(self.frame_filter, (str, os.PathLike)):  # read now: a bad file fails here, not in a worker
            object.__setattr__(self, "frame_filter", FrameFilter.load(self.frame_filter))
        elif self.frame_filter is not None and not isinstance(self.frame_filter, FrameFilter):
            raise TypeError(f"Packing.frame_filter must be a path or a FrameFilter, got "
                            f"{type(self.frame_filter).__name__}")

    def dataset(self, source: Any, *, rank: int = 0, world_size: int = 1, refuse_unfit: bool = True):
        """The planned dataset of ``source`` for one rank (:class:`~mmfeed.loaders.planned.dataset.PlannedDataset`;
        ``refuse_unfit`` as there: a capacity no sample fits is a ValueError)."""
        from mmfeed.loaders.planned.dataset import PlannedDataset
        from mmfeed.loaders.planned.items import EpisodeItems

        items = EpisodeItems(source, layout=self.layout, window=self.window, stride=self.stride,
                             max_length=self.max_length, capacity=self.plan.capacity or None,
                             long_episodes=self.long_episodes, tokenizer=self.tokenizer, weights=self.weights,
                             frame_filter=self.frame_filter)
        return PlannedDataset(items, plan=self.plan, seed=self.seed, rank=rank, world_size=world_size,
                              static_shapes=self.static_shapes, errors=self.errors, transform=self.transform,
                              refuse_unfit=refuse_unfit)
