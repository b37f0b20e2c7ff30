"""LeRobot v3 directories as an episode source.

A LeRobot v3.0 dataset keeps its episode index in ``meta/episodes/chunk-XXX/file-XXX.parquet`` (length, the
episode's row range in the data files and, per camera, which video file holds it and from what timestamp),
per-frame rows in ``data/chunk-XXX/file-XXX.parquet`` and the episodes of each camera back to back in
``videos/<key>/chunk-XXX/file-XXX.mp4``. Frame ``i`` of an episode is at ``from_timestamp + i / fps`` in its file.
Planning reads only the metadata; workers read the rows and decode the frames a batch asks for, one decode pass
per video file for all the frames of the batch.

Camera keys lose their dotted prefix: ``observation.images.cam_high`` becomes ``frames.cam_high``;
``observation.state`` is ``proprio``.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.loaders.layout import FRAMES_PREFIX
from mmfeed.loaders.sources import EpisodeArrays, EpisodeRequest
from mmfeed.loaders.timing import stage
from mmfeed.loaders.errors import decode_with_context

__all__ = ["LeRobotSource", "is_lerobot_dir"]

log = logging.getLogger(__name__)

STATE_KEY = "observation.state"
ACTION_KEY = "action"


def is_lerobot_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` looks like a LeRobot dataset root (it has ``meta/info.json``)."""
    return (Path(path) / "meta" / "info.json").is_file()


