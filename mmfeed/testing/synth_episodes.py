"""The seeded synthetic episodes of :mod:`mmfeed.testing.synth`: :class:`SyntheticEpisode` and :func:`make_episodes`.

Smooth state trajectories, actions that are their next-step change, a task string and cameras whose frames are
generated on access from :func:`~mmfeed.testing.video.frame_pattern`; also the checks the writers share (episode
ids that are webdataset keys, integer arguments).
"""

from __future__ import annotations

import math
import re
from types import MappingProxyType
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from mmfeed.testing.video import frame_pattern

__all__ = ["DEFAULT_TASKS", "IMAGE_PREFIX", "SyntheticEpisode", "make_episodes"]

IMAGE_PREFIX = "observation.images."
"""Feature name prefix of a camera's video: camera ``cam_high`` is feature ``observation.images.cam_high``."""

DEFAULT_TASKS = (
    "pick up the red cube",
    "open the top drawer",
    "fold the towel in half",
    "push the green button",
)
"""Task strings that :func:`make_episodes` draws from by default."""

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_RESERVED_FIELDS = ("proprio", "action", "meta")


class _LazyFrames(Mapping):
    """Read-only ``camera -> uint8 [T_cam, H, W, 3]`` frames, generated on each access (episode-local index)."""

    def __init__(self, episode: SyntheticEpisode) -> None:
        self._episode = episode

    def __getitem__(self, camera: str) -> np.ndarray:
        return self._episode.frames(camera)

    def __iter__(self) -> Iterator[str]:
        return iter(self._episode.camera_seeds)

    def __len__(self) -> int:
        return len(self._episode.camera_seeds)

    def __repr__(self) -> str:
        return f"<frames of cameras {list(self)}>"


@dataclass(frozen=True, eq=False)
class SyntheticEpisode:
    """One synthetic recording; ground truth for tests.

    episode_id:   str, webdataset-safe (letters, digits, ``_``, ``-``; no dots), e.g. ``"episode_000003"``.
    fps:          step rate of ``state`` and ``action``.
    state:        float32 ``[T, Ds]``, a smooth trajectory (sum of sines per dimension, seeded); the feature
                  ``observation.state``.
    action:       float32 ``[T, Da]``, the next-step change of the trajectory: ``x(t + 1/fps) - x(t)``.
    task:         task text.
    camera_seeds: camera -> the ``frame_pattern`` seed of its colours (cameras differ, index bands do not).
    camera_fps:   camera -> its frame rate (the step rate unless the stream runs at its own rate).
    height, width: frame size.
    """

    episode_id: str
    fps: float
    state: np.ndarray
    action: np.ndarray
    task: str
    camera_seeds: Mapping[str, int]
    camera_fps: Mapping[str, float]
    height: int
    width: int

    @property
    def length(self) -> int:
        """Number of steps ``T``."""
        return int(self.state.shape[0])

    @property
    def cameras(self) -> Mapping[str, np.ndarray]:
        """``camera -> frames`` uint8 ``[T_cam, H, W, 3]``, generated on access; ``list(ep.cameras)`` gives names."""
        return _LazyFrames(self)

    @property
    def camera_names(self) -> tuple[str, ...]:
        """Camera names in writing order."""
        return tuple(self.camera_seeds)

    def num_frames(self, camera: str) -> int:
        """Frames of ``camera``: those at ``j / camera_fps`` that fall within ``[0, (T - 1) / fps]``."""
        ratio = _rate(self.camera_fps[self._check_camera(camera)]) / _rate(self.fps)
        return math.floor((self.length - 1) * ratio) + 1 if self.length else 0

    def frame_times(self, camera: str) -> np.ndarray:
        """float64 seconds of each frame of ``camera`` from the episode start."""
        return np.arange(self.num_frames(camera), dtype=np.float64) / float(self.camera_fps[camera])

    def frames(self, camera: str, *, start: int = 0) -> np.ndarray:
        """uint8 ``[T_cam, H, W, 3]`` frames of ``camera`` whose pattern indices run ``start .. start + T_cam - 1``."""
        self._check_camera(camera)
        return frame_pattern(
            self.num_frames(camera), height=self.height, width=self.width, start=start, seed=self.camera_seeds[camera]
        )

    def video_feature(self, camera: str) -> str:
        """The feature name of a camera's video (LeRobot's convention)."""
        return IMAGE_PREFIX + self._check_camera(camera)

    def arrays(self) -> dict[str, np.ndarray]:
        """The array features under their LeRobot names, each ``[T, ...]`` at the control clock:
        ``observation.state`` (the trajectory), ``action`` (its next-step change), ``observation.velocity``
        (``action * fps``, float32), ``next.reward`` (float32 ``[T]``, minus the state's distance from 0) and
        ``next.done`` (bool ``[T]``, True at the last step)."""
        done = np.zeros(self.length, dtype=bool)
        done[-1:] = True
        return {
            "observation.state": self.state,
            "action": self.action,
            "observation.velocity": (self.action * np.float32(self.fps)).astype(np.float32),
            "next.reward": (-np.abs(self.state).sum(axis=1)).astype(np.float32),
            "next.done": done,
        }

    def features(self) -> dict[str, np.ndarray]:
        """Every feature under its own name: :meth:`arrays` plus each camera's frames (generated now)."""
        return {**self.arrays(), **{self.video_feature(c): self.frames(c) for c in self.camera_names}}

    def rates(self) -> dict[str, float]:
        """Features recorded at a rate other than the control clock's: feature -> fps."""
        return {self.video_feature(c): float(f) for c, f in self.camera_fps.items() if f != self.fps}

    def meta(self) -> dict:
        """The ``<key>.meta.json`` content of this episode in a webdataset shard."""
        return {
            "cameras": list(self.camera_seeds),
            "camera_fps": {c: float(f) for c, f in self.camera_fps.items()},
            "fps": float(self.fps),
            "length": self.length,
            "task": self.task,
        }

    def _check_camera(self, camera: str) -> str:
        if camera not in self.camera_seeds:
            raise ValueError(f"unknown camera {camera!r}; episode {self.episode_id!r} has {list(self.camera_seeds)}")
        return camera


