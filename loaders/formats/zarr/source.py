"""Zarr ReplayBuffers (diffusion_policy, UMI) as an :class:`~mmfeed.loaders.sources.base.EpisodeSource`.

Every array of ``data/`` is a feature under its path with "." between levels (``img``, ``state``, ``action``,
``camera0_rgb``); uint8 ``[N, H, W, 3]`` arrays are video features (frames ``[H, W, 3]``), the others arrays of
their own dtype. Episode ``k`` is rows ``ends[k - 1]:ends[k]`` of every array (``meta/episode_ends``). The store
records no frame rate: ``fps=`` is required. A worker reads only the rows a request needs (a slice, or the rows
themselves where they lie far apart), through its own handle on the store. Zarr decodes a whole chunk for any of
its rows, so a process keeps the last decoded chunks of each array (up to 64 MiB an array; arrays whose single
chunk is larger than a quarter of that are read by slice), and samples of nearby steps decode a chunk once::

    >>> ds = ZarrSource("pusht_cchi_v7_replay.zarr", fps=10)                        # doctest: +SKIP
    >>> len(ds), ds.features["action"]                                             # doctest: +SKIP
    (206, Feature(kind='array', dtype='float32', shape=(2,), fps=10.0))

Arrays compressed with codecs zarr does not ship (UMI's JPEG XL pictures, registered by ``imagecodecs``) read once
that package registers them (``imagecodecs.numcodecs.register_codecs()``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmfeed.loaders.clock import stage
from mmfeed.loaders.formats.zarr.metadata import LAYOUTS, array_columns, episode_ends, open_root
from mmfeed.loaders.sources.base import LRU, EpisodeRequest, EpisodeSource, Feature
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.transport.errors import SampleError

__all__ = ["ZarrSource"]


_BLOCK_BYTES = 64 * 2**20  # decoded chunks a process keeps per array (zarr decodes a whole chunk for any row)


def _rows(array: Any, start: int, idx: np.ndarray) -> np.ndarray:
    """Rows ``start + idx`` of ``array``: one slice over their span, or the distinct rows alone (orthogonal
    selection) where the span is more than twice as many rows as they are."""
    if not idx.size:
        return np.zeros((0, *array.shape[1:]), dtype=array.dtype)
    lo, hi = int(idx.min()), int(idx.max()) + 1
    if hi - lo <= 2 * idx.size:
        return np.asarray(array[start + lo:start + hi])[idx - lo]
    rows, back = np.unique(idx, return_inverse=True)
    return np.asarray(array.oindex[start + rows])[back.reshape(-1)]


class _Blocks:
    """The decoded chunks of one array (whole chunks along the rows), the least recently used dropped first:
    samples of nearby steps, and every sample of a small array, decode a chunk once instead of once each."""

    def __init__(self, array: Any) -> None:
        self.rows = max(1, int(array.chunks[0]))
        self.total = int(array.shape[0])
        self.blocks = LRU(max(1, _BLOCK_BYTES // max(1, self.rows * _row_bytes(array))))

    def read(self, array: Any, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (absolute, int64) of ``array``, through the kept chunks."""
        which = rows // self.rows
        first = int(which[0]) if which.size else 0
        if which.size and (which == first).all():  # the common case: one chunk
            return self._block(array, first)[rows - first * self.rows]
        out = np.empty((len(rows), *array.shape[1:]), dtype=array.dtype)
        for c in np.unique(which).tolist():
            at = which == c
            out[at] = self._block(array, c)[rows[at] - c * self.rows]
        return out

    def _block(self, array: Any, c: int) -> np.ndarray:
        block = self.blocks.get(c)
        if block is None:
            block = np.asarray(array[c * self.rows:min((c + 1) * self.rows, self.total)])
            self.blocks.put(c, block)
        return block


def _row_bytes(array: Any) -> int:
    return int(np.prod(array.shape[1:], dtype=np.int64)) * np.dtype(array.dtype).itemsize


