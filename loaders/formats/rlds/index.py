"""The sidecar index of one split of an RLDS dataset: where every record lies, and what planning needs of it.

One scan per shard reads every record once (both CRCs checked, the record checked against features.json:
:func:`~mmfeed.loaders.formats.rlds.metadata.check_record`) and keeps, per episode, its shard, the byte offset
and payload length of its record, its number of steps, the task of every step (``task_key``'s text, as ids into
one list of texts) and, for a record that cannot be read, why; per numeric step feature, its statistics; and
where each feature's value lies inside the record, with its CRC-32C: per key (``Feature`` message) its byte range,
and per picture of every camera its byte range. After that a sample reads only its own values: the few keys it
asks for and its own pictures, each range read checked against the CRC kept for it (a record's own CRC covers
the whole record, which a sample no longer reads); :meth:`episode` and remote datasets still read whole records.

The index is an uncompressed ``.npz`` file (its per-step arrays mapped, not read, when it is loaded) in
``$MMFEED_CACHE/index/rlds`` (default ``~/.cache/mmfeed/index/rlds``), named
by a hash of the version directory, the split, ``task_key``, features.json's and every shard's size and mtime:
a shard that changes gets a new key, so a stale index is never read. It is written to a temporary name and
renamed (ranks race safely); where the cache cannot be written, the index stays in memory and a warning says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mmfeed.loaders.formats.rlds.example import ExampleError, bytes_spans, parse_example
from mmfeed.loaders.formats.rlds.metadata import FEATURES, Leaf, check_record, decode_leaf
from mmfeed.loaders.formats.rlds.tfrecord import TFRecordError, crc32c_spans, scan_records
from mmfeed.loaders.stores import stats as stats_mod
from mmfeed.loaders.stores.frame_store import npy_header
from mmfeed.loaders.stores.index_arrays import index_cache_dir
from mmfeed.loaders.transport.files import DatasetFiles
from mmfeed.loaders.transport.tar import stat_file

__all__ = ["RecordIndex", "record_index"]

log = logging.getLogger(__name__)

INDEX_VERSION = 2


@dataclass
class RecordIndex:
    """Per episode (in file order): ``shard_of``, ``offset`` (of the record's frame; -1 where it cannot be read),
    ``length`` (payload bytes), ``steps``, ``reasons`` (why a record cannot be read, "" where it can); per step
    of every episode back to back, ``task_flat`` (ids into ``tasks``); ``stats`` of the numeric step features;
    ``keys`` (the record keys the features are read from), ``key_span`` int64 ``[E, K, 2]`` (each key's
    ``Feature`` message as byte offsets in the record's payload; ``-1`` where the record cannot be read) and
    ``key_crc`` uint32 ``[E, K]`` (its CRC-32C); per camera, ``pictures[camera]`` uint32 ``[S, 3]`` for every step
    of every episode back to back: its picture's start and stop in the payload and its CRC-32C."""

    shard_of: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    steps: np.ndarray
    reasons: list[str]
    task_flat: np.ndarray
    tasks: list[str]
    stats: dict[str, dict[str, np.ndarray]]
    keys: list[str]
    key_span: np.ndarray
    key_crc: np.ndarray
    pictures: dict[str, np.ndarray]

    def save(self, path: Path) -> None:
        meta = {"reasons": self.reasons, "tasks": self.tasks, "stats": stats_mod.to_json(self.stats),
                "keys": self.keys, "cameras": list(self.pictures)}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, shard_of=self.shard_of, offset=self.offset, length=self.length, steps=self.steps,
                         task_flat=self.task_flat, key_span=self.key_span, key_crc=self.key_crc,
                         meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                         **{f"pictures_{i}": a for i, a in enumerate(self.pictures.values())})
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    @classmethod
    def load(cls, path: Path) -> RecordIndex:
        """The index saved at ``path``; its per-step arrays (every step's task, every picture's range and CRC:
        a GB at DROID's 27 million steps) mapped from the file read-only, not read into the process, so that the
        workers and the ranks of a node share them through the page cache."""
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes())
            names = ["task_flat", *(f"pictures_{i}" for i in range(len(meta["cameras"])))]
            step = {name: _mapped(path, z.zip, name) for name in names}
            return cls(z["shard_of"], z["offset"], z["length"], z["steps"], list(meta["reasons"]), step["task_flat"],
                       list(meta["tasks"]), stats_mod.from_json(meta["stats"]), list(meta["keys"]), z["key_span"],
                       z["key_crc"], {c: step[f"pictures_{i}"] for i, c in enumerate(meta["cameras"])})


MAPPED_BYTES = 1 << 20
"""Step arrays of at least this many bytes are mapped from the index file; smaller ones are read."""


