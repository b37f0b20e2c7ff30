"""The parquet index of webdataset episode shards: what planning needs, and where every byte is, without pixels.

``build_index`` scans tar headers only (Python's ``tarfile``; videos are never decoded, only each episode's small
``meta.json`` member is read), so indexing a terabyte of shards costs one pass over their headers. A worker then
fetches exactly the members it needs with :func:`read_member` (a seek and a read, or an HTTP range request through
fsspec) instead of streaming whole shards::

    >>> index = "shards/" + INDEX_FILENAME                                      # doctest: +SKIP
    >>> row = read_shard_index(index).slice(0, 1).to_pylist()[0]                      # doctest: +SKIP
    >>> m = next(m for m in row["members"] if m["name"] == "proprio.npy")       # doctest: +SKIP
    >>> raw = read_member(resolve_shard(index, row["shard"]), m["offset"], m["size"])  # doctest: +SKIP

Schema (one row per episode, in shard order then tar order; column names are stable, ``INDEX_VERSION`` counts
incompatible changes):

=============== ============================================ ===================================================
column          type                                         meaning
=============== ============================================ ===================================================
episode_id      string                                       the webdataset key (``<key>`` of ``<key>.meta.json``)
shard           string                                       shard path relative to the index's directory
                                                             (posix separators, ``../`` allowed); a remote shard
                                                             outside that directory keeps its full URL
length          int64                                        steps (rows of proprio and action)
fps             float64                                      step rate of proprio and action
task            string                                       task text
cameras         list<string>                                 camera names, as listed in ``meta.json``
camera_fps      list<float64>                                fps of each camera, parallel to ``cameras``
                                                             (``fps`` where meta.json gives no per-stream rate)
members         list<struct<name: string, offset: int64,     every tar member of the episode in tar order:
                size: int64>>                                ``name`` is the part after the key
                                                             (``cam_high.mp4``, ``proprio.npy``, ``meta.json``),
                                                             ``offset`` the byte offset of its data in the shard,
                                                             ``size`` its length in bytes
shard_size      int64                                        size of the shard in bytes when indexed
shard_mtime_ns  int64 (null when unknown)                    modification time of the shard when indexed
=============== ============================================ ===================================================

The index is deterministic: the same shards (same bytes, same size and mtime) give an equal table. The schema
metadata key ``b"mmfeed"`` holds ``{"format": "mmfeed-webdataset-index", "version": INDEX_VERSION}``.
"""

from __future__ import annotations

import json
import os
import posixpath
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

INDEX_FILENAME = "mmfeed-index.parquet"
"""Default file name of the index, written beside the shards."""

INDEX_VERSION = 1
"""Version of the index schema; bumped on incompatible changes."""

_MEMBER = pa.struct([("name", pa.string()), ("offset", pa.int64()), ("size", pa.int64())])

INDEX_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("shard", pa.string()),
        ("length", pa.int64()),
        ("fps", pa.float64()),
        ("task", pa.string()),
        ("cameras", pa.list_(pa.field("element", pa.string()))),  # "element": the name parquet round-trips
        ("camera_fps", pa.list_(pa.field("element", pa.float64()))),
        ("members", pa.list_(pa.field("element", _MEMBER))),
        ("shard_size", pa.int64()),
        ("shard_mtime_ns", pa.int64()),
    ],
    metadata={"mmfeed": json.dumps({"format": "mmfeed-webdataset-index", "version": INDEX_VERSION})},
)
"""The arrow schema of every index table (see the module docstring)."""

_REQUIRED_META = ("fps", "length", "task", "cameras")


def build_index(shards: Sequence[str | os.PathLike], *, root: str | os.PathLike | None = None) -> pa.Table:
    """Index ``shards`` (local paths or fsspec URLs of uncompressed ``.tar`` files) into one table.

    ``root`` is the directory the ``shard`` column is relative to: the index's own directory (default: the
    directory of the first shard). Raises ValueError naming the shard and key for a missing or malformed
    ``meta.json``, a camera without its ``.mp4`` member, or an episode id seen twice.
    """
    shards = [os.fspath(s) for s in _as_list(shards)]
    if not shards:
        raise ValueError("shards is empty: pass at least one .tar path or URL")
    root = os.fspath(root) if root is not None else _dirname(shards[0])
    rows: dict[str, list[Any]] = {name: [] for name in INDEX_SCHEMA.names}
    seen: dict[str, str] = {}
    for shard in shards:
        size, mtime_ns = _stat(shard)
        for key, members, meta in _scan_shard(shard):
            if key in seen:
                raise ValueError(
                    f"episode id {key!r} appears twice: in {seen[key]!r} and in {shard!r}; episode ids must be "
                    "unique across all shards of one index"
                )
            seen[key] = shard
            cameras, camera_fps = camera_fields(shard, key, meta, {m["name"] for m in members})
            rows["episode_id"].append(key)
            rows["shard"].append(_relative(shard, root))
            rows["length"].append(int(meta["length"]))
            rows["fps"].append(float(meta["fps"]))
            rows["task"].append(str(meta["task"]))
            rows["cameras"].append(cameras)
            rows["camera_fps"].append(camera_fps)
            rows["members"].append(members)
            rows["shard_size"].append(size)
            rows["shard_mtime_ns"].append(mtime_ns)
    return pa.Table.from_pydict(rows, schema=INDEX_SCHEMA)


