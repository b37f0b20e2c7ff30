"""Feature statistics that merge exactly: per-episode partials (count, mean, M2, min, max) combine into a
dataset's mean, std, min and max with Chan's parallel update, so stats computed per shard, per worker or per
machine give the same numbers as one pass over everything (up to float64 rounding).

    >>> a, b = np.arange(6.0).reshape(3, 2), np.arange(6.0, 10.0).reshape(2, 2)
    >>> s = finish(merge([partial(a), partial(b)]))
    >>> np.allclose(s["mean"], np.concatenate([a, b]).mean(0)), np.allclose(s["std"], np.concatenate([a, b]).std(0))
    (True, True)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["QUANTILE_NAMES", "MixtureStats", "combine", "combine_datasets", "finish", "from_json", "merge", "partial",
           "step_shaped", "to_json"]

QUANTILE_NAMES = ("q01", "q10", "q50", "q90", "q99")
"""The quantiles a dataset's stats may hold (LeRobot's set)."""


def partial(values: np.ndarray) -> dict[str, np.ndarray]:
    """The partial statistics of ``values`` ``[T, *shape]`` over its first axis (float64 arrays of ``shape``)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim == 0:
        x = x.reshape(1)
    if x.ndim == 1:
        x = x.reshape(-1, 1) if x.size else x.reshape(0, 1)
    n = len(x)
    if n == 0:
        zero, nan = np.zeros(x.shape[1:]), np.full(x.shape[1:], np.nan)
        return {"count": np.array(0.0), "mean": zero, "m2": zero.copy(), "min": nan, "max": nan.copy()}
    mean = x.mean(axis=0)
    return {"count": np.array(float(n)), "mean": mean, "m2": ((x - mean) ** 2).sum(axis=0),
            "min": x.min(axis=0), "max": x.max(axis=0)}


