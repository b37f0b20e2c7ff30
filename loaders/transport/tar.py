"""The one tar reader of webdataset shards, in its three uses: the index scan (member groups with their byte
offsets, :func:`member_groups`), the stream (every episode's members front to back, :func:`iter_shard`) and the
byte-range read of one member (:func:`read_member`, a range request for URLs), plus the parsing of an episode's
``meta.json`` and of member names, which all three share. Local paths and fsspec URLs alike."""

from __future__ import annotations

import json
import os
import posixpath
import tarfile
from collections.abc import Iterator
from typing import IO, Any

from mmfeed.codecs.arrays import MAX_HEADER_BYTES, check_npy_size, npy_header
from mmfeed.codecs.errors import DecodeError
from mmfeed.loaders.transport.json_limits import check_json, check_json_size

__all__ = ["extract", "iter_shard", "member_groups", "open_file", "parse_meta", "read_member", "split_member",
           "stat_file"]


def read_member(shard_path: str | os.PathLike, offset: int, size: int, *, member: bool = False) -> bytes:
    """The ``size`` bytes at ``offset`` of a shard (one member's data): a seek and a read, a range request for URLs.
    ValueError when offset or size is negative or the shard ends before ``offset + size`` (a local shard's size is
    compared first, so that no buffer of a size an index made up is allocated). ``member``: ``offset`` is where a
    tar member's data starts, and the 512-byte tar header just before it must give ``size`` (an index placing a
    member elsewhere, or with another size, is refused)."""
    shard_path = os.fspath(shard_path)
    offset, size = int(offset), int(size)
    if offset < 0 or size < 0:
        raise ValueError(f"offset {offset} and size {size} must be >= 0 (reading {shard_path!r})")
    if "://" in shard_path and not shard_path.startswith("file://"):
        from mmfeed.loaders.transport.remote import read_range  # range requests through a bounded block cache

        header = read_range(shard_path, offset - 512, 512) if member and offset >= 512 else b""
        if member:
            _check_header(shard_path, header, offset, size)
        data = read_range(shard_path, offset, size)
    else:
        with open(shard_path.removeprefix("file://"), "rb") as f:
            have = os.fstat(f.fileno()).st_size
            if offset + size > have:  # refused before a buffer of ``size`` bytes is allocated for the read
                raise ValueError(f"{shard_path!r} ends at byte {have}, before the member the index places at "
                                 f"{offset}..{offset + size}: the shard is truncated or the index is out of date; "
                                 "rebuild it with `mmfeed index`")
            if member:
                f.seek(max(offset - 512, 0))
                _check_header(shard_path, f.read(512) if offset >= 512 else b"", offset, size)
            f.seek(offset)
            data = f.read(size)
    if len(data) != size:
        raise ValueError(f"{shard_path!r} ends before byte {offset + size} (got {len(data)} of {size} bytes at offset "
                         f"{offset}): the shard is truncated or the index is out of date; rebuild it with "
                         "`mmfeed index`")
    return data


def _check_header(shard_path: str, block: bytes, offset: int, size: int) -> None:
    """Raise ValueError unless ``block`` is a tar header giving a member of ``size`` bytes (the one whose data the
    index places at ``offset``)."""
    given = None
    try:
        if len(block) == 512 and tarfile.nti(block[148:156]) in tarfile.calc_chksums(block):  # a header's checksum
            given = tarfile.nti(block[124:136])  # its size field (octal, or GNU base-256)
    except tarfile.InvalidHeaderError:  # a field that is no number: no header
        given = None
    if given != size:
        found = "no tar header precedes it" if given is None else f"its tar header gives {given}"
        raise ValueError(f"{shard_path!r}: the index places a member of {size} bytes at byte {offset}, but {found}: "
                         "the index is out of date or not this shard's; rebuild it with `mmfeed index`")


def iter_shard(shard: str | os.PathLike, select=None) -> Iterator[tuple[str, dict[str, bytes], dict[str, Any]]]:
    """Every episode of one shard in tar order, read front to back (for streaming readers): ``(key, {member name
    after the key: bytes}, meta)``; ``meta`` is the parsed meta.json with ``task`` and ``rates`` filled in.
    ``select(position)`` False skips the episode at that position (0, 1, ... in tar order) unread."""
    shard = os.fspath(shard)
    for position, (key, group, tar) in enumerate(member_groups(shard)):
        if select is not None and not select(position):
            continue
        data = {name: _read_checked(tar, info, name, f"{shard!r} key {key!r} member {info.name}")
                for name, info in group}
        if "meta.json" not in data:
            raise ValueError(f"episode {key!r} in shard {shard!r} has no {key}.meta.json member")
        yield key, data, parse_meta(shard, key, data["meta.json"])


def _read_checked(tar: tarfile.TarFile, info: tarfile.TarInfo, name: str, where: str) -> bytes:
    """A member's bytes, read only once its size is plausible: a meta.json within the metadata JSON limit, an npy
    member no longer than the header and the array its header promises (from the header's bytes, before the
    rest: a valid array followed by gigabytes is refused unread)."""
    f = extract(tar, info)
    if name == "meta.json":
        check_json_size(info.size, where)
    elif name.endswith(".npy"):
        head = f.read(min(info.size, 12 + MAX_HEADER_BYTES))
        try:
            npy_header(head, key=where)
        except DecodeError:  # no readable header: no array, whatever follows; decoding the head names the problem
            return head      # (and the error policy may skip the episode) without reading the rest
        check_npy_size(head, info.size, key=where)
        return head + f.read()
    return f.read()