class ZarrSource(EpisodeSource):
    """The episodes of a Zarr ReplayBuffer.

    path: the store: a directory (``pusht.zarr``), a ``.zip`` store or an fsspec URL.
    options: how it is read (:class:`~mmfeed.loaders.sources.options.ReadOptions`: ``fps`` (required),
        ``layout`` (``"replay_buffer"``, the only one), ``max_frame_pixels``), or its fields as keyword arguments.
    """

    FORMAT = "Zarr ReplayBuffer"
    READ_OPTIONS = ("fps", "layout", "max_frame_pixels")
    """The :class:`~mmfeed.loaders.sources.options.ReadOptions` this format reads."""

    def __init__(self, path: str | os.PathLike, options: ReadOptions | None = None, **kwargs: Any) -> None:
        options = ReadOptions.of(options, **kwargs)
        self.root = self.name = os.fspath(path)
        options.refuse_others(self.READ_OPTIONS, self.FORMAT, self.name)
        if options.layout is not None and options.layout not in LAYOUTS:
            raise ValueError(f"{self.name}: layout={options.layout!r} is no Zarr layout; give one of {list(LAYOUTS)} "
                             "(or None)")
        self.options = options
        self._lock = threading.Lock()
        root = open_root(self.name)
        ends = episode_ends(root, self.name)
        if not len(ends):
            raise ValueError(f"{self.name}: meta/episode_ends is empty: the store holds no episodes")
        self._paths = array_columns(root, ends, self.name)
        if options.fps is None:
            raise ValueError(f"{self.name}: a Zarr ReplayBuffer records no frame rate; pass fps=, e.g. "
                             f"open_dataset({self.name!r}, fps=...) (--fps on the command line)")
        fps = float(options.fps)
        data = root["data"]
        self.features = {}
        for name, path in self._paths.items():
            array = data[path]
            shape, dtype = tuple(int(s) for s in array.shape[1:]), str(np.dtype(array.dtype))
            video = dtype == "uint8" and len(shape) == 3 and shape[-1] == 3
            if video:
                options.check_frame_pixels(self.name, name, shape[0], shape[1])
            self.features[name] = Feature("video" if video else "array", dtype, shape, fps)
        self._starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        self._lengths = (ends - self._starts).astype(np.int64)
        self._fps = np.full(len(ends), fps, dtype=np.float64)
        self.tasks = [""]  # a ReplayBuffer holds no language
        self._episode_tasks = np.zeros(len(ends), dtype=np.int64)
        self.stats: dict[str, dict[str, np.ndarray]] = {}  # the store holds none: `mmfeed stats` computes them
        self._arrays: dict[str, Any] = {name: data[path] for name, path in self._paths.items()}
        self._pid = os.getpid()
        # arrays whose chunks hold few rows each (or a small array whole) are read through decoded chunks kept in
        # memory; an array whose chunk alone passes the budget is read by slice
        self._blocks = {name: _Blocks(a) for name, a in self._arrays.items()
                        if max(1, int(a.chunks[0])) * _row_bytes(a) <= _BLOCK_BYTES // 4}

    def describe(self, episode: int) -> str:
        """Where an episode lives: the store and its rows (``start:end``) in every array of ``data/``."""
        start = int(self._starts[episode])
        return f"{self.name} episode {episode} (rows {start}:{start + int(self._lengths[episode])})"

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested rows of each request, each array read by slice (the chunks it touches)."""
        self._check_requests(requests)
        arrays = self._handles()
        out = []
        for request in requests:
            e = request.episode
            start = int(self._starts[e])
            got = {}
            for feature, idx in request.indices.items():
                asked = np.asarray(idx, dtype=np.int64)
                flat = asked.reshape(-1)
                try:
                    with stage("read"):
                        blocks = self._blocks.get(feature)
                        if blocks is not None and flat.size:
                            rows = blocks.read(arrays[feature], start + flat)
                        else:
                            rows = _rows(arrays[feature], start, flat)
                except Exception as err:  # noqa: BLE001 - a torn chunk or a codec failure, named with the key
                    span = f"{start + int(flat.min())}..{start + int(flat.max())}" if flat.size else "(none)"
                    raise SampleError(f"{self.name}: array data/{self._paths[feature]} rows {span} (episode {e}) "
                                      f"cannot be read: {' '.join(str(err).split()) or type(err).__name__}") from err
                got[feature] = rows.reshape(*asked.shape, *rows.shape[1:])
            out.append(got)
        return out

    def _handles(self) -> dict[str, Any]:
        """The store's arrays, opened again in a process other than the one that opened them (a worker)."""
        with self._lock:
            if self._arrays is None or self._pid != os.getpid():
                data = open_root(self.name)["data"]
                self._arrays = {name: data[path] for name, path in self._paths.items()}
                self._pid = os.getpid()
            return self._arrays

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        state["_arrays"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
