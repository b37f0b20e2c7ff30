"""``open_dataset``: one entry point for every format mmfeed reads, alone or mixed."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from mmfeed.loaders.formats import registered
from mmfeed.loaders.formats.lerobot.hub import is_hub_id
from mmfeed.loaders.formats.lerobot.hub import resolve as resolve_hub_id
from mmfeed.loaders.formats.webdataset import WebDatasetSource
from mmfeed.loaders.sources.base import EpisodeSource
from mmfeed.loaders.sources.concat import ConcatSource
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.sources.renamed import RenamedSource
from mmfeed.loaders.stores.index import INDEX_FILENAME
from mmfeed.loaders.transport.files import is_url
from mmfeed.loaders.transport.remote import explained

__all__ = ["format_of", "open_dataset", "open_each"]


def open_dataset(path: Any, *, pad_to: Mapping[str, int] | None = None,
                 embodiments: Sequence[str] | Mapping[str, str] | None = None, rename: Any = None,
                 absent: str | None = None, revision: str | None = None, download: bool = False,
                 **kwargs: Any) -> EpisodeSource:
    """Open webdataset shards (a directory, brace pattern, glob, URL or index file), a LeRobot v3 directory, HDF5
    demonstrations (a robomimic/LIBERO file, or a folder of them or of ACT/ALOHA episode files), a Zarr
    ReplayBuffer, or a list of them. HDF5 and Zarr files record no frame rate: give ``fps=`` (and ``layout=``,
    ``split=`` where wanted; see :class:`~mmfeed.loaders.sources.options.ReadOptions`).

    A list of tar shards is one dataset; a list of datasets (directories, index files, or sources already open)
    is a mixture of them (:class:`~mmfeed.loaders.sources.concat.ConcatSource`; ``Packing(weights=...)`` weighs
    it), and a dict ``{name: path}`` names its datasets. Keyword arguments are the fields of one
    :class:`~mmfeed.loaders.sources.options.ReadOptions`, handed to
    every dataset: ``backend="pyav"``, ``frame_size=(H, W)`` (or
    ``{feature: (H, W)}``) to resize frames inside the decoder, ``frame_format="yuv420"`` to deliver frames as
    I420 planes ``[H * 3 // 2, W]`` (half the bytes of RGB, no colour conversion in the workers; convert them on
    the device with :func:`mmfeed.codecs.colour.yuv420_to_rgb`), ``decoder_threads=2`` for FFmpeg threads per
    open video (they can pay only for long sequential reads with fewer workers than cores; see
    ``WebDatasetSource``), ``cache=DIR`` (and ``cache_bytes=``) to keep decoded frames in a local store that later
    epochs read instead of decoding (:mod:`mmfeed.loaders.stores.frame_store`), ``device="cuda"`` to decode with
    NVDEC (through PyAV, or ``backend="torchcodec"``) and get video features as torch tensors on the GPU (decoding
    in the training process: ``num_workers=0`` or ``worker_mode="thread"``; see
    :class:`~mmfeed.loaders.sources.options.ReadOptions`), ``max_frame_pixels`` (default 4096x4096; None lifts it)
    for the largest frames a dataset may declare or a video hold, refused before any is decoded; shards also take
    ``cache_episodes`` and ``check_index``, LeRobot directories ``tolerance_s``. Each dataset of a mixture gets the
    options its format takes; an option that no dataset of ``path`` takes is refused (ValueError naming it and the
    formats that take it). ``len(ds)`` is the number of episodes, ``ds.features`` every feature under its own name,
    ``ds.stats`` their statistics and ``ds.episode(i)`` one whole episode::

        ds = open_dataset("shards/")                      # doctest: +SKIP
        ds.features["observation.state"]                  # doctest: +SKIP
        Feature(kind='array', dtype='float32', shape=(14,), fps=50.0)
        mix = open_dataset(["shards/", "lerobot/"], frame_size=(224, 224), cache_episodes=4)  # doctest: +SKIP

    A mixture of robots (see :mod:`~mmfeed.loaders.sources.concat`) takes ``pad_to={feature: width}`` (array
    features padded with zeros in their last dimension; samples carry ``<feature>_dim_mask``), ``embodiments``
    (one name per dataset: datasets of one robot share stats), ``rename`` (``{name: new name}`` for every dataset
    that has the feature, a list of such dicts, one per dataset, or ``{dataset name: {name: new name}}``) and
    ``absent`` ("zeros": a feature a dataset lacks, asked for by a window, comes as zeros flagged in
    ``<feature>_is_pad``; "skip": not at all). ``absent`` defaults to "zeros" when any of the other three is
    given, else "skip"; given any of them, even one dataset opens as a mixture::

        mix = open_dataset({"franka": arm, "aloha": bimanual}, pad_to={"action": 32})   # doctest: +SKIP

    A LeRobot dataset may be named by its Hub id, as LeRobot names it (:mod:`~mmfeed.loaders.formats.lerobot.hub`):
    LeRobot's local copy when it has one (no network), else the Hub's read in place (``hf://datasets/<id>``,
    ``revision=`` a branch, tag or commit), or downloaded into LeRobot's folder first with ``download=True``::

        ds = open_dataset("lerobot/pusht")                # doctest: +SKIP
    """
    options = ReadOptions.of(**kwargs)
    hub = {"revision": revision, "download": download}
    names = None
    if isinstance(path, Mapping):
        if not path:
            raise ValueError("open_dataset got an empty dict; give {name: path} of each dataset")
        names = [str(k) for k in path]
        resolved = [_resolve(p, hub) for p in path.values()]
    else:
        resolved = _resolve(path, hub)
    _check_options(options, _formats_in(resolved))
    crossed = pad_to is not None or embodiments is not None or rename is not None
    if not crossed and absent is None and names is None:
        return _open(resolved, options)
    datasets = [_open(item, options) for item in resolved] if isinstance(resolved, list) else [_open(resolved, options)]
    names = names or [d.name for d in datasets]
    datasets = [RenamedSource(d, m) if m else d for d, m in zip(datasets, _renames(rename, names, datasets))]
    absent = absent if absent is not None else ("zeros" if crossed else "skip")
    if len(datasets) == 1 and not crossed and absent == "skip":
        return datasets[0]
    return ConcatSource(datasets, names=names, pad_to=pad_to, embodiments=embodiments, absent=absent)


def format_of(path: str | os.PathLike) -> str | None:
    """The name of the registered format (:data:`~mmfeed.loaders.formats.FORMATS`) whose detection takes ``path``,
    or None (``open_dataset`` then reads it as webdataset shards)."""
    spec = os.fspath(path)
    with _reaching(spec):
        return next((fmt.name for fmt in registered() if fmt.detect(spec) is not None), None)


def open_each(paths: Sequence[Any], *, revision: str | None = None, download: bool = False,
              **kwargs: Any) -> list[EpisodeSource]:
    """Each of ``paths`` opened alone (no mixture: their features need not agree), each with the options of
    ``kwargs`` its format takes; an option that none of them takes is refused, as :func:`open_dataset` does (Hub
    ids too, with ``revision`` and ``download``). For passes over several datasets, such as
    ``mmfeed stats --fps 10 a.hdf5 lerobot/``."""
    options = ReadOptions.of(**kwargs)
    resolved = [_resolve(p, {"revision": revision, "download": download}) for p in paths]
    _check_options(options, _formats_in(resolved))
    return [_open(item, options) for item in resolved]


def _renames(rename: Any, names: list[str], datasets: list[EpisodeSource]) -> list[dict[str, str]]:
    """Each dataset's ``{name: new name}`` from ``rename`` in any of its forms (see :func:`open_dataset`)."""
    if rename is None:
        return [{} for _ in datasets]
    if isinstance(rename, Mapping) and all(isinstance(v, str) for v in rename.values()):
        nowhere = sorted(k for k in rename if not any(k in d.features for d in datasets))
        if nowhere:
            raise ValueError(f"rename names features {nowhere}, which no dataset of {names} has; give rename only "
                             "features a dataset has (or per dataset: {dataset: {name: new name}})")
        return [{k: v for k, v in rename.items() if k in d.features} for d in datasets]
    if isinstance(rename, Mapping):
        unknown = sorted(set(rename) - set(names))
        if unknown:
            raise ValueError(f"rename names datasets {unknown}; the datasets are {names} (give rename={{name: "
                             "new name}} for all of them, or one dict per dataset)")
        given = [dict(rename.get(n) or {}) for n in names]
        keys = [f"rename[{n!r}]" for n in names]
    elif isinstance(rename, Sequence) and not isinstance(rename, (str, bytes)):
        if len(rename) != len(datasets):
            raise ValueError(f"rename gives {len(rename)} dicts for {len(datasets)} datasets; give one per dataset "
                             "(an empty one where nothing is renamed)")
        given = [dict(m or {}) for m in rename]
        keys = [f"rename[{k}]" for k in range(len(names))]
    else:
        raise TypeError(f"rename takes {{name: new name}}, a list of such dicts or {{dataset: {{name: new name}}}}; "
                        f"got {type(rename).__name__}")
    for key, name, d, mapping in zip(keys, names, datasets, given):  # before RenamedSource, to name the dataset
        missing = sorted(f for f in mapping if f not in d.features)
        if missing:
            raise ValueError(f"{key} renames {missing}, which dataset {name!r} does not have; its features are "
                             f"{sorted(d.features)}")
        new = [mapping.get(f, f) for f in d.features]
        twice = sorted({n for n in new if new.count(n) > 1})
        if twice:
            raise ValueError(f"{key} = {mapping} gives two features of dataset {name!r} the name(s) {twice}")
    return given


