"""HDF5 demonstrations (robomimic, LIBERO, ACT/ALOHA) as an :class:`~mmfeed.loaders.sources.base.EpisodeSource`.

Every per-step dataset of an episode is a feature under its path with "." between levels (``actions``,
``obs.agentview_rgb``, ``observations.images.cam_high``); uint8 ``[T, H, W, 3]`` datasets and ALOHA's JPEG
cameras are video features (frames ``[H, W, 3]``), everything else an array of its own dtype. The files record no
frame rate: ``fps=`` is required. Episodes come in natural order (``demo_2`` before ``demo_10``, ``episode_9.hdf5``
before ``episode_10.hdf5``); a worker reads only the rows a request needs (one slice per dataset, or the rows
themselves where they lie far apart), through its own file handles::

    >>> ds = Hdf5Source("libero_10/", fps=20, split="train")                          # doctest: +SKIP
    >>> ds.features["obs.agentview_rgb"]                                             # doctest: +SKIP
    Feature(kind='video', dtype='uint8', shape=(128, 128, 3), fps=20.0, frame_format='rgb24')

JPEG pictures decode (libjpeg, through Pillow) to exactly what ACT's loader gets back with ``cv2.imdecode``: the
channels in the order they were recorded (``cv2.imencode`` was given them as they came).
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmfeed.loaders.clock import stage
from mmfeed.loaders.formats.hdf5.metadata import (LAYOUTS, Column, Episode, check_episode, columns_of, h5py_module,
                                                  hdf5_files, open_file, read_layout)
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource, Feature
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.transport.errors import SampleError

__all__ = ["Hdf5Source", "decode_jpeg", "pillow_image", "read_rows"]

log = logging.getLogger(__name__)

_MAX_OPEN = 64  # file handles a process keeps open (ALOHA folders hold a file per episode)


def read_rows(array: Any, start: int, idx: np.ndarray) -> np.ndarray:
    """Rows ``start + idx`` of ``array`` (an h5py or zarr array), reading only what they need: one slice over
    their span, or the distinct rows alone where the span is more than twice as many rows as they are."""
    if not idx.size:
        return np.zeros((0, *array.shape[1:]), dtype=array.dtype)
    lo, hi = int(idx.min()), int(idx.max()) + 1
    if hi - lo <= 2 * idx.size:
        return array[start + lo:start + hi][idx - lo]
    rows, back = np.unique(idx, return_inverse=True)
    picked = array.oindex[start + rows] if hasattr(array, "oindex") else array[start + rows]
    return np.asarray(picked)[back.reshape(-1)]


def pillow_image() -> Any:
    """Pillow's ``PIL.Image``, or an ImportError naming the extra that installs it."""
    try:
        from PIL import Image
    except ImportError as err:
        raise ImportError("decoding ALOHA's JPEG pictures needs Pillow: pip install 'mmfeed[hdf5]' (or pip install "
                          "pillow)") from err
    return Image


def decode_jpeg(data: bytes, max_frame_pixels: int | None = None) -> np.ndarray:
    """One JPEG picture as uint8 ``[H, W, 3]`` in the channel order it was encoded from: what ``cv2.imdecode``
    gives (libjpeg through Pillow, the same decoder and upsampling, so the same pixels). A header declaring more
    than ``max_frame_pixels`` is refused before anything is decoded. (Read-only: Pillow packs the channels in
    that order into bytes, which the array views.)"""
    Image = pillow_image()
    with Image.open(io.BytesIO(data), formats=("JPEG",)) as image:
        width, height = image.size
        if max_frame_pixels is not None and width * height > max_frame_pixels:
            raise ValueError(f"the picture declares {height}x{width} pixels, more than max_frame_pixels="
                             f"{max_frame_pixels}")
        rgb = image if image.mode == "RGB" else image.convert("RGB")
        return np.frombuffer(rgb.tobytes("raw", "BGR"), dtype=np.uint8).reshape(height, width, 3)


