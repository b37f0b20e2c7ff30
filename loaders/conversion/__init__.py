"""mmfeed.loaders.conversion: datasets turned into indexed webdataset shards (``mmfeed convert``), and the writer.

:func:`~mmfeed.loaders.conversion.job.convert` drives a job (local processes or Ray,
:mod:`~mmfeed.loaders.conversion.engines`) over one reader per kind of source
(:mod:`~mmfeed.loaders.conversion.readers`: LeRobot, shards, a user's generator), each shard written by
:mod:`~mmfeed.loaders.conversion.writer` (:class:`ShardWriter`, also for a user's own episodes), its index built by
:mod:`mmfeed.loaders.stores.index`.
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

_EXPORTS = {
    "ShardWriter": "mmfeed.loaders.conversion.writer",
    "convert": "mmfeed.loaders.conversion.job",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
