"""A dataset with some features under other names: how a mixture maps each robot's cameras onto shared slots.

Robots name their cameras their own way (``observation.images.top`` on one, ``observation.images.cam_high`` on
another); a policy trained on both wants one name per slot (``observation.images.primary``), as Octo maps each
dataset's cameras to its primary and wrist slots. ``open_dataset(path, rename={"observation.images.top":
"observation.images.primary"})`` (per dataset in a mixture) gives a :class:`RenamedSource`: the same episodes,
read by the same reader, with those features, their stats and every sample's keys under the new names::

    >>> import numpy as np
    >>> from mmfeed.loaders.sources.arrays import ArraySource
    >>> src = RenamedSource(ArraySource([{"joints": np.zeros((4, 2), np.float32), "fps": 10.0}]),
    ...                     {"joints": "observation.state"})
    >>> sorted(src.features), sorted(src.stats)
    (['observation.state'], ['observation.state'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource

__all__ = ["RenamedSource"]


class RenamedSource(EpisodeSource):
    """``source`` with the features of ``names`` (``{name in the dataset: new name}``) under their new names."""

    def __init__(self, source: EpisodeSource, names: Mapping[str, str]) -> None:
        if not isinstance(names, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in
                                                    names.items()):
            raise TypeError(f"rename takes {{feature: new name}} (strings), got {names!r}")
        unknown = sorted(set(names) - set(source.features))
        if unknown:
            raise ValueError(f"{source.name}: rename names features {unknown} that the dataset does not have; its "
                             f"features are {sorted(source.features)}")
        new = [names.get(f, f) for f in source.features]
        twice = sorted({n for n in new if new.count(n) > 1})
        if twice:
            raise ValueError(f"{source.name}: renaming {dict(names)} gives two features the name(s) {twice}")
        self.source = source
        self._old = {names.get(f, f): f for f in source.features}  # new name -> the dataset's name
        self._new = {f: names.get(f, f) for f in source.features}
        self.name = source.name
        self.features = {self._new[f]: feature for f, feature in source.features.items()}
        self.stats = {self._new.get(f, names.get(f, f)): s for f, s in source.stats.items()}
        self.tasks = source.tasks
        self._lengths, self._fps, self._episode_tasks = source.lengths, source.fps, source.episode_tasks

    def _source_name(self, feature: str) -> str:
        self._check_feature(feature)
        return self._old[feature]

    def rates(self, feature: str) -> np.ndarray:
        return self.source.rates(self._source_name(feature))

    def frames(self, feature: str) -> np.ndarray:
        return self.source.frames(self._source_name(feature))

    def present(self, feature: str) -> np.ndarray:
        return self.source.present(self._source_name(feature))

    def filled(self, feature: str) -> np.ndarray | None:
        return self.source.filled(self._source_name(feature))

    def step_tasks(self, episode: int) -> np.ndarray:
        return self.source.step_tasks(episode)

    def task(self, episode: int, step: int = 0) -> str:
        return self.source.task(episode, step)

    def describe(self, episode: int) -> str:
        return self.source.describe(episode)

    def frame_shape(self, episode: int, feature: str) -> tuple[int, int] | None:
        return self.source.frame_shape(episode, self._source_name(feature))

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        local = [EpisodeRequest(r.episode, {self._source_name(f): v for f, v in r.indices.items()},
                                None if r.out is None else {self._source_name(f): v for f, v in r.out.items()})
                 for r in requests]
        return [{self._new.get(f, f): v for f, v in data.items()} for data in self.source.read_many(local)]

    def episode(self, index: int) -> dict:
        return {self._new.get(k, k): v for k, v in self.source.episode(index).items()}
