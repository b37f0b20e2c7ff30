"""``open_dataset``: one entry point for every format mmfeed reads."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mmfeed.loaders.sources.base import EpisodeSource

__all__ = ["open_dataset"]


def open_dataset(path: Any, **kwargs: Any) -> EpisodeSource:
    """Open webdataset shards (a directory, brace pattern, glob, URL or index file), a LeRobot v3 directory, or a
    list of them.

    A list of tar shards is one dataset; a list of datasets (directories, index files, or sources already open)
    is a mixture of them (:class:`~mmfeed.loaders.sources.concat.ConcatSource`; ``Packing(weights=...)`` weighs
    it). Keyword arguments go to each source: ``backend="pyav"``, ``frame_size=(H, W)`` (or ``{feature: (H, W)}``)
    to resize frames inside the decoder, ``frame_format="yuv420"`` to deliver frames as I420 planes
    ``[H * 3 // 2, W]`` (half the bytes of RGB, no colour conversion in the workers; convert them on the device
    with :func:`mmfeed.codecs.colour.yuv420_to_rgb`), ``decoder_threads=2`` for FFmpeg threads per open video
    (they can pay only for long sequential reads with fewer workers than cores; see ``WebDatasetSource``). ``len(ds)`` is the number of episodes,
    ``ds.features`` every feature under its own name, ``ds.stats`` their statistics and ``ds.episode(i)`` one
    whole episode::

        ds = open_dataset("shards/")                      # doctest: +SKIP
        ds.features["observation.state"]                  # doctest: +SKIP
        Feature(kind='array', dtype='float32', shape=(14,), fps=50.0)
    """
    from mmfeed.loaders.sources.concat import ConcatSource
    from mmfeed.loaders.sources.lerobot import LeRobotSource, is_lerobot_dir
    from mmfeed.loaders.sources.webdataset import WebDatasetSource

    if isinstance(path, EpisodeSource):
        if kwargs:
            raise ValueError(f"{path.name} is already open; pass {sorted(kwargs)} when opening it")
        return path
    if isinstance(path, Sequence) and not isinstance(path, (str, bytes)):
        items = list(path)
        if not items:
            raise ValueError("open_dataset got an empty list; give shards, dataset directories or index files")
        if all(isinstance(p, (str, os.PathLike)) and _is_shard(os.fspath(p)) for p in items):
            return WebDatasetSource(items, **kwargs)
        sources = [open_dataset(p, **kwargs) for p in items]
        return sources[0] if len(sources) == 1 else ConcatSource(sources)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"open_dataset takes a path, URL, list of them, or an open source; got {type(path).__name__}")
    spec = os.fspath(path)
    if is_lerobot_dir(spec):  # a local directory or any fsspec URL with meta/info.json
        return LeRobotSource(spec, **kwargs)
    if "://" not in spec and os.path.isdir(os.path.join(spec, "meta")) and not os.path.exists(
            os.path.join(spec, "meta", "info.json")):
        raise FileNotFoundError(f"{spec}: looks like a LeRobot dataset (it has meta/) but meta/info.json is missing")
    if "://" not in spec and not any(c in spec for c in "{*?[") and not os.path.exists(spec):
        raise FileNotFoundError(f"{spec}: no such file or directory (expected webdataset shards or a LeRobot v3 "
                                "directory)")
    return WebDatasetSource(spec, **kwargs)


def _is_shard(path: str) -> bool:
    """A single tar shard or a pattern of shards (rather than a dataset directory or an index file)."""
    return path.endswith(".tar") or any(c in path for c in "{*?[")
