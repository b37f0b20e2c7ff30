"""The LeRobot v3.0 writer of :mod:`mmfeed.testing.synth`: :func:`write_lerobot` writes episodes as the directory
LeRobot's recorder writes (parquet metadata and data, one concatenated video file per camera)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mmfeed.testing.synth_episodes import SyntheticEpisode, _check_ids
from mmfeed.testing.video import write_video

__all__ = ["grow_lerobot", "write_lerobot"]

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
"""The quantiles LeRobot's stats carry beside min, max, mean, std and count."""


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
    task_switch: bool = False,
    use_videos: bool = True,
) -> str:
    """Write ``episodes`` as a LeRobot v3.0 dataset directory at ``out_dir``; return its path.

    The layout is what LeRobot's recorder writes: ``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``
    (pandas layout: column ``task_index``, index ``task``), ``meta/episodes/chunk-000/file-000.parquet``,
    ``data/chunk-000/file-000.parquet`` (one row per frame, Hugging Face ``datasets`` schema metadata) and
    ``videos/observation.images.<camera>/chunk-000/file-000.mp4``: each episode encoded on its own (so it starts
    on a keyframe) and stream-copied after the previous one, as LeRobot concatenates. ``codec`` is ``"av1"``
    (libsvtav1, LeRobot's default, with ``gop=2``) or ``"h264"``. Pattern index = the global ``index``.
    Everything fits one chunk and one file (LeRobot rolls over at 100 MB of data and 200 MB of video). Stats
    (min, max, mean, std, count and the quantiles q01, q10, q50, q90, q99) cover the non-video features. All
    episodes must share fps (an integer, every camera at that rate), cameras, frame size and dimensions.

    The data holds every array of :meth:`SyntheticEpisode.arrays` (``observation.state``, ``action``,
    ``observation.velocity``, ``next.reward``, ``next.done``) beside LeRobot's five default columns.
    ``task_switch=True`` gives every episode of two steps or more a second task for its second half (steps from
    ``(T + 1) // 2`` on): ``"<task>, then return to the start"``; the episode's ``tasks`` list names both and
    ``task_index`` follows per row. ``use_videos=False`` stores the cameras as PNG images in the data parquet
    (feature dtype ``"image"``, Hugging Face ``Image`` struct of ``bytes`` and ``path``), as LeRobot does without
    videos, with LeRobot's per-channel image stats (of pixels / 255, shape ``[3, 1, 1]``).
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
    lengths = np.array([ep.length for ep in episodes], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    n = len(episodes)
    step_tasks = [_step_tasks(ep, task_switch) for ep in episodes]  # the task text of every step
    episode_tasks = [list(dict.fromkeys(t)) for t in step_tasks]
    tasks = list(dict.fromkeys(t for names in episode_tasks for t in names))
    task_index = {task: i for i, task in enumerate(tasks)}

    spans: dict[str, list[tuple[float, float]]] = {}  # video key -> (from, to) seconds of each episode
    with tempfile.TemporaryDirectory(dir=root, prefix=".mmfeed-tmp-") as tmp:
        for camera, key in zip(first.camera_names, video_keys if use_videos else ()):
            parts = []
            for e, ep in enumerate(episodes):
                parts.append(Path(tmp) / f"{key}-{e:06d}.mp4")
                write_video(parts[-1], ep.frames(camera, start=int(bounds[e])), fps=fps, codec=codec, gop=gop, crf=crf)
            (root / "videos" / key / _VIDEO_CHUNK).parent.mkdir(parents=True, exist_ok=True)
            spans[key] = _concatenate(parts, root / "videos" / key / _VIDEO_CHUNK)

    frame_index = np.concatenate([np.arange(length, dtype=np.int64) for length in lengths])
    per_episode_arrays = [ep.arrays() for ep in episodes]
    columns = {
        "action": np.concatenate([ep.action for ep in episodes]),
        "observation.state": np.concatenate([ep.state for ep in episodes]),
        **{name: np.concatenate([a[name] for a in per_episode_arrays])
           for name in per_episode_arrays[0] if name not in ("action", "observation.state")},
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.repeat(np.arange(n, dtype=np.int64), lengths),
        "index": np.arange(bounds[-1], dtype=np.int64),
        "task_index": np.array([task_index[t] for names in step_tasks for t in names], dtype=np.int64),
    }
    images = {} if use_videos else {
        key: np.concatenate([ep.frames(camera, start=int(bounds[e])) for e, ep in enumerate(episodes)])
        for camera, key in zip(first.camera_names, video_keys)}
    arrays, hf = [], {}
    for name, values in images.items():
        png = pa.array([_png(frame) for frame in values], pa.binary())
        arrays.append(pa.StructArray.from_arrays([png, pa.nulls(len(values), pa.string())], ["bytes", "path"]))
        hf[name] = {"_type": "Image"}
    for name, values in columns.items():
        value = {"dtype": str(values.dtype), "_type": "Value"}
        if values.ndim == 2:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1]))
            hf[name] = {"feature": value, "length": values.shape[1], "_type": "List"}
        else:
            arrays.append(pa.array(values))
            hf[name] = value
    data = pa.Table.from_arrays(arrays, names=[*images, *columns])
    data = data.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": hf}})})
    pq.write_table(data, root / "data/chunk-000/file-000.parquet", compression="snappy", use_dictionary=True)

    table: dict[str, list] = {
        "episode_index": list(range(n)),
        "tasks": episode_tasks,
        "length": lengths.tolist(),
        "data/chunk_index": [0] * n,
        "data/file_index": [0] * n,
        "dataset_from_index": bounds[:-1].tolist(),
        "dataset_to_index": bounds[1:].tolist(),
    }
    for key in video_keys if use_videos else ():
        table[f"videos/{key}/chunk_index"] = [0] * n
        table[f"videos/{key}/file_index"] = [0] * n
        table[f"videos/{key}/from_timestamp"] = [a for a, _ in spans[key]]
        table[f"videos/{key}/to_timestamp"] = [b for _, b in spans[key]]
    stats_of = {**{name: _image_stats for name in images}, **{name: _stats for name in columns}}
    for name, values in {**images, **columns}.items():
        per_episode = [stats_of[name](values[bounds[e] : bounds[e + 1]]) for e in range(n)]
        for stat in per_episode[0]:
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
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4" if use_videos else None,
        "features": _lerobot_features(first, root, video_keys, gop, crf, codec, use_videos),
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4, ensure_ascii=False))
    stats = {name: stats_of[name](values) for name, values in {**images, **columns}.items()}
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
        return ep.fps, ep.camera_names, ep.height, ep.width, ep.state.shape[1], ep.action.shape[1]

    for ep in episodes:
        if layout(ep) != layout(first):
            raise ValueError(f"episode {ep.episode_id!r} differs from {first.episode_id!r} in fps, cameras, frame "
                             "size or dimensions; a LeRobot dataset needs them all equal")
        own_rate = {c: f for c, f in ep.camera_fps.items() if f != ep.fps}
        if own_rate:
            raise ValueError(f"episode {ep.episode_id!r} has cameras at their own rate {own_rate}; LeRobot needs "
                             f"every camera at the dataset fps {first.fps}")
    return int(first.fps)


def _step_tasks(ep: SyntheticEpisode, task_switch: bool) -> list[str]:
    """The task text of every step of ``ep``: its task, or with ``task_switch`` another one from ``(T + 1) // 2``."""
    half = (ep.length + 1) // 2 if task_switch else ep.length
    return [ep.task] * half + [f"{ep.task}, then return to the start"] * (ep.length - half)


