"""LeRobot v3 metadata read and checked against the data, cheaply, when a directory opens (and its rows as they
are read):

- ``meta/info.json``: each field the reader uses has the JSON type it expects (:func:`check_info`: ``fps`` a
  finite number > 0, ``features`` a non-empty object of objects with a ``dtype`` the reader reads and a list of
  positive integer ``shape``, per-feature ``fps`` and ``info["video.fps"]`` finite and > 0, ``data_path`` a
  string, ...), so a wrong one is a one-line error naming the field, not a ZeroDivisionError or AttributeError.
- ``meta/episodes`` (:func:`lerobot_episodes`): lengths positive and equal to
  ``dataset_to_index - dataset_from_index``; each episode's rows contiguous with the previous one's, without
  overlap, in episode order as LeRobot writes them; every range inside the rows of the data file it names (their
  row counts come from the parquet footers, :func:`parquet_rows`, one small read per data file); each camera's
  segment times finite, and a segment never starting inside the previous segment of its video file (the
  episode would be given that episode's frames).
- The rows themselves, when a data file is first read (:func:`lerobot_rows`): each row's ``episode_index`` is
  the episode whose range holds it, and every row of every range is there, once; a list column's values per row
  are info.json's shape's.

What disagrees is a :class:`~mmfeed.loaders.sources.consistency.Verdict`, refused or skipped by
:func:`~mmfeed.loaders.sources.consistency.settle`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mmfeed.loaders.sources.consistency import Verdict, is_rate, shown

__all__ = ["check_info", "file_codes", "lerobot_episodes", "lerobot_rows", "parquet_rows"]


def _readable_dtype(dtype: str) -> bool:
    """Whether a LeRobot feature dtype is one the reader reads: frames, text or numbers."""
    if dtype in ("video", "image", "string", "language"):
        return True
    try:
        return len(dtype) <= 40 and np.dtype(dtype).kind in "biuf"
    except (TypeError, ValueError):
        return False


def check_info(info: Any, where: str) -> None:
    """Raise ValueError naming ``where`` (meta/info.json) and the field when a field the LeRobot reader uses does
    not have the JSON type and range it expects. Required fields are checked for presence by the reader."""
    if not isinstance(info, dict):
        raise ValueError(f"{where}: must be a JSON object of fields (fps, features, data_path, ...), got "
                         f"{shown(info)}")
    if "codebase_version" in info and not isinstance(info["codebase_version"], str):
        raise ValueError(f"{where}: field 'codebase_version' must be a string such as 'v3.0', got "
                         f"{shown(info['codebase_version'])}")
    if not info.get("codebase_version", "").startswith(("v3", "v2")):
        return  # the reader refuses other versions by name
    if "fps" in info and not is_rate(info["fps"]):
        raise ValueError(f"{where}: field 'fps' must be a finite number > 0 (frames per second), got "
                         f"{shown(info['fps'])}")
    for field in ("data_path", "video_path"):
        if field in info and not isinstance(info[field], str) and not (field == "video_path" and info[field] is None):
            raise ValueError(f"{where}: field {field!r} must be a path template (a string), got "
                             f"{shown(info[field])}")
    size = info.get("chunks_size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ValueError(f"{where}: field 'chunks_size' must be an integer >= 1, got {shown(size)}")
    features = info.get("features")
    if "features" in info and not isinstance(features, dict):
        raise ValueError(f"{where}: field 'features' must be an object {{name: {{dtype, shape, ...}}}}, got "
                         f"{shown(features)}")
    if "features" in info and not features:
        raise ValueError(f"{where}: field 'features' is empty; a dataset declares the features its files hold")
    for name, spec in (features or {}).items():
        field = f"features[{shown(name)}]"
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: field {field} must be an object {{dtype, shape, ...}}, got {shown(spec)}")
        if not isinstance(spec.get("dtype"), str):
            raise ValueError(f"{where}: field {field}.dtype must be a string such as 'float32' or 'video', got "
                             f"{shown(spec.get('dtype'))}")
        if not _readable_dtype(spec["dtype"]):
            raise ValueError(f"{where}: field {field}.dtype {shown(spec['dtype'])} is no dtype mmfeed reads: 'video', "
                             "'image', 'string', 'language' or a numeric one such as 'float32', 'int64' or 'bool'")
        shape = spec.get("shape")
        if shape is not None and (not isinstance(shape, list) or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)):
            raise ValueError(f"{where}: field {field}.shape must be a list of integers >= 1, got "
                             f"{shown(shape) if not isinstance(shape, list) or len(shape) > 8 else shape}")
        names = spec.get("names")
        if names is not None and not isinstance(names, (list, dict)):
            raise ValueError(f"{where}: field {field}.names must be a list, an object or null, got {shown(names)}")
        if "fps" in spec and not is_rate(spec["fps"]):
            raise ValueError(f"{where}: field {field}.fps must be a finite number > 0, got {shown(spec['fps'])}")
        extra = spec.get("info")
        if extra is not None and not isinstance(extra, dict):
            raise ValueError(f"{where}: field {field}.info must be an object, got {shown(extra)}")
        if extra and "video.fps" in extra and not is_rate(extra["video.fps"]):
            raise ValueError(f"{where}: field {field}.info['video.fps'] must be a finite number > 0, got "
                             f"{shown(extra['video.fps'])}")


def parquet_rows(files: Any, relatives: Sequence[str]) -> np.ndarray:
    """Rows of each parquet file ``relatives`` (of a :class:`~mmfeed.loaders.transport.files.DatasetFiles`), from
    its footer alone; -1 for a file that is missing or no parquet (reading it fails later, naming the episode).
    Remote files are asked for in parallel (one footer read each)."""
    def rows(relative: str) -> int:
        try:
            with files.open(relative) as f:
                return int(pq.read_metadata(f).num_rows)
        except (FileNotFoundError, IsADirectoryError, pa.ArrowException):
            return -1

    if getattr(files, "remote", False) and len(relatives) > 1:
        with ThreadPoolExecutor(max_workers=min(16, len(relatives))) as pool:
            return np.fromiter(pool.map(rows, relatives), np.int64, len(relatives))
    return np.fromiter(map(rows, relatives), np.int64, len(relatives))


def file_codes(chunk: np.ndarray, number: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each episode's data file as a code 0..F-1 numbering the distinct ``(chunk, file)`` pairs in their sorted
    order, and the first episode of each code. Runs of equal pairs in order (as LeRobot writes them) cost one
    pass; any other order a sort."""
    key = np.asarray(chunk, np.int64) << 32 | (np.asarray(number, np.int64) & 0xFFFFFFFF)
    if not len(key):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    step = np.diff(key)
    if (step >= 0).all():
        first = np.flatnonzero(np.concatenate([[True], step != 0]))
        codes = np.repeat(np.arange(len(first)), np.diff(np.append(first, len(key))))
        return codes, first
    _, first, codes = np.unique(key, return_index=True, return_inverse=True)
    return codes.reshape(-1), first


