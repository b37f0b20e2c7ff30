"""``mmfeed.lerobot.LeRobotDataset``: LeRobot's dataset class over mmfeed's reader; a LeRobot training script
changes one import::

    from mmfeed.lerobot import LeRobotDataset      # instead of lerobot.datasets.lerobot_dataset

    ds = LeRobotDataset("lerobot/pusht", delta_timestamps={"action": [i / 10 for i in range(16)]})
    item = ds[0]   # what LeRobot 0.4's item holds: every key, dtype, shape and value
    ds.meta.camera_keys, ds.meta.stats, ds.fps, ds.num_frames

``ds[i]`` is LeRobot 0.4.4's ``LeRobotDataset[i]``, key for key: every feature of ``meta/info.json`` at step ``i``
(numbers as LeRobot makes them: float features float32, integer ones int64, bool ones bool; a number declared shape
``[1]`` a 0-d tensor), camera frames float32 ``[C, H, W]`` in ``[0, 1]`` (videos decoded, PNG/JPEG images from the
parquet), ``timestamp``, ``frame_index``, ``episode_index``, ``index``, ``task_index``, ``task`` (the text of the
step's ``task_index``) and, where the dataset has ``subtask_index`` and ``meta/subtasks.parquet``, ``subtask``;
LeRobot's per-frame language columns (``language_persistent``, ``language_events``: dtype ``language``) as the list
of their message dicts, as newer LeRobot passes them through. With ``delta_timestamps`` each feature named there
holds ``[K, ...]`` (frames ``[K, C, H, W]``; a video asked at one time is squeezed to ``[C, H, W]`` as LeRobot
squeezes it) with ``f"{feature}_is_pad"`` (bool ``[K]``): steps outside the episode read its first or last step,
flagged. A ``torch.utils.data.DataLoader`` over it batches as over LeRobot's.

The samples come from mmfeed's reader (:func:`~mmfeed.loaders.open_dataset`: LeRobot v3 and v2.1 directories,
local or at an fsspec URL, and Hub ids as LeRobot resolves them); ``ds.source`` is that
:class:`~mmfeed.loaders.sources.base.EpisodeSource`, for mmfeed's own loader. Video frames are decoded by mmfeed's
decoder, so they may differ from LeRobot's torchcodec frames by a decoder's colour rounding (a level or two of
255); everything else is equal.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmfeed.loaders import open_dataset
from mmfeed.loaders.formats.lerobot import v21
from mmfeed.loaders.sources.base import EpisodeSource
from mmfeed.loaders.sources.requests import window_requests
from mmfeed.loaders.transport.files import DatasetFiles, is_url
from mmfeed.packing.windows import WindowSpec

__all__ = ["EpisodeTable", "LeRobotDataset", "LeRobotDatasetMetadata"]

log = logging.getLogger(__name__)

CODEBASE_VERSION = "v3.0"
"""The LeRobot dataset version whose class this is (the default ``revision``, as LeRobot's)."""
_FRAMES = ("video", "image")


class EpisodeTable:
    """``meta.episodes`` as LeRobot reads it (``meta/episodes`` without its ``stats/`` columns), with the part of
    ``datasets.Dataset``'s interface LeRobot's code uses: ``table[i]`` is episode ``i``'s row as a dict,
    ``table["length"]`` a column as a list, ``len(table)``, ``column_names``, ``num_rows``, ``to_pandas()`` and
    ``select_columns``."""

    def __init__(self, table: Any) -> None:
        self._table = table

    def __len__(self) -> int:
        return self._table.num_rows

    @property
    def num_rows(self) -> int:
        return self._table.num_rows

    @property
    def column_names(self) -> list[str]:
        return list(self._table.column_names)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            if key not in self._table.column_names:
                raise KeyError(f"meta.episodes has no column {key!r}; its columns are {self.column_names}")
            return self._table[key].to_pylist()
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"meta.episodes takes an episode (int) or a column name (str), got {key!r}")
        n = len(self)
        if not -n <= key < n:
            raise IndexError(f"episode {key} out of range ({n} episodes)")
        return {c: v[0] for c, v in self._table.slice(int(key) % n, 1).to_pydict().items()}

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def select_columns(self, columns: Sequence[str]) -> EpisodeTable:
        return EpisodeTable(self._table.select(list(columns)))

    def to_pandas(self) -> Any:
        return self._table.to_pandas()

    def __repr__(self) -> str:
        return f"EpisodeTable(num_rows={self.num_rows}, columns={self.column_names})"


