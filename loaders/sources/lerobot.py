"""LeRobot v3 directories as an :class:`EpisodeSource`: every feature of ``meta/info.json`` under its own name.

A LeRobot v3.0 dataset keeps its episode index in ``meta/episodes/chunk-XXX/file-XXX.parquet`` (length, the
episode's row range in the data files, its tasks and, per camera, which video file holds it and from what
timestamp), per-frame rows in ``data/chunk-XXX/file-XXX.parquet`` and the episodes of each camera back to back in
``videos/<key>/chunk-XXX/file-XXX.mp4``: frame ``j`` of an episode is at ``from_timestamp + j / fps`` in its file.
Planning reads only the metadata (never the per-episode ``stats/...`` columns); workers read the rows and decode
the frames a batch asks for, one decode pass per video file for all the frames of the batch.

Kinds follow the declared dtypes: ``video`` and ``image`` (PNG or JPEG bytes in the parquet) are uint8
``[H, W, 3]`` frames (kind "video"), ``string`` is text (numpy object arrays of str) and every numeric dtype is an
array of that dtype. LeRobot declares a number per step as shape ``[1]`` and stores it as a scalar column; it is
read as shape ``()``. With ``frame_format="yuv420"`` frames come as I420 planes ``[H * 3 // 2, W]`` instead
(:mod:`mmfeed.codecs.colour`).
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mmfeed.codecs.batch import FrameRequest, VideoReaderCache, readers_within
from mmfeed.codecs.colour import frame_step_shape
from mmfeed.codecs.video import DecodeOptions
from mmfeed.loaders.errors import SampleError, decode_with_context
from mmfeed.loaders.sources.base import LRU, EpisodeRequest, EpisodeSource, Feature
from mmfeed.loaders.sources.stats import from_json, step_shaped
from mmfeed.loaders.timing import stage

__all__ = ["LeRobotSource", "is_lerobot_dir"]

_FRAMES = ("video", "image")
_EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index",
                    "dataset_to_index")
_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp")

FrameSize = tuple[int, int] | Mapping[str, tuple[int, int]] | None


def is_lerobot_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` looks like a LeRobot dataset root (it has ``meta/info.json``)."""
    return (Path(path) / "meta" / "info.json").is_file()


