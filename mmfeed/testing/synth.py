"""Seeded synthetic robot episodes and the two on-disk formats mmfeed reads: webdataset shards and LeRobot v3.0.

Every episode has smooth proprio trajectories (sums of sines), actions that are the next-step change of the
state, a task string, and one or more cameras whose pixels carry a frame index (:func:`frame_pattern`), so a test
can check from decoded pixels alone that the frame it got is the frame it asked for::

    >>> eps = make_episodes(2, seed=0, min_length=20, max_length=30)
    >>> eps[0].proprio.shape[1], eps[0].cameras["cam_high"].shape[1:]
    (14, (48, 64, 3))
    >>> shards = write_webdataset(tmp_dir, eps)                       # doctest: +SKIP
    >>> root = write_lerobot(tmp_dir / "lerobot", eps, codec="av1")   # doctest: +SKIP

What the pattern index means, per format:

- In memory (``ep.cameras[camera]``, ``ep.frames(camera)``) and in webdataset shards (``<key>.<camera>.mp4``):
  the frame number within the episode's stream for that camera, ``0 .. ep.num_frames(camera) - 1``.
- In a LeRobot directory: the GLOBAL frame number within the concatenated video file, which is also the
  dataset-wide ``index`` column: frame ``i`` of episode ``e`` reads ``dataset_from_index[e] + i``
  (``ep.frames(camera, start=dataset_from_index)``).

Frames are not stored; they are generated on access, so hundreds of episodes cost only their proprio and actions.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import tempfile
from types import MappingProxyType
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from mmfeed.testing.video import frame_pattern, write_video

DEFAULT_TASKS = (
    "pick up the red cube",
    "open the top drawer",
    "fold the towel in half",
    "push the green button",
)
"""Task strings that :func:`make_episodes` draws from by default."""

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_RESERVED_FIELDS = ("proprio", "action", "meta")


class _LazyFrames(Mapping):
    """Read-only ``camera -> uint8 [T_cam, H, W, 3]`` frames, generated on each access (episode-local index)."""

    def __init__(self, episode: SyntheticEpisode) -> None:
        self._episode = episode

    def __getitem__(self, camera: str) -> np.ndarray:
        return self._episode.frames(camera)

    def __iter__(self) -> Iterator[str]:
        return iter(self._episode.camera_seeds)

    def __len__(self) -> int:
        return len(self._episode.camera_seeds)

    def __repr__(self) -> str:
        return f"<frames of cameras {list(self)}>"


@dataclass(frozen=True, eq=False)
class SyntheticEpisode:
    """One synthetic recording; ground truth for tests.

    episode_id:   str, webdataset-safe (letters, digits, ``_``, ``-``; no dots), e.g. ``"episode_000003"``.
    fps:          step rate of ``proprio`` and ``action``.
    proprio:      float32 ``[T, Dp]``, a smooth trajectory (sum of sines per dimension, seeded).
    action:       float32 ``[T, Da]``, the next-step change of the trajectory: ``x(t + 1/fps) - x(t)``.
    task:         task text.
    camera_seeds: camera -> the ``frame_pattern`` seed of its colours (cameras differ, index bands do not).
    camera_fps:   camera -> its frame rate (the step rate unless the stream runs at its own rate).
    height, width: frame size.
    """

    episode_id: str
    fps: float
    proprio: np.ndarray
    action: np.ndarray
    task: str
    camera_seeds: Mapping[str, int]
    camera_fps: Mapping[str, float]
    height: int
    width: int

    @property
    def length(self) -> int:
        """Number of steps ``T``."""
        return int(self.proprio.shape[0])

    @property
    def cameras(self) -> Mapping[str, np.ndarray]:
        """``camera -> frames`` uint8 ``[T_cam, H, W, 3]``, generated on access; ``list(ep.cameras)`` gives names."""
        return _LazyFrames(self)

    @property
    def camera_names(self) -> tuple[str, ...]:
        """Camera names in writing order."""
        return tuple(self.camera_seeds)

    def num_frames(self, camera: str) -> int:
        """Frames of ``camera``: those at ``j / camera_fps`` that fall within ``[0, (T - 1) / fps]``."""
        ratio = _rate(self.camera_fps[self._check_camera(camera)]) / _rate(self.fps)
        return math.floor((self.length - 1) * ratio) + 1 if self.length else 0

    def frame_times(self, camera: str) -> np.ndarray:
        """float64 seconds of each frame of ``camera`` from the episode start."""
        return np.arange(self.num_frames(camera), dtype=np.float64) / float(self.camera_fps[camera])

    def frames(self, camera: str, *, start: int = 0) -> np.ndarray:
        """uint8 ``[T_cam, H, W, 3]`` frames of ``camera`` whose pattern indices run ``start .. start + T_cam - 1``."""
        self._check_camera(camera)
        return frame_pattern(
            self.num_frames(camera), height=self.height, width=self.width, start=start, seed=self.camera_seeds[camera]
        )

    def meta(self) -> dict:
        """The ``<key>.meta.json`` content of this episode in a webdataset shard."""
        return {
            "cameras": list(self.camera_seeds),
            "camera_fps": {c: float(f) for c, f in self.camera_fps.items()},
            "fps": float(self.fps),
            "length": self.length,
            "task": self.task,
        }

    def _check_camera(self, camera: str) -> str:
        if camera not in self.camera_seeds:
            raise ValueError(f"unknown camera {camera!r}; episode {self.episode_id!r} has {list(self.camera_seeds)}")
        return camera


def make_episodes(
    num_episodes: int,
    *,
    seed: int = 0,
    cameras: Sequence[str] = ("cam_high", "cam_wrist"),
    height: int = 48,
    width: int = 64,
    fps: float = 30.0,
    min_length: int = 20,
    max_length: int = 60,
    proprio_dim: int = 14,
    action_dim: int = 14,
    camera_fps: Mapping[str, float] | None = None,
    tasks: Sequence[str] = DEFAULT_TASKS,
) -> list[SyntheticEpisode]:
    """``num_episodes`` seeded episodes with lengths drawn uniformly from ``[min_length, max_length]``.

    Episode ``i`` depends only on ``(seed, i)`` and the shape arguments, so ``make_episodes(3)`` is a prefix of
    ``make_episodes(5)``. ``camera_fps`` gives cameras that run at their own rate (others run at ``fps``).
    Episode ids are ``"episode_{i:06d}"``.
    """
    _check_int("num_episodes", num_episodes, 0)
    _check_int("min_length", min_length, 1)
    _check_int("max_length", max_length, min_length)
    _check_int("proprio_dim", proprio_dim, 1)
    _check_int("action_dim", action_dim, 0)
    if not fps > 0:
        raise ValueError(f"fps must be > 0, got {fps!r}")
    cameras = tuple(cameras)
    for camera in cameras:
        if not isinstance(camera, str) or not _NAME.match(camera) or camera in _RESERVED_FIELDS:
            raise ValueError(
                f"camera name {camera!r} is not usable as a webdataset field: use letters, digits, '_' or '-' "
                f"(no dots) and none of {list(_RESERVED_FIELDS)}"
            )
    if len(set(cameras)) != len(cameras):
        raise ValueError(f"camera names must be unique, got {list(cameras)}")
    camera_fps = dict(camera_fps or {})
    unknown = sorted(set(camera_fps) - set(cameras))
    if unknown:
        raise ValueError(f"camera_fps names cameras {unknown} that are not in cameras={list(cameras)}")
    if any(not f > 0 for f in camera_fps.values()):
        raise ValueError(f"every camera_fps must be > 0, got {camera_fps}")
    tasks = tuple(tasks)
    if not tasks or not all(isinstance(t, str) and t for t in tasks):
        raise ValueError(f"tasks must be a non-empty sequence of non-empty strings, got {tasks!r}")
    frame_pattern(1, height=height, width=width)  # validates the frame size early
    return [
        _make_episode(i, seed, cameras, height, width, float(fps), min_length, max_length, proprio_dim, action_dim,
                      camera_fps, tasks)
        for i in range(num_episodes)
    ]


def _make_episode(index, seed, cameras, height, width, fps, min_length, max_length, proprio_dim, action_dim,
                  camera_fps, tasks) -> SyntheticEpisode:
    rng = np.random.default_rng([seed, index])
    length = int(rng.integers(min_length, max_length + 1))
    dims = max(proprio_dim, action_dim)
    amp = rng.uniform(0.05, 0.5, size=(3, dims))
    freq = rng.uniform(0.1, 1.5, size=(3, dims))  # Hz
    phase = rng.uniform(0.0, 2 * np.pi, size=(3, dims))
    offset = rng.uniform(-1.0, 1.0, size=dims)
    t = np.arange(length + 1, dtype=np.float64)[:, None, None] / fps  # one step past the end for the last action
    x = offset + (amp * np.sin(2 * np.pi * freq * t + phase)).sum(axis=1)  # [T + 1, dims]
    proprio = x[:length, :proprio_dim].astype(np.float32)
    action = (x[1:, :action_dim] - x[:-1, :action_dim]).astype(np.float32)
    task = tasks[int(rng.integers(len(tasks)))]
    seeds = {camera: int(s) for camera, s in zip(cameras, rng.integers(0, 2**31 - 1, size=len(cameras)))}
    rates = {camera: float(camera_fps.get(camera, fps)) for camera in cameras}
    return SyntheticEpisode(
        episode_id=f"episode_{index:06d}", fps=fps, proprio=proprio, action=action, task=task,
        camera_seeds=MappingProxyType(seeds), camera_fps=MappingProxyType(rates), height=height, width=width,
    )


def write_webdataset(
    out_dir: str | os.PathLike,
    episodes: Sequence[SyntheticEpisode],
    *,
    episodes_per_shard: int = 8,
    codec: str = "h264",
    gop: int = 30,
    index: bool = True,
) -> list[str]:
    """Write ``episodes`` as webdataset shards ``shard-000000.tar`` ... in ``out_dir``; return the shard paths.

    Each episode is one sample with key ``ep.episode_id``: ``<key>.<camera>.mp4`` (pattern index = frame number
    within the episode), ``<key>.proprio.npy``, ``<key>.action.npy`` and ``<key>.meta.json`` (:meth:`meta`).
    Written through ``webdataset.TarWriter`` with a fixed member mtime, so equal inputs give equal tar headers.
    With ``index`` the parquet index is written beside them (``mmfeed.loaders.index.INDEX_FILENAME``).
    """
    import webdataset

    _check_int("episodes_per_shard", episodes_per_shard, 1)
    episodes = list(episodes)
    _check_ids(episodes)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards = []
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".mmfeed-tmp-") as tmp:
        for start in range(0, len(episodes), episodes_per_shard):
            path = out_dir / f"shard-{len(shards):06d}.tar"
            with open(path, "wb") as stream, webdataset.TarWriter(stream, encoder=False, mtime=0) as writer:
                for ep in episodes[start : start + episodes_per_shard]:
                    sample = {"__key__": ep.episode_id}
                    for camera in ep.camera_names:
                        video = Path(tmp) / f"{ep.episode_id}.{camera}.mp4"
                        write_video(video, ep.frames(camera), fps=ep.camera_fps[camera], codec=codec, gop=gop)
                        sample[f"{camera}.mp4"] = video.read_bytes()
                        video.unlink()
                    sample["proprio.npy"] = _npy_bytes(ep.proprio)
                    sample["action.npy"] = _npy_bytes(ep.action)
                    sample["meta.json"] = json.dumps(ep.meta(), sort_keys=True).encode("utf-8")
                    writer.write(sample)
            shards.append(str(path))
    if index and shards:
        from mmfeed.loaders.index import INDEX_FILENAME, write_index

        write_index(shards, out_dir / INDEX_FILENAME)
    return shards


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _check_ids(episodes: Sequence[SyntheticEpisode]) -> None:
    seen = set()
    for ep in episodes:
        if not isinstance(ep, SyntheticEpisode):
            raise TypeError(f"episodes must be SyntheticEpisode objects from make_episodes, got {type(ep).__name__}")
        if not _NAME.match(ep.episode_id):
            raise ValueError(f"episode id {ep.episode_id!r} is not a webdataset key: use letters, digits, '_', '-'")
        if ep.episode_id in seen:
            raise ValueError(f"episode id {ep.episode_id!r} appears twice; ids must be unique")
        seen.add(ep.episode_id)


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _rate(fps: float) -> Fraction:
    return Fraction(fps).limit_denominator(1001)


# ---------------------------------------------------------------------------------------------------- LeRobot v3.0

_VIDEO_CHUNK = "chunk-000/file-000.mp4"
# The pandas metadata LeRobot's tasks.parquet carries: a frame with column task_index, indexed by the task text.
_TASKS_PANDAS_META = {
    "index_columns": ["task"],
    "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                        "metadata": {"encoding": "UTF-8"}}],
    "columns": [
        {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
         "metadata": None},
        {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
    ],
    "creator": {"library": "pyarrow", "version": "unknown"},
    "pandas_version": "2.2.3",
}


def write_lerobot(
    out_dir: str | os.PathLike,
    episodes: Sequence[SyntheticEpisode],
    *,
    codec: str = "av1",
    gop: int = 2,
    crf: int | None = None,
    robot_type: str = "synthetic",
) -> str:
    """Write ``episodes`` as a LeRobot v3.0 dataset directory at ``out_dir``; return its path.

    The layout is what LeRobot's recorder writes: ``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``
    (pandas layout: column ``task_index``, index ``task``), ``meta/episodes/chunk-000/file-000.parquet``,
    ``data/chunk-000/file-000.parquet`` (one row per frame, Hugging Face ``datasets`` schema metadata) and
    ``videos/observation.images.<camera>/chunk-000/file-000.mp4``: each episode encoded on its own (so it starts
    on a keyframe) and stream-copied after the previous one, as LeRobot concatenates. ``codec`` is ``"av1"``
    (libsvtav1, LeRobot's default, with ``gop=2``) or ``"h264"``. Pattern index = the global ``index``.
    Everything fits one chunk and one file (LeRobot rolls over at 100 MB of data and 200 MB of video). Stats
    (min, max, mean, std, count) cover the non-video features. All episodes must share fps (an integer, every
    camera at that rate), cameras, frame size and dimensions.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    episodes = list(episodes)
    fps = _check_lerobot(episodes)
    first = episodes[0]
    root = Path(out_dir)
    for sub in ("meta/episodes/chunk-000", "data/chunk-000"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    video_keys = [f"observation.images.{camera}" for camera in first.camera_names]
    tasks = list(dict.fromkeys(ep.task for ep in episodes))
    task_index = {task: i for i, task in enumerate(tasks)}
    lengths = np.array([ep.length for ep in episodes], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    n = len(episodes)

    spans: dict[str, list[tuple[float, float]]] = {}  # video key -> (from, to) seconds of each episode
    with tempfile.TemporaryDirectory(dir=root, prefix=".mmfeed-tmp-") as tmp:
        for camera, key in zip(first.camera_names, video_keys):
            parts = []
            for e, ep in enumerate(episodes):
                parts.append(Path(tmp) / f"{key}-{e:06d}.mp4")
                write_video(parts[-1], ep.frames(camera, start=int(bounds[e])), fps=fps, codec=codec, gop=gop, crf=crf)
            (root / "videos" / key / _VIDEO_CHUNK).parent.mkdir(parents=True, exist_ok=True)
            spans[key] = _concatenate(parts, root / "videos" / key / _VIDEO_CHUNK)

    frame_index = np.concatenate([np.arange(length, dtype=np.int64) for length in lengths])
    columns = {
        "action": np.concatenate([ep.action for ep in episodes]),
        "observation.state": np.concatenate([ep.proprio for ep in episodes]),
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.repeat(np.arange(n, dtype=np.int64), lengths),
        "index": np.arange(bounds[-1], dtype=np.int64),
        "task_index": np.repeat(np.array([task_index[ep.task] for ep in episodes], dtype=np.int64), lengths),
    }
    arrays, hf = [], {}
    for name, values in columns.items():
        value = {"dtype": str(values.dtype), "_type": "Value"}
        if values.ndim == 2:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1]))
            hf[name] = {"feature": value, "length": values.shape[1], "_type": "List"}
        else:
            arrays.append(pa.array(values))
            hf[name] = value
    data = pa.Table.from_arrays(arrays, names=list(columns))
    data = data.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": hf}})})
    pq.write_table(data, root / "data/chunk-000/file-000.parquet", compression="snappy", use_dictionary=True)

    table: dict[str, list] = {
        "episode_index": list(range(n)),
        "tasks": [[ep.task] for ep in episodes],
        "length": lengths.tolist(),
        "data/chunk_index": [0] * n,
        "data/file_index": [0] * n,
        "dataset_from_index": bounds[:-1].tolist(),
        "dataset_to_index": bounds[1:].tolist(),
    }
    for key in video_keys:
        table[f"videos/{key}/chunk_index"] = [0] * n
        table[f"videos/{key}/file_index"] = [0] * n
        table[f"videos/{key}/from_timestamp"] = [a for a, _ in spans[key]]
        table[f"videos/{key}/to_timestamp"] = [b for _, b in spans[key]]
    for name, values in columns.items():
        per_episode = [_stats(values[bounds[e] : bounds[e + 1]]) for e in range(n)]
        for stat in ("min", "max", "mean", "std", "count"):
            table[f"stats/{name}/{stat}"] = [s[stat] for s in per_episode]
    table["meta/episodes/chunk_index"] = [0] * n
    table["meta/episodes/file_index"] = [0] * n
    pq.write_table(pa.Table.from_pydict(table), root / "meta/episodes/chunk-000/file-000.parquet",
                   compression="snappy", use_dictionary=True)

    pandas_meta = {**_TASKS_PANDAS_META, "creator": {"library": "pyarrow", "version": pa.__version__}}
    tasks_table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks)})
    pq.write_table(tasks_table.replace_schema_metadata({"pandas": json.dumps(pandas_meta)}),
                   root / "meta/tasks.parquet")

    info = {
        "codebase_version": "v3.0",
        "robot_type": robot_type,
        "total_episodes": n,
        "total_frames": int(bounds[-1]),
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": fps,
        "splits": {"train": f"0:{n}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": _lerobot_features(first, root, video_keys, gop, crf, codec),
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4, ensure_ascii=False))
    stats = {name: _stats(values) for name, values in columns.items()}
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=4))
    return str(root)