def _resolve(path: Any, hub: Mapping[str, Any]) -> Any:
    """What ``path`` names, before anything is opened: a source already open, ``(format class, path)`` of one
    dataset, or a list of those for a mixture; a Hub id becomes the LeRobot directory or URL it names (``hub``:
    ``revision`` and ``download``). Paths that name nothing readable fail here."""
    if isinstance(path, EpisodeSource):
        return path
    if isinstance(path, Sequence) and not isinstance(path, (str, bytes)):
        items = list(path)
        if not items:
            raise ValueError("open_dataset got an empty list; give shards, dataset directories or index files")
        if all(isinstance(p, (str, os.PathLike)) and _is_shard(os.fspath(p)) for p in items):
            return WebDatasetSource, items
        return [_resolve(p, hub) for p in items]
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"open_dataset takes a path, URL, list of them, or an open source; got {type(path).__name__}")
    spec = os.fspath(path)
    if is_hub_id(spec):
        spec = resolve_hub_id(spec, **hub)
    with _reaching(spec):
        for fmt in registered():  # each format's own detection (mmfeed.loaders.formats), in order
            found = fmt.detect(spec)
            if found is not None:
                return fmt.source, found
        if is_url(spec) and not spec.endswith((".tar", ".parquet")) and not any(c in spec for c in "{*?["):
            raise FileNotFoundError(f"{spec}: no dataset there: looked for meta/info.json (a LeRobot v3 directory) "
                                    f"and {INDEX_FILENAME} (webdataset shards); check the URL, or name the shards "
                                    f"by pattern ({spec.rstrip('/')}/shard-{{000000..000009}}.tar)")
    if "://" not in spec and os.path.isdir(os.path.join(spec, "meta")) and not os.path.exists(
            os.path.join(spec, "meta", "info.json")):
        raise FileNotFoundError(f"{spec}: looks like a LeRobot dataset (it has meta/) but meta/info.json is missing")
    if "://" not in spec and not any(c in spec for c in "{*?[") and not os.path.exists(spec):
        raise FileNotFoundError(f"{spec}: no such file or directory (expected webdataset shards or a LeRobot v3 "
                                "directory)")
    local = spec.removeprefix("file://")
    if os.path.isdir(local) and not os.path.isfile(os.path.join(local, INDEX_FILENAME)) \
            and not glob.glob(os.path.join(glob.escape(local), "*.tar")):
        raise _not_a_dataset(local)
    if os.path.basename(local) == "info.json" and os.path.basename(os.path.dirname(os.path.abspath(local))) == "meta":
        raise ValueError(f"{spec} is the metadata file of a LeRobot directory: open the directory itself, "
                         f"{os.path.dirname(os.path.dirname(os.path.abspath(local)))}")
    return WebDatasetSource, spec