class LeRobotSource(EpisodeArrays):
    """Episodes of a LeRobot v3 directory.

    root: the dataset directory (holding ``meta/``, ``data/`` and ``videos/``).
    state_key, action_key: the feature names read as ``proprio`` and ``action``.
    backend: the video backend for ``mmfeed.codecs`` ("auto" sends AV1 to PyAV).
    tolerance_s: how far a decoded frame's timestamp may be from the one asked for (LeRobot's default 1e-4 s).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        state_key: str = STATE_KEY,
        action_key: str = ACTION_KEY,
        backend: str = "auto",
        tolerance_s: float = 1e-4,
    ) -> None:
        self.root = Path(root)
        self.name = str(self.root)
        self.backend = backend
        self.tolerance_s = tolerance_s
        self.state_key, self.action_key = state_key, action_key
        self.info = _read_json(self.root / "meta" / "info.json")
        version = str(self.info.get("codebase_version", ""))
        if not version.startswith("v3"):
            raise ValueError(f"{self.root}: meta/info.json has codebase_version {version!r}; mmfeed reads LeRobot v3.x")
        for field in ("fps", "features", "data_path"):
            if field not in self.info:
                raise ValueError(f"{self.root / 'meta' / 'info.json'}: missing field {field!r}")
        features = self.info["features"]
        for key in (state_key, action_key):
            if key not in features:
                raise ValueError(f"{self.root}: feature {key!r} is not in meta/info.json (features: {sorted(features)})")
        self.video_keys = [k for k, f in features.items() if f.get("dtype") == "video"]
        if self.video_keys and "video_path" not in self.info:
            raise ValueError(f"{self.root / 'meta' / 'info.json'}: video features but no 'video_path'")
        self.cameras = [k.rsplit(".", 1)[-1] for k in self.video_keys]
        self._camera_key = dict(zip(self.cameras, self.video_keys))
        self._episodes = _read_episode_table(self.root)
        self._columns: dict[str, np.ndarray] = {}
        self._lengths = self._column("length").astype(np.int64)
        self._fps = np.full(len(self._lengths), float(self.info["fps"]), dtype=np.float64)
        self._data_cache: OrderedDict[Path, dict[str, np.ndarray]] = OrderedDict()
        self._videos: VideoReaderCache | None = None

    # -- planning-side metadata ------------------------------------------------------------------------------
    def task(self, episode: int) -> str:
        tasks = self._episodes["tasks"][episode].as_py() if "tasks" in self._episodes.column_names else None
        if tasks:
            return str(tasks[0])
        return ""

    def camera_fps(self, episode: int, camera: str) -> float:
        return float(self._fps[episode])

    # -- worker-side reads -----------------------------------------------------------------------------------
    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        if self._videos is None:
            self._videos = VideoReaderCache(max_open=4, backend=self.backend)
        out: list[dict[str, np.ndarray]] = [{} for _ in requests]
        # Video: gather every wanted timestamp per file, decode each file once, scatter back.
        wanted: dict[Path, list[tuple]] = defaultdict(list)  # path -> (request, key, times, where, into)
        for r, request in enumerate(requests):
            for key, steps in request.steps.items():
                steps = np.asarray(steps, dtype=np.int64)
                self._check_steps(request.episode, key, steps)
                if key.startswith(FRAMES_PREFIX):
                    path, times = self._frame_times(request.episode, key[len(FRAMES_PREFIX) :], steps)
                    where = f"{self.describe(request.episode)} stream {key[len(FRAMES_PREFIX):]!r} ({path})"
                    into = request.out.get(key) if request.out else None
                    wanted[path].append((r, key, times, where, into))
                elif key in ("proprio", "action"):
                    out[r][key] = self._rows(request.episode, key, steps)
                else:
                    raise ValueError(f"{self.root}: cannot read key {key!r}; keys are 'proprio', 'action', 'frames.<camera>'")
        requests_flat = [(r, key, FrameRequest(path, timestamps=t, tolerance_s=self.tolerance_s, out=into), where)
                         for path, items in wanted.items() for r, key, t, where, into in items]
        with stage("decode"):
            decoded = decode_with_context(self._videos, [item[2] for item in requests_flat],
                                          [item[3] for item in requests_flat])
        for (r, key, _, _), frames in zip(requests_flat, decoded):
            out[r][key] = frames
        return out

    def episode(self, index: int) -> dict:
        """The whole episode per DESIGN.md: proprio, action, task, fps and ``frames.<camera>`` for every camera."""
        steps = np.arange(self._lengths[index])
        keys = ["proprio", "action", *(FRAMES_PREFIX + c for c in self.cameras)]
        data = self.read_many([EpisodeRequest(index, {k: steps for k in keys})])[0]
        return {**data, "task": self.task(index), "fps": float(self._fps[index]), "episode_index": self._episode_index(index)}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_data_cache"], state["_videos"] = OrderedDict(), None  # each worker opens its own files
        return state

    # -- internals -------------------------------------------------------------------------------------------
    def _column(self, name: str) -> np.ndarray:
        column = self._columns.get(name)
        if column is None:
            if name not in self._episodes.column_names:
                raise ValueError(f"{self.root}: meta/episodes has no column {name!r}")
            column = self._columns[name] = self._episodes[name].to_numpy()
        return column

    def frame_shape(self, episode: int, camera: str) -> tuple[int, int] | None:
        """``(height, width)`` of a camera's frames, as meta/info.json declares them."""
        shape = self.info["features"].get(self._camera_key.get(camera, ""), {}).get("shape")
        names = self.info["features"].get(self._camera_key.get(camera, ""), {}).get("names")
        if not shape or len(shape) != 3:
            return None
        if names and list(names)[:1] == ["channels"]:  # channels-first declaration
            return int(shape[1]), int(shape[2])
        return int(shape[0]), int(shape[1])

    def describe(self, episode: int) -> str:
        """Where an episode lives, for error messages."""
        return f"{self.root} episode {self._episode_index(episode)}"

    def _episode_index(self, episode: int) -> int:
        return int(self._column("episode_index")[episode])

    def _check_steps(self, episode: int, key: str, steps: np.ndarray) -> None:
        if not 0 <= episode < len(self):
            raise IndexError(f"{self.root}: episode {episode} out of range (dataset has {len(self)} episodes)")
        if steps.size and (steps.min() < 0 or steps.max() >= self._lengths[episode]):
            raise IndexError(
                f"{self.root}: episode {episode} key {key!r}: steps {steps.min()}..{steps.max()} outside its "
                f"{self._lengths[episode]} frames"
            )

    def _frame_times(self, episode: int, camera: str, steps: np.ndarray) -> tuple[Path, np.ndarray]:
        if camera not in self._camera_key:
            raise ValueError(f"{self.root}: no camera {camera!r}; cameras are {self.cameras}")
        key = self._camera_key[camera]
        chunk = int(self._column(f"videos/{key}/chunk_index")[episode])
        file = int(self._column(f"videos/{key}/file_index")[episode])
        start = float(self._column(f"videos/{key}/from_timestamp")[episode])
        path = self.root / self.info["video_path"].format(video_key=key, chunk_index=chunk, file_index=file)
        return path, start + steps.astype(np.float64) / float(self._fps[episode])

    def _rows(self, episode: int, key: str, steps: np.ndarray) -> np.ndarray:
        chunk = int(self._column("data/chunk_index")[episode])
        file = int(self._column("data/file_index")[episode])
        path = self.root / self.info["data_path"].format(chunk_index=chunk, file_index=file)
        columns = self._data_file(path)
        first = int(self._column("dataset_from_index")[episode])
        rows = np.searchsorted(columns["index"], first + steps)
        if rows.size and not np.array_equal(columns["index"][np.minimum(rows, len(columns["index"]) - 1)], first + steps):
            raise ValueError(f"{path}: rows of episode {self._episode_index(episode)} are missing from the data file")
        return columns["proprio" if key == "proprio" else "action"][rows]

    def _data_file(self, path: Path) -> dict[str, np.ndarray]:
        if path in self._data_cache:
            self._data_cache.move_to_end(path)
            return self._data_cache[path]
        if not path.is_file():
            raise FileNotFoundError(f"{self.root}: data file {path} named by meta/episodes does not exist")
        with stage("read"):
            table = pq.read_table(path, columns=["index", self.state_key, self.action_key])
        order = np.argsort(table["index"].to_numpy(), kind="stable")
        columns = {
            "index": table["index"].to_numpy()[order],
            "proprio": _matrix(table[self.state_key], path, self.state_key)[order],
            "action": _matrix(table[self.action_key], path, self.action_key)[order],
        }
        self._data_cache[path] = columns
        while len(self._data_cache) > 2:
            self._data_cache.popitem(last=False)
        return columns


def _matrix(column: pa.ChunkedArray, path: Path, key: str) -> np.ndarray:
    """A list or fixed-size-list column as a float32 ``[rows, D]`` array."""
    array = column.combine_chunks()
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
    elif pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        lengths = np.unique(array.value_lengths().to_numpy(zero_copy_only=False))
        if len(lengths) > 1:
            raise ValueError(f"{path}: column {key!r} has rows of different widths {lengths.tolist()}")
        width = int(lengths[0]) if len(lengths) else 0
    else:
        raise ValueError(f"{path}: column {key!r} has type {array.type}, expected a list of floats")
    values = array.flatten().to_numpy(zero_copy_only=False)
    return values.astype(np.float32, copy=False).reshape(len(array), width)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON ({err})") from err


def _read_episode_table(root: Path) -> pa.Table:
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise FileNotFoundError(f"{root}: no meta/episodes/chunk-*/file-*.parquet files")
    table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    order = np.argsort(table["episode_index"].to_numpy(), kind="stable")
    return table.take(pa.array(order))
