"""mmfeed.loaders.streaming: tar shards read in order, no index, packed online in a bounded buffer.

For data that cannot be indexed: :class:`~mmfeed.loaders.streaming.dataset.StreamingPackedDataset` deals shards to
ranks and workers and resumes by shard position; each worker's :class:`~mmfeed.loaders.streaming.worker.Stream`
reads, cuts and packs its episodes with the very collation of the planned path.
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

_EXPORTS = {
    "StreamConfig": "mmfeed.loaders.streaming.dataset",
    "StreamingPackedDataset": "mmfeed.loaders.streaming.dataset",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