def _mapped(path: Path, archive: zipfile.ZipFile, name: str) -> np.ndarray:
    """Member ``name`` of the uncompressed ``.npz`` at ``path`` as a read-only map of its bytes in the file (read
    whole where it is small, stored compressed or has a header only numpy's own reader takes). The member's header
    and bounds are checked against the file."""
    info = archive.getinfo(f"{name}.npy")

    def whole() -> np.ndarray:
        with archive.open(info) as member:
            return np.lib.format.read_array(member, allow_pickle=False)

    if info.compress_type != zipfile.ZIP_STORED or info.file_size < MAPPED_BYTES:
        return whole()
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise ValueError(f"{path}: member {name!r} has no local header where the archive says")
        name_length, extra_length = int.from_bytes(local[26:28], "little"), int.from_bytes(local[28:30], "little")
        start = info.header_offset + 30 + name_length + extra_length
        f.seek(start)
        header = npy_header(f)
    if header is None:
        return whole()
    shape, fortran, dtype, offset = header
    if fortran or dtype.hasobject or offset - start + dtype.itemsize * int(np.prod(shape)) != info.file_size:
        raise ValueError(f"{path}: member {name!r} does not hold the array its header describes")
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _stamp(files: DatasetFiles, relative: str) -> list | None:
    try:
        return list(stat_file(files.where(relative)))
    except FileNotFoundError:
        return None


def cache_path(files: DatasetFiles, split: str, shards: Sequence[str], task_key: str) -> Path:
    """Where the index of this split, with these shards as they are now, is kept."""
    key = json.dumps([INDEX_VERSION, files.root, split, task_key, _stamp(files, FEATURES),
                      [[s, _stamp(files, s)] for s in shards]])
    return index_cache_dir() / "rlds" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"


def record_index(files: DatasetFiles, split: str, shards: Sequence[str], counts: Sequence[int],
                 leaves: Sequence[Leaf], task_key: str) -> RecordIndex:
    """The index of one split: read from the cache when there, else built by scanning every shard and kept."""
    path = cache_path(files, split, shards, task_key)
    if path.is_file():
        try:
            return RecordIndex.load(path)
        except (OSError, ValueError, KeyError) as err:
            log.warning("%s: unreadable RLDS index (%s); building it again", path, err)
    log.info("%s split %r: indexing %d shard(s) (once; kept in %s)", files.root, split, len(shards), path.parent)
    index = build(files, shards, counts, leaves, task_key)
    try:
        index.save(path)
    except OSError as err:
        log.warning("cannot keep the RLDS index in %s (%s): it is rebuilt each time the dataset opens; set "
                    "MMFEED_CACHE to a writable directory", path.parent, err)
    return index


def build(files: DatasetFiles, shards: Sequence[str], counts: Sequence[int], leaves: Sequence[Leaf],
          task_key: str, threads: int | None = None) -> RecordIndex:
    """Scan every shard (see the module docstring), ``threads`` shards at a time (default up to 8: reads and the
    CRC kernel release the GIL, so remote shards overlap their requests), merged in shard order. A shard that is
    missing, truncated or has a record whose framing is broken keeps, for each episode ``dataset_info.json``
    promises and that cannot be read, a reason; whether that refuses the dataset or skips the episodes is the
    reader's ``errors`` option."""
    task_leaf = next((leaf for leaf in leaves if leaf.level == "step" and leaf.name == task_key
                      and leaf.kind == "text"), None)
    numeric = [leaf for leaf in leaves if leaf.level == "step" and leaf.kind == "tensor"]
    keys = list(dict.fromkeys(leaf.key for leaf in leaves if leaf.kind != "ragged"))
    cameras = [leaf for leaf in leaves if leaf.kind == "image" and leaf.level == "step"]
    threads = min(8, len(shards)) if threads is None else max(1, min(int(threads), len(shards)))

    def scan(s: int) -> _Scanned:
        return _scan_shard(files, shards[s], int(counts[s]), leaves, task_leaf, numeric, keys, cameras)

    if threads > 1:
        with ThreadPoolExecutor(threads, thread_name_prefix="mmfeed-rlds-index") as pool:
            scanned = list(pool.map(scan, range(len(shards))))
    else:
        scanned = [scan(s) for s in range(len(shards))]
    tasks: dict[str, int] = {}
    shard_of, offset, length, steps, reasons, task_parts, spans, crcs = [], [], [], [], [], [], [], []
    pictures: dict[str, list] = {leaf.name: [] for leaf in cameras}
    partials: dict[str, list] = {leaf.name: [] for leaf in numeric}
    for s, part in enumerate(scanned):
        for record in part.records:
            shard_of.append(s)
            offset.append(-1 if record.reason else record.offset)
            length.append(record.length)
            steps.append(record.steps)
            reasons.append(record.reason)
            task_parts.append(np.array([tasks.setdefault(t, len(tasks)) for t in record.texts], np.int32)
                              if record.texts else np.zeros(record.steps, np.int32))
            spans.append(record.spans if record.spans is not None else np.full((len(keys), 2), -1, np.int64))
            crcs.append(record.crcs if record.crcs is not None else np.zeros(len(keys), np.uint32))
            for leaf in cameras:
                pictures[leaf.name].append(record.pictures[leaf.name] if record.pictures else
                                           np.zeros((record.steps, 3), np.uint32))
        for name, parts in part.partials.items():
            partials[name].extend(parts)
    stats = {}
    shapes = {leaf.name: leaf.shape for leaf in numeric}
    for name, parts in partials.items():
        if parts:
            stats[name] = stats_mod.step_shaped({name: stats_mod.finish(stats_mod.merge(parts))}, shapes)[name]
    return RecordIndex(np.asarray(shard_of, np.int32), np.asarray(offset, np.int64), np.asarray(length, np.int64),
                       np.asarray(steps, np.int64), reasons,
                       np.concatenate(task_parts) if task_parts else np.zeros(0, np.int32), list(tasks), stats,
                       keys, np.stack(spans) if spans else np.zeros((0, len(keys), 2), np.int64),
                       np.stack(crcs) if crcs else np.zeros((0, len(keys)), np.uint32),
                       {name: np.concatenate(parts) if parts else np.zeros((0, 3), np.uint32)
                        for name, parts in pictures.items()})