def write_index(shards: Sequence[str | os.PathLike], path: str | os.PathLike | None = None) -> str:
    """Build the index of ``shards`` and write it as parquet; return its path.

    ``path`` defaults to ``<directory of the first shard>/mmfeed-index.parquet`` (:data:`INDEX_FILENAME`);
    the ``shard`` column is stored relative to the directory of ``path``.
    """
    shards = [os.fspath(s) for s in _as_list(shards)]
    if not shards:
        raise ValueError("shards is empty: pass at least one .tar path or URL")
    path = os.fspath(path) if path is not None else _join(_dirname(shards[0]), INDEX_FILENAME)
    table = build_index(shards, root=_dirname(path))
    if "://" in path:
        import fsspec

        with fsspec.open(path, "wb") as f:
            pq.write_table(table, f)
    else:
        pq.write_table(table, path)
    return path


def read_shard_index(path: str | os.PathLike) -> pa.Table:
    """Read an index written by :func:`write_index`; ValueError if the file is not an mmfeed index."""
    path = os.fspath(path)
    if "://" in path:
        import fsspec

        with fsspec.open(path, "rb") as f:
            table = pq.read_table(f)
    else:
        table = pq.read_table(path)
    missing = [name for name in INDEX_SCHEMA.names if name not in table.column_names]
    if missing:
        raise ValueError(f"{path!r} is not an mmfeed shard index: columns {missing} are missing; rebuild it with "
                         "`mmfeed index SHARDS`")
    return table.select(INDEX_SCHEMA.names)


def resolve_shard(index_path: str | os.PathLike, shard: str) -> str:
    """The path or URL of ``shard`` (a value of the ``shard`` column) for the index stored at ``index_path``."""
    if "://" in shard or os.path.isabs(shard):
        return shard
    return _join(_dirname(os.fspath(index_path)), shard)


def stale_shards(index_path: str | os.PathLike) -> list[str]:
    """Shards (resolved paths) whose size or mtime differ from what the index recorded, or that are gone."""
    table = read_shard_index(index_path)
    recorded = {}
    for shard, size, mtime in zip(
        table.column("shard").to_pylist(),
        table.column("shard_size").to_pylist(),
        table.column("shard_mtime_ns").to_pylist(),
    ):
        recorded[shard] = (size, mtime)
    stale = []
    for shard, (size, mtime) in recorded.items():
        path = resolve_shard(index_path, shard)
        try:
            now = _stat(path)
        except FileNotFoundError:
            stale.append(path)
            continue
        if now[0] != size or (mtime is not None and now[1] is not None and now[1] != mtime):
            stale.append(path)
    return stale


def read_member(shard_path: str | os.PathLike, offset: int, size: int) -> bytes:
    """The ``size`` bytes at ``offset`` of a shard: one member's data, by a seek and a read (range request for URLs).

    Raises ValueError when offset or size is negative or the shard ends before ``offset + size``.
    """
    shard_path = os.fspath(shard_path)
    offset, size = int(offset), int(size)
    if offset < 0 or size < 0:
        raise ValueError(f"offset {offset} and size {size} must be >= 0 (reading {shard_path!r})")
    if "://" in shard_path and not shard_path.startswith("file://"):
        from mmfeed.loaders.remote import read_range  # range requests through a bounded block cache

        data = read_range(shard_path, offset, size)
    else:
        with _open(shard_path) as f:
            f.seek(offset)
            data = f.read(size)
    if len(data) != size:
        raise ValueError(
            f"{shard_path!r} ends before byte {offset + size} (got {len(data)} of {size} bytes at offset {offset}): "
            "the shard is truncated or the index is out of date; rebuild it with `mmfeed index`"
        )
    return data


# ---------------------------------------------------------------------------------------------------------------


