"""mmfeed: the data pipeline for multimodal training on video, proprioception, actions and language.

It decodes episode shards, packs variable-length samples into fixed token budgets with exact attention
boundaries, prefetches batches to the device and measures every millisecond of input stall.

The public names are imported on first use, so ``import mmfeed`` (and the ``mmfeed`` command) stay fast::

    >>> from mmfeed import PackedBatch
    >>> PackedBatch.from_lengths([[5, 3], [7]], capacity=8).cu_seqlens.tolist()
    [0, 5, 8, 15]
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "PackedBatch": "mmfeed.packing",
    "pack": "mmfeed.packing",
    "read_frames": "mmfeed.codecs",
    "DataLoader": "mmfeed.loaders",
    "open_dataset": "mmfeed.loaders",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmfeed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
