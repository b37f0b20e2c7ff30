"""Windows in time: which frames of each feature one sample covers, every feature at its own rate.

A sample is anchored at one step ``t`` of an episode's control clock (``fps``): its anchor time is ``t / fps``
seconds. A :class:`WindowSpec` asks, per feature, for times relative to the anchor (seconds, as LeRobot's
``delta_timestamps``). Each feature is read at its own rate ``r``: the asked time ``tau`` gets the latest frame at
or before it, ``floor((tau + tolerance_s) * r)``, so a 15 fps camera beside a 50 Hz state gives distinct frames and
never a frame from the future. Times outside the episode (before its first step or after its last) are clamped to
its first or last frame and flagged in ``<feature>_is_pad``, as LeRobot does. Where every feature runs at the
control clock and the deltas are multiples of ``1 / fps``, the indices and flags are exactly LeRobot's.

Everything here is pure numpy over whole arrays of samples, computed from the index alone::

    >>> spec = WindowSpec.from_delta_timestamps({"observation.state": [-0.02, 0.0], "action": [0.0, 0.02]})
    >>> idx, pad = window_indices(spec.deltas["action"], anchor_steps=np.array([0, 4]), fps=50.0,
    ...                           length=5, rate=50.0, frames=5)
    >>> idx.tolist(), pad.tolist()
    ([[0, 1], [4, 4]], [[False, False], [False, True]])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Real

import numpy as np

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "WindowSpec",
    "chunk_frames",
    "episode_chunks",
    "episode_windows",
    "frames_at_rate",
    "window_indices",
]

DEFAULT_TOLERANCE_S = 1e-4
"""How far (seconds) a frame's time may lie after the asked time and still count as "at or before" it."""


@dataclass(frozen=True, kw_only=True)
class WindowSpec:
    """Per-feature times, in seconds relative to a sample's anchor step, of the frames one sample reads.

    deltas: feature name -> seconds (negative: history, 0: the anchor, positive: the future), e.g. two history
        frames of a 15 fps camera, the current state and a 50-step action chunk at 50 Hz::

            {"observation.images.cam_high": (-1 / 15, 0.0), "observation.state": (0.0,),
             "action": tuple(i / 50 for i in range(50))}

    tolerance_s: a frame up to this much after the asked time still counts as at the asked time (float rounding).
    """

    deltas: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    tolerance_s: float = DEFAULT_TOLERANCE_S

    def __post_init__(self) -> None:
        if not isinstance(self.deltas, Mapping):
            raise TypeError(f"WindowSpec.deltas must map feature name -> seconds, got {type(self.deltas).__name__}")
        clean = {}
        for feature, values in self.deltas.items():
            if not isinstance(feature, str) or not feature:
                raise ValueError(f"WindowSpec feature names must be non-empty strings, got {feature!r}")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray):
                raise TypeError(f"WindowSpec.deltas[{feature!r}] must be a sequence of seconds, got {values!r}")
            seconds = []
            for v in values:
                if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(float(v)):
                    raise ValueError(f"WindowSpec.deltas[{feature!r}] holds {v!r}; deltas are finite numbers of "
                                     "seconds relative to the anchor step")
                seconds.append(float(v))
            steps = [v for v in values if isinstance(v, (int, np.integer)) and v != 0]
            if steps:
                raise ValueError(f"WindowSpec.deltas[{feature!r}] holds the integers {steps[:5]}: deltas are seconds, "
                                 "not steps; write k / fps for k steps of a stream at fps (e.g. 2 / 50), or a float "
                                 "such as 1.0 for whole seconds")
            if not seconds:
                raise ValueError(f"WindowSpec.deltas[{feature!r}] is empty; give at least one time (0.0 is the anchor)")
            clean[feature] = tuple(seconds)
        if not clean:
            raise ValueError("a WindowSpec needs at least one feature")
        tol = self.tolerance_s
        if isinstance(tol, bool) or not isinstance(tol, Real) or not 0 <= float(tol) < 1:
            raise ValueError(f"tolerance_s must be a number of seconds in [0, 1), got {tol!r}")
        object.__setattr__(self, "deltas", clean)
        object.__setattr__(self, "tolerance_s", float(tol))

    @classmethod
    def from_delta_timestamps(cls, delta_timestamps: Mapping[str, Sequence[float]], *,
                              tolerance_s: float = DEFAULT_TOLERANCE_S) -> WindowSpec:
        """A window from LeRobot-style ``delta_timestamps`` (feature -> seconds); each feature's rate comes from
        the dataset, so no fps is needed and deltas need not be multiples of anyone's period."""
        return cls(deltas={k: tuple(v) for k, v in delta_timestamps.items()}, tolerance_s=tolerance_s)

    @property
    def features(self) -> list[str]:
        """The features the window reads, in the order given."""
        return list(self.deltas)

    def span_s(self) -> tuple[float, float]:
        """The earliest and latest time asked over all features, in seconds from the anchor."""
        everything = [d for values in self.deltas.values() for d in values]
        return min(everything), max(everything)