def _check_lerobot(episodes: Sequence[SyntheticEpisode]) -> int:
    """Validate that ``episodes`` fit one LeRobot dataset and return its integer fps."""
    if not episodes:
        raise ValueError("episodes is empty: a LeRobot dataset needs at least one episode")
    _check_ids(episodes)
    first = episodes[0]
    if first.fps != int(first.fps):
        raise ValueError(f"LeRobot stores fps as an integer, got fps={first.fps}; make episodes with an integer fps")

    def layout(ep: SyntheticEpisode) -> tuple:
        return ep.fps, ep.camera_names, ep.height, ep.width, ep.proprio.shape[1], ep.action.shape[1]

    for ep in episodes:
        if layout(ep) != layout(first):
            raise ValueError(f"episode {ep.episode_id!r} differs from {first.episode_id!r} in fps, cameras, frame "
                             "size or dimensions; a LeRobot dataset needs them all equal")
        own_rate = {c: f for c, f in ep.camera_fps.items() if f != ep.fps}
        if own_rate:
            raise ValueError(f"episode {ep.episode_id!r} has cameras at their own rate {own_rate}; LeRobot needs "
                             f"every camera at the dataset fps {first.fps}")
    return int(first.fps)


def _lerobot_features(first: SyntheticEpisode, root: Path, video_keys: Sequence[str], gop: int, crf: int | None,
                      codec: str) -> dict[str, dict]:
    """The ``features`` of info.json, in LeRobot's order: user features, then the five default columns."""
    features: dict[str, dict] = {}
    for name, dim in (("action", first.action.shape[1]), ("observation.state", first.proprio.shape[1])):
        features[name] = {"dtype": "float32", "shape": [dim], "names": [f"motor_{i}" for i in range(dim)]}
    for key in video_keys:
        features[key] = {"dtype": "video", "shape": [first.height, first.width, 3],
                         "names": ["height", "width", "channels"],
                         "info": _video_info(root / "videos" / key / _VIDEO_CHUNK, gop, crf, codec)}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        features[name] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _concatenate(parts: Sequence[Path], target: Path) -> list[tuple[float, float]]:
    """Stream-copy ``parts`` back to back into ``target``; return each part's ``(from, to)`` seconds in it."""
    import av

    spans = []
    with av.open(str(target), mode="w") as out:
        stream, offset, seconds = None, 0, 0.0
        for part in parts:
            with av.open(str(part)) as src:
                source = src.streams.video[0]
                if stream is None:
                    # opaque: copy codec parameters without looking up an encoder (the AV1 decoder is libdav1d)
                    stream = out.add_stream_from_template(source, opaque=True)
                    stream.time_base = source.time_base
                duration = float(source.duration * source.time_base)  # what LeRobot measures per episode
                for packet in src.demux(source):
                    if packet.dts is None:  # the demuxer's end-of-stream flush packet
                        continue
                    packet.pts += offset
                    packet.dts += offset
                    packet.stream = stream
                    out.mux(packet)
                offset += source.duration
            spans.append((seconds, seconds + duration))
            seconds += duration
    return spans


def _video_info(path: Path, gop: int, crf: int | None, codec: str) -> dict:
    """The ``info`` of a video feature: probed from the file as LeRobot does, plus the encoder settings."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        info = {
            "video.height": stream.height,
            "video.width": stream.width,
            "video.codec": stream.codec_context.codec.canonical_name,
            "video.pix_fmt": stream.pix_fmt,
            "video.fps": int(stream.base_rate),
            "video.channels": 3,
            "has_audio": False,
        }
    default_crf = 30 if codec == "av1" else 18
    info.update({"video.g": gop, "video.crf": default_crf if crf is None else crf, "is_depth_map": False})
    return info


def _stats(values: np.ndarray) -> dict[str, list]:
    values = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    return {"min": values.min(axis=0).tolist(), "max": values.max(axis=0).tolist(),
            "mean": values.mean(axis=0).tolist(), "std": values.std(axis=0).tolist(), "count": [len(values)]}
