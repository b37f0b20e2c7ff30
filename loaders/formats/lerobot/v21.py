"""LeRobot v2.x metadata (v2.0, v2.1, what LeRobot 0.3 writes), read into the v3 reader's episode columns.

A v2.x dataset keeps one data file per episode, ``data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet``,
and one video per episode and camera, ``videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4``
(``episode_chunk = episode_index // chunks_size``), each video starting at time 0; its metadata is JSON lines:
``meta/episodes.jsonl`` (``episode_index``, ``tasks``, ``length``), ``meta/tasks.jsonl`` (``task_index``,
``task``) and, in v2.1, ``meta/episodes_stats.jsonl`` (each episode's statistics; v2.0 has ``meta/stats.json``).

:func:`read_episodes` gives the columns :class:`~mmfeed.loaders.formats.lerobot.source.LeRobotSource` reads a v3
``meta/episodes`` into: each episode's data "file" is its own (chunk ``episode_chunk``, file ``episode_index``),
its rows ``dataset_from_index..dataset_to_index`` counted across the episodes in order (as LeRobot numbers the
``index`` column), each camera's segment from time 0 of the episode's own video. The reader then reads a v2.x
dataset exactly as a v3 one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfeed.loaders.transport.confine import shorten
from mmfeed.loaders.transport.json_limits import check_json

__all__ = ["PATH_FIELDS", "aggregate_stats", "episode_stats", "is_v2", "read_episodes", "read_jsonl", "read_tasks"]

PATH_FIELDS = ("episode_chunk", "episode_index")
"""The integer fields of a v2.x ``data_path`` and ``video_path`` (the v3 ones are ``chunk_index``, ``file_index``)."""


def is_v2(info: Mapping) -> bool:
    """Whether ``meta/info.json`` declares a LeRobot v2.x dataset (``codebase_version`` v2.0 or v2.1)."""
    return str(info.get("codebase_version", "")).startswith("v2")


def read_jsonl(files: Any, relative: str) -> list[dict]:
    """The objects of a JSON-lines file, one a line (blank lines skipped); a line that is no JSON object, or
    larger or nested deeper than metadata JSON may be (:func:`~mmfeed.loaders.transport.json_limits.check_json`),
    is a ValueError naming the file and the line."""
    where = files.where(relative)
    if not files.exists(relative):
        raise FileNotFoundError(f"{where} does not exist; a LeRobot v2.x dataset lists its metadata there")
    out = []
    for n, line in enumerate(files.read_bytes(relative).decode("utf-8").splitlines()):
        if not line.strip():
            continue
        check_json(line, f"{where} line {n + 1}")  # the limits of every metadata file's JSON, a line at a time
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} line {n + 1}: not JSON ({err.msg}): {shorten(line)}") from err
        if not isinstance(value, dict):
            raise ValueError(f"{where} line {n + 1}: expected a JSON object, got {shorten(line)}")
        out.append(value)
    return out


def _int(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {key!r} must be an integer, got {shorten(repr(value))}")
    return value


def read_tasks(files: Any) -> list[str]:
    """Task texts ordered by ``task_index``, from ``meta/tasks.jsonl``."""
    rows = read_jsonl(files, "meta/tasks.jsonl")
    where = files.where("meta/tasks.jsonl")
    ids = [_int(r.get("task_index"), where, "task_index") for r in rows]
    if sorted(ids) != list(range(len(ids))):
        raise ValueError(f"{where}: task_index must number the tasks 0..{len(ids) - 1}, got {sorted(ids)[:20]}")
    texts = {}
    for r, i in zip(rows, ids):
        if not isinstance(r.get("task"), str):
            raise ValueError(f"{where}: task {i} has no text ('task'), got {shorten(repr(r.get('task')))}")
        texts[i] = r["task"]
    return [texts[i] for i in range(len(ids))]


def read_episodes(files: Any, info: Mapping, video_keys: Sequence[str], tasks: Sequence[str]
                  ) -> tuple[dict[str, np.ndarray], np.ndarray, tuple[np.ndarray, list[str]]]:
    """``meta/episodes.jsonl`` as the v3 reader's episode columns (sorted by episode_index), each episode's task
    id (-1 where it lists several or none: its rows then say) and where each row came from (the file, for
    messages); see the module's docstring."""
    where = files.where("meta/episodes.jsonl")
    rows = read_jsonl(files, "meta/episodes.jsonl")
    if not rows:
        raise ValueError(f"{where}: no episodes")
    ep = np.array([_int(r.get("episode_index"), where, "episode_index") for r in rows], dtype=np.int64)
    length = np.array([_int(r.get("length"), f"{where} episode {e}", "length") for r, e in zip(rows, ep)],
                      dtype=np.int64)
    lookup = {t: i for i, t in enumerate(tasks)}
    task = np.full(len(rows), -1, dtype=np.int64)
    for k, r in enumerate(rows):
        listed = r.get("tasks", [])
        if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
            raise ValueError(f"{where} episode {ep[k]}: 'tasks' must be a list of task texts, got "
                             f"{shorten(repr(listed))}")
        missing = [t for t in listed if t not in lookup]
        if missing:
            raise ValueError(f"{where} episode {ep[k]}: task {missing[0]!r} is not in meta/tasks.jsonl")
        if len(listed) == 1:
            task[k] = lookup[listed[0]]
    order = np.argsort(ep, kind="stable")
    ep, length, task = ep[order], length[order], task[order]
    chunks = max(int(info.get("chunks_size") or 1000), 1)
    chunk = ep // chunks
    ends = np.cumsum(length)
    meta = {"episode_index": ep, "length": length, "data/chunk_index": chunk, "data/file_index": ep.copy(),
            "dataset_from_index": ends - length, "dataset_to_index": ends}
    for key in video_keys:
        meta[f"videos/{key}/chunk_index"] = chunk
        meta[f"videos/{key}/file_index"] = ep.copy()
        meta[f"videos/{key}/from_timestamp"] = np.zeros(len(ep), dtype=np.float64)
    return meta, task, (np.zeros(len(ep), dtype=np.int32), [where])