class LeRobotSource(EpisodeSource):
    """The episodes of a LeRobot v3 directory, every feature at the dataset's fps.

    root: the dataset directory (holding ``meta/``, ``data/`` and, with videos, ``videos/``).
    backend: the video backend of :mod:`mmfeed.codecs` ("auto" sends AV1, LeRobot's default codec, to PyAV).
    tolerance_s: how far a decoded frame's timestamp may be from the one asked for (LeRobot's default 1e-4 s).
    frame_size: ``(height, width)`` for every camera, ``{feature: (height, width)}`` for some, or None: frames
        are resized inside the decoder and the features report that size.
    frame_format: ``"rgb24"`` (frames uint8 ``[H, W, 3]``) or ``"yuv420"`` (I420 planes ``[H * 3 // 2, W]``, half
        the bytes, converted on the device by :func:`mmfeed.codecs.colour.yuv420_to_rgb`; PyAV only).
    decoder_threads: FFmpeg threads per open video (default 1; see
        :class:`~mmfeed.loaders.sources.webdataset.WebDatasetSource`).
    """

    def __init__(self, root: str | os.PathLike, *, backend: str = "auto", tolerance_s: float = 1e-4,
                 frame_size: FrameSize = None, frame_format: str = "rgb24", decoder_threads: int = 1) -> None:
        DecodeOptions(backend=backend, frame_format=frame_format, threads=decoder_threads)  # fails now
        self.frame_format = frame_format
        self.root = Path(root)
        self.name = str(self.root)
        self.tolerance_s = float(tolerance_s)
        self.info = _read_json(self.root / "meta" / "info.json")
        version = str(self.info.get("codebase_version", ""))
        if not version.startswith("v3"):
            raise ValueError(f"{self.root}: meta/info.json has codebase_version {version!r}; mmfeed reads LeRobot v3.x")
        for field in ("fps", "features", "data_path"):
            if field not in self.info:
                raise ValueError(f"{self.root / 'meta' / 'info.json'}: missing field {field!r}")
        specs: dict[str, dict] = self.info["features"]
        fps = float(self.info["fps"])
        self._video_keys = [k for k, s in specs.items() if s.get("dtype") == "video"]
        if self._video_keys and not self.info.get("video_path"):
            raise ValueError(f"{self.root / 'meta' / 'info.json'}: video features but no 'video_path'")
        self._sizes = _frame_sizes(frame_size, specs, self.root)
        self._options = {size: DecodeOptions(backend=backend, size=size, frame_format=frame_format,
                                             threads=decoder_threads) for size in set(self._sizes.values())}
        self.features = {k: _feature(k, s, fps, self._sizes.get(k), self.root, frame_format) for k, s in specs.items()}
        self._meta = _read_episodes(self.root, self._video_keys)
        self._lengths = self._meta["length"].astype(np.int64)
        self._fps = np.full(len(self._lengths), fps, dtype=np.float64)
        self.tasks = _read_tasks(self.root / "meta" / "tasks.parquet")
        self._episode_tasks = self._task_ids(self._meta.pop("tasks"))
        stats = self.root / "meta" / "stats.json"
        raw = from_json({k: v for k, v in _read_json(stats).items() if isinstance(v, dict)}) if stats.is_file() else {}
        self.stats = step_shaped(raw, {k: f.shape for k, f in self.features.items() if f.kind == "array"})
        self._data_cache = LRU(2)  # path -> the non-video columns of one data file
        self._videos: dict[tuple[int, int] | None, VideoReaderCache] = {}
        self._lock = threading.Lock()  # guards _videos: one source may serve loaders in several threads

    def step_tasks(self, episode: int) -> np.ndarray:
        """The task id of every step of ``episode``, int64 ``[T]`` (read from its rows where the task changes)."""
        e = self._check_episode(episode)
        if self._episode_tasks[e] >= 0:
            return super().step_tasks(e)
        steps = np.arange(self._lengths[e], dtype=np.int64)
        return self._rows(e, "task_index", steps).astype(np.int64, copy=False)

    def frame_shape(self, episode: int, feature: str) -> tuple[int, int] | None:
        """``(height, width)`` of a video feature's decoded pictures (in either frame format), else None."""
        f = self.features.get(feature)
        return f.frame_size if f is not None else None

    def describe(self, episode: int) -> str:
        """The root and the episode's ``episode_index``, for error messages."""
        return f"{self.root} episode {int(self._meta['episode_index'][episode])}"

    def episode(self, index: int) -> dict:
        """The whole episode (see :meth:`EpisodeSource.episode`) plus its ``episode_index`` in the dataset: an int,
        unless the dataset has a feature of that name (LeRobot writes one), whose per-step array it then stays."""
        data = super().episode(index)
        data.setdefault("episode_index", int(self._meta["episode_index"][index]))
        return data

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        """The requested frames of each request: rows of the data files, then every video frame of the batch in
        one decode call per frame size, so that each video file is decoded once per batch."""
        out: list[dict[str, np.ndarray]] = [{} for _ in requests]
        videos: dict[tuple[int, int] | None, list[tuple[int, str, FrameRequest, str]]] = {}
        with stage("read"):
            for r, request in enumerate(requests):
                self._check_request(request)
                e = request.episode
                for feature, idx in request.indices.items():
                    idx = np.asarray(idx, dtype=np.int64)
                    into = request.out.get(feature) if request.out else None
                    if feature in self._video_keys:
                        path, times = self._frame_times(e, feature, idx)
                        where = f"{self.describe(e)} feature {feature!r} ({path})"
                        frame_request = FrameRequest(path, timestamps=times, tolerance_s=self.tolerance_s, out=into)
                        videos.setdefault(self._sizes[feature], []).append((r, feature, frame_request, where))
                    else:
                        out[r][feature] = self._rows(e, feature, idx)
        with stage("decode"):
            for r, request in enumerate(requests):
                for feature, rows in list(out[r].items()):
                    if self.info["features"][feature]["dtype"] == "image":
                        into = request.out.get(feature) if request.out else None
                        out[r][feature] = self._decode_images(request.episode, feature, rows, into)
            for size, items in videos.items():
                with self._lock:  # the caches keep one decoder per thread (VideoReaderCache)
                    cache = self._videos.get(size)
                    if cache is None:
                        shapes = [size] if size is not None else [
                            self.features[k].frame_size for k in self._video_keys
                            if self._sizes.get(k) is None and self.features[k].frame_size is not None]
                        cache = self._videos[size] = VideoReaderCache(max_open=readers_within(shapes),
                                                                      options=self._options[size])
                decoded = decode_with_context(cache, [i[2] for i in items], [i[3] for i in items])
                for (r, feature, _, _), frames in zip(items, decoded):
                    out[r][feature] = frames
        return out

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_videos"] = {}  # each worker opens its own files (the LRU pickles empty)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- internals -------------------------------------------------------------------------------------------
    def _task_ids(self, episode_tasks: pa.Array | None) -> np.ndarray:
        """The id of each episode's one task, -1 where it lists several (or none: its rows then say); vectorized
        over the ``tasks`` list column (its texts as dictionary codes or plain strings)."""
        out = np.full(len(self._lengths), -1, dtype=np.int64)
        if episode_tasks is None:
            return out
        counts = pc.fill_null(pc.list_value_length(episode_tasks), 0).to_numpy(zero_copy_only=False)
        values = episode_tasks.flatten()
        if not pa.types.is_dictionary(values.type):
            values = pc.dictionary_encode(values)
        ids = {t: i for i, t in enumerate(self.tasks)}
        texts = values.dictionary.to_pylist()
        known = np.array([ids.get(t, -1) for t in texts], dtype=np.int64)
        codes = values.indices.to_numpy(zero_copy_only=False)
        flat = known[codes] if len(codes) else np.zeros(0, np.int64)
        if (flat < 0).any():
            k = int(np.flatnonzero(flat < 0)[0])
            e = int(np.searchsorted(np.cumsum(counts), k, side="right"))
            raise ValueError(f"{self.describe(e)}: task {texts[codes[k]]!r} is not in "
                             f"{self.root / 'meta/tasks.parquet'}")
        single = counts == 1
        out[single] = flat[(np.cumsum(counts) - counts)[single]]
        return out

    def _frame_times(self, episode: int, feature: str, idx: np.ndarray) -> tuple[Path, np.ndarray]:
        chunk = int(self._meta[f"videos/{feature}/chunk_index"][episode])
        file = int(self._meta[f"videos/{feature}/file_index"][episode])
        start = float(self._meta[f"videos/{feature}/from_timestamp"][episode])
        path = self.root / self.info["video_path"].format(video_key=feature, chunk_index=chunk, file_index=file)
        return path, start + idx.astype(np.float64) / float(self._fps[episode])

    def _rows(self, episode: int, feature: str, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` of ``feature`` in the episode's data file (image features: their encoded bytes)."""
        chunk = int(self._meta["data/chunk_index"][episode])
        file = int(self._meta["data/file_index"][episode])
        path = self.root / self.info["data_path"].format(chunk_index=chunk, file_index=file)
        where = f"{self.describe(episode)} feature {feature!r}"
        columns = self._data_file(path, where)
        if feature not in columns:
            raise ValueError(f"{where}: data file {path} has no column {feature!r}")
        index = columns["index"]
        want = int(self._meta["dataset_from_index"][episode]) + idx
        rows = np.searchsorted(index, want)
        if rows.size and not np.array_equal(index[np.minimum(rows, len(index) - 1)], want):
            raise ValueError(f"{where}: rows {int(want.min())}..{int(want.max())} of the episode are missing from "
                             f"data file {path}")
        values = columns[feature]
        if isinstance(values, Exception):
            raise ValueError(f"{where}: cannot read column {feature!r} of data file {path}: {values}") from values
        return values[rows]

    def _data_file(self, path: Path, where: str) -> dict[str, object]:
        """Every non-video column of one data file, sorted by ``index`` (the last two files stay cached)."""
        cached = self._data_cache.get(path)
        if cached is not None:
            return cached
        if not path.is_file():
            raise FileNotFoundError(f"{where}: data file {path} named by meta/episodes does not exist")
        try:
            schema = pq.read_schema(path)
            names = [k for k in self.features if k not in self._video_keys and k in schema.names]
            table = pq.read_table(path, columns=list(dict.fromkeys(["index", *names])))
        except (OSError, pa.ArrowException) as err:
            raise ValueError(f"{where}: cannot read data file {path}: {err}") from err
        order = np.argsort(table["index"].to_numpy(), kind="stable")
        columns: dict[str, object] = {"index": table["index"].to_numpy()[order]}
        for name in names:
            try:
                columns[name] = self._column(name, table[name].combine_chunks())[order]
            except (ValueError, pa.ArrowException) as err:
                columns[name] = err  # raised when the feature is asked for, so other features still read
        self._data_cache.put(path, columns)
        return columns

    def _column(self, name: str, array: pa.Array) -> np.ndarray:
        """One parquet column as numpy ``[rows, *shape]`` in the feature's dtype (images: ``[rows]`` of bytes)."""
        feature, dtype = self.features[name], self.info["features"][name]["dtype"]
        if dtype == "image":
            return (array.field("bytes") if pa.types.is_struct(array.type) else array).to_numpy(zero_copy_only=False)
        if dtype == "string":
            return array.to_numpy(zero_copy_only=False).astype(object)
        values, rows = array, len(array)
        while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) \
                or pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        flat = values.to_numpy(zero_copy_only=False)
        width = int(np.prod(feature.shape))
        if flat.size != rows * width:
            raise ValueError(f"{flat.size} values in {rows} rows, not {width} per row as shape "
                             f"{list(feature.shape)} in meta/info.json says")
        return flat.astype(feature.dtype, copy=False).reshape(rows, *feature.shape)

    def _decode_images(self, episode: int, feature: str, encoded: np.ndarray, into: np.ndarray | None) -> np.ndarray:
        """PNG or JPEG bytes as uint8 ``[n, H, W, 3]`` (resized to the feature's size; yuv420: ``[n, H * 3 // 2,
        W]``), with PyAV."""
        import av

        f = self.features[feature]
        (h, w), fmt = f.frame_size, "rgb24" if f.frame_format == "rgb24" else "yuv420p"
        out = into if into is not None else np.empty((len(encoded), *f.shape), dtype=np.uint8)
        for i, data in enumerate(encoded):
            try:
                if data is None:
                    raise ValueError("the row holds no image bytes")
                with av.open(io.BytesIO(data)) as container:
                    frame = next(container.decode(video=0))
                out[i] = frame.reformat(width=w, height=h, format=fmt).to_ndarray()
            except (av.error.FFmpegError, StopIteration, ValueError) as err:
                raise SampleError(f"{self.describe(episode)} feature {feature!r}: image {i} of the request cannot "
                                  f"be decoded: {err}") from err
        return out


def _feature(name: str, spec: Mapping, fps: float, size: tuple[int, int] | None, root: Path,
             frame_format: str = "rgb24") -> Feature:
    """The :class:`Feature` that one entry of info.json's ``features`` declares (frames in ``frame_format``)."""
    dtype, shape = spec.get("dtype"), tuple(int(s) for s in spec.get("shape") or ())
    if dtype in _FRAMES:
        if len(shape) != 3:
            raise ValueError(f"{root}: feature {name!r} ({dtype}) has shape {list(shape)}; expected [H, W, 3]")
        channels_first = list(spec.get("names") or [])[:1] == ["channels"]
        h, w = size or (shape[1:3] if channels_first else shape[:2])
        try:
            step = frame_step_shape(h, w, frame_format)
        except ValueError as err:
            raise ValueError(f"{root}: feature {name!r}: {err}; give an even frame_size") from err
        return Feature("video", "uint8", step, fps, frame_format=frame_format)
    if dtype == "string":
        return Feature("text", "object", (), fps)
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as err:
        raise ValueError(f"{root}: feature {name!r} has dtype {dtype!r}, which mmfeed cannot read") from err
    if np_dtype.kind not in "biuf":
        raise ValueError(f"{root}: feature {name!r} has dtype {dtype!r}, which mmfeed cannot read")
    return Feature("array", np_dtype, () if shape == (1,) else shape, fps)


def _frame_sizes(frame_size: FrameSize, specs: Mapping[str, Mapping], root: Path) -> dict[str, tuple[int, int] | None]:
    """The decode size of every frame feature (None: as stored), validating ``frame_size``."""
    cameras = [k for k, s in specs.items() if s.get("dtype") in _FRAMES]
    if not isinstance(frame_size, Mapping):
        size = None if frame_size is None else DecodeOptions(size=tuple(frame_size)).size
        return {k: size for k in cameras}
    for k in frame_size:
        if k not in cameras:
            what = "is not a video or image feature" if k in specs else "is not a feature"
            raise ValueError(f"{root}: frame_size names {k!r}, which {what}; cameras are {cameras}")
    return {k: None if frame_size.get(k) is None else DecodeOptions(size=tuple(frame_size[k])).size for k in cameras}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: malformed JSON ({err})") from err


def _read_episodes(root: Path, video_keys: Sequence[str]) -> dict:
    """The columns of meta/episodes planning and reads need, sorted by episode_index (``tasks`` as lists)."""
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise FileNotFoundError(f"{root}: no meta/episodes/chunk-*/file-*.parquet files")
    wanted = [*_EPISODE_COLUMNS, "tasks", *(f"videos/{k}/{c}" for k in video_keys for c in _VIDEO_COLUMNS)]
    tables = []
    for f in files:
        present = pq.read_schema(f).names
        missing = [c for c in wanted if c not in present and c != "tasks"]
        if missing:
            raise ValueError(f"{f}: meta/episodes has no columns {missing}")
        # the task lists' strings read as parquet dictionary codes: a few distinct texts, however many episodes
        leaves = pq.ParquetFile(f).schema
        task_leaves = [leaves.column(i).path for i in range(len(leaves)) if leaves.column(i).path.startswith("tasks.")]
        reader = pq.ParquetFile(f, read_dictionary=task_leaves)
        tables.append(reader.read(columns=[c for c in wanted if c in present]).unify_dictionaries())
    table = pa.concat_tables(tables, promote_options="default").unify_dictionaries()
    order = table["episode_index"].to_numpy()
    if (np.diff(order) < 0).any():
        table = table.take(pa.array(np.argsort(order, kind="stable")))
    meta = {c: table[c].to_numpy() for c in table.column_names if c != "tasks"}
    meta["tasks"] = table["tasks"].combine_chunks() if "tasks" in table.column_names else None
    bad = np.flatnonzero(meta["dataset_to_index"] - meta["dataset_from_index"] != meta["length"])
    if bad.size:
        raise ValueError(f"{root} episode {int(meta['episode_index'][bad[0]])}: meta/episodes gives length "
                         f"{int(meta['length'][bad[0]])} but rows {int(meta['dataset_from_index'][bad[0]])}.."
                         f"{int(meta['dataset_to_index'][bad[0]])}")
    return meta


def _read_tasks(path: Path) -> list[str]:
    """Task texts ordered by task_index. LeRobot writes a pandas frame indexed by the text, which parquet keeps as
    a column named ``task`` (a named index) or ``__index_level_0__`` (an unnamed one)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; a LeRobot v3 dataset lists its tasks there")
    table = pq.read_table(path)
    text = next((c for c in ("task", "__index_level_0__") if c in table.column_names), None)
    if text is None or "task_index" not in table.column_names:
        raise ValueError(f"{path}: expected columns task_index and task (or the index __index_level_0__), got "
                         f"{table.column_names}")
    ids = table["task_index"].to_numpy()
    if sorted(ids.tolist()) != list(range(len(ids))):
        raise ValueError(f"{path}: task_index must number the tasks 0..{len(ids) - 1}, got {sorted(ids.tolist())}")
    texts = table[text].to_pylist()
    return [str(texts[i]) for i in np.argsort(ids)]