def _lerobot_features(first: SyntheticEpisode, root: Path, video_keys: Sequence[str], gop: int, crf: int | None,
                      codec: str, use_videos: bool) -> dict[str, dict]:
    """The ``features`` of info.json, in LeRobot's order: user features, then the five default columns. A
    feature of one number per step is declared shape ``[1]`` and stored as a scalar column, as LeRobot does."""
    features: dict[str, dict] = {}
    for name, dim in (("action", first.action.shape[1]), ("observation.state", first.state.shape[1])):
        features[name] = {"dtype": "float32", "shape": [dim], "names": [f"motor_{i}" for i in range(dim)]}
    for name, values in first.arrays().items():
        if name not in features:
            features[name] = {"dtype": str(values.dtype), "shape": list(values.shape[1:]) or [1],
                              "names": [f"motor_{i}" for i in range(values.shape[1])] if values.ndim == 2 else None}
    for key in video_keys:
        features[key] = {"dtype": "video" if use_videos else "image", "shape": [first.height, first.width, 3],
                         "names": ["height", "width", "channels"]}
        if use_videos:
            features[key]["info"] = _video_info(root / "videos" / key / _VIDEO_CHUNK, gop, crf, codec)
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


def _png(frame: np.ndarray) -> bytes:
    """One uint8 ``[H, W, 3]`` frame as PNG bytes (lossless, so the image reads back bit for bit)."""
    import av

    encoder = av.CodecContext.create("png", "w")
    encoder.width, encoder.height, encoder.pix_fmt = frame.shape[1], frame.shape[0], "rgb24"
    packets = encoder.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24"))
    return b"".join(bytes(p) for p in packets + encoder.encode(None))


