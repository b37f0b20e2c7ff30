"""``mmfeed.DataLoader(..., packing=Packing(...))``: the keywords that turn on planning and packing."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmfeed.loaders.errors import ErrorPolicy
from mmfeed.loaders.layout import TokenLayout
from mmfeed.packing.plan import PlanConfig
from mmfeed.loaders.windows import WindowSpec

__all__ = ["Packing"]


@dataclass(frozen=True, kw_only=True)
class Packing:
    """How an episode source is sampled, planned and packed by ``mmfeed.DataLoader``.

    layout: token prices of each modality (:class:`~mmfeed.loaders.layout.TokenLayout`).
    window: per-key offsets of windowed samples; None samples whole episodes (split at ``max_length``).
    stride: steps between window anchors.
    max_length: longest whole-episode chunk, in steps.
    plan: capacity, rows per batch, mode, algorithm, ... (:class:`~mmfeed.packing.plan.PlanConfig`).
    seed: the plan's shuffle; rank and world size come from torch.distributed or torchrun's environment.
    static_shapes: pad payloads so every batch has identical tensor shapes.
    tokenizer: ``encode(str) -> int32 ids`` for task text (default: UTF-8 bytes).
    errors: what a sample that cannot be loaded does (raise, skip or warn; see ErrorPolicy).
    """

    layout: TokenLayout = field(default_factory=TokenLayout)
    window: WindowSpec | None = None
    stride: int = 1
    max_length: int | None = None
    plan: PlanConfig = field(default_factory=PlanConfig)
    seed: int = 0
    static_shapes: bool = False
    tokenizer: object = None
    errors: ErrorPolicy = field(default_factory=ErrorPolicy)
