"""A large synthetic shard index, built with vectorized arrow (no shards to read): for benchmarks at the scale
of the largest robot corpora (a million episodes), where writing real shards would take hours.

The index has the schema of :data:`mmfeed.loaders.stores.index.INDEX_SCHEMA`: ``episodes`` episodes of 100-400
steps at 15 Hz, ``episodes_per_shard`` per shard, two video features (``observation.images.cam_high`` and
``observation.images.wrist``, 224x224, one frame per step), ``observation.state`` and ``action`` (float32 ``[7]``)
with their stats partials, one of 16 tasks each (every 1000th episode changes task half-way). The shard files
are created sparse (no disk blocks), as long as the members the index places in them, so that the index is
neither stale nor out of its shards' bounds; they hold zeros, which cannot be decoded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["write_synthetic_index"]

_VIDEOS = ("observation.images.cam_high", "observation.images.wrist")
_ARRAYS = ("observation.state", "action")
_DIM = 7


def _lists(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _strings(values) -> pa.Array:
    out = pa.array(list(values), pa.string())
    return out.combine_chunks() if isinstance(out, pa.ChunkedArray) else out


def write_synthetic_index(directory: str | os.PathLike, episodes: int, *, episodes_per_shard: int = 100,
                          seed: int = 0) -> str:
    """Write ``mmfeed-index.parquet`` (and the sparse shard files) into ``directory``; returns the index path."""
    from mmfeed.loaders.stores import stats as _stats
    from mmfeed.loaders.stores.index import INDEX_FILENAME, INDEX_SCHEMA, INDEX_VERSION, INDEX_FORMAT

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n = int(episodes)
    e = np.arange(n)
    length = rng.integers(100, 401, n).astype(np.int64)
    shard_names = [f"shard-{s:06d}.tar" for s in range((n + episodes_per_shard - 1) // episodes_per_shard)]
    shard_of = e // episodes_per_shard
    shards = pa.DictionaryArray.from_arrays(pa.array(shard_of, pa.int32()), pa.array(shard_names)).cast(pa.string())
    ids = pa.array([f"ep{i:08d}" for i in range(n)], pa.string())
    tasks = [f"task {t}: " + "pick the thing and place it " * (1 + t % 4) for t in range(16)]
    task_code = rng.integers(0, 16, n)
    task = pa.DictionaryArray.from_arrays(pa.array(task_code, pa.int32()), pa.array(tasks)).cast(pa.string())
    changes = e[e % 1000 == 999]
    run_counts = np.zeros(n, np.int64)
    run_counts[changes] = 2
    run_offsets = np.concatenate([[0], np.cumsum(run_counts)])
    starts = np.stack([np.zeros(len(changes), np.int64), length[changes] // 2], 1).ravel()
    run_tasks = np.stack([task_code[changes], (task_code[changes] + 1) % 16], 1).ravel()
    runs = pa.StructArray.from_arrays([pa.array(starts, pa.int64()), pa.array([tasks[t] for t in run_tasks])],
                                      names=["start", "task"])
    names = [*_VIDEOS, *_ARRAYS]
    k = len(names)
    sizes = np.stack([length * 9000, length * 4000, length * _DIM * 4 + 128, length * _DIM * 4 + 128], 1)
    member_sizes = np.concatenate([sizes, np.full((n, 1), 200)], 1)  # + meta.json
    offsets = np.cumsum(member_sizes + 512, axis=1) - member_sizes  # each member after its 512-byte header
    within = offsets - offsets[:, :1] + 512
    ends = np.zeros(len(shard_names), np.int64)
    np.maximum.at(ends, shard_of, (within + member_sizes).max(axis=1))
    stamps = {}
    for name, end in zip(shard_names, ends.tolist()):
        path = root / name
        with open(path, "wb") as f:
            f.truncate(end)  # sparse: as long as the members the index places in it, no disk blocks
        stamps[name] = os.stat(path).st_mtime_ns
    key = ids.to_numpy(zero_copy_only=False)
    ext = [".mp4", ".mp4", ".npy", ".npy"]
    member = _strings(f"{key[i]}.{names[j]}{ext[j]}" for i in range(n) for j in range(k))
    shapes = [[224, 224, 3], [224, 224, 3], [_DIM], [_DIM]]
    shape_flat = np.tile(np.concatenate([np.asarray(s, np.int64) for s in shapes]), n)
    shape_offsets = np.concatenate([[0], np.cumsum(np.tile([len(s) for s in shapes], n))])
    features = pa.StructArray.from_arrays(
        [_strings(names * n), _strings(["video", "video", "array", "array"] * n),
         _strings(["uint8", "uint8", "float32", "float32"] * n),
         _lists(shape_offsets, pa.array(shape_flat, pa.int64())), pa.array(np.full(n * k, 15.0)),
         pa.array(np.repeat(length, k)), member, pa.array(within[:, :k].ravel()), pa.array(sizes.ravel())],
        fields=list(INDEX_SCHEMA.field("features").type.value_type))
    members = pa.StructArray.from_arrays(
        [_strings(f"{key[i]}.{m}" for i in range(n) for m in [*(f"{a}{b}" for a, b in zip(names, ext)),
                                                               "meta.json"]),
         pa.array(within.ravel()), pa.array(member_sizes.ravel())], names=["name", "offset", "size"])
    stat_rows = n * len(_ARRAYS)
    per = np.full(stat_rows * _DIM, 0.5)
    vec = _lists(np.arange(0, stat_rows * _DIM + 1, _DIM), pa.array(per))
    stats = pa.StructArray.from_arrays([_strings(list(_ARRAYS) * n), pa.array(np.repeat(length, 2) * 1.0),
                                        vec, vec, vec, vec],
                                       fields=list(INDEX_SCHEMA.field("stats").type.value_type))
    table = pa.Table.from_arrays(
        [ids, shards, pa.array(length), pa.array(np.full(n, 15.0)), task, _lists(run_offsets, runs),
         _lists(np.arange(0, n * k + 1, k), features), _lists(np.arange(0, n * (k + 1) + 1, k + 1), members),
         _lists(np.arange(0, stat_rows + 1, 2), stats), pa.array(ends[shard_of]),
         pa.array([stamps[shard_names[s]] for s in shard_of], pa.int64())], schema=INDEX_SCHEMA)
    merged = {f: {"count": np.float64(length.sum()), "mean": np.full(_DIM, 0.5), "m2": np.full(_DIM, 1.0),
                  "min": np.zeros(_DIM), "max": np.ones(_DIM)} for f in _ARRAYS}
    info = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "stats": _stats.to_json(merged)}
    table = table.replace_schema_metadata({"mmfeed": json.dumps(info, sort_keys=True)})
    path = root / INDEX_FILENAME
    pq.write_table(table, path)
    return str(path)
