"""Several datasets read as one: episodes back to back, features the union of theirs.

``open_dataset([a, b])`` of two datasets (a LeRobot directory and a folder of shards, say) gives a
:class:`ConcatSource`; with ``Packing(weights=[...])`` it is a mixture planned like any dataset (ranks, exact and
elastic resume, the error policy). Datasets may have different features (a second camera in one of them): an
episode reads only those its own dataset has, and is priced accordingly. The same feature name with another kind,
dtype or step shape in two datasets is an error naming both.

A mixture of robots (a 7-dim arm, a 14-dim bimanual, a 2-dim base) reshapes its samples as the training stacks
that pretrain on many robots do:

- ``pad_to={"action": 32}`` pads the last dimension of each listed array feature with zeros in every dataset: the
  mixture's feature is ``[..., 32]`` and every sample carries ``<feature>_dim_mask`` (bool ``[32]``, True where
  the dataset's own dimensions are) beside ``<feature>_is_pad`` (time);
- ``absent="zeros"`` delivers a feature a dataset lacks (a camera the base does not have), when a window asks for
  it, as zeros flagged in ``<feature>_is_pad``, priced like the real thing, so every batch holds one set of keys;
  ``"skip"`` (the default here) reads only what each dataset has;
- each sample says where it came from: ``dataset`` (its index in the list, named by ``names``) and, with
  ``embodiments`` (one name per dataset; datasets of one robot share a name), ``embodiment``;
- ``sources[k].stats`` are each dataset's own (unpadded) stats, ``embodiment_stats`` those of each embodiment's
  datasets merged by :func:`~mmfeed.loaders.stores.stats.combine` and ``stats`` the union's, element by element
  over the datasets that have it. ``Normalize(mix)`` normalizes each sample by its own dataset's (or
  embodiment's) stats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mmfeed.loaders.stores import stats as _stats
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource, Feature
from mmfeed.packing.windows import frames_at_rate

__all__ = ["ABSENT", "ConcatSource", "check_features_agree"]

ABSENT = ("skip", "zeros")
"""What a sample of a dataset without a feature the window asks for holds: nothing of it, or zeros (flagged)."""


class ConcatSource(EpisodeSource):
    """The episodes of ``sources`` in order; ``dataset_of`` (int64 ``[E]``) says which source each comes from.

    names: one name per dataset (default: each source's name); ``dataset_names`` keeps them.
    pad_to: ``{feature: width}``: array features whose last dimension is padded with zeros to ``width``.
    embodiments: one embodiment name per dataset (or ``{dataset name: embodiment}``): datasets of one robot.
    absent: "skip" (default) or "zeros" (see the module docstring).
    """

    def __init__(self, sources: Sequence[EpisodeSource], *, names: Sequence[str] | None = None,
                 pad_to: Mapping[str, int] | None = None, embodiments: Sequence[str] | Mapping[str, str] | None = None,
                 absent: str = "skip") -> None:
        sources = list(sources)
        if not sources:
            raise ValueError("a mixture needs at least one dataset")
        if absent not in ABSENT:
            raise ValueError(f"absent must be one of {list(ABSENT)}, got {absent!r}")
        self.sources, self.absent = sources, absent
        self.dataset_names = [s.name for s in sources] if names is None else [str(n) for n in names]
        if len(self.dataset_names) != len(sources):
            raise ValueError(f"give one name per dataset: {len(sources)} datasets, {len(self.dataset_names)} names")
        self.padded = _check_pad_to(sources, pad_to, self.dataset_names)
        check_features_agree(sources, self.padded)
        self.name = " + ".join(s.name for s in sources)
        self.features = {}
        for s in sources:
            for name, feature in s.features.items():
                self.features.setdefault(name, _padded(feature, self.padded.get(name)))
        sizes = np.array([len(s) for s in sources], dtype=np.int64)
        self.dataset_of = np.repeat(np.arange(len(sources), dtype=np.int64), sizes)
        self._offsets = np.concatenate([[0], np.cumsum(sizes)])
        self._lengths = np.concatenate([s.lengths for s in sources]).astype(np.int64)
        self._fps = np.concatenate([s.fps for s in sources]).astype(np.float64)
        self.tasks = list(dict.fromkeys(t for s in sources for t in s.tasks))
        where = {t: i for i, t in enumerate(self.tasks)}
        self._task_maps = [np.array([where[t] for t in s.tasks] + [-1], dtype=np.int64) for s in sources]
        self._episode_tasks = np.concatenate([m[s.episode_tasks] for m, s in zip(self._task_maps, sources)])
        self._rates, self._frames, self._present, self._filled = {}, {}, {}, {}
        for name in self.features:
            has = [name in s.features for s in sources]
            self._present[name] = np.repeat(np.asarray(has), sizes)
            self._rates[name] = np.concatenate([s.rates(name) if h else s.fps for s, h in zip(sources, has)])
            self._frames[name] = np.concatenate([s.frames(name) if h else self._missing_frames(s)
                                                 for s, h in zip(sources, has)])
            if absent == "zeros" and not all(has):
                self._filled[name] = ~self._present[name]
        self.dim_masks = {f: np.stack([np.arange(w) < (s.features[f].shape[-1] if f in s.features else 0)
                                       for s in sources]) for f, w in self.padded.items()}
        self._set_embodiments(embodiments)
        self.stats = _stats.combine_datasets([s.stats for s in sources], self.padded)
        self.mixture_stats = _stats.MixtureStats([s.stats for s in sources], self.dataset_names,
                                                 embodiments=self.embodiment_stats,
                                                 embodiment_of_dataset=self.embodiment_of_dataset)
        """Each dataset's stats and each embodiment's (what ``Normalize(mix)`` picks from)."""

    def _missing_frames(self, source: EpisodeSource) -> np.ndarray:
        """Frames of a feature a dataset lacks: none, or under ``absent="zeros"`` those the clock implies."""
        if self.absent == "zeros":
            return frames_at_rate(source.lengths, source.fps, source.fps)
        return np.zeros(len(source), np.int64)

    def _set_embodiments(self, embodiments: Sequence[str] | Mapping[str, str] | None) -> None:
        """``embodiment_names`` (distinct, in order), ``embodiment_of_dataset`` and ``embodiment_stats``."""
        self.embodiment_names: list[str] | None = None
        self.embodiment_of_dataset: np.ndarray | None = None
        self.embodiment_stats: dict[str, dict] = {}
        if embodiments is None:
            return
        if isinstance(embodiments, Mapping):
            unknown = sorted(set(embodiments) - set(self.dataset_names))
            missing = [n for n in self.dataset_names if n not in embodiments]
            if unknown or missing:
                raise ValueError(f"embodiments names datasets {unknown} that the mixture does not have and lacks "
                                 f"{missing}; give one embodiment for each of {self.dataset_names}")
            embodiments = [embodiments[n] for n in self.dataset_names]
        embodiments = [str(e) for e in embodiments]
        if len(embodiments) != len(self.sources):
            raise ValueError(f"give one embodiment per dataset: {len(self.sources)} datasets "
                             f"({self.dataset_names}), {len(embodiments)} embodiments")
        self.embodiment_names = list(dict.fromkeys(embodiments))
        self.embodiment_of_dataset = np.array([self.embodiment_names.index(e) for e in embodiments], np.int64)
        for k, embodiment in enumerate(self.embodiment_names):
            members = [s for s, e in zip(self.sources, self.embodiment_of_dataset) if e == k]
            check_features_agree(members, {}, why=f"datasets of embodiment {embodiment!r} share their statistics",
                                 suggest_fix=False)
            self.embodiment_stats[embodiment] = _stats.combine_datasets([s.stats for s in members])

    def _split(self, episode: int) -> tuple[int, int]:
        d = int(self.dataset_of[episode])
        return d, int(episode - self._offsets[d])

    def present(self, feature: str) -> np.ndarray:
        self._check_feature(feature)
        return self._present[feature] if feature not in self._filled else np.ones(len(self), dtype=bool)

    def filled(self, feature: str) -> np.ndarray | None:
        self._check_feature(feature)
        return self._filled.get(feature)

    def origin(self, episode: int) -> dict[str, int]:
        d = int(self.dataset_of[episode])
        out = {"dataset": d}
        if self.embodiment_of_dataset is not None:
            out["embodiment"] = int(self.embodiment_of_dataset[d])
        return out

    def dim_mask(self, episode: int, feature: str) -> np.ndarray | None:
        masks = self.dim_masks.get(feature)
        return None if masks is None else masks[int(self.dataset_of[episode])]

    def stats_of(self, dataset: int, by: str = "dataset") -> dict:
        """The stats a sample of ``dataset`` is normalized with: its own (``by="dataset"``) or its embodiment's
        (``by="embodiment"``), unpadded, under the mixture's feature names."""
        return self.mixture_stats.stats_of(dataset, by)

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
        if feature not in self.sources[d].features and feature in self._filled:
            return self.features[feature].frame_size  # delivered as zeros of the mixture's size
        return self.sources[d].frame_shape(e, feature)

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        out: list[dict | None] = [None] * len(requests)
        by_source: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            by_source.setdefault(self._split(r.episode)[0], []).append(i)
        for d, members in by_source.items():
            own = self.sources[d].features
            local = []
            for i in members:
                r = requests[i]
                indices = {f: v for f, v in r.indices.items() if f in own}
                given = {f: v for f, v in r.out.items() if f in own} if r.out else r.out
                local.append(EpisodeRequest(self._split(r.episode)[1], indices, given))
            for i, data in zip(members, self.sources[d].read_many(local)):
                out[i] = self._reshaped(requests[i], data)
        return out

    def _reshaped(self, request: EpisodeRequest, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A dataset's read with its padded features widened and the features it lacks as zeros."""
        for feature in self.padded:
            if feature in data:
                data[feature] = _pad_last(data[feature], self.padded[feature])
        for feature, idx in request.indices.items():
            if feature in data:
                continue
            spec = self.features[feature]
            given = request.out.get(feature) if request.out else None
            if given is not None:
                given[...] = 0
                data[feature] = given
            else:
                data[feature] = np.zeros((len(idx), *spec.shape), np.dtype(spec.dtype))
        return data

    def episode(self, index: int) -> dict:
        """The dataset's own episode (see :meth:`EpisodeSource.episode`), its padded features widened with their
        ``<feature>_dim_mask``, and ``dataset`` (and ``embodiment``): where it came from."""
        d, e = self._split(self._check_episode(index))
        data = self.sources[d].episode(e)
        for feature, width in self.padded.items():
            if feature in data:
                data[feature] = _pad_last(data[feature], width)
                data[f"{feature}_dim_mask"] = self.dim_masks[feature][d].copy()
        data.update(self.origin(int(index)))
        return data


def _padded(feature: Feature, width: int | None) -> Feature:
    if width is None:
        return feature
    return Feature(feature.kind, feature.dtype, (*feature.shape[:-1], width), feature.fps, feature.frame_format)


def _pad_last(values: np.ndarray, width: int) -> np.ndarray:
    """``values [n, ..., d]`` with zeros appended to its last dimension up to ``width``."""
    values = np.asarray(values)
    extra = width - values.shape[-1]
    if extra == 0:
        return values
    return np.concatenate([values, np.zeros((*values.shape[:-1], extra), values.dtype)], axis=-1)


def _check_pad_to(sources: Sequence[EpisodeSource], pad_to: Mapping[str, int] | None,
                  names: Sequence[str]) -> dict[str, int]:
    """``pad_to`` checked against the datasets (``names``: the mixture's names of them): array features with a last
    dimension no wider than the width, in every dataset that has them; ValueError names the dataset."""
    if pad_to is None:
        return {}
    if not isinstance(pad_to, Mapping):
        raise TypeError(f"pad_to takes {{feature: width}}, e.g. {{'action': 32}}; got {type(pad_to).__name__}")
    out = {}
    for feature, width in pad_to.items():
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 1:
            raise ValueError(f"pad_to[{feature!r}] must be a width >= 1, got {width!r}")
        having = [(s, n) for s, n in zip(sources, names) if feature in s.features]
        if not having:
            raise ValueError(f"pad_to names feature {feature!r}, which no dataset has")
        for s, n in having:
            f, where = s.features[feature], _dataset_label(n, s)
            if f.kind != "array" or not f.shape:
                raise ValueError(f"pad_to pads the last dimension of array features; {feature!r} in {where} is "
                                 f"{f.kind} {f.dtype} {list(f.shape)}: drop it from pad_to")
            if f.shape[-1] > width:
                raise ValueError(f"feature {feature!r} is {f.shape[-1]} wide in {where}, more than "
                                 f"pad_to[{feature!r}] = {width}; raise the width")
        out[feature] = int(width)
    return out


def _dataset_label(name: str, source: EpisodeSource) -> str:
    """``dataset 'aloha' (aloha_shards/mmfeed-index.parquet)``: a dataset of a mixture in a message."""
    return f"dataset {name!r}" + ("" if source.name == name else f" ({source.name})")


def check_features_agree(sources: Sequence[EpisodeSource], padded: Mapping[str, int] | None = None, *,
                         why: str = "mixed sources must agree on every feature they share",
                         suggest_fix: bool = True) -> None:
    """Raise ValueError when one feature name has different kinds, dtypes or step shapes in two sources (for a
    feature of ``padded``, the last dimension may differ); ``suggest_fix``: name the option that would fix it
    (``pad_to`` for an array of another width, ``frame_size`` for frames of another size)."""
    padded = padded or {}
    seen: dict[str, tuple[Feature, str]] = {}
    for source in sources:
        for name, feature in source.features.items():
            if name not in seen:
                seen[name] = (feature, source.name)
                continue
            other, where = seen[name]
            cut = -1 if name in padded else None
            a = (other.kind, other.dtype, other.shape[:cut])
            if a == (feature.kind, feature.dtype, feature.shape[:cut]):
                continue
            fix = ""
            same = (other.kind, other.dtype) == (feature.kind, feature.dtype)
            if suggest_fix and same and feature.kind == "array" and other.shape and feature.shape and \
                    other.shape[:-1] == feature.shape[:-1]:
                width = max(other.shape[-1], feature.shape[-1])
                fix = (f", or pad the last dimension with zeros: open_dataset([...], pad_to={{{name!r}: {width}}}) "
                       f"(each sample then carries {name}_dim_mask)")
            if suggest_fix and same and feature.kind == "video":
                fix = (", or decode every dataset's frames at one size: open_dataset([...], frame_size=(H, W)) (or "
                       f"{{{name!r}: (H, W)}})")
            raise ValueError(f"feature {name!r} is {other.kind} {other.dtype} {list(other.shape)} in {where} but "
                             f"{feature.kind} {feature.dtype} {list(feature.shape)} in {source.name}; {why}{fix}")

