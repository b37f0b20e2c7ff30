"""``ds.windows(spec)``: the unpacked, LeRobotDataset-shaped view of exactly the samples the packed loader plans.

One sample per step of every episode, in LeRobot's order (episode by episode, step by step). Sample ``i`` is found
from cumulative episode lengths (nothing is stored per window) and read through the same request builder as the
packed loader (:func:`mmfeed.loaders.sources.requests.window_requests`), so ``windows[i]`` holds the very frames and
flags the packed loader lays out for that sample. A user moving from LeRobot changes one line and keeps
``mmfeed.DataLoader(windows, batch_size=32, shuffle=True)``::

    windows = open_dataset(root).windows(WindowSpec.from_delta_timestamps(delta_timestamps))
    sample = windows[0]   # {feature: [K, ...], f"{feature}_is_pad": bool [K], "task", "episode_index", "frame_index"}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from mmfeed.loaders.sources.requests import EpisodeRequest, Indexed, window_requests
from mmfeed.packing.windows import WindowSpec

__all__ = ["Windowed", "WindowsDataset"]


class Windowed(Indexed, Protocol):
    """What the view reads of its source (every :class:`~mmfeed.loaders.sources.base.EpisodeSource` is one; a
    source makes its own view, ``EpisodeSource.windows``, so the view names no source class)."""

    name: str

    @property
    def features(self) -> Mapping[str, Any]: ...

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]: ...

    def dim_mask(self, episode: int, feature: str) -> np.ndarray | None: ...

    def task(self, episode: int, step: int = 0) -> str: ...

    def origin(self, episode: int) -> dict[str, int]: ...


class WindowsDataset(torch.utils.data.Dataset):
    """Map-style dataset of the windows of ``source``: item ``i`` is the window anchored at the ``i``-th step of
    the dataset (episodes back to back).

    Items: ``{feature: tensor [K, ...]`` (video uint8 ``[K, H, W, 3]``), ``f"{feature}_is_pad": bool [K]``,
    ``"task": str`` (of the anchor step), ``"episode_index": int``, ``"frame_index": int}``; in a mixture also
    ``"dataset": int`` (its index in the list; ``"embodiment"`` too, given embodiments) and, for a feature the
    mixture pads (``pad_to``), ``f"{feature}_dim_mask": bool [width]``, True where the dataset's own elements are.
    """

    def __init__(self, source: Windowed, spec: WindowSpec) -> None:
        if not isinstance(spec, WindowSpec):
            raise TypeError(f"windows() takes a WindowSpec (WindowSpec.from_delta_timestamps(...)), got "
                            f"{type(spec).__name__}")
        for feature in spec.features:
            if feature not in source.features:
                raise ValueError(f"{source.name}: the window names feature {feature!r}, which the dataset does not "
                                 f"have; its features are {sorted(source.features)}")
        self.source, self.spec = source, spec
        self._ends = np.cumsum(np.asarray(source.lengths, dtype=np.int64))

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def locate(self, index: int) -> tuple[int, int]:
        """``(episode, anchor step)`` of window ``index``."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"a window index is an int, got {index!r}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"window {index} out of range ({n} windows)")
        index = int(index) % n
        episode = int(np.searchsorted(self._ends, index, side="right"))
        start = int(self._ends[episode - 1]) if episode else 0
        return episode, index - start

    def __getitem__(self, index: int) -> dict[str, Any]:
        episode, anchor = self.locate(index)
        (request, pads), = window_requests(self.source, self.spec, np.array([episode]), np.array([anchor]))
        data = self.source.read_many([request])[0]
        out: dict[str, Any] = {}
        for feature in request.indices:
            values = data[feature]
            if isinstance(values, torch.Tensor):  # frames decoded onto the GPU (device=): left where they are
                out[feature] = values
            else:
                out[feature] = torch.from_numpy(np.ascontiguousarray(values)) if values.dtype != object else values
            out[f"{feature}_is_pad"] = torch.from_numpy(pads[feature])
            mask = self.source.dim_mask(episode, feature)
            if mask is not None:
                out[f"{feature}_dim_mask"] = torch.from_numpy(mask.copy())
        out.update(task=self.source.task(episode, anchor), episode_index=episode, frame_index=anchor)
        out.update(self.source.origin(episode))
        return out
