"""Episodes held in memory as arrays: the reference source for tests and for data already in RAM.

    >>> import numpy as np
    >>> src = ArraySource([{"observation.state": np.zeros((5, 2), np.float32), "action": np.ones((5, 2), np.float32),
    ...                     "task": "pick", "fps": 10.0}])
    >>> sorted(src.features), int(src.lengths[0]), src.task(0)
    (['action', 'observation.state'], 5, 'pick')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mmfeed.loaders.clock import stage
from mmfeed.loaders.stores import stats as _stats
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource, Feature
from mmfeed.packing.windows import check_stream_frames

__all__ = ["ArraySource", "feature_of"]

_RESERVED = ("task", "fps", "rates", "length")


def feature_of(values: np.ndarray, fps: float) -> Feature:
    """The :class:`Feature` of an array ``[T, ...]``: video when it is uint8 ``[T, H, W, 3]``, else an array."""
    values = np.asarray(values)
    if values.ndim == 0:
        raise ValueError("a feature needs one entry per step: an array [T, ...], got a scalar")
    video = values.dtype == np.uint8 and values.ndim == 4 and values.shape[-1] == 3
    return Feature("video" if video else "array", values.dtype, values.shape[1:], fps)


class ArraySource(EpisodeSource):
    """Episodes given as dicts: ``{feature: array [T_feature, ...], "task": str, "fps": float, "rates":
    {feature: fps}}``; ``fps`` is the control clock (default 30), ``rates`` names features recorded at another
    rate (a uint8 ``[T, H, W, 3]`` array is a video feature). Every episode must have the same features with the
    same dtypes and step shapes; a feature at the control clock has one entry per step, one at its own rate the
    frames the episode's span implies, or up to one fewer (:func:`mmfeed.packing.windows.fewest_frames`)."""

    def __init__(self, episodes: Sequence[Mapping], *, name: str = "arrays") -> None:
        if not episodes:
            raise ValueError("ArraySource needs at least one episode")
        self.name = name
        self._episodes: list[dict[str, np.ndarray]] = []
        lengths, fps, task_names, rates = [], [], [], {}
        for i, ep in enumerate(episodes):
            if not isinstance(ep, Mapping):
                raise TypeError(f"episode {i} of source {name!r} must be a dict of arrays, got {type(ep).__name__}")
            rate = float(ep.get("fps", 30.0))
            own = dict(ep.get("rates") or {})
            arrays = {k: np.asarray(v) for k, v in ep.items() if k not in _RESERVED}
            if not arrays:
                raise ValueError(f"episode {i} of source {name!r} has no feature arrays")
            unknown = sorted(set(own) - set(arrays))
            if unknown:
                raise ValueError(f"episode {i} of source {name!r}: rates name {unknown}, which it does not hold")
            clock = {len(v) for k, v in arrays.items() if k not in own}
            length = ep.get("length", clock.pop() if len(clock) == 1 else None)
            if length is None or clock - {length}:
                raise ValueError(f"episode {i} of source {name!r}: the features at the control clock have different "
                                 f"numbers of steps {sorted({len(v) for k, v in arrays.items() if k not in own})}; "
                                 "give 'length' or 'rates' for the features recorded at another rate")
            for k, r in own.items():
                check_stream_frames(len(arrays[k]), length=int(length), fps=rate, rate=float(r),
                                    where=f"episode {i} of source {name!r} feature {k!r}")
            if i == 0:
                self.features = {k: feature_of(v, own.get(k, rate)) for k, v in arrays.items()}
            for k, v in arrays.items():
                want = self.features.get(k)
                got = feature_of(v, own.get(k, rate))
                if want is None or (want.kind, want.dtype, want.shape) != (got.kind, got.dtype, got.shape):
                    raise ValueError(f"episode {i} of source {name!r} feature {k!r} is {got.dtype} {list(got.shape)}; "
                                     "episode 0 has "
                                     f"{'no such feature' if want is None else f'{want.dtype} {list(want.shape)}'}")
            missing = sorted(set(self.features) - set(arrays))
            if missing:
                raise ValueError(f"episode {i} of source {name!r} lacks features {missing} that episode 0 has")
            for k in self.features:
                rates.setdefault(k, []).append(float(own.get(k, rate)))
            self._episodes.append(arrays)
            lengths.append(int(length))
            fps.append(rate)
            task_names.append(str(ep.get("task", "")))
        self._lengths = np.asarray(lengths, dtype=np.int64)
        self._fps = np.asarray(fps, dtype=np.float64)
        self.tasks = list(dict.fromkeys(task_names))
        self._episode_tasks = np.asarray([self.tasks.index(t) for t in task_names], dtype=np.int64)
        self._rates = {k: np.asarray(v, dtype=np.float64) for k, v in rates.items()}
        self._frames = {k: np.asarray([len(ep[k]) for ep in self._episodes], dtype=np.int64) for k in self.features}
        stats = {k: _stats.finish(_stats.merge(_stats.partial(ep[k]) for ep in self._episodes))
                 for k, f in self.features.items() if f.kind == "array"}
        self.stats = _stats.step_shaped(stats, {k: f.shape for k, f in self.features.items()})

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        out = []
        with stage("read"):
            self._check_requests(requests)
            for request in requests:
                ep = self._episodes[request.episode]
                out.append({k: ep[k][np.asarray(idx, dtype=np.int64)] for k, idx in request.indices.items()})
        return out
