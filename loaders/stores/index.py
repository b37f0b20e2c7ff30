"""Index v2 of webdataset episode shards: every feature of every episode, where its bytes lie, and its stats.

An episode is one tar member group with key ``<episode id>``: ``<key>.<feature>.npy`` (any dtype and shape,
steps first) or ``<key>.<feature>.mp4`` per feature, and ``<key>.meta.json`` (``fps`` of the control clock,
``length`` in steps, ``task``, optional ``rates`` {feature: fps} and, for an episode whose task changes,
``task_runs`` ``[[first step, task], ...]``; :class:`~mmfeed.loaders.conversion.writer.ShardWriter`
adds ``features`` {name: {kind, dtype, shape, frames, stats}}, so indexing its shards reads only tar headers,
meta.json and npy headers). Member names split as in :func:`~mmfeed.loaders.transport.tar.split_member`. First-version
shards (meta.json ``cameras`` / ``camera_fps``; ``<cam>.mp4``, ``proprio.npy``, ``action.npy``) index the same way, as
features ``proprio``, ``action`` and one per camera at its ``camera_fps``; their videos are probed, their arrays read.

    >>> table = read_shard_index("shards/" + INDEX_FILENAME)                                    # doctest: +SKIP
    >>> state = feature_columns(table)["observation.state"]                                     # doctest: +SKIP
    >>> shard = resolve_shard("shards/" + INDEX_FILENAME, table["shard"][0].as_py())             # doctest: +SKIP
    >>> raw = tar.read_member(shard, state["offset"][0], state["size"][0])                           # doctest: +SKIP

Schema: one row per episode, in shard order then tar order (``INDEX_VERSION`` counts incompatible changes).

============== ================================================ ===============================================
column         type                                             meaning
============== ================================================ ===============================================
episode_id     string                                           the webdataset key
shard          string                                           path relative to the index's directory (posix;
                                                                inside it: no ``..``, no link out, no other URL)
length, fps    int64, float64                                   steps and rate of the control clock
task           string                                           task text ("" where meta.json has none)
task_runs      list<struct<start: int64, task: string>>         where the task changes within the episode: each
                                                                run's first step and text (empty otherwise;
                                                                indexes written before it read as empty)
features       list<struct<name, kind, dtype: string, shape:    per feature, in tar order: "video" or "array",
               list<int64>, fps: float64, frames: int64,        element dtype, step shape (video ``[H, W, 3]``),
               member: string, offset, size: int64>>            rate, frame count, and its member's data bytes
members        list<struct<name: string, offset, size: int64>>  every member in tar order, meta.json included
stats          list<struct<name: string, count: float64, mean,  per numeric array feature, its partials over
               m2, min, max: list<float64>>>                    the episode (flattened step shape; they merge
                                                                exactly, :mod:`.stats`), read vectorized
shard_size     int64                                            bytes of the shard when indexed
shard_mtime_ns int64 (null when unknown)                        its modification time when indexed
============== ================================================ ===============================================

The schema metadata key ``b"mmfeed"`` holds ``{"format", "version", "stats"}``, ``stats`` being all episodes'
partials merged (opening never re-merges; :func:`dataset_stats`), and, for an index built with
``quantiles=True``, ``quantiles`` {feature: {"q01", "q10", "q50", "q90", "q99"}} of every numeric array feature
from a mergeable sketch (:mod:`.quantiles`: within 1% of ``np.quantile``). Equal shards (bytes, size, mtime; or
bytes and size with ``record_mtime=False``) give a byte-identical index file.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mmfeed.codecs.arrays import MAX_HEADER_BYTES, check_npy_size, load_npy
from mmfeed.codecs.demux import probe
from mmfeed.codecs.errors import DecodeError
from mmfeed.loaders.stores import stats as _stats
from mmfeed.loaders.transport.confine import UnsafePathError, check_shards, shard_outside, shorten
from mmfeed.loaders.transport.json_limits import check_json, check_json_size
from mmfeed.loaders.stores.quantiles import MAX_ELEMENTS, Sketch
from mmfeed.loaders.transport.tar import extract, member_groups, open_file, parse_meta, stat_file
from mmfeed.packing.windows import check_stream_frames

__all__ = ["INDEX_FILENAME", "INDEX_SCHEMA", "INDEX_VERSION", "VIDEO_EXTENSIONS", "build_index", "dataset_stats",
           "default_index_path", "feature_columns", "index_version", "read_shard_index", "resolve_shard",
           "stale_shards", "write_index"]

INDEX_FILENAME = "mmfeed-index.parquet"
"""Default file name of the index, written beside the shards."""

INDEX_VERSION = 2
"""Version of the index schema; bumped on incompatible changes (version 1 listed cameras, proprio and action)."""

VIDEO_EXTENSIONS = ("mp4", "mkv", "webm")
"""Member extensions read as video features (``npy`` members are array features; others are only listed)."""

INDEX_FORMAT = "mmfeed-webdataset-index"
"""The ``format`` an index records in its schema metadata (with its ``version``)."""
_PARTIAL = ("count", "mean", "m2", "min", "max")
_INT_LIST = pa.list_(pa.field("element", pa.int64()))  # "element": the list field name parquet round-trips
_FLOATS = pa.list_(pa.field("element", pa.float64()))
_STAT = pa.struct([("name", pa.string()), ("count", pa.float64())] + [(k, _FLOATS) for k in _PARTIAL[1:]])
_RUN = pa.struct([("start", pa.int64()), ("task", pa.string())])
_MEMBER = pa.struct([("name", pa.string()), ("offset", pa.int64()), ("size", pa.int64())])
_FEATURE = pa.struct([("name", pa.string()), ("kind", pa.string()), ("dtype", pa.string()), ("shape", _INT_LIST),
                      ("fps", pa.float64()), ("frames", pa.int64()), ("member", pa.string()),
                      ("offset", pa.int64()), ("size", pa.int64())])

INDEX_SCHEMA = pa.schema(
    [("episode_id", pa.string()), ("shard", pa.string()), ("length", pa.int64()), ("fps", pa.float64()),
     ("task", pa.string()), ("task_runs", pa.list_(pa.field("element", _RUN))),
     ("features", pa.list_(pa.field("element", _FEATURE))),
     ("members", pa.list_(pa.field("element", _MEMBER))), ("stats", pa.list_(pa.field("element", _STAT))),
     ("shard_size", pa.int64()), ("shard_mtime_ns", pa.int64())],
    metadata={"mmfeed": json.dumps({"format": INDEX_FORMAT, "version": INDEX_VERSION})},
)
"""The arrow schema of every index table (see the module docstring); built tables add ``stats`` to the metadata."""


def build_index(shards: Sequence[str | os.PathLike] | str | os.PathLike, root: str | os.PathLike | None = None, *,
                quantiles: bool = False, record_mtime: bool = True,
                progress: Callable[[int], object] | None = None) -> pa.Table:
    """Index ``shards`` (local paths or fsspec URLs of uncompressed ``.tar`` files) into one table.

    ``root`` is the directory the ``shard`` column is relative to (default: the first shard's). ``quantiles``
    also reads every numeric array member into a mergeable sketch and stores the dataset's quantiles in the
    metadata (:func:`dataset_stats` returns them); ``record_mtime=False`` leaves ``shard_mtime_ns`` null, so
    equal shards give an equal index whenever they were written (staleness is then judged by size). Raises ValueError
    naming the shard, key and member for a missing or malformed meta.json, an unreadable npy or mp4 member, an
    array at the control clock without one row per step, a stream more than one frame short of what the episode's
    span implies (:func:`~mmfeed.packing.windows.fewest_frames`; a stream up to one frame short, or longer, is
    indexed with the frames it holds), an episode id seen twice, or a feature whose kind, dtype or shape differs between
    two episodes. ``progress(1)`` is called as each shard is indexed (e.g. a tqdm bar's ``update``).
    """
    shards = _paths(shards)
    root = os.fspath(root) if root is not None else _dirname(shards[0])
    rows: dict[str, list[Any]] = {name: [] for name in INDEX_SCHEMA.names}
    partials: list[dict[str, dict[str, np.ndarray]]] = []
    sketches: dict[str, Sketch] | None = {} if quantiles else None
    seen: dict[str, str] = {}
    for shard in shards:
        size, mtime_ns = stat_file(shard)
        mtime_ns = mtime_ns if record_mtime else None
        for key, group, tar in member_groups(shard):
            if key in seen:
                raise ValueError(f"episode id {key!r} appears twice: in {seen[key]!r} and in {shard!r}; episode ids "
                                 "must be unique across all shards of one index")
            seen[key] = shard
            entries = [(n, i.offset_data, i.size) for n, i in group]
            infos = dict(group)
            _add_row(rows, partials, shard, key, entries, lambda n: extract(tar, infos[n]), size, mtime_ns,
                     sketches)
        if progress is not None:
            progress(1)
    return _finish(rows, partials, root, sketches)


def memory_table(name: str, episodes: Sequence[tuple[str, Mapping[str, bytes]]]) -> pa.Table:
    """The index table of episodes held in memory as ``(key, {member name after the key: bytes})`` (what
    :func:`~mmfeed.loaders.transport.tar.iter_shard` yields), every member at offset 0 of its own bytes: how a stream
    reads the episodes it holds with the very reader that reads indexed shards."""
    rows: dict[str, list[Any]] = {n: [] for n in INDEX_SCHEMA.names}
    partials: list[dict[str, dict[str, np.ndarray]]] = []
    for key, members in episodes:
        entries = [(n, 0, len(b)) for n, b in members.items()]
        _add_row(rows, partials, name, key, entries, lambda n: io.BytesIO(members[n]), None, None)
    return _finish(rows, partials, None)


def _add_row(rows: dict, partials: list, shard: str, key: str, entries: list[tuple[str, int, int]],
             open_member, size: int | None, mtime_ns: int | None, sketches: dict[str, Sketch] | None = None) -> None:
    meta, features, parts = _episode(shard, key, entries, open_member)
    row = {"episode_id": key, "shard": shard, "length": meta["length"], "fps": float(meta["fps"]),
           "task": meta["task"], "task_runs": [{"start": a, "task": t} for a, t in meta.get("task_runs", [])],
           "features": features,
           "members": [{"name": n, "offset": o, "size": k} for n, o, k in entries],
           "stats": [{"name": f, "count": float(p["count"]), **{k: np.ravel(p[k]).tolist() for k in _PARTIAL[1:]}}
                     for f, p in parts.items()],
           "shard_size": size, "shard_mtime_ns": mtime_ns}
    for name, value in row.items():
        rows[name].append(value)
    partials.append(parts)
    for f in features if sketches is not None else ():
        if f["name"] in parts and int(np.prod(f["shape"])) <= MAX_ELEMENTS:
            values = load_npy(open_member(f["member"]).read(), key=f"{shard!r} key {key!r} member {f['member']}")
            sketches.setdefault(f["name"], Sketch(tuple(f["shape"]))).add(values)


def _finish(rows: dict, partials: list, root: str | None, sketches: dict[str, Sketch] | None = None) -> pa.Table:
    """The table of ``rows``, its features checked, shards relative to ``root``, the merged stats in its metadata."""
    table = pa.Table.from_pydict(rows, schema=INDEX_SCHEMA)
    feature_columns(table)  # every episode has every feature, with one kind, dtype and shape (errors name shards)
    if root is not None:
        relative = pa.array([_relative(s, root) for s in rows["shard"]], pa.string())
        table = table.set_column(INDEX_SCHEMA.get_field_index("shard"), INDEX_SCHEMA.field("shard"), relative)
    merged = {f: _stats.merge(p[f] for p in partials) for f in (partials[0] if partials else {})}
    info = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "stats": _stats.to_json(merged)}
    if sketches is not None:
        info["quantiles"] = _stats.to_json({f: s.quantiles(merged[f]["min"], merged[f]["max"])
                                            for f, s in sketches.items() if f in merged})
    return table.replace_schema_metadata({"mmfeed": json.dumps(info, sort_keys=True)})


def write_index(shards: Sequence[str | os.PathLike] | str | os.PathLike, path: str | os.PathLike | None = None,
                *, quantiles: bool = False, record_mtime: bool = True,
                progress: Callable[[int], object] | None = None) -> str:
    """Build the index of ``shards`` and write it as parquet at ``path`` (default: :func:`default_index_path`);
    return the path. The ``shard`` column is relative to the directory of ``path``; ``quantiles``,
    ``record_mtime`` and ``progress`` as in :func:`build_index`."""
    path = os.fspath(path) if path is not None else default_index_path(shards)
    table = build_index(shards, root=_dirname(path), quantiles=quantiles, record_mtime=record_mtime,
                        progress=progress)
    for shard in pc.unique(table["shard"]).to_pylist():  # what reading accepts (confine.shard_outside)
        reason = shard_outside(path, shard)
        if reason is not None:
            raise UnsafePathError(f"{path}: shard {shorten(shard)} lies outside the index's folder ({reason}); an "
                                  "index is read only with its shards inside its own folder: write it into a folder "
                                  "that holds every shard (mmfeed index -o)")
    with open_file(path, "wb") as f:
        pq.write_table(table, f)
    return path


def default_index_path(shards: Sequence[str | os.PathLike] | str | os.PathLike) -> str:
    """Where the index of ``shards`` lives by default: :data:`INDEX_FILENAME` in the first shard's directory."""
    return _join(_dirname(_paths(shards)[0]), INDEX_FILENAME)


def index_version(path: str | os.PathLike) -> int | None:
    """The ``INDEX_VERSION`` an index file was written with, or None when it is not an mmfeed index."""
    with open_file(os.fspath(path)) as f:
        metadata = pq.read_schema(f).metadata or {}
    if b"mmfeed" in metadata:
        check_json(metadata[b"mmfeed"], f"{os.fspath(path)}: its schema metadata")
    try:
        info = json.loads(metadata[b"mmfeed"])
        return int(info["version"]) if info.get("format") == INDEX_FORMAT else None
    except (KeyError, ValueError, TypeError, AttributeError):
        return None


def read_shard_index(path: str | os.PathLike) -> pa.Table:
    """Read an index written by :func:`write_index`. ValueError for other parquet files and for indexes of
    another version (version 1 files are refused with the command that rebuilds them)."""
    path = os.fspath(path)
    version = index_version(path)
    if version != INDEX_VERSION:
        what = "is not an mmfeed shard index" if version is None else f"is an mmfeed index of version {version}"
        raise ValueError(f"{path!r} {what}; this mmfeed reads version {INDEX_VERSION} (features by name, with "
                         f"stats): rebuild it with `mmfeed index SHARDS`")
    with open_file(path) as f:
        table = pq.read_table(f)
    if "task_runs" not in table.column_names:  # written before episodes could change task: none does
        runs = pa.array([[]] * table.num_rows, INDEX_SCHEMA.field("task_runs").type)
        table = table.append_column(INDEX_SCHEMA.field("task_runs"), runs)
    missing = [name for name in INDEX_SCHEMA.names if name not in table.column_names]
    if missing:
        raise ValueError(f"{path!r} lacks index columns {missing}; rebuild it with `mmfeed index SHARDS`")
    return check_required(table, path).select(INDEX_SCHEMA.names)


def check_required(table: pa.Table, path: str) -> pa.Table:
    """``table`` (an index read from ``path``), after checking that every row names its episode, shard and length
    (a rate and a shard's stamp may be null); ValueError naming the index, the column and the row otherwise."""
    for name in ("episode_id", "shard", "length"):
        if table[name].null_count:
            row = int(np.flatnonzero(table[name].is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{path}: column {name!r} is empty (null) in row {row}; rebuild the index with "
                             "`mmfeed index SHARDS`")
    return table


def feature_columns(table: pa.Table, *, arrow_members: bool = False) -> dict[str, dict[str, Any]]:
    """Each feature of an index table as columns over its episodes, in the order features first appear:
    ``{name: {"kind", "dtype", "shape" (of the first episode), "fps", "frames", "offset", "size" (numpy [E]),
    "member" (object [E], or Arrow strings with ``arrow_members``)}}``. Vectorized, so 1e5 episodes take
    milliseconds. ValueError naming two episodes (shard and key) when a feature is missing from one or differs
    in kind, dtype or step shape."""
    n = table.num_rows
    if n == 0:
        return {}
    flat, row, groups = _by_name(table, "features")

    def where(r) -> str:
        return f"{table['shard'][int(r)].as_py()} key {shorten(table['episode_id'][int(r)].as_py())}"

    for field, values in (*flat.items(), ("shape", flat["shape"].flatten())):  # empty (null) values: no numbers
        if field != "member" and values.null_count:
            i = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            if values is not flat.get(field):  # a dimension inside a shape: the entry it belongs to
                i = int(pc.list_parent_indices(flat["shape"]).to_numpy()[i])
            raise ValueError(f"{where(row[i])}: a feature's {field} is empty (null) in the index; rebuild it with "
                             "`mmfeed index`")
    (kinds, kind_of), (dtypes, dtype_of) = (_codes(flat[k]) for k in ("kind", "dtype"))
    ndim = pc.list_value_length(flat["shape"]).to_numpy(zero_copy_only=False)
    dims = flat["shape"].flatten().to_numpy()
    starts = np.cumsum(ndim) - ndim

    def desc(i) -> str:
        dtype = dtype_of[dtypes[i]]
        dtype = dtype if len(dtype) <= 40 else shorten(dtype, 40)  # a hostile index's dtype, never whole
        return f"{kind_of[kinds[i]]} {dtype} {dims[starts[i]:starts[i] + ndim[i]].tolist()}"

    out = {}
    for name, idx in groups:
        counts = np.bincount(row[idx], minlength=n)
        if (counts != 1).any():
            bad = int(np.flatnonzero(counts != 1)[0])
            how = "does not have" if counts[bad] == 0 else "has twice"
            raise ValueError(f"{where(bad)} {how} feature {name!r}, which {where(row[idx[0]])} has once; every "
                             "episode needs every feature")
        d = int(ndim[idx[0]])
        same = (kinds[idx] == kinds[idx[0]]) & (dtypes[idx] == dtypes[idx[0]]) & (ndim[idx] == d)
        shapes = dims[np.minimum(starts[idx][:, None] + np.arange(d), max(len(dims) - 1, 0))] if d else None
        if d:
            same &= (shapes == shapes[0]).all(axis=1)
        if not same.all():
            a, b = idx[0], idx[int(np.flatnonzero(~same)[0])]
            raise ValueError(f"feature {name!r} is {desc(a)} in {where(row[a])} but {desc(b)} in {where(row[b])}")
        out[name] = {"kind": kind_of[kinds[idx[0]]], "dtype": dtype_of[dtypes[idx[0]]],
                     "shape": tuple(int(s) for s in (shapes[0] if d else ())),
                     **{k: flat[k].take(pa.array(idx)).to_numpy(zero_copy_only=False)
                        for k in ("fps", "frames", "offset", "size", *(() if arrow_members else ("member",)))}}
        if arrow_members:
            out[name]["member"] = flat["member"].take(pa.array(idx))
    return out


def dataset_stats(table: pa.Table, *, from_rows: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """``{feature: {mean, std, min, max, count}}`` of the numeric array features over the table's episodes.

    By default the partials merged at build time, from the schema metadata (no per-row work), with the quantiles
    q01 ... q99 where the index was built with them; ``from_rows`` merges the ``stats`` column instead
    (vectorized over rows; no quantiles), for a table whose rows were selected since: the metadata describes every
    episode the index was built from."""
    info = json.loads((table.schema.metadata or {}).get(b"mmfeed", b"{}"))
    if not from_rows and "stats" in info:
        quantiles = _stats.from_json(info.get("quantiles", {}))
        return {f: {**_stats.finish(p), **quantiles.get(f, {})} for f, p in _stats.from_json(info["stats"]).items()}
    shapes = {f: c["shape"] or (1,) for f, c in feature_columns(table).items()}  # a scalar per step: shape (1,)
    flat, _, groups = _by_name(table, "stats")
    out = {}
    for name, idx in groups:  # all rows at once: n-weighted means, M2 = sum of M2 + n * (mean - total)^2
        take = pa.array(idx)
        n = flat["count"].take(take).to_numpy()
        mean, m2, low, high = (flat[k].take(take).flatten().to_numpy().reshape(len(idx), -1) for k in _PARTIAL[1:])
        total = (n[:, None] * mean).sum(axis=0) / max(n.sum(), 1.0)
        merged = {"mean": total, "m2": (m2 + n[:, None] * (mean - total) ** 2).sum(axis=0),
                  "min": np.fmin.reduce(low, axis=0), "max": np.fmax.reduce(high, axis=0)}
        out[name] = _stats.finish({"count": n.sum(), **{k: v.reshape(shapes[name]) for k, v in merged.items()}})
    return out


def resolve_shard(index_path: str | os.PathLike, shard: str) -> str:
    """The path or URL of ``shard`` (a value of the ``shard`` column) for the index stored at ``index_path``."""
    if "://" in shard or os.path.isabs(shard):
        return shard
    return _join(_dirname(os.fspath(index_path)), shard)


def stale_shards(index_path: str | os.PathLike, table: pa.Table | None = None) -> list[str]:
    """Shards (resolved paths) whose size or mtime differ from what the index recorded, or that are gone;
    ``table``: the index already read from ``index_path`` (else it is read)."""
    table = read_shard_index(index_path) if table is None else table
    check_shards(os.fspath(index_path), pc.unique(table["shard"]).to_pylist())  # nothing stat'ed outside its folder
    recorded = zip(*(table[c].to_pylist() for c in ("shard", "shard_size", "shard_mtime_ns")))
    return changed_shards(index_path, dict.fromkeys(recorded))


def changed_shards(index_path: str | os.PathLike, recorded: Iterable[tuple[str, int | None, int | None]]
                   ) -> list[str]:
    """The shards (resolved paths) among ``recorded`` ``(shard, size, mtime_ns)`` whose size or mtime differ now,
    or that are gone (an mtime of None, recorded or now, is not compared)."""
    stale = []
    for shard, size, mtime in recorded:
        path = resolve_shard(index_path, shard)
        try:
            now_size, now_mtime = stat_file(path)
        except FileNotFoundError:
            now_size, now_mtime = None, None
        if now_size != size or (None not in (mtime, now_mtime) and now_mtime != mtime):
            stale.append(path)
    return stale


def _episode(shard: str, key: str, entries: list[tuple[str, int, int]], open_member
             ) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, dict[str, np.ndarray]]]:
    """meta, feature rows and stats partials of one episode (members ``(name, offset, size)``, opened by
    ``open_member(name)``), from meta.json ``features`` where it has them."""
    names = {n for n, _, _ in entries}
    if "meta.json" not in names:
        raise ValueError(f"episode {key!r} in shard {shard!r} has no {key}.meta.json member; every episode needs one "
                         "with fps, length and task")
    meta_size = next(k for n, _, k in entries if n == "meta.json")
    check_json_size(meta_size, f"{key}.meta.json in shard {shard!r}")  # before reading it
    meta = parse_meta(shard, key, open_member("meta.json").read())
    described, length, fps = meta.get("features", {}), meta["length"], float(meta["fps"])
    features, parts = [], {}
    for member, offset, size in entries:
        feature, _, ext = member.rpartition(".")
        if not feature or ext != "npy" and ext not in VIDEO_EXTENSIONS:
            continue
        where = f"{shard!r} key {key!r} member {key}.{member}"
        if any(f["name"] == feature for f in features):
            raise ValueError(f"{where}: feature {feature!r} has two members in this episode")
        kind, dtype, shape, frames, part = _member_feature(open_member(member), ext, described.get(feature), where,
                                                           size)
        if part is not None:
            parts[feature] = part
        rate = meta["rates"].get(feature, fps)
        if ext == "npy" and feature not in meta["rates"] and frames != length:
            raise ValueError(f"{where}: {frames} rows, but meta.json length is {length}: an array at the control "
                             "clock has one row per step (name its own rate in meta.json rates otherwise)")
        check_stream_frames(frames, length=length, fps=fps, rate=rate, where=f"{where} feature {feature!r}")
        features.append({"name": feature, "kind": kind, "dtype": dtype, "shape": list(shape), "fps": rate,
                         "frames": frames, "member": member, "offset": offset, "size": size})
    named = set(meta["rates"]) | set(described) | set(meta.get("cameras") or [])
    unbacked = sorted(named - {f["name"] for f in features})
    if unbacked:
        raise ValueError(f"{key}.meta.json in shard {shard!r} names features {unbacked} that have no member "
                         f"{key}.<feature>.npy or .mp4 in the shard")
    return meta, features, parts


def _member_feature(f: IO[bytes], ext: str, entry: Mapping | None, where: str, size: int):
    """``(kind, dtype, step shape, frames, stats partial or None)`` of a member of ``size`` bytes: from its
    meta.json ``features`` entry where there is one (an npy header is always read and must agree, and the member
    must be no longer than the header and the array it promises, checked before the array is read), else probed
    or read."""
    said = part = None
    if entry is not None:
        try:
            said = (entry.get("kind", "video" if ext in VIDEO_EXTENSIONS else "array"), str(np.dtype(entry["dtype"])),
                    tuple(int(s) for s in entry["shape"]), int(entry["frames"]), entry.get("stats"))
            part = None if said[4] is None else {k: np.asarray(said[4][k], np.float64) for k in _PARTIAL}
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: meta.json features entry {entry!r} is malformed ({exc!r})") from exc
    if ext in VIDEO_EXTENSIONS:
        if said is None:
            try:
                info = probe(f.read())
            except DecodeError as err:
                raise ValueError(f"{where}: {err}") from err
            return "video", "uint8", (info.height, info.width, 3), info.num_frames, None
        if said[:2] != ("video", "uint8") or len(said[2]) != 3 or said[2][2] != 3:
            raise ValueError(f"{where}: meta.json describes {entry!r}; a video is kind video, uint8 [H, W, 3]")
        return "video", "uint8", said[2], said[3], None
    try:  # the header alone, and the member's size checked against it before the array is read
        dtype, shape, _, _ = check_npy_size(f.read(min(size, 12 + MAX_HEADER_BYTES)), size, key=where)
    except OSError as exc:
        raise ValueError(f"{where}: not .npy bytes: {exc}") from exc
    if dtype.hasobject or not shape:
        raise ValueError(f"{where}: an array feature holds numbers per step [T, ...], got {dtype} {list(shape)}"
                         + (" (object arrays need pickle, which mmfeed never loads)" if dtype.hasobject else ""))
    held = ("array", str(dtype), tuple(shape[1:]), int(shape[0]))
    if said is not None and said[:4] != held:
        raise ValueError(f"{where}: meta.json describes {list(said[:4])} but the member holds {list(held)}")
    if dtype.kind not in "biuf":
        return (*held, None)
    if part is None:
        f.seek(0)
        part = _stats.partial(load_npy(f.read(), key=where))
    return (*held, part)


def _by_name(table: pa.Table, column: str) -> tuple[dict[str, pa.Array], np.ndarray, list[tuple[str, np.ndarray]]]:
    """A ``list<struct<name, ...>>`` column flattened: its fields over all entries, the row of each entry, and
    ``(name, entry indices)`` per name in order of first appearance."""
    chunks = table.column(column)
    values = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()
    row = np.repeat(np.arange(table.num_rows), pc.list_value_length(values).to_numpy(zero_copy_only=False))
    flat = dict(zip([f.name for f in values.type.value_type], values.flatten().flatten()))
    codes, names = _codes(flat["name"])
    return flat, row, [(name, np.flatnonzero(codes == u)) for u, name in enumerate(names)]


def _codes(strings: pa.Array) -> tuple[np.ndarray, list[str]]:
    """Strings as dictionary codes (compared as integers) and the dictionary, in order of first appearance."""
    encoded = pc.dictionary_encode(strings)
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.to_pylist()


def _paths(shards: Iterable[str | os.PathLike] | str | os.PathLike) -> list[str]:
    shards = [os.fspath(s) for s in ([shards] if isinstance(shards, (str, os.PathLike)) else shards)]
    if not shards:
        raise ValueError("shards is empty: pass at least one .tar path or URL")
    return shards


def _join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if "://" in directory else os.path.join(directory, name)


def _dirname(path: str) -> str:
    return posixpath.dirname(path) if "://" in path else os.path.dirname(os.path.abspath(path))


def _relative(shard: str, root: str) -> str:
    if "://" in shard or "://" in root:
        prefix = root.rstrip("/") + "/"
        return shard[len(prefix):] if shard.startswith(prefix) else shard
    return os.path.relpath(os.path.abspath(shard), os.path.abspath(root)).replace(os.sep, "/")