def split_member(name: str) -> tuple[str | None, str, str]:
    """``(key, feature, extension)`` of a tar member name; key None for names webdataset skips (no extension).

    >>> split_member("ep_7.observation.state.npy"), split_member("ep_7.meta.json")
    (('ep_7', 'observation.state', 'npy'), ('ep_7', 'meta', 'json'))
    """
    head, base = posixpath.split(name)
    if "." not in base or base.startswith("."):
        return None, "", ""
    stem, rest = base.split(".", 1)
    feature, _, ext = rest.rpartition(".")
    return (posixpath.join(head, stem) if head else stem), feature, ext


def parse_meta(shard: str, key: str, raw: bytes) -> dict[str, Any]:
    """A meta.json checked (``length`` int >= 0, ``fps`` > 0, ``task`` str, rates > 0, ``task_runs`` starting at
    step 0 and increasing) with ``task`` defaulted to "", ``task_runs`` to ``[]`` (else ``[(first step, text)]``)
    and ``rates`` = v1's ``camera_fps`` updated by ``rates``; ValueError naming the shard and key."""
    where = f"{key}.meta.json in shard {shard!r}"
    check_json(raw, where)  # size and nesting depth, before parsing
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where} is not valid UTF-8 JSON: {exc}") from exc
    missing = [k for k in ("fps", "length") if k not in meta] if isinstance(meta, dict) else ["a JSON object"]
    if missing:
        raise ValueError(f"{where} lacks {missing}; it needs fps, length and (optionally) task and rates")
    length, fps, task = meta["length"], meta["fps"], meta.get("task", "")
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValueError(f"{where}: length must be an integer >= 0, got {length!r}")
    rates: dict[str, float] = {}
    for field in ("camera_fps", "rates"):  # v1's per-camera rates, then v2's per-feature ones
        if not isinstance(meta.get(field) or {}, dict):
            raise ValueError(f"{where}: {field} must map feature -> fps, got {meta[field]!r}")
        rates.update(meta.get(field) or {})
    for name, rate in {"fps": fps, **{f"rates[{k!r}]": v for k, v in rates.items()}}.items():
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < float("inf"):
            raise ValueError(f"{where}: {name} must be a finite number > 0, got {rate!r}")
    if not isinstance(task, str) or not isinstance(meta.get("features", {}), dict):
        raise ValueError(f"{where}: task must be a string and features a dict, got {task!r} and "
                         f"{meta.get('features')!r}")
    runs = meta.get("task_runs") or []
    ok = isinstance(runs, list) and all(isinstance(r, list) and len(r) == 2 and isinstance(r[1], str)
                                         and isinstance(r[0], int) and not isinstance(r[0], bool) for r in runs)
    starts = [r[0] for r in runs] if ok else []
    if not ok or runs and (starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= length):
        raise ValueError(f"{where}: task_runs must be [[first step, task text], ...] with first steps 0, then "
                         f"increasing below length {length}, got {meta.get('task_runs')!r}")
    return {**meta, "task": task, "task_runs": [(int(a), t) for a, t in runs],
            "rates": {k: float(v) for k, v in rates.items()}}


def member_groups(shard: str) -> Iterator[tuple[str, list[tuple[str, tarfile.TarInfo]], tarfile.TarFile]]:
    """``(key, [(member name after the key, info)], tar)`` per episode in tar order; a key's members must be
    consecutive, as webdataset reads them. The tar stays open while the caller reads members of the group."""
    size = stat_file(shard)[0]
    with open_file(shard) as f:
        try:
            tar = tarfile.open(fileobj=f, mode="r:")
        except tarfile.TarError as exc:
            raise ValueError(f"{shard!r} is not a readable uncompressed tar file: {exc}") from exc
        with tar:
            key, group, done = None, [], set()
            try:
                for info in tar:
                    if not info.isfile():
                        continue
                    if info.offset_data + info.size > size:
                        raise ValueError(f"{shard!r} is truncated: member {info.name!r} needs bytes up to "
                                         f"{info.offset_data + info.size} but the file has {size}")
                    k, feature, ext = split_member(info.name)
                    if k is None:
                        continue  # webdataset skips names without an extension too
                    if k != key:
                        if group:
                            yield key, group, tar
                        if k in done:
                            raise ValueError(f"{shard!r}: the members of key {k!r} are not consecutive (member "
                                             f"{info.name!r} follows other keys); webdataset would split the episode")
                        done.add(k)
                        key, group = k, []
                    group.append((f"{feature}.{ext}" if feature else ext, info))
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise ValueError(f"{shard!r} is not a readable uncompressed tar file (truncated or corrupt): "
                                 f"{exc}") from exc
            if group:
                yield key, group, tar


def extract(tar: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    extracted = tar.extractfile(info)
    assert extracted is not None  # a regular file always extracts
    return extracted


def open_file(path: str, mode: str = "rb") -> IO[bytes]:
    """``path`` (local, or any fsspec URL) opened in ``mode``; a remote file opened for reading is read by range
    through the process's block cache, each request retried (:mod:`mmfeed.loaders.transport.files`)."""
    if "://" in path:
        if mode == "rb":
            from mmfeed.loaders.transport.files import open_remote

            return open_remote(path)
        import fsspec

        return fsspec.open(path, mode).open()
    return open(path, mode)


def stat_file(path: str) -> tuple[int, int | None]:
    """``(size, mtime in ns or None)`` of a local file or an fsspec URL (asked with retries)."""
    if "://" in path:
        from mmfeed.loaders.transport.files import remote_info

        info = remote_info(path)
        mtime = info.get("mtime")
        return int(info["size"]), (int(float(mtime) * 1e9) if isinstance(mtime, (int, float)) else None)
    st = os.stat(path)
    return int(st.st_size), int(st.st_mtime_ns)
