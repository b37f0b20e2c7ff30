"""Several datasets read as one: episodes back to back, features the union of theirs.

``open_dataset([a, b])`` of two datasets (a LeRobot directory and a folder of shards, say) gives a
:class:`ConcatSource`; with ``Packing(weights=[...])`` it is a mixture planned like any dataset (ranks, exact and
elastic resume, the error policy). Datasets may have different features (a second camera in one of them): an
episode reads only those its own dataset has, and is priced accordingly. The same feature name with another kind,
dtype or step shape in two datasets is an error naming both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mmfeed.loaders.sources import stats as _stats
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource, check_features_agree

__all__ = ["ConcatSource"]


class ConcatSource(EpisodeSource):
    """The episodes of ``sources`` in order; ``dataset_of`` (int64 ``[E]``) says which source each comes from."""

    def __init__(self, sources: Sequence[EpisodeSource]) -> None:
        sources = list(sources)
        if not sources:
            raise ValueError("a mixture needs at least one dataset")
        check_features_agree(sources)
        self.sources = sources
        self.name = " + ".join(s.name for s in sources)
        self.features = {}
        for s in sources:
            for name, feature in s.features.items():
                self.features.setdefault(name, feature)
        sizes = np.array([len(s) for s in sources], dtype=np.int64)
        self.dataset_of = np.repeat(np.arange(len(sources), dtype=np.int64), sizes)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)])
        self._lengths = np.concatenate([s.lengths for s in sources]).astype(np.int64)
        self._fps = np.concatenate([s.fps for s in sources]).astype(np.float64)
        self.tasks = list(dict.fromkeys(t for s in sources for t in s.tasks))
        where = {t: i for i, t in enumerate(self.tasks)}
        self._task_maps = [np.array([where[t] for t in s.tasks] + [-1], dtype=np.int64) for s in sources]
        self._episode_tasks = np.concatenate([m[s.episode_tasks] for m, s in zip(self._task_maps, sources)])
        self._rates, self._frames, self._present = {}, {}, {}
        for name in self.features:
            has = [name in s.features for s in sources]
            self._present[name] = np.repeat(np.asarray(has), sizes)
            self._rates[name] = np.concatenate([s.rates(name) if h else s.fps for s, h in zip(sources, has)])
            self._frames[name] = np.concatenate([s.frames(name) if h else np.zeros(len(s), np.int64)
                                                 for s, h in zip(sources, has)])
        self.stats = _merged_stats(sources)

    def _split(self, episode: int) -> tuple[int, int]:
        d = int(self.dataset_of[episode])
        return d, int(episode - self._offsets[d])

    def present(self, feature: str) -> np.ndarray:
        self._check_feature(feature)
        return self._present[feature]

    def step_tasks(self, episode: int) -> np.ndarray:
        d, e = self._split(episode)
        return self._task_maps[d][self.sources[d].step_tasks(e)]

    def describe(self, episode: int) -> str:
        d, e = self._split(episode)
        return self.sources[d].describe(e)

    def leaf(self, episode: int) -> tuple[EpisodeSource, int]:
        d, e = self._split(int(episode))
        return self.sources[d].leaf(e)

    def frame_shape(self, episode: int, feature: str) -> tuple[int, int] | None:
        d, e = self._split(episode)
        return self.sources[d].frame_shape(e, feature)

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        out: list[dict | None] = [None] * len(requests)
        by_source: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            by_source.setdefault(self._split(r.episode)[0], []).append(i)
        for d, members in by_source.items():
            local = [EpisodeRequest(self._split(requests[i].episode)[1], requests[i].indices, requests[i].out)
                     for i in members]
            for i, data in zip(members, self.sources[d].read_many(local)):
                out[i] = data
        return out

    def episode(self, index: int) -> dict:
        d, e = self._split(self._check_episode(index))
        return self.sources[d].episode(e)


def _merged_stats(sources: Sequence[EpisodeSource]) -> dict:
    """Stats of the union where every dataset holding a feature gives its count (mean, std, min, max merge
    exactly); a feature whose stats lack counts keeps those of the first dataset that has it."""
    out = {}
    names = dict.fromkeys(n for s in sources for n in s.stats)
    for name in names:
        parts = [s.stats[name] for s in sources if name in s.stats]
        if len(parts) == 1 or not all({"count", "mean", "std", "min", "max"} <= set(p) for p in parts):
            out[name] = parts[0]
            continue
        partials = [{"count": np.asarray(p["count"]).reshape(-1)[0], "mean": p["mean"],
                     "m2": np.asarray(p["std"]) ** 2 * np.asarray(p["count"]).reshape(-1)[0],
                     "min": p["min"], "max": p["max"]} for p in parts]
        out[name] = _stats.finish(_stats.merge(partials))
    return out