def merge(parts: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One partial from many (Chan et al.'s pairwise update of mean and M2)."""
    out = None
    for p in parts:
        p = {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}
        if out is None:
            out = p
            continue
        na, nb = float(out["count"]), float(p["count"])
        if nb == 0:
            continue
        if na == 0:
            out = p
            continue
        n = na + nb
        delta = p["mean"] - out["mean"]
        out = {"count": np.array(n), "mean": out["mean"] + delta * (nb / n),
               "m2": out["m2"] + p["m2"] + delta ** 2 * (na * nb / n),
               "min": np.fmin(out["min"], p["min"]), "max": np.fmax(out["max"], p["max"])}
    if out is None:
        raise ValueError("no statistics to merge")
    return out


def finish(p: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``{"mean", "std", "min", "max", "count"}`` of a partial (population std, as LeRobot computes it)."""
    n = float(p["count"])
    return {"mean": np.asarray(p["mean"], np.float64), "std": np.sqrt(np.asarray(p["m2"], np.float64) / max(n, 1.0)),
            "min": np.asarray(p["min"], np.float64), "max": np.asarray(p["max"], np.float64),
            "count": np.asarray([n], np.float64)}


def to_json(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """Stats (feature -> name -> array) as plain lists, for JSON."""
    return {f: {k: np.asarray(v).tolist() for k, v in s.items()} for f, s in stats.items()}


def from_json(raw: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, np.ndarray]]:
    """Stats read from JSON: every value a float64 array."""
    return {f: {k: np.asarray(v, dtype=np.float64) for k, v in s.items()} for f, s in raw.items()}


def step_shaped(stats: Mapping[str, Mapping[str, np.ndarray]], shapes: Mapping[str, tuple[int, ...]]
                ) -> dict[str, dict[str, np.ndarray]]:
    """Stats whose per-element arrays have the step shape of their feature (``shapes``: feature -> step shape):
    a scalar feature's ``[1]`` (as LeRobot stores it) becomes ``()``, a flat vector of a ``[2, 3]`` feature
    ``[2, 3]``; ``count`` and arrays of any other size (per-channel video stats) are kept as they are."""
    out = {}
    for feature, named in stats.items():
        shape = shapes.get(feature)
        size = None if shape is None else int(np.prod(shape, dtype=np.int64))
        out[feature] = {k: (np.asarray(v, np.float64).reshape(shape) if shape is not None and k != "count"
                            and np.size(v) == size else np.asarray(v, np.float64)) for k, v in named.items()}
    return out


def combine(parts: Sequence[Mapping[str, np.ndarray]], width: int | None = None) -> dict[str, np.ndarray]:
    """The stats of several datasets' union from each one's finished stats (``{"count", "mean", "std", "min",
    "max"[, "q01", ...]}``), by the rule Isaac-GR00T merges the datasets of one robot with: count-weighted mean
    and variance (exact), min of the mins, max of the maxes, min of the q01s and max of the q99s (a range that
    covers every dataset's), the other quantiles count-weighted means. A quantile only some parts hold is left
    out. Without counts in every part the stats cannot be weighed, nor parts of different sizes: the first part's
    come back (one part's come back as they are).

    width: for a feature padded to ``width`` in its last dimension (``open_dataset(..., pad_to=...)``), the parts
    may be narrower: element ``j`` merges the parts that have it, and an element none has is 0 (what the padding
    holds), with std 0.

        >>> a = {"count": np.array([2.0]), "mean": np.array([0.0]), "std": np.array([1.0]), "min": np.array([-1.0]),
        ...      "max": np.array([1.0])}
        >>> b = {"count": np.array([2.0]), "mean": np.array([2.0]), "std": np.array([1.0]), "min": np.array([1.0]),
        ...      "max": np.array([3.0])}
        >>> {k: v.tolist() for k, v in combine([a, b]).items()}
        {'mean': [1.0], 'std': [1.4142135623730951], 'min': [-1.0], 'max': [3.0], 'count': [4.0]}
    """
    parts = [{k: np.asarray(v, np.float64) for k, v in p.items()} for p in parts]
    if not parts:
        raise ValueError("no statistics to combine")
    if not all({"count", "mean", "std", "min", "max"} <= set(p) for p in parts) or len(parts) == 1 and width is None:
        return parts[0]
    if width is None and len({p["mean"].shape for p in parts}) > 1:  # a scalar as () beside [1] (LeRobot's)
        if len({p["mean"].size for p in parts}) > 1:
            return parts[0]
        shape = parts[0]["mean"].shape
        parts = [{k: v if k == "count" else v.reshape(shape) for k, v in p.items()} for p in parts]
    shape = parts[0]["mean"].shape if width is None else (*parts[0]["mean"].shape[:-1], int(width))
    names = ["mean", "std", "min", "max", *(q for q in QUANTILE_NAMES if all(q in p for p in parts))]
    grown = [{k: _grown(p[k], shape) for k in names} for p in parts]
    count = np.stack([np.where(np.isnan(g["mean"]), 0.0, float(p["count"].reshape(-1)[0]))
                      for g, p in zip(grown, parts)])
    stacked = {k: np.stack([g[k] for g in grown]) for k in names}
    total = count.sum(0)
    weight = np.divide(count, total, out=np.zeros_like(count), where=total > 0)
    filled = {k: np.nan_to_num(v) for k, v in stacked.items()}
    mean = (weight * filled["mean"]).sum(0)
    var = (weight * (filled["std"] ** 2 + (filled["mean"] - mean) ** 2)).sum(0)
    out = {"mean": mean, "std": np.sqrt(var)}
    have = total > 0
    for k, reduce in (("min", np.nanmin), ("max", np.nanmax), ("q01", np.nanmin), ("q99", np.nanmax)):
        if k in stacked:
            out[k] = np.where(have, _nanreduce(reduce, stacked[k], count), 0.0)
    for k in ("q10", "q50", "q90"):
        if k in stacked:
            out[k] = (weight * filled[k]).sum(0)
    out["count"] = np.asarray([sum(float(p["count"].reshape(-1)[0]) for p in parts)], np.float64)
    return {k: out[k] for k in [*names, "count"]}


def combine_datasets(datasets: Sequence[Mapping[str, Mapping[str, np.ndarray]]],
                     widths: Mapping[str, int] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Every feature's stats over ``datasets`` (each one's feature -> finished stats), merged by :func:`combine`
    over the datasets that have the feature (a feature of ``widths`` padded to its width): how the datasets of one
    embodiment share stats, in ``open_dataset`` and in ``mmfeed stats`` alike."""
    widths = widths or {}
    names = dict.fromkeys(n for d in datasets for n in d)
    return {n: combine([d[n] for d in datasets if n in d], widths.get(n)) for n in names}


def _grown(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` padded with NaN to ``shape`` in its last dimension (a scalar's shape ``()`` stays)."""
    values = np.asarray(values, np.float64)
    if values.shape == shape or not shape:
        return values.reshape(shape)
    out = np.full(shape, np.nan)
    out[..., : values.shape[-1]] = values
    return out


def _nanreduce(reduce, values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``reduce`` over the parts (axis 0) of the elements they have (count > 0); NaN where none has one."""
    masked = np.where(count > 0, values, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "All-NaN slice": an element no part has
        return reduce(masked, axis=0)


class MixtureStats:
    """The stats of each dataset of a mixture and of each embodiment (datasets of one robot), what
    ``Normalize(stats)`` picks a sample's from by its ``dataset``; ``mmfeed stats`` writes them as JSON
    (:meth:`to_json`, :meth:`load`).

    datasets: each dataset's stats (feature -> name -> array, unpadded); names: the datasets' names;
    embodiments: embodiment name -> stats; embodiment_of_dataset: the embodiment (index into ``embodiments``'s
    keys, in order) of each dataset, or None without embodiments.
    """

    def __init__(self, datasets: Sequence[Mapping[str, Mapping[str, np.ndarray]]], names: Sequence[str], *,
                 embodiments: Mapping[str, Mapping] | None = None,
                 embodiment_of_dataset: Sequence[int] | None = None) -> None:
        if len(datasets) != len(names):
            raise ValueError(f"give one name per dataset: {len(datasets)} datasets, {len(names)} names")
        self.datasets = [dict(d) for d in datasets]
        self.dataset_names = [str(n) for n in names]
        self.embodiment_stats = dict(embodiments or {})
        self.embodiment_names = list(self.embodiment_stats) if embodiment_of_dataset is not None else None
        self.embodiment_of_dataset = None if embodiment_of_dataset is None else \
            np.asarray(embodiment_of_dataset, dtype=np.int64)

    def stats_of(self, dataset: int, by: str = "dataset") -> dict:
        """The stats of ``dataset``: its own (``by="dataset"``) or its embodiment's (``by="embodiment"``)."""
        if by == "embodiment":
            if self.embodiment_of_dataset is None:
                raise ValueError("these stats have no embodiments: compute them with embodiments, or normalize by "
                                 "dataset")
            return self.embodiment_stats[self.embodiment_names[int(self.embodiment_of_dataset[dataset])]]
        if by != "dataset":
            raise ValueError(f"stats are kept by 'dataset' or 'embodiment', got {by!r}")
        return self.datasets[int(dataset)]

    def to_json(self) -> dict:
        """A JSON-ready dict: ``{"datasets": [{"name", "embodiment", "stats"}], "embodiments": {name: stats}}``."""
        of = self.embodiment_of_dataset
        return {"datasets": [{"name": n, "embodiment": None if of is None else self.embodiment_names[int(of[k])],
                              "stats": to_json(d)} for k, (n, d) in enumerate(zip(self.dataset_names, self.datasets))],
                "embodiments": {e: to_json(s) for e, s in self.embodiment_stats.items()}}

    @classmethod
    def from_json(cls, raw: Mapping) -> MixtureStats:
        """The stats :meth:`to_json` wrote."""
        try:
            entries = list(raw["datasets"])
            embodiments = {e: from_json(s) for e, s in dict(raw.get("embodiments") or {}).items()}
            names = [str(d["name"]) for d in entries]
            stats = [from_json(d["stats"]) for d in entries]
            labels = [d.get("embodiment") for d in entries]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not stats written by mmfeed stats: {err!r}") from err
        of = None
        if embodiments and all(e is not None for e in labels):
            order = list(embodiments)
            of = [order.index(e) for e in labels]
        return cls(stats, names, embodiments=embodiments, embodiment_of_dataset=of)

    @classmethod
    def load(cls, path: str) -> MixtureStats:
        """The stats in the JSON file ``path`` (what ``mmfeed stats --json PATH`` writes)."""
        import json

        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))
