"""mmfeed: the data pipeline for multimodal training on video, proprioception, actions and language.

It decodes episode shards, packs variable-length samples into fixed token budgets with exact attention
boundaries, prefetches batches to the device and measures every millisecond of input stall.

The public names are imported on first use, so ``import mmfeed`` (and the ``mmfeed`` command) stay fast::

    >>> from mmfeed import PackedBatch
    >>> PackedBatch.from_lengths([[5, 3], [7]], capacity=8).cu_seqlens.tolist()
    [0, 5, 8, 15]
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

__version__ = "0.7.9"

# public name -> module that defines it
_EXPORTS = {
    "PackedBatch": "mmfeed.packing",
    "pack": "mmfeed.packing",
    "read_frames": "mmfeed.codecs",
    "DataLoader": "mmfeed.loaders",
    "open_dataset": "mmfeed.loaders",
}

__all__ = sorted([*_EXPORTS, "__version__"])

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
