"""Feature statistics that merge exactly: per-episode partials (count, mean, M2, min, max) combine into a
dataset's mean, std, min and max with Chan's parallel update, so stats computed per shard, per worker or per
machine give the same numbers as one pass over everything (up to float64 rounding).

    >>> a, b = np.arange(6.0).reshape(3, 2), np.arange(6.0, 10.0).reshape(2, 2)
    >>> s = finish(merge([partial(a), partial(b)]))
    >>> np.allclose(s["mean"], np.concatenate([a, b]).mean(0)), np.allclose(s["std"], np.concatenate([a, b]).std(0))
    (True, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["finish", "from_json", "merge", "partial", "step_shaped", "to_json"]


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
