"""Windows in time: which frames of each feature one sample covers, every feature at its own rate.

A sample is anchored at one step ``t`` of an episode's control clock (``fps``): its anchor time is ``t / fps``
seconds. A :class:`WindowSpec` asks, per feature, for times relative to the anchor (seconds, as LeRobot's
``delta_timestamps``). Each feature is read at its own rate ``r``: the asked time ``tau`` gets the latest frame at
or before it, ``floor((tau + tolerance_s) * r)``, so a 15 fps camera beside a 50 Hz state gives distinct frames and
never a frame from the future. Times outside the episode (before its first step or after its last) are clamped to
its first or last frame and flagged in ``<feature>_is_pad``, as LeRobot does. Where every feature runs at the
control clock and the deltas are multiples of ``1 / fps``, the indices and flags are exactly LeRobot's.

A feature's frames in an episode are those the control clock implies (:func:`frames_at_rate`: at ``j / r`` within
the episode's span). A real stream may hold one fewer (its recorder stopped up to one frame period early,
:func:`fewest_frames`) or more (it ran on after the last step). A time whose frame the stream lacks is flagged
and reads the stream's last frame, as a time past the episode does; frames after the episode's last step are never
read. Prices never depend on what a stream holds: a padded frame costs what a real one does, since tokens are
planned before anything is read.

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
from numba import njit

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "WindowSpec",
    "check_stream_frames",
    "chunk_frames",
    "clamp_to_stream",
    "episode_chunks",
    "episode_windows",
    "fewest_frames",
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
    same = (rate == fps) | (np.abs(rate - fps) <= 1e-9 * np.abs(fps))  # np.isclose(rtol=1e-9), at a fifth the cost
    other = np.floor((lengths - 1) / fps * rate + 1e-6).astype(np.int64) + 1
    return np.where(lengths > 0, np.where(same, lengths, other), 0)


def fewest_frames(lengths: np.ndarray, fps: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """The fewest frames a stream at ``rate`` may hold over episodes of ``lengths`` steps at ``fps``: one fewer than
    :func:`frames_at_rate` implies (never fewer than one frame in an episode of any steps). int64, broadcast.

    A recorder that stops up to one frame period early misses the last frame the clock implies: the stream's last
    frame is then at ``(n - 1) / rate >= (need - 1) / rate - 1 / rate``, one period before the clock's last
    frame ``(need - 1) / rate``, itself the latest at or before the episode's last step ``(T - 1) / fps``. A
    stream lacking two frames or more (a truncated recording, or a wrong rate) is refused; windows and chunks
    that ask for the missing frame read the stream's last frame, flagged as padding (:func:`clamp_to_stream`).
    """
    need = frames_at_rate(lengths, fps, rate)
    return np.where(need > 1, need - 1, need)


def check_stream_frames(frames: int, *, length: int, fps: float, rate: float, where: str) -> None:
    """Raise ValueError naming ``where`` (the feature, and its file) when a stream of ``frames`` at ``rate`` is
    too short for an episode of ``length`` steps at ``fps`` (:func:`fewest_frames`). A longer stream is kept:
    frames after the episode's last step are never read."""
    need, fewest = int(frames_at_rate(length, fps, rate)), int(fewest_frames(length, fps, rate))
    if frames < fewest:
        raise ValueError(
            f"{where}: {frames} frames, but {length} steps at {fps:g} fps need {need} at its rate {rate:g} fps "
            f"(the frames at j / {rate:g} s up to the last step, {(length - 1) / fps:g} s); a stream may end at most "
            f"one frame period early, so it needs at least {fewest}: check its rate, or cut the episode to the "
            "steps the stream covers")