def lerobot_episodes(meta: Mapping[str, np.ndarray], source: np.ndarray, sources: Sequence[str],
                     codes: np.ndarray, rows: np.ndarray, data_files: Sequence[str],
                     videos: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]], fps: float,
                     tolerance_s: float, video_of: Callable[[int, str], str]) -> Verdict:
    """The LeRobot v3 episodes (``meta``'s columns, sorted by episode_index) that disagree with their data.

    source: the meta/episodes file (index into ``sources``) each row came from, for messages; codes: each
    episode's data file (index into ``rows``, its row count or -1 where unknown, and ``data_files``, its path);
    videos: per camera, each episode's video file (a code, as ``codes``) and its segment's ``from_timestamp`` and
    ``to_timestamp`` (None where meta/episodes has none); ``video_of(k, camera)`` names the file in messages.

    Rows are numbered across the data files in their (chunk, file) order from 0, as LeRobot numbers them, so
    file ``f`` holds rows ``[start_f, start_f + rows_f)``; a file whose rows are unknown (missing: its reads fail)
    spans what its episodes say. An episode is bad when its length is not positive or not its range's, its
    ``episode_index`` repeats, its range leaves its file's rows, it overlaps an earlier episode's rows, or rows
    lie between it and both its neighbours (a gap before it and after it: under "raise" any gap is refused); or
    when a camera's segment times are not finite times >= 0 with ``to >= from``, or its segment starts before the
    previous episode's in the same video file ends (less ``tolerance_s``; without ``to_timestamp``, before the
    previous episode's next-to-last frame): it would be given that episode's frames."""
    ep = np.asarray(meta["episode_index"], np.int64)
    length = np.asarray(meta["length"], np.int64)
    lo = np.asarray(meta["dataset_from_index"], np.int64)
    hi = np.asarray(meta["dataset_to_index"], np.int64)
    n = len(ep)
    times = np.zeros(n, bool)  # a camera's segment times are no times
    shared = np.zeros(n, bool)  # a camera's segment starts inside the previous episode's in its file
    clash: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}  # camera -> (clashes, order of its files' episodes)
    for camera, (video, start, stop) in videos.items():
        start = np.asarray(start, np.float64)
        bad_times = ~np.isfinite(start) | (start < 0)
        if stop is not None:
            stop = np.asarray(stop, np.float64)
            bad_times |= ~np.isfinite(stop) | (stop < start)
        times |= bad_times
        ends = stop if stop is not None else start + (np.maximum(length, 2) - 2) / fps
        # each video file's episodes in episode order (as LeRobot writes them: one pass; else a stable sort)
        order = None if n < 2 or (video[1:] >= video[:-1]).all() else np.argsort(video, kind="stable")
        v, a, b, t = (video, start, ends, bad_times) if order is None else (
            video[order], start[order], ends[order], bad_times[order])
        hit = np.zeros(n, bool)
        hit[1:] = (v[1:] == v[:-1]) & (a[1:] < b[:-1] - tolerance_s) & ~t[:-1]
        if order is not None:
            hit[order] = hit.copy()
        clash[camera] = (hit, order)
        shared |= hit
    if not times.any() and not shared.any() and _as_lerobot_writes(ep, length, lo, hi, codes, rows):
        return Verdict(np.zeros(n, bool), str, lambda k: (None, ""))  # the usual dataset: no per-episode work
    known = rows >= 0
    spans = np.bincount(codes, weights=np.maximum(length, 0).astype(np.float64), minlength=len(rows))
    held = np.where(known, rows, np.minimum(spans, 2.0**62).astype(np.int64))
    begin = np.concatenate([[0], np.cumsum(held)])[:-1]
    file_lo, file_hi = begin[codes], (begin + held)[codes]

    repeated = np.zeros(n, bool)
    repeated[1:] = ep[1:] == ep[:-1]
    not_positive = length <= 0
    wrong_span = (hi - lo) != length
    outside = known[codes] & ((lo < file_lo) | (hi > file_hi))
    alone = repeated | not_positive | wrong_span | outside | times | shared
    # the end of the rows before each episode: the furthest any earlier episode that passed so far reaches
    ends = np.where(alone, 0, hi)
    before = np.zeros(n, np.int64)
    if n > 1:
        before[1:] = np.maximum.accumulate(ends)[:-1]
    overlap = ~alone & (lo < before)
    gap = ~alone & (lo > before)
    joins_next = np.ones(n, bool)
    joins_next[:-1] = hi[:-1] == lo[1:]
    bad = alone | overlap | (gap & ~joins_next)
    rises = np.flatnonzero(np.concatenate([[True], ends[1:] > np.maximum.accumulate(ends)[:-1]])) if n else ends

    def reaching(k: int) -> int | None:
        """The earlier episode whose rows end furthest before episode ``k`` (None: none passed)."""
        if k == 0 or before[k] == 0:
            return None
        return int(rises[np.searchsorted(rises, k - 1, "right") - 1])

    def reason(k: int) -> str:
        at = f"{sources[source[k]]} episode {ep[k]}"
        rows_of = f"rows {lo[k]}..{hi[k]} (dataset_from_index..dataset_to_index)"
        data = data_files[codes[k]]
        if repeated[k]:
            return f"{at}: episode_index {ep[k]} is listed twice in meta/episodes"
        if not_positive[k]:
            return f"{at}: length {length[k]}; an episode holds at least one step"
        if wrong_span[k]:
            return f"{at}: length {length[k]}, but {rows_of} hold {hi[k] - lo[k]}"
        if outside[k]:
            return (f"{at}: {rows_of} lie outside its data file {data}, which holds rows {file_lo[k]}..{file_hi[k]} "
                    f"({held[codes[k]]} rows, by its parquet footer)")
        for camera, (_, start, stop) in videos.items():
            said = {"from_timestamp": float(start[k]), **({"to_timestamp": float(stop[k])} if stop is not None else {})}
            if not all(np.isfinite(v) and v >= 0 for v in said.values()) or said.get("to_timestamp", 1) < said[
                    "from_timestamp"]:
                return f"{at}: camera {camera!r} segment times {said} are not finite times >= 0 s, from before to"
            hit, order = clash[camera]
            if hit[k]:
                p = k - 1 if order is None else int(order[int(np.flatnonzero(order == k)[0]) - 1])
                end = float(stop[p]) if stop is not None else float(start[p]) + (max(int(length[p]), 2) - 2) / fps
                return (f"{at}: camera {camera!r} segment starts at {float(start[k]):.6g} s of {video_of(k, camera)}, "
                        f"before episode {ep[p]}'s ends at {end:.6g} s: it would read that episode's frames; "
                        "each episode's segment follows the previous one's")
        prior = reaching(k)
        whose = f"episode {ep[prior]}'s rows end" if prior is not None else "the rows before it end"
        if overlap[k]:
            return (f"{at}: {rows_of} overlap the rows before it: {whose} at row {before[k]}, and each episode's "
                    f"rows follow the previous one's (data file {data})")
        return (f"{at}: {rows_of} start at row {lo[k]}, but {whose} at row {before[k]}: rows {before[k]}..{lo[k]} "
                f"belong to no episode; LeRobot numbers rows from 0, each episode's after the previous one's (data "
                f"file {data})")

    def what(k: int) -> tuple[Any, str]:
        return int(ep[k]), sources[source[k]]

    return Verdict(bad, reason, what, strict=bad | gap)  # under "raise" any gap is refused too


