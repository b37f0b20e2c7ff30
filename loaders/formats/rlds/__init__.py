"""RLDS datasets as TensorFlow Datasets writes them (Open X-Embodiment, DROID, Bridge), read without TensorFlow:
``<name>/<version>/`` with ``dataset_info.json``, ``features.json`` and tfrecord shards, local or at an fsspec
URL. :mod:`.tfrecord` is the record framing (both CRC-32C checks), :mod:`.example` the ``tf.train.Example``
decoder, :mod:`.metadata` reads the metadata and decodes each feature as features.json declares it,
:mod:`.index` keeps where every record lies and :mod:`.source` is the episode reader
(:class:`~mmfeed.loaders.formats.rlds.source.RldsSource`).
"""

from __future__ import annotations

import os

from mmfeed.loaders.formats import Format
from mmfeed.loaders.formats.rlds.metadata import locate
from mmfeed.loaders.formats.rlds.source import RldsSource

__all__ = ["FORMAT", "RldsSource"]


def detect(path: str) -> str | None:
    """``path`` when it is an RLDS version directory (``dataset_info.json`` and ``features.json`` in it) or a
    dataset directory with one in a version folder below it (local, or a URL whose store lists folders)."""
    spec = os.fspath(path)
    if spec.endswith((".tar", ".parquet")) or any(c in spec for c in "{*?["):
        return None
    if "://" not in spec and not os.path.isdir(spec):
        return None
    return spec if locate(spec) is not None else None


FORMAT = Format("rlds", RldsSource, detect)
