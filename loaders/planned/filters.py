"""Frame filters from a file: per-episode ranges of steps to keep or drop, applied in the plan.

``Packing(frame_filter="idle.json")`` (or a :class:`FrameFilter`) restricts which steps anchor a window, or which
steps whole-episode chunks cover, as openpi's DROID idle filter keeps only the steps where the robot moves. The
ranges become segments of the sample table (:func:`mmfeed.packing.filters.kept_segments`), so the plan stays a
pure function of the index and exact and elastic resume hold. An episode named in ``keep`` keeps only those
ranges; one not named keeps every step; ``drop`` ranges are taken out of what is kept. Steps count the control
clock from 0, ``end`` excluded; ``episode`` is the episode's position in its dataset (a LeRobot directory's
``episode_index``), ``dataset`` its dataset's index or name in a mixture (left out: the first).

The file is JSON or parquet:

- JSON ``{"keep": [...], "drop": [...]}``, each a list of ``{"dataset", "episode", "start", "end"}`` objects or
  ``[episode, start, end]`` lists, or ``{episode: [[start, end], ...]}`` (openpi's form), or
  ``{dataset: {episode: [[start, end], ...]}}``;
- JSON ``{episode: [[start, end], ...]}`` or ``{dataset: {episode: [[start, end], ...]}}`` alone, as openpi's
  DROID idle filter is written: its ranges are the steps to **keep** (openpi keeps the frames where the robot
  moves), so it means ``{"keep": {...}}``; an episode it does not name keeps every step;
- parquet with columns ``episode``, ``start``, ``end`` and optionally ``dataset`` and ``keep`` (bool, default
  True: False rows are dropped ranges).

    >>> f = FrameFilter.of(keep={"0": [[2, 5]]}, drop=[[1, 0, 3]])
    >>> f.keep, f.drop
    ([(None, 0, 2, 5)], [(None, 1, 0, 3)])
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmfeed.packing.filters import Ranges, kept_segments

__all__ = ["FrameFilter"]

Row = tuple[Any, int, int, int]  # (dataset: index, name or None for the first; episode, start, end)


@dataclass(frozen=True)
class FrameFilter:
    """Ranges ``(dataset, episode, start, end)`` to keep and to drop (see the module docstring)."""

    keep: list[Row]
    drop: list[Row]
    where: str = "frame filter"

    @classmethod
    def of(cls, keep: Any = None, drop: Any = None, *, where: str = "frame filter") -> FrameFilter:
        """A filter from ranges in any of the JSON forms of the module docstring."""
        return cls(_rows(keep, f"{where} keep"), _rows(drop, f"{where} drop"), where)

    @classmethod
    def load(cls, path: str | os.PathLike) -> FrameFilter:
        """The filter in a JSON or parquet file (see the module docstring); ValueError names the file and what is
        wrong with it."""
        path = os.fspath(path)
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            table = pq.read_table(path).to_pydict()
            missing = [c for c in ("episode", "start", "end") if c not in table]
            if missing:
                raise ValueError(f"{path}: a frame filter needs columns episode, start and end; it lacks {missing}")
            n = len(table["episode"])
            datasets = table.get("dataset", [None] * n)
            keeps = table.get("keep", [True] * n)
            rows = [(d, e, a, b) for d, e, a, b in zip(datasets, table["episode"], table["start"], table["end"])]
            return cls(_rows([r for r, k in zip(rows, keeps) if k], path),
                       _rows([r for r, k in zip(rows, keeps) if not k], path), path)
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err}); a frame filter is JSON or parquet") from err
        if not isinstance(raw, Mapping) or not raw:
            raise ValueError(f"{path}: a frame filter is {{\"keep\": [...], \"drop\": [...]}} or {{episode: [[start, "
                             f"end], ...]}} (openpi's keep ranges), got "
                             f"{'{}' if isinstance(raw, Mapping) else type(raw).__name__}")
        if not set(raw) & {"keep", "drop"}:  # openpi's form: {episode: ranges} or {dataset: {episode: ranges}}
            return cls.of(raw, None, where=path)
        if not set(raw) <= {"keep", "drop"}:
            raise ValueError(f"{path}: a frame filter is {{\"keep\": [...], \"drop\": [...]}} or {{episode: [[start, "
                             f"end], ...]}} (openpi's keep ranges), not both; got keys {sorted(raw)}")
        return cls.of(raw.get("keep"), raw.get("drop"), where=path)

    def segments(self, source: Any) -> Ranges:
        """The kept segments of ``source``'s episodes (global episode ids of a mixture)."""
        names = list(getattr(source, "dataset_names", None) or [getattr(source, "name", "dataset")])
        dataset_of = getattr(source, "dataset_of", None)
        sizes = np.bincount(dataset_of, minlength=len(names)) if dataset_of is not None else np.array([len(source)])
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        lengths = np.asarray(source.lengths, dtype=np.int64)
        resolved = []
        for what, rows in (("keep", self.keep), ("drop", self.drop)):
            out = []
            for dataset, episode, start, end in rows:
                d = _dataset_index(dataset, names, f"{self.where} {what}")
                if not 0 <= episode < sizes[d]:
                    raise ValueError(f"{self.where} {what}: episode {episode} of dataset {names[d]!r}, which has "
                                     f"{int(sizes[d])} episodes")
                out.append((int(offsets[d] + episode), start, end))
            resolved.append(tuple(np.array([r[k] for r in out], dtype=np.int64) for k in range(3)) if out else None)
        return kept_segments(lengths, keep=resolved[0], drop=resolved[1])