def _not_a_dataset(directory: str) -> FileNotFoundError:
    """The error for a local directory that holds no dataset, naming what was looked for (and the datasets among
    its subdirectories, a few of them, when it is a folder of datasets)."""
    inside = []
    for sub in sorted(os.scandir(directory), key=lambda e: e.name):
        if sub.is_dir() and (os.path.isfile(os.path.join(sub.path, "meta", "info.json"))
                             or os.path.isfile(os.path.join(sub.path, INDEX_FILENAME))
                             or glob.glob(os.path.join(glob.escape(sub.path), "*.tar"))):
            inside.append(sub.name)
    hint = ""
    if inside:
        shown = ", ".join(inside[:3]) + (f" and {len(inside) - 3} more" if len(inside) > 3 else "")
        hint = f"; its subdirectories {shown} are datasets: open one, or a list of them (a mixture)"
    return FileNotFoundError(f"{directory}: not a dataset: looked for webdataset shards (*.tar) or their "
                             f"{INDEX_FILENAME}, and for meta/info.json (a LeRobot v3 directory), and found none"
                             f"{hint}")


@contextmanager
def _reaching(spec: Any) -> Iterator[None]:
    """Run the block; a remote dataset that cannot be reached fails naming its URL and what to set or install
    (:func:`~mmfeed.loaders.transport.remote.explained`). Local paths fail as they do."""
    first = os.fspath(spec[0]) if isinstance(spec, (list, tuple)) and spec else spec
    if isinstance(first, str) and is_url(first):
        with explained(first):
            yield
    else:
        yield


