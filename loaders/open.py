"""``open_dataset``: one entry point for every format mmfeed reads, alone or mixed."""

from __future__ import annotations

import inspect
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
    it). Keyword arguments are the formats' options: ``backend="pyav"``, ``frame_size=(H, W)`` (or
    ``{feature: (H, W)}``) to resize frames inside the decoder, ``frame_format="yuv420"`` to deliver frames as
    I420 planes ``[H * 3 // 2, W]`` (half the bytes of RGB, no colour conversion in the workers; convert them on
    the device with :func:`mmfeed.codecs.colour.yuv420_to_rgb`), ``decoder_threads=2`` for FFmpeg threads per
    open video (they can pay only for long sequential reads with fewer workers than cores; see
    ``WebDatasetSource``); shards also take ``cache_episodes`` and ``check_index``, LeRobot directories
    ``tolerance_s``. Each dataset of a mixture gets the options its format takes; an option that no dataset of
    ``path`` takes is refused (ValueError naming it and the formats that take it). ``len(ds)`` is the number of
    episodes, ``ds.features`` every feature under its own name, ``ds.stats`` their statistics and
    ``ds.episode(i)`` one whole episode::

        ds = open_dataset("shards/")                      # doctest: +SKIP
        ds.features["observation.state"]                  # doctest: +SKIP
        Feature(kind='array', dtype='float32', shape=(14,), fps=50.0)
        mix = open_dataset(["shards/", "lerobot/"], frame_size=(224, 224), cache_episodes=4)  # doctest: +SKIP
    """
    resolved = _resolve(path)
    _check_options(kwargs, _formats_in(resolved))
    return _open(resolved, kwargs)


def _formats() -> dict[str, type[EpisodeSource]]:
    """Every format ``open_dataset`` reads: its name -> its source class (whose constructor's keyword arguments
    are the format's options)."""
    from mmfeed.loaders.sources.lerobot import LeRobotSource
    from mmfeed.loaders.sources.webdataset import WebDatasetSource

    return {"webdataset shards": WebDatasetSource, "LeRobot v3": LeRobotSource}


def _options(source_class: type[EpisodeSource]) -> list[str]:
    """The options a format takes: the named parameters of its constructor after the path."""
    parameters = list(inspect.signature(source_class.__init__).parameters.values())[2:]
    return [p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _resolve(path: Any) -> Any:
    """What ``path`` names, before anything is opened: a source already open, ``(format class, path)`` of one
    dataset, or a list of those for a mixture. Paths that name nothing readable fail here."""
    from mmfeed.loaders.sources.lerobot import LeRobotSource, is_lerobot_dir
    from mmfeed.loaders.sources.webdataset import WebDatasetSource

    if isinstance(path, EpisodeSource):
        return path
    if isinstance(path, Sequence) and not isinstance(path, (str, bytes)):
        items = list(path)
        if not items:
            raise ValueError("open_dataset got an empty list; give shards, dataset directories or index files")
        if all(isinstance(p, (str, os.PathLike)) and _is_shard(os.fspath(p)) for p in items):
            return WebDatasetSource, items
        return [_resolve(p) for p in items]
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"open_dataset takes a path, URL, list of them, or an open source; got {type(path).__name__}")
    spec = os.fspath(path)
    if is_lerobot_dir(spec):  # a local directory or any fsspec URL with meta/info.json
        return LeRobotSource, spec
    if "://" not in spec and os.path.isdir(os.path.join(spec, "meta")) and not os.path.exists(
            os.path.join(spec, "meta", "info.json")):
        raise FileNotFoundError(f"{spec}: looks like a LeRobot dataset (it has meta/) but meta/info.json is missing")
    if "://" not in spec and not any(c in spec for c in "{*?[") and not os.path.exists(spec):
        raise FileNotFoundError(f"{spec}: no such file or directory (expected webdataset shards or a LeRobot v3 "
                                "directory)")
    return WebDatasetSource, spec


def _formats_in(resolved: Any) -> list[tuple[type[EpisodeSource], Any]]:
    """``(format class, path)`` of every dataset still to open in ``resolved``, in order."""
    if isinstance(resolved, list):
        return [leaf for item in resolved for leaf in _formats_in(item)]
    return [] if isinstance(resolved, EpisodeSource) else [resolved]


def _check_options(kwargs: dict[str, Any], datasets: list[tuple[type[EpisodeSource], Any]]) -> None:
    """Refuse an option that no dataset to open takes, naming the formats that take it."""
    if not datasets:
        return  # only sources already open: _open names the options they cannot take
    taken = {name for cls, _ in datasets for name in _options(cls)}
    names = {cls: name for name, cls in _formats().items()}
    for option in kwargs:
        if option in taken:
            continue
        takers = [name for name, cls in _formats().items() if option in _options(cls)]
        if takers:
            given = "; ".join(f"{_shown(p)} is {names.get(cls, cls.__name__)}" for cls, p in datasets)
            raise ValueError(f"open_dataset: option {option!r} applies to {' and '.join(takers)} only, and no dataset "
                             f"given is one ({given}); drop {option}=")
        every = sorted({name for cls in _formats().values() for name in _options(cls)})
        raise ValueError(f"open_dataset: no format takes option {option!r}; the options are {every} (each applies "
                         "to the datasets whose format takes it)")


def _shown(path: Any) -> str:
    """A dataset's path for a message (a list of shards by its first)."""
    return f"{os.fspath(path[0])} and {len(path) - 1} more shards" if isinstance(path, list) else os.fspath(path)


def _open(resolved: Any, kwargs: dict[str, Any]) -> EpisodeSource:
    """Open what :func:`_resolve` found, each dataset with the options its format takes."""
    from mmfeed.loaders.sources.concat import ConcatSource

    if isinstance(resolved, EpisodeSource):
        if kwargs:
            raise ValueError(f"{resolved.name} is already open; pass {sorted(kwargs)} when opening it")
        return resolved
    if isinstance(resolved, list):
        sources = [_open(item, kwargs) for item in resolved]
        return sources[0] if len(sources) == 1 else ConcatSource(sources)
    cls, spec = resolved
    mine = _options(cls)
    return cls(spec, **{k: v for k, v in kwargs.items() if k in mine})


def _is_shard(path: str) -> bool:
    """A single tar shard or a pattern of shards (rather than a dataset directory or an index file)."""
    return path.endswith(".tar") or any(c in path for c in "{*?[")