def _dataset_index(dataset: Any, names: Sequence[str], where: str) -> int:
    if dataset is None:
        return 0
    if isinstance(dataset, str):
        if dataset not in names:
            raise ValueError(f"{where}: dataset {dataset!r} is not one of {list(names)}")
        return names.index(dataset)
    d = int(dataset)
    if not 0 <= d < len(names):
        raise ValueError(f"{where}: dataset {d}; the mixture has {len(names)} datasets ({list(names)})")
    return d


def _rows(raw: Any, where: str) -> list[Row]:
    """``(dataset or None, episode, start, end)`` rows from any of the forms of the module docstring."""
    if raw is None:
        return []
    if isinstance(raw, Mapping):  # {episode: ranges} or {dataset: {episode: ranges}}
        if all(isinstance(v, Mapping) for v in raw.values()):
            return [(_dataset(d), *r[1:]) for d, inner in raw.items() for r in _rows(inner, where)]
        return [(None, _int(e, where), *_pair(r, where)) for e, ranges in raw.items() for r in ranges]
    rows = []
    for item in raw:
        if isinstance(item, Mapping):
            try:
                rows.append((_dataset(item.get("dataset")), _int(item["episode"], where), _int(item["start"], where),
                             _int(item["end"], where)))
            except KeyError as err:
                raise ValueError(f"{where}: range {dict(item)} lacks {err.args[0]!r}") from None
        elif isinstance(item, Sequence) and len(item) in (3, 4):
            dataset = _dataset(item[0]) if len(item) == 4 else None
            rows.append((dataset, *(_int(v, where) for v in item[-3:])))
        else:
            raise ValueError(f"{where}: a range is {{dataset, episode, start, end}} or [episode, start, end], got "
                             f"{item!r}")
    return rows


def _pair(r: Any, where: str) -> tuple[int, int]:
    if not isinstance(r, Sequence) or len(r) != 2:
        raise ValueError(f"{where}: a range of an episode is [start, end], got {r!r}")
    return _int(r[0], where), _int(r[1], where)


def _dataset(d: Any) -> Any:
    """A dataset given by index (also as a string of digits, a JSON key) or by name; None for the first."""
    if d is None or isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return d
    return int(d) if isinstance(d, str) and d.isdigit() else str(d)


def _int(v: Any, where: str) -> int:
    try:
        if isinstance(v, bool) or float(v) != int(float(v)):
            raise ValueError
        return int(float(v))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {v!r} is not a whole number of steps or an episode index") from None
