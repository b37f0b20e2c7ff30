"""What every episode source is: features under the dataset's own names, each at its own rate.

A source lists its episodes with the numbers planning needs and no pixels: steps of the control clock and its
rate (``lengths``, ``fps``), the rate and frame count of every feature in every episode (``rates``, ``frames``),
the task of every step, and where each episode lives (``describe``, for error messages). Workers then read
exactly the frames a batch asks for with :meth:`EpisodeSource.read_many`, which takes the requests of a whole
batch at once so that video sources decode each group of pictures once for every frame wanted from it.

Frame indices in a request count frames of that feature at its own rate (frame ``j`` of a 15 fps camera is at
``j / 15`` s); which frames a window wants is decided beforehand, from the index alone
(:mod:`mmfeed.packing.windows`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from mmfeed.loaders.sources.requests import EpisodeRequest, WindowArrays
from mmfeed.packing.windows import frames_at_rate

__all__ = ["FEATURE_KINDS", "LRU", "EpisodeRequest", "EpisodeSource", "Feature", "WindowArrays"]

FEATURE_KINDS = ("video", "array", "text")


@dataclass(frozen=True)
class Feature:
    """One feature of a dataset.

    kind: "video" (uint8 frames ``[H, W, 3]``), "array" (a number or vector per step) or "text".
    dtype: numpy dtype name of one element ("uint8" for video).
    shape: shape of one step (video: ``(H, W, 3)`` as decoded, after any ``frame_size``; ``(H * 3 // 2, W)``
        for yuv420 frames).
    fps: the feature's rate (of the first episode, where episodes differ; see ``EpisodeSource.rates``).
    frame_format: how a video feature's frames are delivered: "rgb24" (the default) or "yuv420" (I420 planes, see
        :mod:`mmfeed.codecs.colour`); None for other kinds.
    """

    kind: str
    dtype: str
    shape: tuple[int, ...]
    fps: float
    frame_format: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in FEATURE_KINDS:
            raise ValueError(f"feature kind must be one of {list(FEATURE_KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "dtype", str(np.dtype(self.dtype)))
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "fps", float(self.fps))
        if self.kind != "video":
            if self.frame_format is not None:
                raise ValueError(f"only video features have a frame_format, got {self.frame_format!r} for a "
                                 f"{self.kind} feature")
        elif self.frame_format is None:
            object.__setattr__(self, "frame_format", "rgb24")
        elif self.frame_format not in ("rgb24", "yuv420"):
            raise ValueError(f"frame_format must be 'rgb24' or 'yuv420', got {self.frame_format!r}")

    @property
    def frame_size(self) -> tuple[int, int] | None:
        """``(height, width)`` of a video feature's pictures (whatever the frame format), else None."""
        if self.kind != "video":
            return None
        if self.frame_format == "yuv420" and len(self.shape) == 2:
            return (self.shape[0] * 2 // 3, self.shape[1])
        return tuple(self.shape[:2]) if len(self.shape) == 3 else None

    def __repr__(self) -> str:
        fmt = f", frame_format={self.frame_format!r}" if self.kind == "video" else ""
        return (f"Feature(kind={self.kind!r}, dtype={self.dtype!r}, shape={self.shape!r}, fps={self.fps!r}"
                f"{fmt})")


class LRU:
    """A bounded map of what a reader keeps (member bytes, decoded arrays, data files), least recently used
    dropped first, safe to share between threads; a pickled copy starts empty (each worker fills its own)."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable):
        """The value kept for ``key``, or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def get_many(self, keys: Sequence[Hashable]) -> list:
        """The value kept for each of ``keys`` (None where none), under one hold of the lock."""
        with self._lock:
            items = self._items
            values = [items.get(key) for key in keys]
            for key, value in zip(keys, values):
                if value is not None:
                    items.move_to_end(key)
            return values

    def put(self, key: Hashable, value) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> dict:
        return {"max_items": self.max_items}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_items"])


class EpisodeSource:
    """The part every source shares. A subclass sets ``name``, ``features``, ``stats``, ``tasks`` and the arrays
    ``_lengths`` (int64 ``[E]``), ``_fps`` (float64 ``[E]``), ``_episode_tasks`` (int64 ``[E]``: the task id of
    every step of the episode, or -1 where it changes within the episode) and optionally ``_rates`` / ``_frames``
    (feature -> per-episode arrays, where a feature's rate or frame count is not the control clock's); it
    implements :meth:`read_many`, :meth:`describe` and, for episodes of several tasks, :meth:`step_tasks`.
    """

    name: str
    features: dict[str, Feature]
    stats: dict[str, dict[str, np.ndarray]]
    tasks: list[str]
    _lengths: np.ndarray
    _fps: np.ndarray
    _episode_tasks: np.ndarray
    _rates: dict[str, np.ndarray]
    _frames: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self._lengths)

    @property
    def lengths(self) -> np.ndarray:
        """Steps of the control clock of each episode, int64 ``[E]``."""
        return self._lengths

    @property
    def fps(self) -> np.ndarray:
        """Control-clock rate of each episode, float64 ``[E]``."""
        return self._fps

    @property
    def episode_tasks(self) -> np.ndarray:
        """int64 ``[E]``: the id (into ``tasks``) of each episode's task, -1 where it changes within the episode."""
        return self._episode_tasks

    def rates(self, feature: str) -> np.ndarray:
        """The rate of ``feature`` in each episode, float64 ``[E]``."""
        self._check_feature(feature)
        rates = getattr(self, "_rates", {}).get(feature)
        return rates if rates is not None else self._fps

    def frames(self, feature: str) -> np.ndarray:
        """Frames of ``feature`` in each episode, int64 ``[E]`` (from the index; nothing is read)."""
        self._check_feature(feature)
        frames = getattr(self, "_frames", {}).get(feature)
        if frames is None:  # derived from the clock once per feature (a request checks it per sample)
            derived = self.__dict__.setdefault("_derived_frames", {})
            frames = derived.get(feature)
            if frames is None:
                frames = derived[feature] = frames_at_rate(self._lengths, self._fps, self.rates(feature))
        return frames

    def present(self, feature: str) -> np.ndarray:
        """bool ``[E]``: which episodes hold ``feature`` (all, except in a mixture of datasets that differ)."""
        self._check_feature(feature)
        return np.ones(len(self), dtype=bool)

    def filled(self, feature: str) -> np.ndarray | None:
        """bool ``[E]``: the episodes whose dataset lacks ``feature`` but delivers it as zeros, flagged in
        ``<feature>_is_pad`` (a mixture opened with ``absent="zeros"``); None: every episode reads its own."""
        self._check_feature(feature)
        return None

    def origin(self, episode: int) -> dict[str, int]:
        """Where ``episode`` comes from in a mixture: ``{"dataset": index}`` (and ``"embodiment"``); ``{}`` for
        a single dataset."""
        return {}

    def dim_mask(self, episode: int, feature: str) -> np.ndarray | None:
        """bool ``[width]``: which elements of ``feature``'s last dimension are the episode's own data, for a
        feature a mixture pads (``pad_to``); None for any other."""
        return None

    def windows(self, spec):
        """The unpacked, LeRobotDataset-shaped view: one sample per step of every episode (see
        :class:`mmfeed.loaders.sources.windows.WindowsDataset`)."""
        from mmfeed.loaders.sources.windows import WindowsDataset

        return WindowsDataset(self, spec)

    def step_tasks(self, episode: int) -> np.ndarray:
        """The task id of every step of ``episode``, int64 ``[T]``."""
        task = int(self._episode_tasks[episode])
        if task < 0:
            raise NotImplementedError(f"{type(self).__name__} does not give per-step tasks")
        return np.full(int(self._lengths[episode]), task, dtype=np.int64)

    def task(self, episode: int, step: int = 0) -> str:
        """The task text of one step of an episode ("" where the dataset has none)."""
        task = int(self._episode_tasks[episode])
        if task < 0:
            task = int(self.step_tasks(episode)[step])
        return self.tasks[task] if 0 <= task < len(self.tasks) else ""

    def describe(self, episode: int) -> str:
        """Where an episode lives, for error messages (file and key)."""
        return f"{self.name} episode {episode}"

    def leaf(self, episode: int) -> tuple[EpisodeSource, int]:
        """The dataset that holds ``episode`` and its index there: this source itself, or in a mixture the
        dataset of the mixture (see :class:`~mmfeed.loaders.sources.concat.ConcatSource`)."""
        return self, int(episode)

    def frame_shape(self, episode: int, feature: str) -> tuple[int, int] | None:
        """``(height, width)`` of a video feature's decoded frames, or None when not known without decoding."""
        f = self.features.get(feature)
        return tuple(f.shape[:2]) if f is not None and f.kind == "video" and len(f.shape) == 3 else None

    one_frame_shape = False
    """Whether every episode's frames of a feature share one shape (its metadata declares it), so that
    :meth:`frame_shapes` asks the first episode alone."""

    def frame_shapes(self, episodes: Sequence[int], feature: str) -> set[tuple[int, int] | None]:
        """The distinct :meth:`frame_shape` of ``feature`` over ``episodes``."""
        if self.one_frame_shape:
            return {self.frame_shape(0, feature)} if len(episodes) else set()
        return {self.frame_shape(e, feature) for e in episodes}

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested frames of each request, in request order: feature -> ``[n, *shape]``."""
        raise NotImplementedError

    def read_windows(self, windows: WindowArrays, buffer: Callable[..., np.ndarray]
                     ) -> dict[str, np.ndarray] | None:
        """The frames of a batch of windows in one call, where this source can: feature -> ``[B, n, *shape]``
        (:class:`~mmfeed.loaders.sources.requests.WindowArrays`: every sample reads every feature), a video
        feature's frames decoded into ``buffer(feature)`` (uint8 ``[B, n, H, W, 3]``, yuv420 ``[B, n, H * 3 // 2,
        W]``; called only for a batch it reads; ``buffer(feature, phase=16)`` starts it 16 bytes past a 64-byte
        boundary, for a decoder that stores faster there, see :func:`mmfeed.loaders.shm.phase_offset`). None
        (before calling ``buffer``) where it reads them one request at a time: the caller then uses
        :meth:`read_many`, as it does after any error here, so that an error names the request it concerns. This
        default: None."""
        return None

    def _windows_in_range(self, windows: WindowArrays) -> bool:
        """Every episode and frame of ``windows`` inside the dataset (what :meth:`_check_requests` checks)."""
        episodes = windows.episodes
        if len(episodes) and (episodes.min() < 0 or episodes.max() >= len(self)):
            return False
        for feature, idx in windows.indices.items():
            if feature not in self.features:
                return False
            if idx.size and ((idx < 0).any() or (idx >= self.frames(feature)[episodes][:, None]).any()):
                return False
        return True

    def episode_arrays(self, episodes: Sequence[int], features: Sequence[str]) -> dict[str, np.ndarray]:
        """Every frame of each array feature of ``features`` over ``episodes`` (ints, in order), the episodes back
        to back: feature -> ``[sum of frames, *shape]``. What whole-dataset passes (``mmfeed stats``) read; a
        format whose array rows sit in files overrides it to read each file once for a run of episodes."""
        requests = [EpisodeRequest(int(e), {f: np.arange(self.frames(f)[e], dtype=np.int64) for f in features})
                    for e in episodes]
        read = self.read_many(requests)
        return {f: np.concatenate([r[f] for r in read]) if read else
                np.zeros((0, *self.features[f].shape), np.dtype(self.features[f].dtype)) for f in features}

    def episode(self, index: int) -> dict:
        """The whole episode: every feature ``[T_feature, *shape]`` (videos decoded), ``task`` and ``fps``."""
        index = self._check_episode(index)
        request = EpisodeRequest(index, {f: np.arange(self.frames(f)[index], dtype=np.int64) for f in self.features})
        data = self.read_many([request])[0]
        return {**data, "task": self.task(index), "fps": float(self._fps[index])}

    def _check_feature(self, feature: str) -> None:
        if feature not in self.features:
            raise KeyError(f"{self.name}: no feature {feature!r}; the dataset has {sorted(self.features)}")

    def _check_episode(self, index: int) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"{self.name}: episode index must be an int, got {index!r}")
        if not 0 <= index < len(self):
            raise IndexError(f"{self.name}: episode {index} out of range ({len(self)} episodes)")
        return int(index)

    def _check_requests(self, requests: Sequence[EpisodeRequest]) -> None:
        """:meth:`_check_request` of a batch of requests, with one vectorized bounds check per feature (checking
        each request on its own costs more than its reads once samples are many and small). Anything amiss is
        raised by :meth:`_check_request` of the first request it concerns, so errors read the same."""
        try:
            fine = self._all_in_range(requests)
        except (KeyError, TypeError, IndexError, ValueError):
            fine = False
        if not fine:
            for request in requests:
                self._check_request(request)

    def _all_in_range(self, requests: Sequence[EpisodeRequest]) -> bool:
        by_feature: dict[str, tuple[list[int], list[np.ndarray]]] = {}
        n = len(self)
        for request in requests:
            e = request.episode
            if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or not 0 <= e < n:
                return False
            for feature, idx in request.indices.items():
                episodes, indices = by_feature.setdefault(feature, ([], []))
                episodes.append(e)
                indices.append(idx if type(idx) is np.ndarray and idx.ndim == 1 else np.asarray(idx).reshape(-1))
        for feature, (episodes, indices) in by_feature.items():
            frames = self.frames(feature)  # raises for an unknown feature
            flat = np.concatenate(indices)
            if not flat.size:
                continue
            if flat.dtype.kind not in "iu":
                return False
            limit = np.repeat(frames[np.asarray(episodes, dtype=np.int64)], [len(i) for i in indices])
            if (flat < 0).any() or (flat >= limit).any():
                return False
        return True

    def _check_request(self, request: EpisodeRequest) -> None:
        """Raise naming the episode and feature when a request asks for an unknown feature or a frame outside
        the feature's frames."""
        e = self._check_episode(request.episode)
        for feature, idx in request.indices.items():
            self._check_feature(feature)
            idx = np.asarray(idx)
            n = int(self.frames(feature)[e])
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                raise IndexError(f"{self.describe(e)} feature {feature!r}: frames {int(idx.min())}..{int(idx.max())} "
                                 f"asked, it has {n}")