class Hdf5Source(EpisodeSource):
    """The episodes of robomimic/LIBERO files or ACT/ALOHA episode files.

    path: one HDF5 file (robomimic, LIBERO or a single ALOHA episode) or a folder of them (``*.hdf5``, ``*.h5``).
    options: how it is read (:class:`~mmfeed.loaders.sources.options.ReadOptions`: ``fps`` (required),
        ``layout`` (``"robomimic"`` or ``"aloha"``; default detected from the first file), ``split`` (a robomimic
        ``mask/<split>``), ``max_frame_pixels``), or its fields as keyword arguments.
    """

    FORMAT = "HDF5 demonstrations"
    READ_OPTIONS = ("fps", "layout", "split", "max_frame_pixels")
    """The :class:`~mmfeed.loaders.sources.options.ReadOptions` this format reads."""

    def __init__(self, path: str | os.PathLike, options: ReadOptions | None = None, **kwargs: Any) -> None:
        options = ReadOptions.of(options, **kwargs)
        self.root = self.name = os.fspath(path)
        options.refuse_others(self.READ_OPTIONS, self.FORMAT, self.name)
        if options.layout is not None and options.layout not in LAYOUTS:
            raise ValueError(f"{self.name}: layout={options.layout!r} is no HDF5 layout; give one of {list(LAYOUTS)} "
                             "(or None to detect it)")
        h5py_module()
        self.options = options
        self._files = hdf5_files(self.name)
        self._handles: dict[int, Any] = {}
        self._lock = threading.Lock()
        episodes: list[Episode] = []
        tasks: list[str] = []
        columns: list[Column] | None = None
        self.layout, first, freq = options.layout, "", None
        for k, file in enumerate(self._files):
            f = open_file(file)
            try:
                found = read_layout(f, file, self.layout, options.split)
                self.layout = self.layout or found.layout
                freq = freq or found.control_freq
                for episode in found.episodes:
                    episode.file = k
                    if columns is None:
                        columns = columns_of(f, episode, self.layout, file)
                        first = f"{file} {episode.group or '/'}"
                    check_episode(f, episode, columns, file, first)
                episodes.extend(found.episodes)
                tasks.extend([found.task] * len(found.episodes))
            finally:
                f.close()
        if not episodes:
            raise ValueError(f"{self.name}: no episodes" + (f" in split {options.split!r}" if options.split else ""))
        if options.fps is None:
            hint = f" (its env_args give control_freq {freq:g}: fps={freq:g} if that is the rate)" if freq else ""
            raise ValueError(f"{self.name}: HDF5 demonstrations record no frame rate{hint}; pass fps=, e.g. "
                             f"open_dataset({self.name!r}, fps=...) (--fps on the command line)")
        fps = float(options.fps)
        self._episodes = episodes
        self._columns = {c.name: c for c in columns}
        self.features = {}
        for name, column in self._columns.items():
            self.features[name] = self._feature(name, column, fps)
        self._lengths = np.asarray([e.length for e in episodes], dtype=np.int64)
        self._fps = np.full(len(episodes), fps, dtype=np.float64)
        self.tasks = list(dict.fromkeys(tasks))
        self._episode_tasks = np.asarray([self.tasks.index(t) for t in tasks], dtype=np.int64)
        self.stats: dict[str, dict[str, np.ndarray]] = {}  # the files hold none: `mmfeed stats` computes them

    def _feature(self, name: str, column: Column, fps: float) -> Feature:
        shape = column.shape
        if column.compressed:  # the size of the first picture of the first episode
            shape = self._first_picture(name).shape
        video = column.compressed or (column.dtype == "uint8" and len(shape) == 3 and shape[-1] == 3)
        if video:
            self.options.check_frame_pixels(self.name, name, shape[0], shape[1])
        return Feature("video" if video else "array", "uint8" if video else column.dtype, shape, fps)

    def _first_picture(self, name: str) -> np.ndarray:
        """The first picture of the first episode that has one: its size is the feature's."""
        episode = next((e for e in self._episodes if e.length > 0), None)
        if episode is None:
            raise ValueError(f"{self.name}: every episode is empty, so the size of {name!r}'s pictures is unknown")
        column = self._columns[name]
        row = np.asarray(self._dataset(episode.file, episode.key(column.path))[0])
        sizes = episode.compress_len.get(name)
        data = row[: int(sizes[0])] if sizes is not None else row
        pillow_image()
        try:
            return np.ascontiguousarray(decode_jpeg(data.tobytes(), self.options.max_frame_pixels))
        except (OSError, ValueError, SyntaxError) as err:  # what Pillow raises for bytes that are no JPEG
            raise ValueError(f"{self._files[episode.file]}: dataset {episode.key(column.path)!r} row 0 is not a JPEG "
                             f"picture ({err})") from err

    # -- the EpisodeSource interface -------------------------------------------------------------------------
    def describe(self, episode: int) -> str:
        e = self._episodes[episode]
        return f"{self._files[e.file]} {e.group or '/'}"

    def episode(self, index: int) -> dict:
        """The whole episode (every feature, pictures decoded), ``task``, ``fps`` and ``episode_id`` (the file and
        group)."""
        return {**super().episode(index), "episode_id": self.describe(index)}

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested rows of each request, each dataset read by slice; JPEG pictures decoded."""
        self._check_requests(requests)
        out: list[dict[str, np.ndarray]] = []
        for request in requests:
            e = request.episode
            episode = self._episodes[e]
            got = {}
            for feature, idx in request.indices.items():
                asked = np.asarray(idx, dtype=np.int64)
                idx = asked.reshape(-1)
                column = self._columns[feature]
                key = episode.key(column.path)
                try:
                    with stage("read"):
                        rows = read_rows(self._dataset(episode.file, key), 0, idx)
                    if column.compressed:
                        with stage("decode"):
                            rows = self._pictures(e, feature, rows, idx)
                except (OSError, KeyError, RuntimeError, ValueError) as err:
                    if isinstance(err, SampleError):
                        raise
                    raise SampleError(f"{self._files[episode.file]}: dataset {key!r} rows {_span(idx)} cannot be "
                                      f"read: {' '.join(str(err).split())}") from err
                got[feature] = rows.reshape(*asked.shape, *rows.shape[1:])
            out.append(got)
        return out

    def _pictures(self, e: int, feature: str, rows: np.ndarray, idx: np.ndarray) -> np.ndarray:
        episode = self._episodes[e]
        sizes = episode.compress_len.get(feature)
        shape = self.features[feature].shape
        out = np.empty((len(idx), *shape), dtype=np.uint8)
        done: dict[int, int] = {}  # step -> where it was decoded (a padded window repeats its edge rows)
        for i, (row, step) in enumerate(zip(rows, idx.tolist())):
            if step in done:
                out[i] = out[done[step]]
                continue
            done[step] = i
            data = row[: int(sizes[step])] if sizes is not None else row
            try:
                picture = decode_jpeg(data.tobytes(), self.options.max_frame_pixels)
            except (OSError, ValueError, SyntaxError) as err:
                raise SampleError(f"{self.describe(e)} dataset {self._columns[feature].path!r} row {int(step)}: not a "
                                  f"JPEG picture ({err})") from err
            if picture.shape != shape:
                raise SampleError(f"{self.describe(e)} dataset {self._columns[feature].path!r} row {int(step)}: the "
                                  f"picture is {picture.shape[0]}x{picture.shape[1]}, the feature's {shape[0]}x"
                                  f"{shape[1]}")
            out[i] = picture
        return out

    def _dataset(self, k: int, key: str) -> Any:
        """Dataset ``key`` of file ``k``, opened once in this process (handles do not cross a fork or a pickle;
        looking a path up in a file costs more than reading a small row)."""
        pid = os.getpid()
        with self._lock:
            if getattr(self, "_pid", None) != pid:
                self._handles, self._pid = {}, pid
            opened = self._handles.get(k)
            if opened is None:
                if len(self._handles) >= _MAX_OPEN:
                    for f, _ in self._handles.values():
                        f.close()
                    self._handles.clear()
                opened = self._handles[k] = (open_file(self._files[k]), {})
            f, datasets = opened
            ds = datasets.get(key)
            if ds is None:
                ds = datasets[key] = f[key]
            return ds

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_handles", "_lock", "_pid"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._handles, self._lock = {}, threading.Lock()


def _span(idx: np.ndarray) -> str:
    return f"{int(idx.min())}..{int(idx.max())}" if idx.size else "(none)"
