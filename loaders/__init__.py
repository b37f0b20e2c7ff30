"""mmfeed.loaders: I/O and processes -- sources, the planned dataset, workers, collation, DataLoader, prefetch, timing.

The path of a batch: a source (:mod:`mmfeed.loaders.sources`: webdataset shards, LeRobot v3 directories, arrays in
memory, a mixture of them) lists its episodes with every feature under its own name; the planned dataset
(:mod:`mmfeed.loaders.planned`) plans an epoch over its items (:mod:`mmfeed.loaders.items`: windows, whole-episode
chunks, records) from the index alone; workers read and decode exactly the frames of their planned batches and
collate them (:mod:`mmfeed.loaders.collate`); :class:`DataLoader` hands them out, prefetched to the device and
timed. Everything decided from the index alone lives in :mod:`mmfeed.packing`; the window, layout and plan types
are re-exported here because they are what a loader is configured with::

    from mmfeed import DataLoader
    from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset

    ds = open_dataset("shards/")
    window = WindowSpec.from_delta_timestamps({"observation.images.cam_high": [-1 / 15, 0.0],
                                               "observation.state": [0.0], "action": [i / 50 for i in range(50)]})
    loader = DataLoader(ds, packing=Packing(layout=TokenLayout(tokens_per_frame={"observation.images.cam_high": 256}),
                                            window=window, plan=PlanConfig(capacity=8192, rows_per_batch=4)))

Names are imported on first use, so ``import mmfeed.loaders`` stays fast.
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "DataLoader": "mmfeed.loaders.dataloader",
    "convert": "mmfeed.loaders.conversion",
    "count_flops": "mmfeed.loaders.flops",
    "DevicePrefetcher": "mmfeed.loaders.prefetch",
    "ErrorPolicy": "mmfeed.loaders.errors",
    "Feature": "mmfeed.loaders.sources.base",
    "Normalize": "mmfeed.loaders.transforms",
    "Packing": "mmfeed.loaders.packing_config",
    "PlanConfig": "mmfeed.packing.plan",
    "PlannedDataset": "mmfeed.loaders.planned",
    "SampleError": "mmfeed.loaders.errors",
    "ShardWriter": "mmfeed.loaders.sources.writer",
    "StepTimer": "mmfeed.loaders.timing",
    "StreamConfig": "mmfeed.loaders.streaming",
    "StreamingPackedDataset": "mmfeed.loaders.streaming",
    "TokenLayout": "mmfeed.packing.layout",
    "WindowSpec": "mmfeed.packing.windows",
    "open_dataset": "mmfeed.loaders.open",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