class LeRobotDatasetMetadata:
    """LeRobot's ``LeRobotDatasetMetadata`` of a dataset mmfeed opened: ``info`` (``meta/info.json``, shapes as
    tuples), ``stats`` (``meta/stats.json`` as numpy arrays; None without it), ``episodes``
    (:class:`EpisodeTable`), ``tasks`` (a pandas DataFrame indexed by the task text, column ``task_index``;
    pandas needed), ``subtasks`` and the properties LeRobot derives from them. ``force_cache_sync`` and
    ``metadata_buffer_size`` (recording) are accepted and ignored; ``source`` takes a dataset mmfeed opened."""

    def __init__(self, repo_id: str, root: str | os.PathLike | None = None, revision: str | None = None,
                 force_cache_sync: bool = False, metadata_buffer_size: int = 10, *,
                 source: EpisodeSource | None = None) -> None:
        self.repo_id = repo_id
        self.revision = revision if revision else CODEBASE_VERSION
        if source is None:
            source = _open(repo_id, root, revision)
        self.source = source
        self.root = _root_of(source)
        files = DatasetFiles(source.root)
        self.info = _info(source)
        self.stats = _stats(files, self.info)
        self.episodes = _episodes(source, files)
        self._tasks = None
        self._files = files

    @property
    def tasks(self) -> Any:
        """Task texts as LeRobot reads ``meta/tasks.parquet``: a pandas DataFrame indexed by the text, with a
        ``task_index`` column."""
        if self._tasks is None:
            self._tasks = _tasks_frame(self.source, self._files)
        return self._tasks

    @property
    def subtasks(self) -> Any:
        """``meta/subtasks.parquet`` as a pandas DataFrame, or None where the dataset has none."""
        if not self._files.exists("meta/subtasks.parquet"):
            return None
        return self._files.parquet("meta/subtasks.parquet").read().to_pandas()

    @property
    def url_root(self) -> str:
        return f"hf://datasets/{self.repo_id}"

    @property
    def data_path(self) -> str:
        return self.info["data_path"]

    @property
    def video_path(self) -> str | None:
        return self.info.get("video_path")

    @property
    def robot_type(self) -> str | None:
        return self.info.get("robot_type")

    @property
    def fps(self) -> int:
        return self.info["fps"]

    @property
    def features(self) -> dict[str, dict]:
        return self.info["features"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == "image"]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] == "video"]

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, ft in self.features.items() if ft["dtype"] in _FRAMES]

    @property
    def names(self) -> dict[str, Any]:
        return {k: ft.get("names") for k, ft in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple]:
        return {k: tuple(ft["shape"]) for k, ft in self.features.items()}

    @property
    def total_episodes(self) -> int:
        return self.info["total_episodes"]

    @property
    def total_frames(self) -> int:
        return self.info["total_frames"]

    @property
    def total_tasks(self) -> int:
        return self.info["total_tasks"]

    @property
    def chunks_size(self) -> int:
        return self.info["chunks_size"]

    def get_task_index(self, task: str) -> int | None:
        """The task_index of ``task``, or None where the dataset has no such task."""
        tasks = self.tasks
        return int(tasks.loc[task].task_index) if task in tasks.index else None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({{\n    Repository ID: '{self.repo_id}',\n    Total episodes: "
                f"'{self.total_episodes}',\n    Total frames: '{self.total_frames}',\n    Features: "
                f"'{list(self.features)}',\n}})',\n")


class LeRobotDataset(torch.utils.data.Dataset):
    """LeRobot 0.4's ``LeRobotDataset`` for reading, over mmfeed's reader (see the module's docstring).

    repo_id: the dataset's Hub id (``"lerobot/pusht"``), opened as :func:`~mmfeed.loaders.open_dataset` opens one
        (LeRobot's local copy, else the Hub's in place) unless ``root`` is given.
    root: the dataset's directory (or fsspec URL); read there, whatever ``repo_id`` says.
    episodes: the ``episode_index`` of the episodes to read (default: all); ``ds[i]`` numbers their steps back to
        back, in the dataset's order.
    image_transforms: applied to every camera's frames of each item (torchvision v2 transforms, as LeRobot).
    delta_timestamps: ``{feature: [seconds from the step]}``; each must be a multiple of ``1 / fps`` within
        ``tolerance_s``.
    tolerance_s: that tolerance, also the one within which decoded frames must meet their timestamps.
    revision: the Hub revision (branch, tag or commit) a Hub id is read at.

    Accepted and ignored, as they have no meaning for a reader: ``force_cache_sync`` and ``download_videos`` (the
    files are read where they are, nothing is synced), ``video_backend`` (frames are decoded by mmfeed's decoder;
    give ``open_dataset``'s ``backend=`` through ``source=`` to choose it) and ``batch_encoding_size`` (recording
    only). ``source`` takes a dataset mmfeed already opened, instead of ``repo_id``/``root``.
    """

    def __init__(self, repo_id: str, root: str | os.PathLike | None = None, episodes: Sequence[int] | None = None,
                 image_transforms: Callable | None = None,
                 delta_timestamps: Mapping[str, Sequence[float]] | None = None,
                 tolerance_s: float = 1e-4, revision: str | None = None, force_cache_sync: bool = False,
                 download_videos: bool = True, video_backend: str | None = None, batch_encoding_size: int = 1,
                 *, source: EpisodeSource | None = None) -> None:
        super().__init__()
        if not isinstance(repo_id, str):
            raise TypeError(f"repo_id is a str (a Hub id such as 'lerobot/pusht'), got {type(repo_id).__name__}")
        self.repo_id, self.image_transforms, self.tolerance_s = repo_id, image_transforms, float(tolerance_s)
        self.revision = revision if revision else CODEBASE_VERSION
        self.video_backend = video_backend
        self.batch_encoding_size = batch_encoding_size
        if source is None:
            source = _open(repo_id, root, revision, tolerance_s=self.tolerance_s)
        self.source = source
        self.meta = LeRobotDatasetMetadata(repo_id, revision=revision, source=source)
        self.root = self.meta.root
        self._episode_ids = _episode_ids(source, self.meta)
        self.episodes = None if episodes is None else [int(e) for e in episodes]
        self._positions = self._select(self.episodes)
        lengths = np.asarray(source.lengths, dtype=np.int64)[self._positions]
        self._ends = np.cumsum(lengths)
        self.delta_timestamps = None if delta_timestamps is None else {k: list(v) for k, v in delta_timestamps.items()}
        self.delta_indices = None
        if self.delta_timestamps is not None:
            _check_delta_timestamps(self.delta_timestamps, self.fps, self.tolerance_s, self.features)
            self.delta_indices = {k: [round(d * self.fps) for d in v] for k, v in self.delta_timestamps.items()}
        self._spec = self._window()
        self._tasks = [str(t) for t in self.meta.tasks.index] if len(self.meta.tasks) else []
        self._task_of = dict(zip(self.meta.tasks["task_index"].tolist(), self._tasks))

    # -- LeRobot's properties -------------------------------------------------------------------------------
    @property
    def fps(self) -> int:
        return self.meta.fps

    @property
    def num_frames(self) -> int:
        """Steps of the selected episodes (all of them without ``episodes``)."""
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def num_episodes(self) -> int:
        return len(self.episodes) if self.episodes is not None else self.meta.total_episodes

    @property
    def features(self) -> dict[str, dict]:
        return self.meta.features

    def __len__(self) -> int:
        return self.num_frames

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({{\n    Repository ID: '{self.repo_id}',\n    Number of selected episodes: "
                f"'{self.num_episodes}',\n    Number of selected samples: '{self.num_frames}',\n    Features: "
                f"'{list(self.features)}',\n}})',\n")

    # -- items ----------------------------------------------------------------------------------------------
    def __getitem__(self, idx: int) -> dict[str, Any]:
        if isinstance(idx, torch.Tensor) and idx.ndim == 0:
            idx = int(idx)
        if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
            raise TypeError(f"LeRobotDataset takes an int index, got {idx!r}")
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} out of range ({n} samples)")
        idx = int(idx) % n
        k = int(np.searchsorted(self._ends, idx, side="right"))
        episode, step = int(self._positions[k]), idx - (int(self._ends[k - 1]) if k else 0)
        (request, pads), = window_requests(self.source, self._spec, np.array([episode]), np.array([step]))
        data = self.source.read_many([request])[0]
        deltas = self.delta_timestamps or {}
        values = {f: self._value(f, data[f], f in deltas) for f in self._spec.deltas}
        videos = self.meta.video_keys
        item = {f: values[f] for f in videos}  # LeRobot's order: videos, the parquet's columns, pad flags, task
        item.update((f, values[f]) for f in self.features if f not in videos and f in values)
        item.update((f"{f}_is_pad", torch.from_numpy(np.asarray(pads[f], dtype=bool).copy())) for f in deltas)
        if self.image_transforms is not None:
            for camera in self.meta.camera_keys:
                item[camera] = self.image_transforms(item[camera])
        item["task"] = self._task_of[int(item["task_index"])]
        if "subtask_index" in self.features:
            subtasks = self.meta.subtasks
            if subtasks is not None:
                item["subtask"] = str(subtasks.index[int(item["subtask_index"])])
        return item

    def _value(self, feature: str, values: Any, windowed: bool) -> Any:
        """One feature's ``[K, ...]`` read as LeRobot's item holds it."""
        spec = self.features[feature]
        if spec["dtype"] in _FRAMES:
            frames = values if isinstance(values, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(values))
            frames = frames.permute(0, 3, 1, 2).contiguous().to(torch.float32).div_(255.0)  # contiguous, as LeRobot's
            if not windowed or (spec["dtype"] == "video" and frames.shape[0] == 1):
                return frames[0]  # LeRobot squeezes a video asked at one time
            return frames
        if spec["dtype"] == "language":  # LeRobot's per-frame messages: mmfeed reads them as JSON text
            rows = [json.loads(v) for v in values]
            return rows if windowed else rows[0]
        if spec["dtype"] == "string" or getattr(values, "dtype", None) == object:
            return values.tolist() if windowed else str(values[0])
        array = np.asarray(values)
        kind = array.dtype.kind
        dtype = torch.float32 if kind == "f" else torch.bool if kind == "b" else torch.int64
        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
        return tensor if windowed else tensor[0]

    def _window(self) -> WindowSpec:
        """The window each item reads: ``delta_timestamps``' features at their times, every other feature at the
        step."""
        deltas = {k: [float(d) for d in v] for k, v in (self.delta_timestamps or {}).items()}
        for feature in self.features:
            if feature in self.source.features and feature not in deltas:
                deltas[feature] = [0.0]
        return WindowSpec.from_delta_timestamps(deltas, tolerance_s=self.tolerance_s)

    def _select(self, episodes: Sequence[int] | None) -> np.ndarray:
        """Positions in the source of the episodes whose ``episode_index`` is in ``episodes``, in the dataset's
        order (all without ``episodes``)."""
        ids = self._episode_ids
        if episodes is None:
            return np.arange(len(ids), dtype=np.int64)
        wanted = set(episodes)
        missing = sorted(wanted - set(ids.tolist()))
        if missing:
            raise ValueError(f"{self.root}: episodes {missing[:10]} are not in the dataset; its episode_index runs "
                             f"over {len(ids)} episodes from {int(ids.min()) if len(ids) else 0} to "
                             f"{int(ids.max()) if len(ids) else -1}")
        return np.flatnonzero(np.isin(ids, list(wanted))).astype(np.int64)


# -- helpers -------------------------------------------------------------------------------------------------
def _open(repo_id: str, root: str | os.PathLike | None, revision: str | None, **options: Any) -> EpisodeSource:
    """mmfeed's source of the dataset at ``root``, else of the Hub id ``repo_id``."""
    if root is not None:
        return open_dataset(root, **options)
    return open_dataset(repo_id, revision=revision, **options)


def _root_of(source: EpisodeSource) -> Path | str:
    root = str(source.root)
    return root if is_url(root) else Path(root)


def _info(source: EpisodeSource) -> dict:
    """``meta/info.json`` as LeRobot loads it: shapes as tuples."""
    import copy

    info = copy.deepcopy(getattr(source, "info"))
    for ft in info["features"].values():
        ft["shape"] = tuple(ft["shape"])
    return info


def _stats(files: DatasetFiles, info: Mapping) -> dict | None:
    """``meta/stats.json`` as LeRobot loads it: every leaf ``np.array(value)`` (v2.1: its episodes' statistics
    aggregated as LeRobot aggregates them); None without either."""
    if not files.exists("meta/stats.json"):
        if v21.is_v2(info) and files.exists("meta/episodes_stats.jsonl"):
            return v21.aggregate_stats(v21.episode_stats(files))
        return None

    def cast(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: cast(v) for k, v in value.items()}
        return np.array(value)

    return cast(files.read_json("meta/stats.json"))


def _episodes(source: EpisodeSource, files: DatasetFiles) -> EpisodeTable:
    """``meta/episodes`` without its ``stats/`` columns, its files in order, as LeRobot loads it; a dataset of
    another layout gives what its reader knows in the same columns."""
    import pyarrow as pa

    info = getattr(source, "info", {})
    if v21.is_v2(info):  # meta/episodes.jsonl, with the row ranges a v3 dataset keeps beside
        rows = sorted(v21.read_jsonl(files, "meta/episodes.jsonl"), key=lambda r: r["episode_index"])
        lengths = np.array([r["length"] for r in rows], dtype=np.int64)
        ends = np.cumsum(lengths)
        return EpisodeTable(pa.table({
            "episode_index": [r["episode_index"] for r in rows], "tasks": [r.get("tasks", []) for r in rows],
            "length": lengths, "dataset_from_index": ends - lengths, "dataset_to_index": ends}))
    paths = sorted(files.glob("meta/episodes/chunk-*/file-*.parquet") or [])
    parts = []
    for relative in paths:
        parquet = files.parquet(relative)
        columns = [c for c in parquet.schema_arrow.names if not c.startswith("stats/")]
        parts.append(parquet.read(columns=columns))
    return EpisodeTable(pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({}))


def _tasks_frame(source: EpisodeSource, files: DatasetFiles) -> Any:
    """``meta/tasks.parquet`` as LeRobot loads it (``pd.read_parquet``): indexed by the task text."""
    try:
        import pandas  # noqa: F401
    except ImportError as err:
        raise ImportError("LeRobotDataset.meta.tasks is a pandas DataFrame, as LeRobot's; pip install pandas") from err
    if v21.is_v2(getattr(source, "info", {})):  # meta/tasks.jsonl, as a v3 dataset's tasks.parquet reads
        import pandas as pd

        texts = v21.read_tasks(files)
        return pd.DataFrame({"task_index": np.arange(len(texts), dtype=np.int64)}, index=pd.Index(texts))
    return files.parquet("meta/tasks.parquet").read().to_pandas()


def _episode_ids(source: EpisodeSource, meta: LeRobotDatasetMetadata) -> np.ndarray:
    """The ``episode_index`` of each of the source's episodes, in its order."""
    episodes = meta.episodes
    if "episode_index" in episodes.column_names and len(episodes) == len(source):
        return np.sort(np.asarray(episodes["episode_index"], dtype=np.int64))
    return np.arange(len(source), dtype=np.int64)


def _check_delta_timestamps(delta_timestamps: Mapping[str, Sequence[float]], fps: float, tolerance_s: float,
                            features: Mapping[str, Any]) -> None:
    """LeRobot's check: every delta a multiple of ``1 / fps`` within ``tolerance_s``; and every feature named."""
    unknown = [k for k in delta_timestamps if k not in features]
    if unknown:
        raise ValueError(f"delta_timestamps names {unknown}, which the dataset does not have; its features are "
                         f"{sorted(features)}")
    outside = {k: [d for d in v if abs(d * fps - round(d * fps)) / fps > tolerance_s]
               for k, v in delta_timestamps.items()}
    outside = {k: v for k, v in outside.items() if v}
    if outside:
        raise ValueError(f"delta_timestamps {outside} are not multiples of 1/fps (fps {fps}) within tolerance_s "
                         f"{tolerance_s}; give multiples of {1 / fps:g} s")
