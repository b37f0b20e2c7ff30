"""The webdataset writers of :mod:`mmfeed.testing.synth`: :func:`write_webdataset` writes episodes as shards
(every feature under its own name, through :class:`~mmfeed.loaders.conversion.writer.ShardWriter`);
:func:`write_webdataset_v1` writes the first version's layout (cameras, proprio, action), which mmfeed still reads."""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mmfeed.testing.synth_episodes import SyntheticEpisode, _check_ids, _check_int
from mmfeed.testing.video import write_video

__all__ = ["write_webdataset", "write_webdataset_v1"]


def write_webdataset(
    out_dir: str | os.PathLike,
    episodes: Sequence[SyntheticEpisode],
    *,
    episodes_per_shard: int = 8,
    codec: str = "h264",
    gop: int = 30,
) -> list[str]:
    """Write ``episodes`` as shards ``shard-000000.tar`` ... and their index in ``out_dir``; return the shard
    paths. Each episode holds :meth:`SyntheticEpisode.features` (cameras encoded at their own rates, pattern index
    = frame number within the episode) under key ``ep.episode_id``, through
    :class:`mmfeed.loaders.conversion.writer.ShardWriter`.

        >>> import tempfile
        >>> from mmfeed.testing import make_episodes
        >>> len(write_webdataset(tempfile.mkdtemp(), make_episodes(3), episodes_per_shard=2))
        2
    """
    from mmfeed.loaders.conversion.writer import ShardWriter

    _check_int("episodes_per_shard", episodes_per_shard, 1)
    episodes = list(episodes)
    _check_ids(episodes)
    with ShardWriter(out_dir, codec=codec, gop=gop, episodes_per_shard=episodes_per_shard) as writer:
        for ep in episodes:
            writer.write(ep.features(), fps=ep.fps, task=ep.task, rates=ep.rates(), key=ep.episode_id)
    return writer.shards


def write_webdataset_v1(
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
    within the episode), ``<key>.state.npy``, ``<key>.action.npy`` and ``<key>.meta.json`` (:meth:`meta`).
    Written through ``webdataset.TarWriter`` with a fixed member mtime, so equal inputs give equal tar headers.
    With ``index`` the parquet index is written beside them (``mmfeed.loaders.stores.index.INDEX_FILENAME``).
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
                    sample["proprio.npy"] = _npy_bytes(ep.state)
                    sample["action.npy"] = _npy_bytes(ep.action)
                    sample["meta.json"] = json.dumps(ep.meta(), sort_keys=True).encode("utf-8")
                    writer.write(sample)
            shards.append(str(path))
    if index and shards:
        from mmfeed.loaders.stores.index import INDEX_FILENAME, write_index

        write_index(shards, out_dir / INDEX_FILENAME)
    return shards


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()
