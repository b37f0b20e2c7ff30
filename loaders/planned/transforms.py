"""Transforms: functions of one sample run in the workers after decode and before packing.

A transform is ``fn(sample: dict[str, Tensor], generator: torch.Generator) -> dict``: the sample holds each
feature's frames ``[K, ...]``, its ``<feature>_is_pad`` flags, ``task``, ``episode_index`` and ``frame_index``;
``generator`` is seeded from ``(seed, epoch, sample id)`` so random augmentation is the same for any
``num_workers`` and replays exactly after a resume. A transform may change values and frame sizes, never the
number of frames (tokens are planned before anything is read). :class:`Normalize` is the ready one for array
features::

    >>> import torch
    >>> stats = {"observation.state": {"mean": np.array([1.0]), "std": np.array([2.0])}}
    >>> Normalize(stats)({"observation.state": torch.tensor([[3.0]])}, None)["observation.state"].tolist()
    [[1.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["NORMALIZE_MODES", "Normalize"]

NORMALIZE_MODES = {
    "mean_std": ("mean", "std"),
    "min_max": ("min", "max"),
    "quantile": ("q01", "q99"),
}
"""Mode -> the two statistics it needs: ``(x - mean) / std``; ``min_max`` and ``quantile`` map the range between
their two statistics to ``[-1, 1]``, as LeRobot's MIN_MAX and QUANTILES modes do."""


class Normalize:
    """Normalize array features with a dataset's stats (``ds.stats``).

    stats: feature -> {"mean", "std", "min", "max", "q01", "q99", ...} arrays of the feature's step shape.
    mode: a key of :data:`NORMALIZE_MODES`.
    features: the features to normalize (default: every feature the stats hold that a sample carries; video
        frames, uint8 tensors of 3 or more dimensions in either frame format, are left alone).
    eps: added to the denominator, so a constant feature does not divide by zero.
    """

    def __init__(self, stats: Mapping[str, Mapping[str, Any]], mode: str = "mean_std", *,
                 features: Sequence[str] | None = None, eps: float = 1e-8) -> None:
        if mode not in NORMALIZE_MODES:
            raise ValueError(f"Normalize mode must be one of {sorted(NORMALIZE_MODES)}, got {mode!r}")
        a, b = NORMALIZE_MODES[mode]
        chosen = list(stats) if features is None else list(features)
        self.mode, self.eps = mode, float(eps)
        self._params: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for feature in chosen:
            have = stats.get(feature)
            if have is None:
                if features is not None:
                    raise ValueError(f"Normalize: no stats for feature {feature!r}; stats cover {sorted(stats)}")
                continue
            if a not in have or b not in have:
                if features is not None:
                    raise ValueError(f"Normalize(mode={mode!r}) needs {a!r} and {b!r} for {feature!r}; its stats "
                                     f"have {sorted(have)}")
                continue
            lo, hi = (torch.as_tensor(np.asarray(have[k], dtype=np.float64)) for k in (a, b))
            self._params[feature] = (lo, hi)

    @property
    def features(self) -> list[str]:
        return list(self._params)

    def __call__(self, sample: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        out = dict(sample)
        for feature, (lo, hi) in self._params.items():
            x = sample.get(feature)
            if not isinstance(x, torch.Tensor) or x.dtype == torch.uint8 and x.dim() >= 3:
                continue  # absent, or video frames (RGB [K, H, W, 3] or yuv420 planes [K, H * 3 // 2, W])
            dtype = x.dtype if x.is_floating_point() else torch.float32
            lo_, hi_ = lo.to(dtype).reshape(lo.shape), hi.to(dtype).reshape(hi.shape)
            if self.mode == "mean_std":
                y = (x.to(dtype) - lo_) / (hi_ + self.eps)
            else:
                y = 2 * (x.to(dtype) - lo_) / (hi_ - lo_ + self.eps) - 1
            out[feature] = y
        return out
