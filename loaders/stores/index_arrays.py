"""The columns of a shard index that reading needs, as flat arrays in one memory-mapped file per node.

A shard index (:mod:`.index`) is a parquet table with a row per episode and nested lists per row (features,
members, stats). Opening it used to turn every row into Python objects: at a million episodes that took ~28 s
and ~3 GB in every process (each DataLoader worker and each rank of a node held its own copy). Instead,
:func:`index_arrays` derives, once, the flat columns a
:class:`~mmfeed.loaders.formats.webdataset.source.WebDatasetSource` reads (episode
ids, shard and task codes, lengths and rates, and per feature its rate, frame count, member name, offset and
size; the task runs where an episode changes task), writes them as an uncompressed Arrow IPC file in the cache
directory, keyed by the index file's path, size and mtime, and memory-maps it. Every later open, in any process
of the node, maps the same file: numeric columns are numpy views of the mapped pages (no copy, shared through
the page cache), strings stay Arrow arrays read one at a time. The per-episode stats partials and member lists
are not read at all (the merged stats sit in the schema metadata).

The cache is ``$MMFEED_CACHE/index`` (default ``~/.cache/mmfeed/index``), or ``cache_dir=``; if it cannot be
written, the arrays are derived in memory and a warning says so. A changed index file gets a new key, so a stale
cache is never read; files are written to a temporary name and renamed, so concurrent ranks race safely.

    >>> arrays = index_arrays("shards/mmfeed-index.parquet")                            # doctest: +SKIP
    >>> arrays.lengths[:3], arrays.features["action"]["offset"][:3]                    # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mmfeed.loaders.stores.index import (INDEX_VERSION, changed_shards, check_required, feature_columns,
                                          index_version, read_shard_index, resolve_shard)
from mmfeed.loaders.transport.tar import open_file, stat_file

__all__ = ["CACHE_VERSION", "IndexArrays", "derive", "index_arrays", "index_cache_dir", "stale"]

log = logging.getLogger(__name__)

CACHE_VERSION = 1
"""Layout version of the cached arrays (part of the cache key)."""

_READ = ["episode_id", "shard", "length", "fps", "task", "task_runs", "features", "shard_size", "shard_mtime_ns"]


def index_cache_dir() -> Path:
    """``$MMFEED_CACHE/index`` (default ``~/.cache/mmfeed/index``)."""
    return Path(os.environ.get("MMFEED_CACHE") or Path.home() / ".cache" / "mmfeed") / "index"


class IndexArrays:
    """The flat columns of one index (see the module docstring); ``path`` is the mapped file, or None.

    Attributes: ``ids`` (Arrow strings ``[E]``), ``shards`` (the ``shard`` column's distinct values, in order),
    ``shard_of``, ``lengths``, ``fps``, ``task_of`` (numpy ``[E]``; -1 where the episode changes task),
    ``tasks`` (distinct task texts, in order of first appearance), ``runs`` (``{episode: (starts, task ids)}``
    for episodes that change task), ``features`` (``{name: {"kind", "dtype", "shape", "fps", "frames", "offset",
    "size", "member"}}``), ``shard_stamps`` (recorded ``(size, mtime_ns)`` per shard) and ``metadata`` (the
    index's ``mmfeed`` schema metadata, with the merged stats).
    """

    def __init__(self, table: pa.Table, path: str | None = None) -> None:
        self.path = path
        self._table = table
        info = json.loads(table.schema.metadata[b"mmfeed-arrays"])
        self.metadata: str = info["metadata"]
        self.shards: list[str] = info["shards"]
        self.shard_stamps: list[tuple[int | None, int | None]] = [tuple(s) for s in info["shard_stamps"]]
        self.tasks: list[str] = info["tasks"]
        column = self._column
        self.ids: pa.Array = column("episode_id")
        self.shard_of, self.lengths, self.fps = (numpy_of(column(c)) for c in ("shard", "length", "fps"))
        self.task_of = numpy_of(column("task"))
        self.runs = _runs(column("task_runs"))
        self.features: dict[str, dict[str, Any]] = {}
        for i, meta in enumerate(info["features"]):
            entry = {k: meta[k] for k in ("kind", "dtype")}
            entry["shape"] = tuple(meta["shape"])
            for key in ("fps", "frames", "offset", "size"):
                entry[key] = numpy_of(column(f"f{i}.{key}"))
            names = f"f{i}.member"  # kept for episodes held in memory only (shards are read by offset)
            entry["member"] = column(names) if names in self._table.column_names else None
            self.features[meta["name"]] = entry

    def _column(self, name: str) -> pa.Array:
        chunks = self._table.column(name)
        return chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()

    def __len__(self) -> int:
        return len(self.lengths)

    def select(self, keep: np.ndarray) -> IndexArrays:
        """The arrays of the episodes where ``keep`` (bool ``[E]``) is true, in memory (not mapped)."""
        return IndexArrays(self._table.filter(pa.array(np.asarray(keep, bool))), None)

    def __reduce__(self):
        # a mapped copy travels as its path: the receiving process maps the same pages instead of a pickled copy
        if self.path is not None:
            return _mapped, (self.path,)
        return IndexArrays, (self._table, None)


def _lengths(lists: pa.Array) -> np.ndarray:
    """The length of each list (0 for a null one), from the offsets when no list is null (``fill_null`` and
    ``to_numpy`` import pandas: 0.4 s of a cold open)."""
    if lists.null_count:
        return numpy_of(pc.list_value_length(lists), fill=0)
    return np.diff(numpy_of(lists.offsets))


def _arrow(values: Any, kind: pa.DataType | None = None) -> pa.Array:
    """A primitive Arrow array over a numpy array's buffer (``pa.array`` imports pandas to ask whether its input
    is a pandas object)."""
    values = np.ascontiguousarray(values, dtype=None if kind is None else kind.to_pandas_dtype())
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def numpy_of(array: pa.Array | pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    """A primitive Arrow array as numpy, read from its buffers (a view of its data buffer; booleans unpacked from
    their bitmap): no copy, and none of the pandas machinery ``to_numpy`` imports (a quarter to half a second of
    a cold open). A chunked array is combined first. Nulls become ``fill`` (the values then int64); without it,
    an array with nulls, like one of another type, goes through ``to_numpy``."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if (array.null_count and fill is None) or not pa.types.is_primitive(array.type):
        return array.to_numpy(zero_copy_only=False)
    n, buffers = len(array), array.buffers()
    if pa.types.is_boolean(array.type):
        values = _bits(buffers[1], array.offset, n)
    else:
        dtype = np.dtype(array.type.to_pandas_dtype())
        values = np.frombuffer(buffers[1], dtype=dtype, count=n, offset=array.offset * dtype.itemsize) if n else \
            np.zeros(0, dtype)
    if array.null_count:
        values = values.astype(np.int64)
        values[~_bits(buffers[0], array.offset, n)] = fill
    return values


def _bits(buffer: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """``n`` bits of an Arrow bitmap from bit ``offset``, as bools."""
    return np.unpackbits(np.frombuffer(buffer, np.uint8), bitorder="little")[offset:offset + n].astype(bool)


def _runs(column: pa.Array) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    counts = _lengths(column)
    changing = np.flatnonzero(counts > 0)
    if not len(changing):
        return {}
    flat = column.flatten()
    starts, codes = numpy_of(flat.field("start")), numpy_of(flat.field("task"))
    offsets = numpy_of(column.offsets)
    return {int(e): (starts[offsets[e]:offsets[e + 1]].astype(np.int64), codes[offsets[e]:offsets[e + 1]]
                     .astype(np.int64)) for e in changing}


def _first_appearance(values: pa.Array) -> tuple[np.ndarray, list[str]]:
    """Dictionary codes of strings (or of a dictionary array) numbered in order of first appearance, and the
    distinct values in that order."""
    encoded = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
    indices = numpy_of(encoded.indices).astype(np.int64)
    used, first = np.unique(indices, return_index=True)
    order = used[np.argsort(first)]
    remap = np.full(len(encoded.dictionary), -1, np.int64)
    remap[order] = np.arange(len(order))
    return remap[indices], encoded.dictionary.take(_arrow(order)).to_pylist()


def derive(table: pa.Table, index_path: str | None = None, *, members: bool = True) -> pa.Table:
    """The flat table of an index table (its features checked, as :func:`.index.feature_columns` does; errors
    name shards resolved against ``index_path`` when given); ``members``: keep each feature's member names."""
    for name in ("length", "fps"):  # an empty (null) value is no number
        if table[name].null_count:
            r = int(np.flatnonzero(table[name].is_null().to_numpy(zero_copy_only=False))[0])
            shard = table["shard"][r].as_py()
            shard = resolve_shard(index_path, shard) if index_path is not None else shard
            raise ValueError(f"{shard} key {table['episode_id'][r].as_py()!r}: its {name} is empty (null) in the "
                             "index; rebuild it with `mmfeed index`")
    try:
        columns = feature_columns(table, arrow_members=True)  # every episode has every feature, one kind, ...
    except ValueError:
        if index_path is None:
            raise
        full = pa.array([resolve_shard(index_path, s) for s in table["shard"].to_pylist()], pa.string())
        feature_columns(table.set_column(table.schema.get_field_index("shard"), "shard", full))
        raise
    if not members:
        for c in columns.values():
            c.pop("member")
    return _assemble(table, columns)


def _assemble(table: pa.Table, columns: Mapping[str, Mapping[str, Any]]) -> pa.Table:
    """The flat table from an index table's episode columns and its feature columns."""
    shard_of, shards = _first_appearance(table["shard"].combine_chunks())
    runs = table["task_runs"].combine_chunks()
    task_of, tasks = _first_appearance(table["task"].combine_chunks())
    run_tasks = runs.flatten().field("task")
    code = {t: i for i, t in enumerate(tasks)}
    run_codes = []
    for t in run_tasks.to_pylist():  # episodes that change task are few: a Python loop over their runs
        run_codes.append(code.setdefault(t, len(code)))
    tasks = list(code)
    changing = _lengths(runs) > 0
    task_of[changing] = -1
    run_struct = pa.StructArray.from_arrays([runs.flatten().field("start"), _arrow(np.asarray(run_codes, np.int64))],
                                            names=["start", "task"])
    arrays = {"episode_id": table["episode_id"].combine_chunks(), "shard": _arrow(shard_of, pa.int32()),
              "length": table["length"].combine_chunks().cast(pa.int64()),
              "fps": table["fps"].combine_chunks().cast(pa.float64()), "task": _arrow(task_of),
              "task_runs": pa.ListArray.from_arrays(runs.offsets, run_struct)}
    meta = []
    for i, (name, c) in enumerate(columns.items()):
        meta.append({"name": name, "kind": c["kind"], "dtype": c["dtype"], "shape": list(c["shape"])})
        for key, kind in (("fps", pa.float64()), ("frames", pa.int64()), ("offset", pa.int64()),
                          ("size", pa.int64())):
            arrays[f"f{i}.{key}"] = _arrow(c[key], kind)
        if "member" in c:
            arrays[f"f{i}.member"] = c["member"]
    first = np.unique(shard_of, return_index=True)[1]
    sizes, mtimes = (table[c].combine_chunks() for c in ("shard_size", "shard_mtime_ns"))
    stamps = [[_int(sizes[int(r)].as_py()), _int(mtimes[int(r)].as_py())] for r in first]
    info = {"version": CACHE_VERSION, "metadata": (table.schema.metadata or {}).get(b"mmfeed", b"{}").decode(),
            "shards": shards, "shard_stamps": stamps, "tasks": tasks, "features": meta}
    out = pa.table(arrays)
    return out.replace_schema_metadata({"mmfeed-arrays": json.dumps(info)})


_LEAVES = ("name", "kind", "dtype", "fps", "frames", "offset", "size")
_DICTIONARY = ["shard", "task", *(f"features.list.element.{k}" for k in ("name", "kind", "dtype"))]


def _read_regular(index_path: str) -> pa.Table | None:
    """The flat table read straight from the parquet leaves a reader needs (no member names, no member lists, no
    stats; strings read as parquet dictionaries), when every episode lists the same features in the same order
    with one kind, dtype and shape each (what :func:`.index.build_index` writes); None otherwise."""
    with open_file(index_path) as f:
        pf = pq.ParquetFile(f, read_dictionary=_DICTIONARY)
        rows = pf.read(columns=[c for c in _READ if c != "features"]).unify_dictionaries()
        leaves = [f"features.list.element.{k}" for k in _LEAVES] + ["features.list.element.shape.list.element"]
        features = pf.read(columns=leaves).unify_dictionaries()["features"].combine_chunks()
    n = rows.num_rows
    counts = _lengths(features)
    k = int(counts[0]) if n else 0
    if n == 0 or k == 0 or (counts != k).any():
        return None
    flat = features.flatten()
    fields = {name: flat.field(name) for name in (*_LEAVES, "shape")}
    if (any(rows[c].null_count for c in ("episode_id", "shard", "length", "fps"))
            or fields["shape"].flatten().null_count
            or any(v.null_count for v in fields.values())):  # empty values: the full reader names them
        return None
    codes = {key: numpy_of(fields[key].indices).reshape(n, k) for key in ("name", "kind", "dtype")}
    if any((c != c[0]).any() for c in codes.values()) or len(set(codes["name"][0].tolist())) != k:
        return None
    ndim = _lengths(fields["shape"]).reshape(n, k)
    dims = numpy_of(fields["shape"].flatten())
    if (ndim != ndim[0]).any() or (dims.reshape(n, -1) != dims[:int(ndim[0].sum())]).any():
        return None
    starts = np.concatenate([[0], np.cumsum(ndim[0])])
    columns = {}
    for j in range(k):
        name = fields["name"].dictionary[int(codes["name"][0, j])].as_py()
        columns[name] = {"kind": fields["kind"].dictionary[int(codes["kind"][0, j])].as_py(),
                         "dtype": fields["dtype"].dictionary[int(codes["dtype"][0, j])].as_py(),
                         "shape": tuple(int(d) for d in dims[starts[j]:starts[j + 1]]),
                         **{key: np.ascontiguousarray(numpy_of(fields[key]).reshape(n, k)[:, j])
                            for key in ("fps", "frames", "offset", "size")}}
    return _assemble(rows, columns)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _mapped(path: str) -> IndexArrays:
    source = pa.memory_map(path, "r")
    return IndexArrays(pa.ipc.open_file(source).read_all(), path)


def _key(index_path: str) -> str:
    size, mtime = stat_file(index_path)
    where = index_path if "://" in index_path else os.path.abspath(index_path)
    text = json.dumps([where, size, mtime, CACHE_VERSION])
    return hashlib.sha1(text.encode()).hexdigest()[:24]


def index_arrays(index_path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> IndexArrays:
    """The flat columns of the index at ``index_path``: mapped from the node's cache, derived and cached on the
    first open (``read_shard_index``'s errors for files that are no index of this version)."""
    index_path = os.fspath(index_path)
    directory = Path(cache_dir) if cache_dir is not None else index_cache_dir()
    cached = directory / f"{_key(index_path)}.arrow"
    if cached.exists():
        try:
            return _mapped(str(cached))
        except (pa.ArrowInvalid, OSError, KeyError, ValueError) as err:  # a torn or foreign file: derive again
            log.warning("%s: unreadable cached index arrays (%s); deriving them again", cached, err)
    with reading_pool():
        table = _read_regular(index_path) if _is_current(index_path) else None
        if table is None:  # an index of another layout (or one this fast path cannot vouch for): the full reader
            table = derive(_read(index_path), index_path, members=False)
        written = _write(table, index_path, cached)
        if written:
            del table  # freed inside the pool, so that its pages go back to the system
    return _mapped(str(cached)) if written else IndexArrays(table)


def _write(table: pa.Table, index_path: str, cached: Path) -> bool:
    """Write ``table`` as the Arrow IPC file ``cached`` (through a temporary name, so concurrent ranks race
    safely); False, with a warning, where it cannot be written."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, prefix=cached.stem, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, cached)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as err:
        log.warning("cannot cache the index arrays of %s in %s (%s): every process derives its own copy",
                    index_path, cached.parent, err)
        return False
    return True


@contextlib.contextmanager
def reading_pool():
    """Arrow's jemalloc pool while the index is read, where this pyarrow has it: the parquet reader's many large
    first allocations cost 2.1-2.3 s of a million-episode read under mimalloc (pyarrow's default) and 0.8-0.9 s
    under jemalloc. Its arenas are made with no decay, so the pages the read frees go back to the system at once
    (with jemalloc's default decay 300-500 MB of freed pages stayed resident after a million-episode read, and
    ``release_unused`` did not return them). The default pool comes back after (the derived table is then written
    out and mapped, and its buffers freed)."""
    if "jemalloc" not in pa.supported_memory_backends():
        yield
        return
    pa.jemalloc_set_decay_ms(0)  # arenas made from now on give freed pages back at once, not after a decay
    previous, pool = pa.default_memory_pool(), pa.jemalloc_memory_pool()
    pa.set_memory_pool(pool)
    try:
        yield
    finally:
        pa.set_memory_pool(previous)
        for used in (pool, previous):
            used.release_unused()


def _is_current(index_path: str) -> bool:
    if index_version(index_path) != INDEX_VERSION:
        return False
    with open_file(index_path) as f:
        return set(_READ) <= set(pq.read_schema(f).names)


def _read(index_path: str) -> pa.Table:
    """The index table with only the columns reading needs (no member lists, no stats partials); an index of
    another version or layout goes through :func:`.index.read_shard_index` (its errors, its fill-ins)."""
    if not _is_current(index_path):
        return read_shard_index(index_path).select(_READ)
    with open_file(index_path) as f:
        return check_required(pq.read_table(f, columns=_READ), index_path)


def stale(index_path: str, arrays: IndexArrays) -> list[str]:
    """Shards (resolved) whose size or mtime differ from what the index recorded, or that are gone."""
    return changed_shards(index_path, [(s, *stamp) for s, stamp in zip(arrays.shards, arrays.shard_stamps)])
