"""Episode windows: which steps of an episode one sample covers, per key, with LeRobot's edge clamping.

A sample is anchored at one step ``t`` of an episode. Each key (``"frames.cam_high"``, ``"proprio"``,
``"action"``, ...) asks for steps ``t + offset`` for its offsets; offsets that fall outside the episode are clamped
to its first or last step and flagged in ``<key>_is_pad``, exactly as LeRobot's ``delta_timestamps`` do. All
functions here are pure numpy over whole arrays of samples, so a million windows cost milliseconds::

    >>> spec = WindowSpec(offsets={"proprio": (-1, 0), "action": (0, 1, 2)})
    >>> idx, pad = spec.indices(anchors=np.array([0, 4]), length=5)
    >>> idx["action"].tolist(), pad["action"].tolist()
    ([[0, 1, 2], [4, 4, 4]], [[False, False, False], [False, True, True]])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["WindowSpec", "align_to_stream", "episode_chunks", "episode_windows", "lerobot_key"]


@dataclass(frozen=True, kw_only=True)
class WindowSpec:
    """Per-key step offsets relative to a sample's anchor step.

    offsets: key -> offsets in steps of the episode's control clock (its ``fps``); e.g. two history frames and a
        50-step action chunk: ``{"frames.cam_high": (-1, 0), "proprio": (0,), "action": tuple(range(50))}``.
    """

    offsets: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clean = {}
        for key, values in self.offsets.items():
            values = tuple(int(v) for v in values)
            if not values:
                raise ValueError(f"window key {key!r} has no offsets; give at least one (0 is the anchor step)")
            clean[key] = values
        object.__setattr__(self, "offsets", clean)

    @classmethod
    def from_delta_timestamps(
        cls, delta_timestamps: Mapping[str, Sequence[float]], fps: float, *, tolerance_s: float = 1e-4
    ) -> WindowSpec:
        """Offsets from LeRobot-style ``delta_timestamps`` (seconds); each must be a whole number of frames.

        Keys may be mmfeed's or LeRobot's own: ``observation.images.<camera>`` becomes ``frames.<camera>`` and
        ``observation.state`` becomes ``proprio``.
        """
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        offsets = {}
        for key, deltas in delta_timestamps.items():
            key = lerobot_key(key)
            deltas = np.asarray(deltas, dtype=np.float64)
            steps = np.round(deltas * fps)
            bad = np.abs(steps / fps - deltas) > tolerance_s
            if bad.any():
                raise ValueError(
                    f"delta_timestamps[{key!r}] = {deltas[bad].tolist()} s are not multiples of 1/fps = {1 / fps:.6f} s "
                    f"within tolerance_s={tolerance_s}"
                )
            offsets[key] = tuple(int(s) for s in steps)
        return cls(offsets=offsets)

    @property
    def keys(self) -> list[str]:
        return list(self.offsets)

    def span(self) -> tuple[int, int]:
        """The smallest and largest offset over all keys."""
        everything = [o for values in self.offsets.values() for o in values] or [0]
        return min(everything), max(everything)

    def indices(self, anchors: np.ndarray, length: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Clamped step indices ``int64 [N, K]`` and ``is_pad`` flags ``bool [N, K]`` per key, for anchors in one episode."""
        if length < 1:
            raise ValueError(f"episode length must be >= 1, got {length}")
        anchors = np.asarray(anchors, dtype=np.int64).reshape(-1, 1)
        out_idx, out_pad = {}, {}
        for key, offsets in self.offsets.items():
            raw = anchors + np.asarray(offsets, dtype=np.int64)[None, :]
            out_pad[key] = (raw < 0) | (raw >= length)
            out_idx[key] = np.clip(raw, 0, length - 1)
        return out_idx, out_pad


def lerobot_key(key: str) -> str:
    """mmfeed's name for a LeRobot feature key (``observation.images.cam`` -> ``frames.cam``,
    ``observation.state`` -> ``proprio``); other keys are returned unchanged."""
    if key == "observation.state":
        return "proprio"
    if key.startswith("observation.images."):
        return "frames." + key.rsplit(".", 1)[-1]
    return key


def episode_windows(lengths: np.ndarray, *, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One sample every ``stride`` steps of every episode: ``(episode, anchor)`` int64 arrays, episode-major.

    LeRobot's sampling is ``stride=1``: one sample per frame of the dataset.
    """
    lengths = _lengths(lengths)
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    per_episode = (lengths + stride - 1) // stride
    episode = np.repeat(np.arange(len(lengths), dtype=np.int64), per_episode)
    starts = np.cumsum(per_episode) - per_episode
    anchor = (np.arange(len(episode), dtype=np.int64) - np.repeat(starts, per_episode)) * stride
    return episode, anchor


def episode_chunks(lengths: np.ndarray, max_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Whole episodes as samples, longer ones split into consecutive chunks of at most ``max_length`` steps.

    Returns ``(episode, start, length)`` int64 arrays; the chunks of an episode cover it exactly, in order.
    """
    lengths = _lengths(lengths)
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    per_episode = (lengths + max_length - 1) // max_length
    episode = np.repeat(np.arange(len(lengths), dtype=np.int64), per_episode)
    first = np.cumsum(per_episode) - per_episode
    chunk = np.arange(len(episode), dtype=np.int64) - np.repeat(first, per_episode)
    start = chunk * max_length
    length = np.minimum(lengths[episode] - start, max_length)
    return episode, start, length


def align_to_stream(
    steps: np.ndarray, *, fps: float, stream_fps: float, stream_length: int, mode: str = "previous"
) -> np.ndarray:
    """Map control-clock steps to frame indices of a stream recorded at its own rate, by time.

    Time is ``step / fps`` (float64). ``mode="previous"`` takes the latest frame at or before that time (causal:
    a model never sees a frame from the future); ``"nearest"`` takes the closest frame, as LeRobot does.
    Indices are clamped to the stream's frames.
    """
    if fps <= 0 or stream_fps <= 0:
        raise ValueError(f"fps and stream_fps must be positive, got {fps} and {stream_fps}")
    if stream_length < 1:
        raise ValueError(f"stream_length must be >= 1, got {stream_length}")
    t = np.asarray(steps, dtype=np.float64) / fps
    position = t * stream_fps
    if mode == "previous":
        frame = np.floor(position + 1e-6)
    elif mode == "nearest":
        frame = np.floor(position + 0.5)
    else:
        raise ValueError(f"unknown mode {mode!r}; choose 'previous' or 'nearest'")
    return np.clip(frame.astype(np.int64), 0, stream_length - 1)


def _lengths(lengths: np.ndarray) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and (not np.issubdtype(lengths.dtype, np.integer) or lengths.min() < 0)):
        raise ValueError("episode lengths must be a 1-D array of integers >= 0 (an empty episode has no samples)")
    return lengths.astype(np.int64)
