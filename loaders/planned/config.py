"""``mmfeed.DataLoader(..., packing=Packing(...))``: everything that turns on planning and packing, in one place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmfeed.loaders.planned.errors import ErrorPolicy
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
    weights: for a mixture (a list of datasets), each dataset's share of an epoch's samples.
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
    weights: Sequence[float] | None = None

    def __post_init__(self) -> None:
        for name, kind in (("layout", TokenLayout), ("plan", PlanConfig), ("errors", ErrorPolicy)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"Packing.{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")
        if self.window is not None and not isinstance(self.window, WindowSpec):
            raise TypeError(f"Packing.window must be a WindowSpec or None, got {type(self.window).__name__}")
        if self.weights is not None:
            object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))

    def dataset(self, source: Any, *, rank: int = 0, world_size: int = 1):
        """The planned dataset of ``source`` for one rank (:class:`~mmfeed.loaders.planned.dataset.PlannedDataset`)."""
        from mmfeed.loaders.planned.dataset import PlannedDataset
        from mmfeed.loaders.planned.items import EpisodeItems

        items = EpisodeItems(source, layout=self.layout, window=self.window, stride=self.stride,
                             max_length=self.max_length, capacity=self.plan.capacity or None,
                             long_episodes=self.long_episodes, tokenizer=self.tokenizer, weights=self.weights)
        dataset = PlannedDataset(items, plan=self.plan, seed=self.seed, rank=rank, world_size=world_size,
                                 static_shapes=self.static_shapes, errors=self.errors, transform=self.transform)
        dataset.packing = self
        return dataset