def frames_at_rate(lengths: np.ndarray, fps: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Frames a stream at ``rate`` holds over episodes of ``lengths`` steps at ``fps``: those at ``j / rate`` within
    ``[0, (T - 1) / fps]`` (``T`` frames when the rate is the control clock's). int64, broadcast over arguments."""
    lengths = np.asarray(lengths, dtype=np.int64)
    fps, rate = np.asarray(fps, dtype=np.float64), np.asarray(rate, dtype=np.float64)
    same = np.isclose(rate, fps, rtol=1e-9, atol=0.0)
    other = np.floor((lengths - 1) / fps * rate + 1e-6).astype(np.int64) + 1
    return np.where(lengths > 0, np.where(same, lengths, other), 0)


def window_indices(deltas: Sequence[float], *, anchor_steps: np.ndarray, fps: np.ndarray | float,
                   length: np.ndarray | int, rate: np.ndarray | float, frames: np.ndarray | int,
                   tolerance_s: float = DEFAULT_TOLERANCE_S) -> tuple[np.ndarray, np.ndarray]:
    """Frame indices ``int64 [N, K]`` and ``is_pad`` flags ``bool [N, K]`` of one feature for ``N`` anchors.

    anchor_steps: the anchor step of each sample (int ``[N]``); fps, length: the control clock and steps of each
        sample's episode; rate, frames: the feature's rate and frame count in that episode (each scalar or ``[N]``).

    The asked time ``t / fps + delta`` gets the latest frame at or before it; a time before the episode's first
    step or after its last is flagged and clamped to the first or last frame.
    """
    anchors = np.asarray(anchor_steps, dtype=np.int64).reshape(-1, 1)
    d = np.asarray(deltas, dtype=np.float64).reshape(1, -1)
    fps = np.asarray(fps, dtype=np.float64).reshape(-1, 1)
    last_s = (np.asarray(length, dtype=np.int64).reshape(-1, 1) - 1) / fps
    rate = np.asarray(rate, dtype=np.float64).reshape(-1, 1)
    last_frame = np.asarray(frames, dtype=np.int64).reshape(-1, 1) - 1
    # Relative to the anchor, so an anchor at step t and a delta of k / fps land exactly on step t + k.
    tau = anchors / fps + d
    pad = (tau < -tolerance_s) | (tau > last_s + tolerance_s)
    index = np.floor((tau + tolerance_s) * rate).astype(np.int64)
    return np.clip(index, 0, np.maximum(last_frame, 0)), pad


def chunk_frames(start: np.ndarray, stop: np.ndarray, *, length: np.ndarray | int, fps: np.ndarray | float,
                 rate: np.ndarray | float, frames: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """``(first, count)`` int64 ``[N]``: the frames of one feature that chunks of control steps ``[start, stop)``
    cover. A chunk owns the times ``[start / fps, stop / fps)`` (the episode's last chunk up to its end), so the
    consecutive chunks of an episode hold every frame of every feature exactly once."""
    start, stop = np.asarray(start, dtype=np.int64), np.asarray(stop, dtype=np.int64)
    fps, rate = np.asarray(fps, dtype=np.float64), np.asarray(rate, dtype=np.float64)
    frames = np.asarray(frames, dtype=np.int64)
    first = np.ceil(start / fps * rate - 1e-6).astype(np.int64)
    end = np.ceil(stop / fps * rate - 1e-6).astype(np.int64)
    end = np.where(stop >= np.asarray(length, dtype=np.int64), frames, np.minimum(end, frames))
    first = np.minimum(first, frames)
    return first, np.maximum(end - first, 0)


def episode_windows(lengths: np.ndarray, *, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One sample every ``stride`` steps of every episode: ``(episode, anchor)`` int64 arrays, episode-major.

    LeRobot's sampling is ``stride=1``: one sample per frame of the dataset, in dataset order.
    """
    lengths = _lengths(lengths)
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"stride must be an integer >= 1 (steps between anchors), got {stride!r}")
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
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise ValueError(f"max_length must be an integer >= 1 (steps), got {max_length!r}")
    per_episode = (lengths + max_length - 1) // max_length
    episode = np.repeat(np.arange(len(lengths), dtype=np.int64), per_episode)
    first = np.cumsum(per_episode) - per_episode
    chunk = np.arange(len(episode), dtype=np.int64) - np.repeat(first, per_episode)
    start = chunk * max_length
    length = np.minimum(lengths[episode] - start, max_length)
    return episode, start, length


def _lengths(lengths: np.ndarray) -> np.ndarray:
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and (not np.issubdtype(lengths.dtype, np.integer) or lengths.min() < 0)):
        raise ValueError("episode lengths must be a 1-D array of integers >= 0 (an empty episode has no samples)")
    return lengths.astype(np.int64)
