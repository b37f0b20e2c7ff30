"""mmfeed.loaders.formats: one room per dataset format.

Each format is a folder here: ``lerobot/`` (LeRobot v3 and v2.x directories), ``rlds/`` (RLDS datasets as TFDS
writes them: Open X-Embodiment, DROID, Bridge), ``hdf5/`` (robomimic, LIBERO and ACT/ALOHA demonstrations),
``zarr/`` (diffusion_policy's and UMI's ReplayBuffer) and ``webdataset/`` (indexed tar shards). A
folder holds the format's metadata reader and checks (``metadata.py``), its episode reader (``source.py``, an
:class:`~mmfeed.loaders.sources.base.EpisodeSource`) and, in its ``__init__.py``, its registration: one
:class:`Format` named ``FORMAT``. Every format reads bytes through :mod:`mmfeed.loaders.transport` (local files,
tar members, remote byte ranges with retries and the range cache), keeps what it derives in
:mod:`mmfeed.loaders.stores`, decodes video (where it has any) through one shared reader cache
(:class:`~mmfeed.loaders.sources.readers.ReaderCaches`) and is windowed, packed, mixed and resumed by the episode-source
core (:mod:`mmfeed.loaders.sources`), which knows no format.

Adding a format:

1. a folder ``loaders/formats/<name>/`` with ``metadata.py`` (read and check the metadata against the data:
   one-line errors naming the file and the key, or a :class:`~mmfeed.loaders.sources.consistency.Verdict` that
   ``errors="skip"`` settles) and ``source.py`` (a subclass of
   :class:`~mmfeed.loaders.sources.base.EpisodeSource` with ``FORMAT``, ``READ_OPTIONS``, ``features``,
   ``__len__``, ``episode_length``, ``episode_fps``, ``task`` and ``read_many``);
2. in its ``__init__.py``, ``FORMAT = Format("<name>", Source, detect)``, where ``detect(path)`` returns what to
   open when ``path`` is this format (the path itself, or a file inside it) and None otherwise, without reading
   more than a metadata file;
3. its name in :data:`FORMATS` below, before the formats whose detection is looser (webdataset, which takes any
   tar, pattern or index, stays last);
4. the folder in pyproject's ``packages`` (``tests/test_packaging.py`` checks it) and its conformance tests on
   files the format's own tool wrote.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from mmfeed.loaders.sources.base import EpisodeSource

__all__ = ["FORMATS", "Format", "registered"]

FORMATS: tuple[str, ...] = ("lerobot", "rlds", "hdf5", "zarr", "webdataset")
"""The formats :func:`~mmfeed.loaders.open_dataset` reads, in the order their ``detect`` is asked."""


@dataclass(frozen=True)
class Format:
    """A format's registration: its ``name``, its ``source`` class and ``detect(path) -> what to open | None``."""

    name: str
    source: type[EpisodeSource]
    detect: Callable[[str], str | None]


@cache
def registered() -> tuple[Format, ...]:
    """Every registered format's :class:`Format`, in :data:`FORMATS` order (each folder imported on first use)."""
    return tuple(importlib.import_module(f"{__name__}.{name}").FORMAT for name in FORMATS)