def _stats(values: np.ndarray) -> dict[str, list]:
    values = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    stats = {"min": values.min(axis=0).tolist(), "max": values.max(axis=0).tolist(),
             "mean": values.mean(axis=0).tolist(), "std": values.std(axis=0).tolist(), "count": [len(values)]}
    for name, q in QUANTILES.items():
        stats[name] = np.quantile(values, q, axis=0).tolist()
    return stats


def _image_stats(frames: np.ndarray) -> dict[str, list]:
    """LeRobot's image stats: per channel over every pixel of ``frames`` / 255, each shaped ``[3, 1, 1]``."""
    pixels = (np.asarray(frames, dtype=np.float64) / 255.0).reshape(-1, 3)
    stats = {k: np.reshape(v, (3, 1, 1)).tolist() for k, v in _stats(pixels).items() if k != "count"}
    return {**stats, "count": [len(frames)]}


def grow_lerobot(root: str | os.PathLike, episodes: int, *, files: int = 10, keep_stats: str = "observation.state",
                 rows_per_file: int = 1_000_000, frames_per_video: int = 100_000,
                 row_group_size: int | None = None) -> str:
    """Grow the LeRobot v3 directory ``root`` (written by :func:`write_lerobot`) to ``episodes`` episodes, for
    measuring how opening, planning and reading scale: episode ``i`` is a copy of written episode ``i % n`` (same
    values, frames and tasks) under its own ``episode_index``, with rows and frames of its own, so the grown
    directory is one LeRobot could have written and its metadata agrees with its data. The data rows are copied,
    numbered on (``index``, ``episode_index``), each data file taking episodes until it holds ``rows_per_file``
    rows (as LeRobot rolls its data files over at 100 MB). Each camera's video is stream-copied ``R`` times back
    to back into one file of at most ``frames_per_video`` frames (LeRobot rolls its videos over at 200 MB, some
    100,000 frames; ``R`` is also at most a tenth of the grown episodes' share), whose segments ``R * n``
    episodes take in turn; the next ``R * n`` episodes take the same segments of the next file, a hard link to it
    (a copy where links cannot be made). ``meta/info.json``'s
    totals follow. The episode rows are split over ``files`` parquet files of ``meta/episodes/chunk-000`` as
    LeRobot splits large metadata; of the per-episode stats only ``keep_stats``'s columns stay (each episode's
    stats of every feature would make gigabytes at a million episodes; the reader must skip them either way).
    ``row_group_size=10`` writes those files in row groups of ten episodes, as LeRobot does (it flushes its
    episode metadata every ten episodes), which makes their footers large (None: pyarrow's default)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(root)
    meta_dir = root / "meta" / "episodes" / "chunk-000"
    written = sorted(meta_dir.glob("file-*.parquet"))
    table = pa.concat_tables(pq.read_table(f) for f in written)
    keep = [c for c in table.column_names if not c.startswith("stats/") or c.startswith(f"stats/{keep_stats}/")]
    table = table.select(keep)
    n = table.num_rows
    data_path = root / "data" / "chunk-000" / "file-000.parquet"
    data = pq.read_table(data_path)
    data = data.take(pa.array(np.argsort(data["index"].to_numpy(), kind="stable")))
    source_from = table["dataset_from_index"].to_numpy().astype(np.int64)
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    per_chunk = int(info.get("chunks_size") or 1000)

    ids = np.arange(episodes, dtype=np.int64)
    lengths = table["length"].to_numpy().astype(np.int64)[ids % n]
    ends = np.cumsum(lengths)
    starts = ends - lengths
    data_file = starts // max(int(rows_per_file), 1)  # a file takes episodes while it holds fewer rows than that
    data_file = np.concatenate([[0], np.cumsum(np.diff(data_file) > 0)]) if episodes else data_file
    for f in written:
        f.unlink()
    cuts = np.flatnonzero(np.concatenate([[True], np.diff(data_file) > 0, [True]]))
    for k, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        count = lengths[lo:hi]
        rows = np.arange(starts[lo], ends[hi - 1], dtype=np.int64)
        take = np.repeat(source_from[ids[lo:hi] % n] - starts[lo:hi], count) + rows
        part = data.take(pa.array(take))
        part = part.set_column(part.column_names.index("index"), "index", pa.array(rows))
        part = part.set_column(part.column_names.index("episode_index"), "episode_index",
                               pa.array(np.repeat(ids[lo:hi], count)))
        path = root / "data" / f"chunk-{k // per_chunk:03d}" / f"file-{k % per_chunk:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(part.replace_schema_metadata(data.schema.metadata), path, compression="zstd")
    columns: dict[str, np.ndarray] = {
        "episode_index": ids, "dataset_from_index": starts, "dataset_to_index": ends,
        "data/chunk_index": data_file // per_chunk, "data/file_index": data_file % per_chunk}
    video_keys = [k for k, spec in info["features"].items() if spec.get("dtype") == "video"]
    per_copy = int(table["length"].to_numpy().sum())  # frames of the written video
    copies = max(1, min(-(-episodes // (10 * n)), int(frames_per_video) // max(per_copy, 1)))  # R
    video_file = ids // (copies * n)
    for key in video_keys:
        folder = root / "videos" / key
        spans = _concatenate([folder / _VIDEO_CHUNK] * copies, folder / "long.mp4")
        (folder / "long.mp4").replace(folder / _VIDEO_CHUNK)
        for k in range(1, int(video_file[-1]) + 1 if episodes else 0):
            link = folder / f"chunk-{k // per_chunk:03d}" / f"file-{k % per_chunk:03d}.mp4"
            link.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(folder / _VIDEO_CHUNK, link)
            except OSError:
                shutil.copyfile(folder / _VIDEO_CHUNK, link)
        offset = np.array([a for a, _ in spans])[(ids // n) % copies]
        for c in ("from_timestamp", "to_timestamp"):
            columns[f"videos/{key}/{c}"] = table[f"videos/{key}/{c}"].to_numpy()[ids % n] + offset
        columns[f"videos/{key}/chunk_index"] = video_file // per_chunk
        columns[f"videos/{key}/file_index"] = video_file % per_chunk
    bounds = np.linspace(0, episodes, files + 1).astype(np.int64)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        part = table.take(pa.array(ids[lo:hi] % n))
        for name, values in (*columns.items(), ("meta/episodes/file_index", np.full(episodes, i))):
            if name in part.column_names:
                kind = part.schema.field(name).type
                part = part.set_column(part.column_names.index(name), name, pa.array(values[lo:hi], kind))
        pq.write_table(part, meta_dir / f"file-{i:03d}.parquet", row_group_size=row_group_size)
    info["total_episodes"] = int(episodes)
    info["total_frames"] = int(lengths.sum())
    info["splits"] = {"train": f"0:{episodes}"}
    info_path.write_text(json.dumps(info, indent=2))
    return str(root)
