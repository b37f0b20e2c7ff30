"""Webdataset tar shards with their parquet index (:mod:`mmfeed.loaders.stores.index`), local or remote.
:mod:`.metadata` checks the index against the shards' members; :mod:`.source` is the episode reader
(:class:`~mmfeed.loaders.formats.webdataset.source.WebDatasetSource`, one byte-range read per member).

Its ``detect`` names only a remote folder whose index is there: every other path that is no other format's (a
shard, a pattern or list of shards, a folder of them, an index file) is opened as shards, the last resort of
:func:`~mmfeed.loaders.open_dataset`.
"""

from __future__ import annotations

from mmfeed.loaders.formats import Format
from mmfeed.loaders.formats.webdataset.source import WebDatasetSource, expand_shards
from mmfeed.loaders.stores.index import INDEX_FILENAME
from mmfeed.loaders.transport.files import DatasetFiles, is_url

__all__ = ["FORMAT", "WebDatasetSource", "expand_shards"]


def detect(path: str) -> str | None:
    """The index of the remote folder ``path`` when the index is there (a URL naming no file and no pattern)."""
    if is_url(path) and not path.endswith((".tar", ".parquet")) and not any(c in path for c in "{*?["):
        if DatasetFiles(path).exists(INDEX_FILENAME):  # a folder of shards: its index lists them
            return f"{path.rstrip('/')}/{INDEX_FILENAME}"
    return None


FORMAT = Format("webdataset", WebDatasetSource, detect)
