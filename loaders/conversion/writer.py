"""Write your own episodes as webdataset shards (format v2) that :class:`WebDatasetSource` reads.

Every feature of an episode becomes one tar member under its own name: arrays of any dtype and shape as
``<key>.<feature>.npy``, uint8 ``[T, H, W, 3]`` frames encoded as ``<key>.<feature>.mp4`` at the feature's rate,
and mp4 bytes kept as they are. ``<key>.meta.json`` records the control clock, the length, the task (and, for
an episode whose task changes, ``task_runs``: ``[[first step, task], ...]``), the rates, every feature's kind,
dtype, shape, frame count and stats partial, so indexing the shards reads no pixels, and the episode's other texts
(``text``: name -> str, where given)::

    >>> import numpy as np, tempfile
    >>> with ShardWriter(tempfile.mkdtemp(), episodes_per_shard=2) as w:
    ...     for i in range(3):
    ...         _ = w.write({"observation.state": np.zeros((50, 6), np.float32), "next.done": np.zeros(50, bool),
    ...                      "observation.images.top": np.zeros((15, 32, 32, 3), np.uint8)},
    ...                     fps=50.0, rates={"observation.images.top": 15.0}, task="pick")
    >>> [os.path.basename(p) for p in w.shards], os.path.basename(w.index_path)
    (['shard-000000.tar', 'shard-000001.tar'], 'mmfeed-index.parquet')

Shards are ``shard-000000.tar``, ... written through ``webdataset.TarWriter`` with a fixed member mtime and a
deterministic encoder, so equal inputs give byte-identical shards; each is written under a temporary name and
renamed when complete, and the index (:mod:`mmfeed.loaders.stores.index`) is written beside them on close.
:func:`episode_sample` (one episode's members) and :class:`ShardFile` (one shard under a name of your choosing)
are the same steps for writers that place episodes themselves (``mmfeed.loaders.conversion.job``).
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import logging
import os
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import numpy as np

from mmfeed.codecs.demux import probe
from mmfeed.codecs.encode import CODECS, encode_video, encoder_name
from mmfeed.codecs.errors import DecodeError
from mmfeed.loaders.stores import stats as _stats
from mmfeed.loaders.stores.index import INDEX_FILENAME, write_index
from mmfeed.packing.windows import check_stream_frames

__all__ = ["ShardFile", "ShardWriter", "episode_sample"]

log = logging.getLogger(__name__)

_MTIME = 0
"""Member mtime of every tar header (a fixed value: equal inputs give equal bytes)."""


class ShardWriter:
    """Episodes to ``out_dir/shard-000000.tar``, ... (``episodes_per_shard`` each) and their index, on close.

    codec, gop, crf: how frame arrays are encoded (:func:`mmfeed.codecs.encode_video`; codec one of
        :data:`mmfeed.codecs.encode.CODECS`: "h264", "av1" or "hevc").
    Attributes: ``shards`` (the paths of the complete shards) and ``index_path`` (set by :meth:`close`).
    Leaving the ``with`` block by an exception discards the unfinished shard and writes no index.
    """

    def __init__(self, out_dir: str | os.PathLike, *, codec: str = "h264", gop: int = 30, crf: int | None = None,
                 episodes_per_shard: int = 8) -> None:
        if isinstance(episodes_per_shard, bool) or not isinstance(episodes_per_shard, int) or episodes_per_shard < 1:
            raise ValueError(f"episodes_per_shard must be an int >= 1, got {episodes_per_shard!r}")
        if codec not in CODECS:  # an unknown codec fails now, not at the first video
            raise ValueError(f"ShardWriter codec {codec!r} is not one shards are written with; choose one of "
                             f"{list(CODECS)}")
        encoder_name(codec)  # this PyAV has the encoder
        self.out_dir = os.fspath(out_dir)
        os.makedirs(self.out_dir, exist_ok=True)
        existing = sorted(glob.glob(os.path.join(self.out_dir, "shard-*.tar")))
        if existing or os.path.exists(os.path.join(self.out_dir, INDEX_FILENAME)):
            raise FileExistsError(f"{self.out_dir} already holds shards or an index ({existing[:3]}); remove them or "
                                  "write to another directory")
        self.codec, self.gop, self.crf, self.episodes_per_shard = codec, gop, crf, episodes_per_shard
        self.shards: list[str] = []
        self.index_path: str | None = None
        self._keys: set[str] = set()
        self._shard: ShardFile | None = None
        self._closed = False

    def write(self, features: Mapping[str, Any], *, fps: float, task: str | Sequence[str] = "",
              rates: Mapping[str, float] | None = None, key: str | None = None,
              text: Mapping[str, str] | None = None) -> str:
        """Add one episode; return its key (default ``episode_{n:06d}``, n counting episodes written).

        features: name -> array ``[T_feature, ...]`` of any dtype (stored as npy), uint8 ``[T, H, W, 3]`` frames
            (encoded at the feature's rate) or the bytes of an mp4 (kept as is). Names may hold dots
            (``observation.state``) but not "/", must not start with "_" and must not be "meta".
        fps: the control clock; features not in ``rates`` have one entry per step, and their common count is the
            episode's length. rates: feature -> fps for streams recorded at their own rate (a camera at the
            clock's rate that ended early is named here too), each kept with the frames it holds (see below).
        task: the episode's task text, or one text per step for an episode whose task changes (stored as runs).
        text: other texts of the episode, one each (name -> str), kept in its meta.json under ``"text"``.
        Raises ValueError naming the feature (and both lengths where two disagree) before anything is written.

        Streams at their own rate: over ``T`` steps at ``fps`` the clock implies ``need =
        frames_at_rate(T, fps, rate)`` frames, those at ``j / rate`` within ``[0, (T - 1) / fps]``. Real recorders
        stop a little early or late, so a stream of ``n`` frames is kept, with ``n`` recorded as its frame count
        (meta.json, the index, ``source.frames``), when ``n >= need - 1`` (and ``n >= 1``): its last frame,
        at ``(n - 1) / rate``, is at most one frame period ``1 / rate`` before the clock's last frame
        ``(need - 1) / rate`` (:func:`mmfeed.packing.windows.fewest_frames`). Reading it, a time whose frame
        it lacks gets its last frame, flagged in ``<feature>_is_pad``. A stream short by two frames or more is
        refused: a truncated recording or a wrong rate. A longer stream (it ran on after the last step) is kept
        whole; its frames after the last step are never read, and a sample's tokens never depend on ``n``.
        """
        if self._closed:
            raise ValueError(f"ShardWriter({self.out_dir!r}) is closed")
        key = f"episode_{len(self._keys):06d}" if key is None else key
        if key in self._keys:
            raise ValueError(f"episode key {key!r} was already written; keys must be unique")
        sample = episode_sample(features, fps=fps, task=task, rates=rates, key=key, codec=self.codec, gop=self.gop,
                                crf=self.crf, text=text)
        if self._shard is None:
            self._shard = ShardFile(os.path.join(self.out_dir, f"shard-{len(self.shards):06d}.tar"))
        self._shard.add(sample)
        self._keys.add(key)
        if self._shard.episodes == self.episodes_per_shard:
            self._finish_shard()
        return key

    def close(self) -> str | None:
        """Finish the last shard and write the index beside the shards; return its path (None: no episodes)."""
        if not self._closed:
            self._closed = True
            self._finish_shard()
            if self.shards:
                self.index_path = write_index(self.shards, os.path.join(self.out_dir, INDEX_FILENAME))
            else:
                log.warning("ShardWriter(%r) closed without episodes: no shards, no index", self.out_dir)
        return self.index_path

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        self._closed = True
        if self._shard is not None:
            self._shard.discard()
            self._shard = None
        log.warning("ShardWriter(%r) stopped by %s: kept %d complete shard(s), wrote no index", self.out_dir,
                    exc_type.__name__, len(self.shards))

    def _finish_shard(self) -> None:
        if self._shard is not None:
            self._shard.close()
            self.shards.append(self._shard.path)
            self._shard = None


class ShardFile:
    """One shard at ``path``, written as ``.<name>.partial`` beside it and renamed to ``path`` by :meth:`close`
    (after an fsync), so ``path`` only ever holds a complete shard. Members carry a fixed mtime: equal samples
    give equal bytes. After close, ``size`` and ``sha256`` describe the file; :meth:`discard` drops it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        directory, name = os.path.split(self.path)
        self.partial = os.path.join(directory, f".{name}.partial")
        self.episodes = 0
        self.size: int | None = None
        self.sha256: str | None = None
        self._file: Any = None
        self._tar: Any = None

    def add(self, sample: Mapping[str, Any]) -> None:
        """Append one episode's members (:func:`episode_sample`)."""
        if self._tar is None:
            import webdataset

            self._file = open(self.partial, "wb")
            self._tar = webdataset.TarWriter(self._file, encoder=False, mtime=_MTIME)
        self._tar.write(dict(sample))
        self.episodes += 1

    def close(self) -> str:
        """Finish the tar, fsync it and rename it to ``path``; return ``path``."""
        if self._tar is None:
            raise ValueError(f"{self.path}: no episode was added; an empty shard is not written")
        self._tar.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._tar = self._file = None
        digest = hashlib.sha256()
        with open(self.partial, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        self.size, self.sha256 = os.path.getsize(self.partial), digest.hexdigest()
        os.replace(self.partial, self.path)
        return self.path

    def discard(self) -> None:
        """Drop the unfinished shard (its partial file)."""
        if self._tar is not None:
            self._tar.close()
            self._file.close()
            self._tar = self._file = None
        if os.path.exists(self.partial):
            os.unlink(self.partial)

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def episode_sample(features: Mapping[str, Any], *, fps: float, task: str | Sequence[str] = "",
                   rates: Mapping[str, float] | None = None, key: str, codec: str = "h264", gop: int = 30,
                   crf: int | None = None, text: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The tar members of one episode (``__key__``, ``<feature>.npy`` / ``.mp4``, ``meta.json``), everything
    checked as :meth:`ShardWriter.write` says before any frame array is encoded (with ``codec``, ``gop``, ``crf``).
    text: the episode's own texts (name -> str, such as an RLDS ``episode_metadata.file_path``), kept in
    meta.json under ``"text"``; they are no feature of the shards."""
    rates = dict(rates or {})
    texts = dict(text or {})
    bad = {k: v for k, v in texts.items() if not isinstance(k, str) or not k or not isinstance(v, str)}
    if bad:
        raise ValueError(f"text must map names to strings (one text per episode), got {bad!r}")
    if not isinstance(key, str) or not key or "." in key or "/" in key or key.startswith("_"):
        raise ValueError(f"episode key {key!r} must be a non-empty string without '.' or '/', not starting with "
                         "'_' (webdataset splits member names at the first dot)")
    if isinstance(fps, bool) or not isinstance(fps, Real) or not fps > 0:
        raise ValueError(f"fps must be a number > 0 (the control clock), got {fps!r}")
    if not isinstance(task, str) and not (isinstance(task, (Sequence, np.ndarray))
                                          and all(isinstance(t, str) for t in task)):
        raise ValueError(f"task must be a string or one string per step, got {task!r}")
    if not isinstance(features, Mapping) or not features:
        raise ValueError("features must be a non-empty dict of name -> array or mp4 bytes")
    unknown = sorted(set(rates) - set(features))
    if unknown:
        raise ValueError(f"rates name {unknown}, which are not among the features {sorted(features)}")
    values, described = {}, {}
    for name, value in features.items():
        if not isinstance(name, str) or not name or "/" in name or name.startswith("_") or name == "meta":
            raise ValueError(f"feature name {name!r} must be a non-empty string without '/', not starting with "
                             "'_' and not 'meta'")
        rate = rates.get(name, fps)
        if isinstance(rate, bool) or not isinstance(rate, Real) or not rate > 0:
            raise ValueError(f"rates[{name!r}] must be a number > 0, got {rate!r}")
        values[name], described[name] = _describe(name, value)
    clock = {n: d["frames"] for n, d in described.items() if n not in rates}
    if not clock:
        raise ValueError("every feature is in rates: at least one feature must run at the control clock (fps), "
                         "its entries counting the episode's steps")
    first, length = next(iter(clock.items()))
    for name, frames in clock.items():
        if frames != length:
            raise ValueError(f"feature {name!r} has {frames} steps but feature {first!r} has {length}: features at "
                             f"the control clock ({fps:g} fps) have one entry per step; give the rate of a feature "
                             "recorded at another rate in rates=")
    for name, rate in rates.items():
        check_stream_frames(described[name]["frames"], length=length, fps=fps, rate=rate, where=f"feature {name!r}")
    text, runs = _task_runs(task, length)
    sample: dict[str, Any] = {"__key__": key}
    for name, value in values.items():
        if isinstance(value, np.ndarray):  # frames to encode
            value = encode_video(value, fps=float(rates.get(name, fps)), codec=codec, gop=gop, crf=crf)
        sample[f"{name}.{'npy' if described[name]['kind'] == 'array' else 'mp4'}"] = value
    meta = {"fps": float(fps), "length": length, "task": text, "features": described}
    if runs:
        meta["task_runs"] = runs
    if rates:
        meta["rates"] = {k: float(v) for k, v in rates.items()}
    if texts:
        meta["text"] = texts
    sample["meta.json"] = json.dumps(meta, sort_keys=True).encode("utf-8")
    return sample


def _task_runs(task: str | Sequence[str], length: int) -> tuple[str, list[list]]:
    """``(task text, runs)``: the text, and ``[[first step, text], ...]`` only where the task changes."""
    if isinstance(task, str):
        return task, []
    steps = [str(t) for t in task]
    if len(steps) != length:
        raise ValueError(f"task gives {len(steps)} per-step texts but the episode has {length} steps; give one "
                         "text per step, or one string for the whole episode")
    runs = [[i, t] for i, t in enumerate(steps) if i == 0 or t != steps[i - 1]]
    return (runs[0][1] if runs else ""), (runs if len(runs) > 1 else [])


def _describe(name: str, value: Any) -> tuple[Any, dict[str, Any]]:
    """``(npy bytes | mp4 bytes | frames to encode, meta.json features entry)`` of one feature value."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            info = probe(data)
        except DecodeError as err:
            raise ValueError(f"feature {name!r}: the bytes are not a readable video: {err}") from err
        return data, {"kind": "video", "dtype": "uint8", "shape": [info.height, info.width, 3],
                      "frames": info.num_frames}
    array = np.asarray(value)
    if array.ndim == 0 or array.dtype.hasobject:
        raise ValueError(f"feature {name!r} must be an array [T, ...] of numbers (one entry per step) or mp4 bytes, "
                         f"got {array.dtype} of shape {list(array.shape)}")
    entry = {"dtype": str(array.dtype), "shape": list(array.shape[1:]), "frames": int(len(array))}
    if array.dtype == np.uint8 and array.ndim == 4 and array.shape[-1] == 3:
        if len(array) == 0 or array.shape[1] % 2 or array.shape[2] % 2:
            raise ValueError(f"feature {name!r}: frames {list(array.shape)} must be non-empty with an even height and "
                             "width (yuv420p video)")
        return array, {"kind": "video", **entry}
    if array.dtype.kind in "biuf":
        entry["stats"] = _stats.to_json({name: _stats.partial(array)})[name]
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue(), {"kind": "array", **entry}
