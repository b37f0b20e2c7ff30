"""``mmfeed stats PATH...``: the statistics of datasets (and of each embodiment) from their arrays alone.

Normalization wants each robot's own statistics with quantiles (openpi's q01..q99), and computing them must not
decode video nobody needs (openpi's takes hours for that). :func:`compute_stats` reads only the numeric array
features of each dataset (LeRobot data parquet columns, the ``.npy`` members of shards; never a video or an
image), episode range by episode range, on local processes or Ray tasks (the engines of ``mmfeed convert``), and
merges exactly: mean, std, min and max from per-range partials (Chan's update), the quantiles q01..q99 from
mergeable log-bucket sketches (:mod:`~mmfeed.loaders.stores.quantiles`, within 1% of ``np.quantile``). The
datasets of one embodiment merge their finished stats by the rule ``open_dataset(..., embodiments=...)`` applies
(:func:`~mmfeed.loaders.stores.stats.combine`: count-weighted mean and variance, min of the mins and of the q01s,
max of the maxes and of the q99s), so ``Normalize`` gets the same numbers from either.

With ``delta`` (:class:`~mmfeed.loaders.planned.transforms.DeltaActions`) the stats of delta actions come too,
under ``"action.delta"``: over every anchor step ``t`` and offset ``k < horizon`` in an episode, the chosen
elements ``action[t + k] - state[t]`` and the others as they are, what ``Normalize(..., delta=...)`` normalizes
with::

    stats = compute_stats(["franka/", "aloha/"], embodiments=["arm", "bimanual"], workers=4)   # doctest: +SKIP
    stats.save("stats.json"); Normalize(MixtureStats.load("stats.json"), mode="quantile")     # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmfeed._progress import progress_bar
from mmfeed.loaders.conversion.engines import run_local, run_ray
from mmfeed.loaders.stores import stats as _stats
from mmfeed.loaders.stores.quantiles import MAX_ELEMENTS, Sketch

__all__ = ["HELP", "StatsJob", "add_arguments", "compute_stats", "run", "stats_task"]

log = logging.getLogger(__name__)

HELP = "each dataset's (and each embodiment's) stats with quantiles, from the arrays alone (no video decoded)"
DESCRIPTION = ("Compute the statistics of the numeric array features of datasets (webdataset shards, LeRobot v3 "
               "directories) from their arrays alone, never decoding a video or an image: mean, std, min, max and "
               "count merged exactly, and the quantiles q01, q10, q50, q90, q99 from a mergeable sketch (within 1%). "
               "With --embodiments the datasets of one robot are merged into that embodiment's stats; with --delta "
               "the stats of delta actions (action minus the anchor state on chosen elements) come too. Runs on "
               "local processes (--workers) or Ray (--engine ray). Prints each dataset's figures; --json writes "
               "what Normalize(MixtureStats.load(FILE)) reads.")
EPISODES_PER_TASK = 20_000
"""Episodes one task reads at most (each dataset is cut into at least as many tasks as there are workers)."""
BATCH_EPISODES = 2000
"""Episodes read and counted at once within a task."""


@dataclass(frozen=True)
class StatsJob:
    """What every worker gets: the datasets (paths, or sources already open), the features to count (None: every
    numeric array feature), and the delta actions to count, per dataset ``(action, state, elements)`` or None."""

    datasets: tuple
    features: tuple[str, ...] | None
    deltas: tuple
    horizon: int


def compute_stats(paths: Any, *, names: Sequence[str] | None = None,
                  embodiments: Sequence[str] | Mapping[str, str] | None = None, features: Sequence[str] | None = None,
                  delta: Any = None, horizon: int = 1, workers: int = 1, engine: str = "local",
                  ray_address: str | None = None, max_retries: int = 3,
                  progress: Callable[[int], object] | None = None) -> _stats.MixtureStats:
    """The stats of each dataset of ``paths`` (one path or source, a list of them, or ``{name: path}``) and, given
    ``embodiments`` (one per dataset, or ``{name: embodiment}``), of each embodiment, as
    :class:`~mmfeed.loaders.stores.stats.MixtureStats`. ``features``: the array features to count (default every
    numeric one); ``delta``: a :class:`~mmfeed.loaders.planned.transforms.DeltaActions`, counted over ``horizon``
    action steps from each anchor; ``workers``, ``engine`` ("local" or "ray"), ``ray_address``, ``max_retries``
    as for :func:`mmfeed.loaders.convert`; ``progress(n)`` is called as each range of ``n`` episodes is counted (e.g.
    a tqdm bar's ``update``)."""
    from mmfeed.loaders.open import open_dataset
    from mmfeed.loaders.sources.base import EpisodeSource

    if isinstance(paths, Mapping):
        names, paths = [str(k) for k in paths], list(paths.values())
    elif isinstance(paths, (str, os.PathLike, EpisodeSource)):
        paths = [paths]
    paths = [p if isinstance(p, EpisodeSource) else os.fspath(p) for p in paths]
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1 (action steps from each anchor), got {horizon!r}")
    sources = [open_dataset(p) for p in paths]  # the metadata only: each worker opens its own
    names = [s.name for s in sources] if names is None else [str(n) for n in names]
    if len(names) != len(sources):
        raise ValueError(f"give one name per dataset: {len(sources)} datasets, {len(names)} names")
    groups = _groups(embodiments, names)
    deltas = tuple(_delta_of(delta, s, [n] + ([groups[0][k]] if groups else [])) for k, (s, n) in
                   enumerate(zip(sources, names)))
    if features is not None:
        if isinstance(features, str):
            features = [features]
        for s in sources:
            unknown = [f for f in features if f in s.features and s.features[f].kind != "array"]
            if unknown:
                raise ValueError(f"{s.name}: {unknown} are not array features; stats are of arrays")
        nowhere = [f for f in features if not any(f in s.features for s in sources)]
        if nowhere:
            numeric = sorted({f for s in sources for f, spec in s.features.items() if _numeric(spec)})
            where = f"{sources[0].name}: no" if len(sources) == 1 else \
                f"{', '.join(s.name for s in sources)}: none of the {len(sources)} datasets has"
            raise ValueError(f"{where} feature {_listed(nowhere)} to compute stats of; the numeric array features "
                             f"are {_listed(numeric)}")
    job = StatsJob(tuple(p if isinstance(p, str) else s for p, s in zip(paths, sources)),
                   None if features is None else tuple(features), deltas, int(horizon))
    tasks = list(enumerate(_units(sources, workers)))
    start = time.perf_counter()
    runner = run_local(job, tasks, workers, stats_task) if engine == "local" else \
        run_ray(job, tasks, workers, ray_address, max_retries, stats_task)
    totals: list[dict] = [{} for _ in sources]
    for result in runner:
        _add(totals[result["dataset"]], result["counts"])
        if progress is not None:
            progress(result["episodes"])
    log.info("stats of %d datasets in %.1f s", len(sources), time.perf_counter() - start)
    per_dataset = [_finished(t) for t in totals]
    embodiment_stats, of = {}, None
    if groups:
        labels, order = groups
        of = [order.index(label) for label in labels]
        embodiment_stats = {label: _stats.combine_datasets([p for p, k in zip(per_dataset, of) if k == e])
                            for e, label in enumerate(order)}
    return _stats.MixtureStats(per_dataset, names, embodiments=embodiment_stats, embodiment_of_dataset=of)


def stats_task(job: StatsJob, k: int, unit: tuple[int, int, int]) -> dict[str, Any]:
    """Count episodes ``[lo, hi)`` of dataset ``d`` (``unit = (d, lo, hi)``): per feature the partial statistics
    and the sketch's counts (and the delta actions', under their key)."""
    d, lo, hi = unit
    source = _opened(job.datasets[d])
    delta = job.deltas[d]
    chosen = [f for f, spec in source.features.items() if spec.kind == "array" and np.dtype(spec.dtype).kind in "biuf"
              and (job.features is None or f in job.features)]
    read_too = [f for f in (delta or ())[:2] if f not in chosen]  # what the deltas need beside the features counted
    counts: dict[str, dict] = {}
    for first in range(lo, hi, BATCH_EPISODES):  # a data file is read once for a run of episodes
        episodes = np.arange(first, min(first + BATCH_EPISODES, hi), dtype=np.int64)
        arrays = source.episode_arrays(episodes, chosen + read_too)
        for f in chosen:
            _add(counts, {f: _counted(arrays[f], source.features[f].shape)})
        if delta is not None:
            action, state, dims = delta
            pairs = _deltas(arrays[action], arrays[state], source.frames(action)[episodes], dims, job.horizon)
            _add(counts, {_delta_key(action): _counted(pairs, source.features[action].shape)})
    return {"dataset": d, "episodes": hi - lo, "counts": counts}


def _counted(values: np.ndarray, shape: tuple[int, ...]) -> dict[str, Any]:
    """The partial statistics of ``values`` ``[n, *shape]`` and its sketch's counts (None past MAX_ELEMENTS)."""
    values = np.asarray(values)
    sketch = None
    if int(np.prod(shape, dtype=np.int64)) <= MAX_ELEMENTS:
        sketch = Sketch(tuple(shape))
        sketch.add(values.reshape(len(values), *shape))
    return {"partial": _stats.partial(values), "sketch": None if sketch is None else sketch.counts}


def _add(total: dict, counts: Mapping[str, Mapping]) -> None:
    """Merge ``counts`` (feature -> partial and sketch counts) into ``total``, in place."""
    for f, c in counts.items():
        have = total.get(f)
        if have is None:
            total[f] = {"partial": c["partial"], "sketch": None if c["sketch"] is None else c["sketch"].copy()}
            continue
        have["partial"] = _stats.merge([have["partial"], c["partial"]])
        if have["sketch"] is not None and c["sketch"] is not None:
            have["sketch"] += c["sketch"]


def _finished(total: Mapping[str, Mapping]) -> dict[str, dict[str, np.ndarray]]:
    """Finished stats (mean, std, min, max, count and the quantiles) of each feature's merged counts, in the step
    shape of the feature."""
    out = {}
    for f, c in total.items():
        done = _stats.finish(c["partial"])
        shape = np.shape(c["partial"]["mean"])
        if c["sketch"] is not None:
            sketch = Sketch(shape)
            sketch.counts = c["sketch"]
            done.update(sketch.quantiles(done["min"], done["max"]))
        out[f] = done
    return out


def _deltas(action: np.ndarray, state: np.ndarray, lengths: np.ndarray, dims: Sequence[int],
            horizon: int) -> np.ndarray:
    """``action[t + k]`` with ``dims`` less ``state[t]``'s, for every anchor ``t`` and ``k < horizon`` within its
    episode (episodes of ``lengths`` steps back to back in both arrays): ``[pairs, D]``."""
    action = np.asarray(action, np.float64)
    state = np.asarray(state, np.float64)
    lengths = np.asarray(lengths, np.int64)
    step = np.arange(len(action)) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # t within its episode
    left = np.repeat(lengths, lengths) - step  # steps from t to the episode's end, t included
    index = list(dims)
    out = []
    for k in range(horizon):
        t = np.flatnonzero(left > k)
        pair = action[t + k]
        pair[:, index] -= state[t][:, index]
        out.append(pair)
    return np.concatenate(out)


def _delta_key(action: str) -> str:
    return f"{action}.delta"  # as mmfeed.loaders.planned.transforms.delta_key (which imports torch)


def _delta_of(delta: Any, source: Any, names: list[str]) -> tuple[str, str, tuple[int, ...]] | None:
    """``(action, state, elements)`` of ``delta`` for one dataset known by ``names``, or None."""
    if delta is None:
        return None
    dims = tuple(delta.dims_of(names))
    if not dims:
        return None
    for feature in (delta.action, delta.state):
        if feature not in source.features:
            numeric = sorted(f for f, spec in source.features.items() if _numeric(spec))
            raise ValueError(f"{source.name}: delta actions need feature {feature!r}, which the dataset lacks; its "
                             f"numeric array features are {_listed(numeric)}")
    width = min(source.features[delta.action].shape[-1], source.features[delta.state].shape[-1])
    if max(dims) >= width:
        raise ValueError(f"{source.name}: delta elements {list(dims)} reach past the width {width} of "
                         f"{delta.action!r} and {delta.state!r}")
    return delta.action, delta.state, dims


def _numeric(spec: Any) -> bool:
    """Whether a feature is a numeric array (what stats are computed of)."""
    return spec.kind == "array" and np.dtype(spec.dtype).kind in "biuf"


def _listed(names: Sequence[str], most: int = 12) -> str:
    """``names`` for a message: all of a few, else the first ``most`` and how many more."""
    if len(names) <= most:
        return str(list(names))
    return f"{list(names[:most])} and {len(names) - most} more"


def _groups(embodiments: Any, names: list[str]) -> tuple[list[str], list[str]] | None:
    """Each dataset's embodiment and the embodiments in order, or None."""
    if embodiments is None:
        return None
    if isinstance(embodiments, Mapping):
        missing = [n for n in names if n not in embodiments]
        if missing:
            raise ValueError(f"embodiments lacks datasets {missing}; give one for each of {names}")
        embodiments = [embodiments[n] for n in names]
    labels = [str(e) for e in embodiments]
    if len(labels) != len(names):
        raise ValueError(f"give one embodiment per dataset: {len(names)} datasets, {len(labels)} embodiments")
    return labels, list(dict.fromkeys(labels))


def _units(sources: Sequence[Any], workers: int) -> list[tuple[int, int, int]]:
    """Episode ranges ``(dataset, lo, hi)``: each dataset cut into at least ``workers`` ranges of at most
    :data:`EPISODES_PER_TASK` episodes."""
    out = []
    for d, s in enumerate(sources):
        n = len(s)
        per = max(1, min(EPISODES_PER_TASK, -(-n // max(workers, 1))))
        out.extend((d, lo, min(lo + per, n)) for lo in range(0, n, per))
    return out


_OPEN: dict[str, Any] = {}


def _opened(dataset: Any) -> Any:
    """The source of a dataset (a path opened once per process; a source as it came)."""
    if not isinstance(dataset, str):
        return dataset
    source = _OPEN.get(dataset)
    if source is None:
        from mmfeed.loaders.open import open_dataset

        source = _OPEN[dataset] = open_dataset(dataset)
    return source


# -- the command line ------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``mmfeed stats``."""
    p.add_argument("paths", nargs="+", metavar="PATH", help="webdataset shards, LeRobot v3 directories, HDF5 or "
                   "Zarr demonstrations (with --fps)")
    p.add_argument("--names", help="comma-separated, one per PATH (default: the paths)")
    p.add_argument("--embodiments", help="comma-separated, one per PATH: datasets of one robot merge into its stats")
    p.add_argument("--features", help="comma-separated array features (default: every numeric array feature)")
    p.add_argument("--delta", metavar="ELEMENTS", help="delta actions: action minus the anchor state on these "
                   "elements (e.g. 0-5 or 0,1,2), of every dataset")
    p.add_argument("--action", default="action", help="the action feature for --delta (default action)")
    p.add_argument("--state", default="observation.state", help="the state feature for --delta")
    p.add_argument("--horizon", type=int, default=1, help="action steps from each anchor for --delta (default 1)")
    p.add_argument("--fps", type=float, default=None, help="steps per second of the datasets whose files record "
                   "none (HDF5 and Zarr demonstrations)")
    p.add_argument("--workers", type=int, default=1, help="processes (local) or CPUs of a local Ray (default 1)")
    p.add_argument("--engine", choices=["local", "ray"], default="local")
    p.add_argument("--ray-address", default=None, help="a Ray cluster to join (default: a running one, else local)")
    p.add_argument("--json", metavar="FILE", help="write the stats (Normalize(MixtureStats.load(FILE)) reads them)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one is drawn only when stderr is "
                   "a terminal)")


def run(args: argparse.Namespace) -> int:
    """``mmfeed stats``: compute, print each dataset's figures, write --json."""
    split = (lambda text: [t.strip() for t in text.split(",") if t.strip()])  # noqa: E731
    for path in args.paths:
        if "://" not in path and not any(c in path for c in "{*?[") and not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file or directory (give shards or a LeRobot v3 directory)")
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    delta = None
    if args.delta:
        from mmfeed.loaders.planned.transforms import DeltaActions

        delta = DeltaActions(_elements(args.delta), action=args.action, state=args.state)
    names = split(args.names) if args.names else None
    paths: list = list(args.paths)
    if args.fps is not None:  # datasets whose files record no frame rate (HDF5, Zarr): opened here, at that rate
        from mmfeed.loaders.open import open_each

        paths = open_each(paths, fps=args.fps)  # each dataset with fps= where its format takes it
    start = time.perf_counter()
    with progress_bar(desc="stats", unit="episode", enabled=not args.no_progress) as bar:
        result = compute_stats(paths, names=names,
                               embodiments=split(args.embodiments) if args.embodiments else None,
                               features=split(args.features) if args.features else None, delta=delta,
                               horizon=args.horizon, workers=args.workers, engine=args.engine,
                               ray_address=args.ray_address, progress=bar.update)
    seconds = time.perf_counter() - start
    for name, stats in zip(result.dataset_names, result.datasets):
        print(f"{name}:")
        print("\n".join(_lines(stats)))
    for name, stats in result.embodiment_stats.items():
        print(f"embodiment {name}:")
        print("\n".join(_lines(stats)))
    print(f"{len(result.datasets)} dataset(s) in {seconds:.2f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result.to_json(), f, indent=1)
        print(f"wrote {args.json}")
    return 0


def _elements(text: str) -> list[int]:
    """``"0-5"`` or ``"0,1,2"`` (or both) as element indices."""
    out = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        except ValueError:
            raise ValueError(f"--delta {text!r}: give element indices such as 0-5 or 0,1,2") from None
    return out


def _lines(stats: Mapping[str, Mapping[str, np.ndarray]]) -> list[str]:
    def short(v: np.ndarray) -> str:
        flat = np.asarray(v, np.float64).reshape(-1)
        text = ", ".join(f"{x:.4g}" for x in flat[:6])
        return f"[{text}{', ...' if flat.size > 6 else ''}]"

    return [f"  {f}: count {int(np.asarray(s['count']).reshape(-1)[0])} "
            + " ".join(f"{k} {short(s[k])}" for k in ("mean", "std", "min", "max", "q01", "q99") if k in s)
            for f, s in stats.items()]
