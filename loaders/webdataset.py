"""Webdataset tar shards as an episode source, read member by member through the parquet index.

The index (``mmfeed-index.parquet`` beside the shards, written by ``mmfeed index`` or by
:func:`mmfeed.testing.write_webdataset`) gives every episode's length, rates, cameras and task, and the byte
offset and size of each of its tar members. Planning uses the index alone; a worker reads exactly the members a
batch needs with one seek and one read each (a range request for URLs), keeps the last few episodes' bytes,
and decodes each needed group of pictures once for all the frames a batch wants from it.

Shards without an index are indexed in memory at open time (one pass over their tar headers), with a log line
suggesting ``mmfeed index`` to make that a one-time cost.
"""

from __future__ import annotations

import glob
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from mmfeed.codecs.arrays import load_npy
from mmfeed.codecs.batch import FrameRequest, VideoReaderCache
from mmfeed.codecs.errors import DecodeError
from mmfeed.loaders.errors import SampleError, decode_with_context
from mmfeed.loaders.index import INDEX_FILENAME, build_index, read_shard_index, read_member, resolve_shard, stale_shards
from mmfeed.loaders.layout import FRAMES_PREFIX
from mmfeed.loaders.sources import EpisodeArrays, EpisodeRequest
from mmfeed.loaders.timing import stage
from mmfeed.loaders.windows import align_to_stream

__all__ = ["WebDatasetSource", "expand_shards"]

log = logging.getLogger(__name__)


