"""Episode sources: what the planner and the workers need to know about a dataset, and nothing more.

A source lists its episodes with the numbers planning needs (length in steps, fps, cameras, task) without
touching pixels, and reads exactly the steps a sample asks for. ``read_many`` takes the requests of a whole batch
at once so that video sources can decode each group of pictures once for every frame wanted from it.

Keys follow DESIGN.md: ``"proprio"`` float32 ``[n, Dp]``, ``"action"`` float32 ``[n, Da]`` and
``"frames.<camera>"`` uint8 ``[n, H, W, 3]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from mmfeed.loaders.layout import FRAMES_PREFIX
from mmfeed.loaders.timing import stage

__all__ = ["ArraySource", "EpisodeArrays", "EpisodeRequest", "Source", "open_dataset"]


@dataclass(frozen=True)
class EpisodeRequest:
    """Steps of one episode to read: key -> step indices (int64, any order, repeats allowed).

    out: optional key -> preallocated uint8 ``[n, H, W, 3]`` array for a camera's frames, which the source
        decodes into (and returns) instead of allocating; a source may ignore it.
    """

    episode: int
    steps: Mapping[str, np.ndarray]
    out: Mapping[str, np.ndarray] | None = None


@runtime_checkable
class Source(Protocol):
    """The protocol every episode source implements (webdataset shards, LeRobot directories, arrays)."""

    name: str
    cameras: list[str]

    def __len__(self) -> int: ...

    @property
    def lengths(self) -> np.ndarray:
        """Steps of each episode, int64 ``[num_episodes]``."""

    @property
    def fps(self) -> np.ndarray:
        """Control-clock rate of each episode, float64 ``[num_episodes]``."""

    def task(self, episode: int) -> str: ...

    def describe(self, episode: int) -> str:
        """Where an episode lives (file, key), for error messages."""

    def camera_fps(self, episode: int, camera: str) -> float: ...

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested steps of each request, in request order (frame steps are control-clock steps)."""

    def episode(self, index: int) -> dict:
        """The whole episode: proprio, action, task, fps and every camera's frames."""


class EpisodeArrays:
    """The planning-side part every source shares: episode lengths and rates held as arrays (``_lengths``
    int64, ``_fps`` float64), set by the subclass."""

    _lengths: np.ndarray
    _fps: np.ndarray

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def lengths(self) -> np.ndarray:
        """Steps of each episode, int64 ``[num_episodes]``."""
        return self._lengths

    @property
    def fps(self) -> np.ndarray:
        """Control-clock rate of each episode, float64 ``[num_episodes]``."""
        return self._fps


class ArraySource(EpisodeArrays):
    """Episodes held in memory as arrays; the reference source for tests and for data already in RAM.

    episodes: a sequence of dicts with "proprio" ``[T, Dp]``, "action" ``[T, Da]``, optional "task" str, "fps"
        float and ``"frames.<camera>"`` ``[T, H, W, 3]`` arrays (one frame per step).
    """

    def __init__(self, episodes: Sequence[Mapping], *, name: str = "arrays") -> None:
        if not episodes:
            raise ValueError("ArraySource needs at least one episode")
        self.name = name
        self._episodes = [dict(e) for e in episodes]
        for i, ep in enumerate(self._episodes):
            for key in ("proprio", "action"):
                if key not in ep:
                    raise ValueError(f"episode {i} of source {name!r} has no {key!r} array")
            if len(ep["proprio"]) != len(ep["action"]) or len(ep["proprio"]) < 1:
                raise ValueError(
                    f"episode {i} of source {name!r}: proprio has {len(ep['proprio'])} steps and action "
                    f"{len(ep['action'])}; both must have the same number, at least 1"
                )
        first = self._episodes[0]
        self.cameras = [k[len(FRAMES_PREFIX) :] for k in first if k.startswith(FRAMES_PREFIX)]
        self._lengths = np.array([len(e["proprio"]) for e in self._episodes], dtype=np.int64)
        self._fps = np.array([float(e.get("fps", 30.0)) for e in self._episodes], dtype=np.float64)

    def task(self, episode: int) -> str:
        return str(self._episodes[episode].get("task", ""))

    def describe(self, episode: int) -> str:
        """Where an episode lives, for error messages."""
        return f"source {self.name!r} episode {episode}"

    def camera_fps(self, episode: int, camera: str) -> float:
        return float(self._fps[episode])

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        out = []
        with stage("read"):
            for request in requests:
                ep = self._episodes[request.episode]
                out.append({k: np.asarray(ep[k])[np.asarray(steps, dtype=np.int64)] for k, steps in request.steps.items()})
        return out

    def episode(self, index: int) -> dict:
        ep = dict(self._episodes[index])
        ep.setdefault("task", "")
        ep.setdefault("fps", float(self._fps[index]))
        return ep


def open_dataset(path, **kwargs) -> Source:
    """Open webdataset shards (directory, brace pattern, glob, URL or index file) or a LeRobot v3 directory.

    Keyword arguments go to the source (e.g. ``backend="pyav"``). ``len(ds)`` is the number of episodes and
    ``ds.episode(i)`` the whole episode as a dict (DESIGN.md).
    """
    from mmfeed.loaders.lerobot import LeRobotSource, is_lerobot_dir
    from mmfeed.loaders.webdataset import WebDatasetSource

    if not isinstance(path, (list, tuple)) and is_lerobot_dir(path):
        return LeRobotSource(path, **kwargs)
    if not isinstance(path, (list, tuple)) and "://" not in str(path) and not any(c in str(path) for c in "{*?["):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file or directory (expected webdataset shards or a LeRobot v3 "
                                    f"directory)")
    return WebDatasetSource(path, **kwargs)