def episode_stats(files: Any) -> list[dict[str, dict[str, np.ndarray]]]:
    """Each episode's statistics in ``meta/episodes_stats.jsonl`` (v2.1), every leaf ``np.array(value)``; empty
    without the file."""
    if not files.exists("meta/episodes_stats.jsonl"):
        return []
    where = files.where("meta/episodes_stats.jsonl")
    out = []
    for row in read_jsonl(files, "meta/episodes_stats.jsonl"):
        stats = row.get("stats")
        if not isinstance(stats, dict):
            raise ValueError(f"{where} episode {row.get('episode_index')}: 'stats' must be an object "
                             "{feature: {statistic: values}}")
        try:
            out.append({f: {s: np.array(v) for s, v in st.items()} for f, st in stats.items() if isinstance(st, dict)})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{where} episode {row.get('episode_index')}: statistics are not numbers: {err}") from err
    return out


def aggregate_stats(per_episode: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """The dataset's statistics from its episodes' as LeRobot aggregates them: min of mins, max of maxes, the
    count-weighted mean, the pooled standard deviation, summed counts and count-weighted quantiles."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for feature in dict.fromkeys(f for stats in per_episode for f in stats):
        parts = [s[feature] for s in per_episode if feature in s]
        if not all({"mean", "std", "count", "min", "max"} <= set(p) for p in parts):
            continue
        means = np.stack([p["mean"] for p in parts]).astype(np.float64)
        variances = np.stack([p["std"] for p in parts]).astype(np.float64) ** 2
        counts = np.stack([p["count"] for p in parts])
        total = counts.sum(axis=0)
        weights = counts.astype(np.float64)
        while weights.ndim < means.ndim:
            weights = weights[..., None]
        mean = (means * weights).sum(axis=0) / total
        variance = ((variances + (means - mean) ** 2) * weights).sum(axis=0) / total
        agg = {"min": np.min(np.stack([p["min"] for p in parts]), axis=0),
               "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
               "mean": mean, "std": np.sqrt(variance), "count": total}
        for q in [k for k in parts[0] if k.startswith("q") and k[1:].isdigit()]:
            if all(q in p for p in parts):
                agg[q] = (np.stack([p[q] for p in parts]) * weights).sum(axis=0) / total
        out[feature] = agg
    return out