def clamp_to_stream(index: np.ndarray, frames: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """``(index, missing)``: frame indices at or past a stream's ``frames`` (broadcast) clamped to its last
    frame, and bool flags of those that were. A stream that ended early reads its last real frame, never one
    that does not exist."""
    index = np.asarray(index, dtype=np.int64)
    frames = np.asarray(frames, dtype=np.int64)
    return np.minimum(index, np.maximum(frames - 1, 0)), index >= frames


def window_indices(deltas: Sequence[float], *, anchor_steps: np.ndarray, fps: np.ndarray | float,
                   length: np.ndarray | int, rate: np.ndarray | float, frames: np.ndarray | int,
                   tolerance_s: float = DEFAULT_TOLERANCE_S) -> tuple[np.ndarray, np.ndarray]:
    """Frame indices ``int64 [N, K]`` and ``is_pad`` flags ``bool [N, K]`` of one feature for ``N`` anchors.

    anchor_steps: the anchor step of each sample (int ``[N]``); fps, length: the control clock and steps of each
        sample's episode; rate, frames: the feature's rate and the frames its stream holds in that episode (each
        scalar or ``[N]``).

    The asked time ``t / fps + delta`` gets the latest frame at or before it (within ``tolerance_s``) among the
    frames the clock implies (:func:`frames_at_rate`). It is padding when the time is before the episode's first
    step or after its last (clamped to the first or last frame), or when that frame is one the stream lacks
    (index >= ``frames``: it ended early, :func:`fewest_frames`; the stream's last frame is read instead).
    """
    anchors = np.ascontiguousarray(anchor_steps, dtype=np.int64).reshape(-1)
    n = len(anchors)
    d = np.ascontiguousarray(deltas, dtype=np.float64).reshape(-1)
    index, pad = np.empty((n, len(d)), np.int64), np.empty((n, len(d)), np.bool_)
    _window_kernel(anchors, d, _per_sample(fps, np.float64, n), _per_sample(length, np.int64, n),
                   _per_sample(rate, np.float64, n), _per_sample(frames, np.int64, n), float(tolerance_s), index, pad)
    return index, pad


def _per_sample(values: np.ndarray | float, dtype: type, n: int) -> np.ndarray:
    """``values`` (a scalar or ``[n]``) as a contiguous ``[n]`` array of ``dtype``."""
    values = np.ascontiguousarray(values, dtype=dtype).reshape(-1)
    return values if len(values) == n else np.ascontiguousarray(np.broadcast_to(values, (n,)))


@njit(cache=True)
def _window_kernel(anchors, deltas, fps, length, rate, frames, tolerance_s, index, pad):
    """:func:`window_indices` in one pass (about 40 numpy calls a feature otherwise, which a batch of windows pays
    in full): the same arithmetic, in the same order, as :func:`frames_at_rate` and :func:`clamp_to_stream`."""
    for i in range(len(anchors)):
        f, steps, r = fps[i], length[i], rate[i]
        implied = 0
        if steps > 0:
            if r == f or abs(r - f) <= 1e-9 * abs(f):
                implied = steps
            else:
                implied = np.int64(np.floor((steps - 1) / f * r + 1e-6)) + 1
        last_s = (steps - 1) / f
        highest, held = max(implied - 1, 0), frames[i]
        for k in range(len(deltas)):
            tau = anchors[i] / f + deltas[k]
            j = min(max(np.int64(np.floor((tau + tolerance_s) * r)), 0), highest)
            index[i, k] = min(j, max(held - 1, 0))
            pad[i, k] = tau < -tolerance_s or tau > last_s + tolerance_s or j >= held


def chunk_frames(start: np.ndarray, stop: np.ndarray, *, length: np.ndarray | int, fps: np.ndarray | float,
                 rate: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """``(first, count)`` int64 ``[N]``: the frames of one feature that chunks of control steps ``[start, stop)``
    cover, among those the clock implies (:func:`frames_at_rate`). A chunk owns the times ``[start / fps,
    stop / fps)`` (the episode's last chunk up to its last step), so the consecutive chunks of an episode hold
    every one of those frames exactly once. The counts price chunks whatever a stream holds: a frame it lacks is
    read as its last one and flagged (:func:`clamp_to_stream`); frames after the last step are in no chunk."""
    start, stop = np.asarray(start, dtype=np.int64), np.asarray(stop, dtype=np.int64)
    fps, rate = np.asarray(fps, dtype=np.float64), np.asarray(rate, dtype=np.float64)
    length = np.asarray(length, dtype=np.int64)
    implied = frames_at_rate(length, fps, rate)
    first = np.ceil(start / fps * rate - 1e-6).astype(np.int64)
    end = np.ceil(stop / fps * rate - 1e-6).astype(np.int64)
    end = np.where(stop >= length, implied, np.minimum(end, implied))
    first = np.minimum(first, implied)
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