@dataclass
class _Record:
    """One record as the scan found it: where its frame starts, its payload's length, its steps, why it cannot
    be read ("" where it can), its task texts, its keys' spans and CRCs and its cameras' pictures' (None where it
    cannot be read)."""

    offset: int
    length: int
    steps: int = 0
    reason: str = ""
    texts: list = field(default_factory=list)
    spans: np.ndarray | None = None
    crcs: np.ndarray | None = None
    pictures: dict[str, np.ndarray] | None = None


@dataclass
class _Scanned:
    """One shard's records and its stats partials."""

    records: list[_Record]
    partials: dict[str, list]


def _scan_shard(files: DatasetFiles, relative: str, count: int, leaves: Sequence[Leaf], task_leaf: Leaf | None,
                numeric: Sequence[Leaf], keys: Sequence[str], cameras: Sequence[Leaf]) -> _Scanned:
    where = files.where(relative)
    records: list[_Record] = []
    partials: dict[str, list] = {leaf.name: [] for leaf in numeric}

    def each(k: int, position: int, payload: memoryview, problem: str | None) -> None:
        at = f"{where} record {k}"
        if problem is not None:
            records.append(_Record(position, len(payload), reason=problem))
            return
        regions: dict[str, tuple[int, int]] = {}
        try:
            parsed = parse_example(payload, regions=regions)
            n = check_record(leaves, parsed, at)
        except ExampleError as err:
            records.append(_Record(position, len(payload), reason=f"{at}: not a tf.train.Example ({err})"))
            return
        except ValueError as err:
            records.append(_Record(position, len(payload), reason=str(err)))
            return
        texts = decode_leaf(task_leaf, parsed, n, at).tolist() if task_leaf is not None else []
        for leaf in numeric:
            partials[leaf.name].append(stats_mod.partial(
                decode_leaf(leaf, parsed, n, at).reshape(n, -1).astype(np.float64)))
        data = np.frombuffer(payload, np.uint8)
        spans = np.array([regions[key] for key in keys], np.int64).reshape(len(keys), 2)
        crcs = crc32c_spans(data, spans).astype(np.uint32)
        pictures = {}
        for leaf in cameras:
            at = np.array(bytes_spans(parsed[leaf.key]), np.int64).reshape(-1, 2)
            pictures[leaf.name] = np.column_stack([at, crc32c_spans(data, at)]).astype(np.uint32).reshape(-1, 3)
        records.append(_Record(position, len(payload), n, "", texts, spans, crcs, pictures))

    try:
        size = files.size(relative)
    except FileNotFoundError:
        size = None
    failure = ""
    if size is None:
        failure = f"{where}: the shard is missing (dataset_info.json lists it)"
    else:
        try:
            with files.open(relative) as f:
                scan_records(f, size, where, each)
        except TFRecordError as err:  # the scan stopped at a broken frame: the records before it stay
            failure = str(err)
    found = len(records)
    for _ in range(found, max(count, found + (1 if failure else 0))):
        records.append(_Record(-1, 0, reason=failure or f"{where}: holds {found} records, dataset_info.json "
                                                        f"promises {count}"))
    if not failure and found > count:
        log.warning("%s holds %d records, dataset_info.json promises %d: reading all of them", where, found, count)
    return _Scanned(records, partials)