def _scan_shard(shard: str) -> Iterator[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    """Yield ``(key, members, meta)`` per episode of one shard, in tar order, reading only meta.json data."""
    with _open(shard) as f:
        try:
            tar = tarfile.open(fileobj=f, mode="r:")
        except tarfile.TarError as exc:
            raise ValueError(f"{shard!r} is not a readable uncompressed tar file: {exc}") from exc
        groups: dict[str, list[dict[str, Any]]] = {}
        metas: dict[str, bytes] = {}
        size = _stat(shard)[0]
        with tar:
            try:
                for info in tar:
                    if not info.isfile():
                        continue
                    if size is not None and info.offset_data + info.size > size:
                        raise ValueError(f"{shard!r} is truncated: member {info.name!r} needs bytes up to "
                                         f"{info.offset_data + info.size} but the file has {size}")
                    key, name = _split_name(info.name)
                    if key is None:
                        continue  # webdataset skips names without an extension too
                    groups.setdefault(key, []).append({"name": name, "offset": info.offset_data, "size": info.size})
                    if name == "meta.json":
                        extracted = tar.extractfile(info)
                        assert extracted is not None  # a regular file always extracts
                        metas[key] = extracted.read()
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise ValueError(f"{shard!r} is not a readable uncompressed tar file (truncated or corrupt): "
                                 f"{exc}") from exc
    for key, members in groups.items():
        if key not in metas:
            raise ValueError(
                f"episode {key!r} in shard {shard!r} has no {key}.meta.json member; every episode needs one with "
                f"fields {list(_REQUIRED_META)}"
            )
        yield key, members, parse_meta(shard, key, metas[key])


def parse_meta(shard: str, key: str, raw: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{key}.meta.json in shard {shard!r} is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"{key}.meta.json in shard {shard!r} must hold a JSON object, got {type(meta).__name__}")
    missing = [field for field in _REQUIRED_META if field not in meta]
    if missing:
        raise ValueError(f"{key}.meta.json in shard {shard!r} lacks fields {missing}; it needs {list(_REQUIRED_META)}")
    length, fps = meta["length"], meta["fps"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"{key}.meta.json in shard {shard!r}: length must be an integer >= 0, got {length!r}")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
        raise ValueError(f"{key}.meta.json in shard {shard!r}: fps must be a number > 0, got {fps!r}")
    cameras = meta["cameras"]
    if not isinstance(cameras, list) or not all(isinstance(c, str) for c in cameras):
        raise ValueError(f"{key}.meta.json in shard {shard!r}: cameras must be a list of names, got {cameras!r}")
    return meta


def _camera_fps_of(shard: str, key: str, meta: dict[str, Any]) -> dict[str, Any]:
    per_stream = meta.get("camera_fps") or {}
    if not isinstance(per_stream, dict):
        raise ValueError(f"{key}.meta.json in shard {shard!r}: camera_fps must map camera -> fps, got {per_stream!r}")
    return per_stream


def camera_fields(shard: str, key: str, meta: dict[str, Any], names: set[str]) -> tuple[list[str], list[float]]:
    cameras = list(meta["cameras"])
    per_stream = _camera_fps_of(shard, key, meta)
    rates = []
    for camera in cameras:
        if f"{camera}.mp4" not in names:
            raise ValueError(
                f"episode {key!r} in shard {shard!r} lists camera {camera!r} but has no {key}.{camera}.mp4 member"
            )
        rate = per_stream.get(camera, meta["fps"])
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise ValueError(f"{key}.meta.json in shard {shard!r}: camera_fps[{camera!r}] must be > 0, got {rate!r}")
        rates.append(float(rate))
    return cameras, rates


def _split_name(name: str) -> tuple[str | None, str]:
    """webdataset's rule: the key is everything before the first dot of the basename (directories included)."""
    head, base = posixpath.split(name)
    if "." not in base or base.startswith("."):
        return None, ""
    stem, ext = base.split(".", 1)
    return (posixpath.join(head, stem) if head else stem), ext


def _as_list(shards: Iterable[str | os.PathLike] | str | os.PathLike) -> list[str | os.PathLike]:
    if isinstance(shards, (str, os.PathLike)):
        return [shards]
    return list(shards)


def _open(path: str) -> IO[bytes]:
    if "://" in path:
        import fsspec

        return fsspec.open(path, "rb").open()
    return open(path, "rb")


def _stat(path: str) -> tuple[int, int | None]:
    if "://" in path:
        import fsspec

        fs, inner = fsspec.core.url_to_fs(path)
        info = fs.info(inner)
        mtime = info.get("mtime")
        return int(info["size"]), (int(float(mtime) * 1e9) if isinstance(mtime, (int, float)) else None)
    st = os.stat(path)
    return int(st.st_size), int(st.st_mtime_ns)


def _dirname(path: str) -> str:
    return posixpath.dirname(path) if "://" in path else os.path.dirname(os.path.abspath(path))


def _join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if "://" in directory else os.path.join(directory, name)


def _relative(shard: str, root: str) -> str:
    if "://" in shard or "://" in root:
        prefix = root.rstrip("/") + "/"
        return shard[len(prefix):] if shard.startswith(prefix) else shard
    rel = os.path.relpath(os.path.abspath(shard), os.path.abspath(root))
    return rel.replace(os.sep, "/")