def expand_shards(spec: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Shard paths from a directory (its ``*.tar``), a brace pattern (``shard-{000000..000009}.tar``), a glob,
    a URL or a list of any of these, in sorted order within each pattern."""
    if isinstance(spec, (list, tuple)):
        return [s for item in spec for s in expand_shards(item)]
    spec = os.fspath(spec)
    if "://" in spec and not spec.startswith("file://"):
        import braceexpand

        return list(braceexpand.braceexpand(spec))
    spec = spec.removeprefix("file://")
    if os.path.isdir(spec):
        shards = sorted(glob.glob(os.path.join(spec, "*.tar")))
        if not shards:
            raise FileNotFoundError(f"{spec}: directory holds no .tar shards")
        return shards
    import braceexpand

    shards = []
    for pattern in braceexpand.braceexpand(spec):
        matches = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        shards.extend(matches)
    missing = [s for s in shards if not os.path.exists(s)]
    if missing or not shards:
        raise FileNotFoundError(f"{spec}: no such shard(s): {missing[:3] or [spec]}")
    return shards


class WebDatasetSource(EpisodeArrays):
    """Episodes in webdataset shards (DESIGN.md shard format).

    path: a directory of shards, a brace pattern, a glob, a URL pattern, a list of them, or an index file.
    backend: video backend for ``mmfeed.codecs`` ("auto" is PyAV; "decord" by name).
    cache_episodes: how many episodes' member bytes a worker keeps (consecutive samples of one episode reuse them).
    check_index: refuse an index whose shards changed size or mtime since indexing.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        backend: str = "auto",
        cache_episodes: int = 8,
        check_index: bool = True,
    ) -> None:
        self.backend = backend
        self.cache_episodes = cache_episodes
        index_path = _index_path(path)
        if index_path is not None:
            if check_index:
                stale = stale_shards(index_path)
                if stale:
                    raise ValueError(
                        f"{index_path} is out of date with its shards (changed or missing: {stale[:5]}); "
                        f"rebuild it with `mmfeed index`"
                    )
            table = read_shard_index(index_path)
            self._shards = [resolve_shard(index_path, s) for s in table["shard"].to_pylist()]
            self.name = str(index_path)
        else:
            shards = expand_shards(path)
            log.info("no %s beside %d shard(s): indexing tar headers now; `mmfeed index` makes this a one-time cost",
                     INDEX_FILENAME, len(shards))
            table = build_index(shards)
            self._shards = [resolve_shard(os.path.join(os.path.dirname(shards[0]), INDEX_FILENAME), s)
                            for s in table["shard"].to_pylist()]
            self.name = str(path)
        if table.num_rows == 0:
            raise ValueError(f"{self.name}: the shards hold no episodes")
        self._ids = table["episode_id"].to_pylist()
        self._lengths = table["length"].to_numpy().astype(np.int64)
        self._fps = table["fps"].to_numpy().astype(np.float64)
        self._tasks = table["task"].to_pylist()
        self._cameras = table["cameras"].to_pylist()
        self._camera_fps = table["camera_fps"].to_pylist()
        self._members = [{m["name"]: (m["offset"], m["size"]) for m in ms} for ms in table["members"].to_pylist()]
        self.cameras = list(self._cameras[0])
        self._bytes: OrderedDict[tuple[int, str], bytes] = OrderedDict()
        self._videos: VideoReaderCache | None = None
        self._frame_counts: dict[tuple[int, str], int] = {}
        self._frame_sizes: dict[tuple[int, str], tuple[int, int]] = {}

    def episode_id(self, episode: int) -> str:
        return self._ids[episode]

    def task(self, episode: int) -> str:
        return self._tasks[episode]

    def camera_fps(self, episode: int, camera: str) -> float:
        try:
            return float(self._camera_fps[episode][self._cameras[episode].index(camera)])
        except ValueError:
            raise ValueError(f"{self.describe(episode)}: no camera {camera!r}; it has {self._cameras[episode]}") from None

    def read_many(self, requests: Sequence[EpisodeRequest]) -> list[dict[str, np.ndarray]]:
        if self._videos is None:
            self._videos = VideoReaderCache(max_open=max(2, self.cache_episodes), backend=self.backend)
        out: list[dict[str, np.ndarray]] = [{} for _ in requests]
        frame_requests, targets = [], []
        for r, request in enumerate(requests):
            e = request.episode
            if not 0 <= e < len(self):
                raise IndexError(f"{self.name}: episode {e} out of range ({len(self)} episodes)")
            for key, steps in request.steps.items():
                steps = np.asarray(steps, dtype=np.int64)
                if steps.size and (steps.min() < 0 or steps.max() >= self._lengths[e]):
                    raise IndexError(f"{self.describe(e)} key {key!r}: steps {steps.min()}..{steps.max()} outside "
                                     f"its {self._lengths[e]} steps")
                if key in ("proprio", "action"):
                    out[r][key] = self._array(e, key)[steps]
                elif key.startswith(FRAMES_PREFIX):
                    camera = key[len(FRAMES_PREFIX) :]
                    data = self._member(e, f"{camera}.mp4")
                    frames = align_to_stream(steps, fps=self._fps[e], stream_fps=self.camera_fps(e, camera),
                                             stream_length=self._camera_frames(e, camera, data))
                    out_arr = request.out.get(key) if request.out else None
                    frame_requests.append(FrameRequest(data, indices=frames, out=out_arr))
                    targets.append((r, key, f"{self.describe(e)} stream {camera!r}"))
                else:
                    raise ValueError(f"{self.describe(e)}: cannot read key {key!r}; keys are 'proprio', 'action', "
                                     f"'frames.<camera>'")
        with stage("decode"):
            decoded = decode_with_context(self._videos, frame_requests, [t[2] for t in targets])
        for (r, key, _), frames in zip(targets, decoded):
            out[r][key] = frames
        return out

    def episode(self, index: int) -> dict:
        """The whole episode per DESIGN.md: proprio, action, task, fps and ``frames.<camera>`` for every camera."""
        steps = np.arange(self._lengths[index])
        keys = ["proprio", "action", *(FRAMES_PREFIX + c for c in self._cameras[index])]
        data = self.read_many([EpisodeRequest(index, {k: steps for k in keys[:2]})])[0]
        for camera in self._cameras[index]:
            data[FRAMES_PREFIX + camera] = self._videos.read(self._member(index, f"{camera}.mp4"))
        return {**data, "task": self.task(index), "fps": float(self._fps[index]), "episode_id": self._ids[index]}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_bytes"], state["_videos"] = OrderedDict(), None  # each worker reads its own bytes
        return state

    # -- internals -------------------------------------------------------------------------------------------
    def describe(self, episode: int) -> str:
        """Where an episode lives, for error messages: its shard and key."""
        return f"{self._shards[episode]} key {self._ids[episode]!r}"


    def _member(self, episode: int, name: str) -> bytes:
        cache_key = (episode, name)
        if cache_key in self._bytes:
            self._bytes.move_to_end(cache_key)
            return self._bytes[cache_key]
        if name not in self._members[episode]:
            raise ValueError(f"{self.describe(episode)}: no member {name!r} (it has {sorted(self._members[episode])})")
        offset, size = self._members[episode][name]
        with stage("read"):
            data = read_member(self._shards[episode], offset, size)
        if len(data) != size:
            raise ValueError(f"{self.describe(episode)} member {name!r}: read {len(data)} of {size} bytes "
                             f"(shard truncated?)")
        self._bytes[cache_key] = data
        while len(self._bytes) > 4 * self.cache_episodes:
            self._bytes.popitem(last=False)
        return data

    def _array(self, episode: int, key: str) -> np.ndarray:
        name = f"{key}.npy"
        array = load_npy(self._member(episode, name), key=f"{self.describe(episode)} member {name!r}",
                         expect_dtype=np.float32, expect_shape=(int(self._lengths[episode]), None))
        return array

    def frame_shape(self, episode: int, camera: str) -> tuple[int, int] | None:
        """``(height, width)`` of a camera's decoded frames (probed once per video, from its bytes)."""
        if self._videos is None:
            self._videos = VideoReaderCache(max_open=max(2, self.cache_episodes), backend=self.backend)
        self._camera_frames(episode, camera, self._member(episode, f"{camera}.mp4"))
        return self._frame_sizes[(episode, camera)]

    def _camera_frames(self, episode: int, camera: str, data: bytes) -> int:
        key = (episode, camera)
        if key not in self._frame_counts:  # probe once per video, not once per sample
            try:
                info = self._videos.info(data)
            except DecodeError as err:
                raise SampleError(f"{self.describe(episode)} stream {camera!r}: {err}") from err
            have = info.num_frames
            self._frame_sizes[key] = (info.height, info.width)
            rate = self.camera_fps(episode, camera)
            # A stream at its own rate covers the episode's span [0, (T - 1) / fps] with frames j / rate.
            want = int(np.floor((self._lengths[episode] - 1) / self._fps[episode] * rate + 1e-6)) + 1
            if have < want:
                raise SampleError(f"{self.describe(episode)} stream {camera!r}: the video has {have} frames but "
                                  f"meta.json promises {self._lengths[episode]} steps at {self._fps[episode]:g} fps, "
                                  f"which need {want} frames at {rate:g} fps")
            self._frame_counts[key] = have
        return self._frame_counts[key]


def _index_path(path) -> str | None:
    """The index file for ``path``: the path itself if it is one, else ``<dir>/mmfeed-index.parquet`` if present."""
    if isinstance(path, (list, tuple)):
        return None
    path = os.fspath(path)
    if path.endswith(".parquet") and ("://" in path or os.path.isfile(path)):
        return path
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, INDEX_FILENAME)):
        return os.path.join(path, INDEX_FILENAME)
    return None