def _as_lerobot_writes(ep: np.ndarray, length: np.ndarray, lo: np.ndarray, hi: np.ndarray, codes: np.ndarray,
                       rows: np.ndarray) -> bool:
    """Whether the episodes' rows are laid out exactly as LeRobot writes them, which :func:`lerobot_episodes` then
    need not look into episode by episode: episode_index increasing, lengths positive and their ranges', rows
    from 0, each episode's after the previous one's, data files in order, each holding exactly its episodes' rows
    (by its footer)."""
    if not len(ep) or lo[0] != 0 or (rows < 0).any():
        return False
    if not ((length > 0).all() and (hi - lo == length).all() and (lo[1:] == hi[:-1]).all()
            and (ep[1:] > ep[:-1]).all() and (codes[1:] >= codes[:-1]).all()):
        return False
    last = np.append(np.flatnonzero(codes[1:] != codes[:-1]), len(codes) - 1)
    return len(last) == len(rows) and not (np.diff(np.append(0, hi[last])) != rows).any()


def lerobot_rows(index: np.ndarray, episode_column: np.ndarray | None, lo: np.ndarray, hi: np.ndarray,
                 episodes: np.ndarray, path: str) -> dict[int, str]:
    """The episodes (positions into ``lo``/``hi``/``episodes``, the ranges and ``episode_index`` of the episodes a
    data file holds, increasing and disjoint) whose rows in that file (sorted ``index`` column, and its
    ``episode_index`` column when it has one) are not all there once, or carry another episode_index; ``{position:
    reason}``, each reason naming the file ``path``, the rows and both values. One pass over the file's rows."""
    bad: dict[int, str] = {}
    if not len(lo):
        return bad
    if (len(index) == hi[-1] - lo[0] and len(index) and index[0] == lo[0] and (lo[1:] == hi[:-1]).all()
            and (np.diff(index) == 1).all()):  # the usual file: its rows are the ranges, back to back
        if episode_column is None or np.array_equal(episode_column, np.repeat(episodes, hi - lo)):
            return bad
    first, last = np.searchsorted(index, lo, "left"), np.searchsorted(index, hi, "left")
    count = last - first
    twice = np.flatnonzero(index[1:] == index[:-1]) + 1 if len(index) > 1 else np.zeros(0, np.int64)
    owners = np.searchsorted(lo, index[twice], "right") - 1 if len(twice) else np.zeros(0, np.int64)
    for k in np.unique(owners[(owners >= 0) & (index[twice] < hi[np.maximum(owners, 0)])]).tolist():
        rows = index[twice][owners == k]
        bad[k] = (f"data file {path} holds row {int(rows[0])} of episode {int(episodes[k])} more than once "
                  f"(index column)")
    for k in np.flatnonzero(count != hi - lo).tolist():
        bad.setdefault(k, f"{int(hi[k] - lo[k] - count[k])} of the rows {int(lo[k])}..{int(hi[k])} of episode "
                          f"{int(episodes[k])} are missing from data file {path} (its index column holds "
                          f"{int(count[k])} of them)")
    if episode_column is None:
        return bad
    owner = np.searchsorted(lo, index, "right") - 1
    inside = (owner >= 0) & (index < hi[np.maximum(owner, 0)])
    wrong = inside & (episode_column != episodes[np.maximum(owner, 0)])
    if wrong.any():
        rows = np.flatnonzero(wrong)
        for k in np.unique(owner[rows]).tolist():
            mine = rows[owner[rows] == k]
            carried = np.unique(episode_column[mine])
            said = ", ".join(str(int(v)) for v in carried[:3]) + (" ..." if len(carried) > 3 else "")
            bad.setdefault(k, f"data file {path}: {len(mine)} of the rows {int(lo[k])}..{int(hi[k])} of episode "
                              f"{int(episodes[k])} carry episode_index {said}, not {int(episodes[k])} (first: row "
                              f"{int(index[mine[0]])})")
    return bad