def make_episodes(
    num_episodes: int,
    *,
    seed: int = 0,
    cameras: Sequence[str] = ("cam_high", "cam_wrist"),
    height: int = 48,
    width: int = 64,
    fps: float = 30.0,
    min_length: int = 20,
    max_length: int = 60,
    state_dim: int = 14,
    action_dim: int = 14,
    camera_fps: Mapping[str, float] | None = None,
    tasks: Sequence[str] = DEFAULT_TASKS,
) -> list[SyntheticEpisode]:
    """``num_episodes`` seeded episodes with lengths drawn uniformly from ``[min_length, max_length]``.

    Episode ``i`` depends only on ``(seed, i)`` and the shape arguments, so ``make_episodes(3)`` is a prefix of
    ``make_episodes(5)``. ``camera_fps`` gives cameras that run at their own rate (others run at ``fps``).
    Episode ids are ``"episode_{i:06d}"``.
    """
    _check_int("num_episodes", num_episodes, 0)
    _check_int("min_length", min_length, 1)
    _check_int("max_length", max_length, min_length)
    _check_int("state_dim", state_dim, 1)
    _check_int("action_dim", action_dim, 0)
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps!r}")
    cameras = tuple(cameras)
    for camera in cameras:
        if not isinstance(camera, str) or not _NAME.match(camera) or camera in _RESERVED_FIELDS:
            raise ValueError(
                f"camera name {camera!r} is not usable as a webdataset field: use letters, digits, '_' or '-' "
                f"(no dots) and none of {list(_RESERVED_FIELDS)}"
            )
    if len(set(cameras)) != len(cameras):
        raise ValueError(f"camera names must be unique, got {list(cameras)}")
    camera_fps = dict(camera_fps or {})
    unknown = sorted(set(camera_fps) - set(cameras))
    if unknown:
        raise ValueError(f"camera_fps names cameras {unknown} that are not in cameras={list(cameras)}")
    if any(not f > 0 for f in camera_fps.values()):
        raise ValueError(f"every camera_fps must be > 0, got {camera_fps}")
    tasks = tuple(tasks)
    if not tasks or not all(isinstance(t, str) and t for t in tasks):
        raise ValueError(f"tasks must be a non-empty sequence of non-empty strings, got {tasks!r}")
    frame_pattern(1, height=height, width=width)  # validates the frame size early
    return [
        _make_episode(i, seed, cameras, height, width, float(fps), min_length, max_length, state_dim, action_dim,
                      camera_fps, tasks)
        for i in range(num_episodes)
    ]


def _make_episode(index, seed, cameras, height, width, fps, min_length, max_length, state_dim, action_dim,
                  camera_fps, tasks) -> SyntheticEpisode:
    rng = np.random.default_rng([seed, index])
    length = int(rng.integers(min_length, max_length + 1))
    dims = max(state_dim, action_dim)
    amp = rng.uniform(0.05, 0.5, size=(3, dims))
    freq = rng.uniform(0.1, 1.5, size=(3, dims))  # Hz
    phase = rng.uniform(0.0, 2 * np.pi, size=(3, dims))
    offset = rng.uniform(-1.0, 1.0, size=dims)
    t = np.arange(length + 1, dtype=np.float64)[:, None, None] / fps  # one step past the end for the last action
    x = offset + (amp * np.sin(2 * np.pi * freq * t + phase)).sum(axis=1)  # [T + 1, dims]
    state = x[:length, :state_dim].astype(np.float32)
    action = (x[1:, :action_dim] - x[:-1, :action_dim]).astype(np.float32)
    task = tasks[int(rng.integers(len(tasks)))]
    seeds = {camera: int(s) for camera, s in zip(cameras, rng.integers(0, 2**31 - 1, size=len(cameras)))}
    rates = {camera: float(camera_fps.get(camera, fps)) for camera in cameras}
    return SyntheticEpisode(
        episode_id=f"episode_{index:06d}", fps=fps, state=state, action=action, task=task,
        camera_seeds=MappingProxyType(seeds), camera_fps=MappingProxyType(rates), height=height, width=width,
    )


def _check_ids(episodes: Sequence[SyntheticEpisode]) -> None:
    seen = set()
    for ep in episodes:
        if not isinstance(ep, SyntheticEpisode):
            raise TypeError(f"episodes must be SyntheticEpisode objects from make_episodes, got {type(ep).__name__}")
        if not _NAME.match(ep.episode_id):
            raise ValueError(f"episode id {ep.episode_id!r} is not a webdataset key: use letters, digits, '_', '-'")
        if ep.episode_id in seen:
            raise ValueError(f"episode id {ep.episode_id!r} appears twice; ids must be unique")
        seen.add(ep.episode_id)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _rate(fps: float) -> Fraction:
    return Fraction(fps).limit_denominator(1001)