def _formats_in(resolved: Any) -> list[tuple[type[EpisodeSource], Any]]:
    """``(format class, path)`` of every dataset still to open in ``resolved``, in order."""
    if isinstance(resolved, list):
        return [leaf for item in resolved for leaf in _formats_in(item)]
    return [] if isinstance(resolved, EpisodeSource) else [resolved]


def _check_options(options: ReadOptions, datasets: list[tuple[type[EpisodeSource], Any]]) -> None:
    """Refuse an option that no dataset to open reads, naming the formats that read it."""
    if not datasets:
        return  # only sources already open: _open names the options they cannot take
    for option in options.given():
        if any(option in cls.READ_OPTIONS for cls, _ in datasets):
            continue
        takers = [fmt.source.FORMAT for fmt in registered() if option in fmt.source.READ_OPTIONS]
        given = "; ".join(f"{_shown(p)} is {cls.FORMAT}" for cls, p in datasets)
        named = ", ".join(takers[:-1]) + " and " + takers[-1] if len(takers) > 1 else "".join(takers)
        raise ValueError(f"open_dataset: option {option!r} applies to {named} only, and no dataset "
                         f"given is one ({given}); drop {option}=")


def _shown(path: Any) -> str:
    """A dataset's path for a message (a list of shards by its first)."""
    return f"{os.fspath(path[0])} and {len(path) - 1} more shards" if isinstance(path, list) else os.fspath(path)


def _open(resolved: Any, options: ReadOptions) -> EpisodeSource:
    """Open what :func:`_resolve` found, each dataset with the options its format reads."""
    if isinstance(resolved, EpisodeSource):
        if options.given():
            raise ValueError(f"{resolved.name} is already open; pass {options.given()} when opening it")
        return resolved
    if isinstance(resolved, list):
        sources = [_open(item, options) for item in resolved]
        return sources[0] if len(sources) == 1 else ConcatSource(sources)
    cls, spec = resolved
    with _reaching(spec):
        return cls(spec, options.restricted(cls.READ_OPTIONS))


def _is_shard(path: str) -> bool:
    """A single tar shard or a pattern of shards (rather than a dataset directory or an index file)."""
    return path.endswith(".tar") or any(c in path for c in "{*?[")
