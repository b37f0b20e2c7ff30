"""mmfeed.loaders: I/O and processes, in rooms: sources, the planned path, the loop, streaming, conversion,
observation.

The path of a batch: a source (:mod:`mmfeed.loaders.sources`: webdataset shards, LeRobot v3 directories, arrays in
memory, a mixture of them) lists its episodes with every feature under its own name; the planned dataset
(:mod:`mmfeed.loaders.planned`) plans an epoch from its items' sample table (:mod:`mmfeed.packing.samples`,
:func:`mmfeed.packing.epoch.plan_for`) and, for one step, reads and collates exactly the frames of the step's
samples; :class:`DataLoader` (:mod:`mmfeed.loaders.loop`) hands the batches out, prefetched to the device, timed
(:mod:`mmfeed.loaders.observe`) and resumable. Everything decided from the index alone lives in
:mod:`mmfeed.packing`; the window, layout and plan types are re-exported here because they are what a loader is
configured with::

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
    "CameraDropout": "mmfeed.loaders.planned.transforms",
    "Compose": "mmfeed.loaders.planned.transforms",
    "DataLoader": "mmfeed.loaders.loop.dataloader",
    "DeltaActions": "mmfeed.loaders.planned.transforms",
    "FrameFilter": "mmfeed.loaders.planned.filters",
    "MixtureStats": "mmfeed.loaders.stores.stats",
    "SizeWeights": "mmfeed.packing.mixture",
    "compute_stats": "mmfeed.loaders.conversion.statistics",
    "convert": "mmfeed.loaders.conversion.job",
    "count_flops": "mmfeed.loaders.observe.flops",
    "DevicePrefetcher": "mmfeed.loaders.loop.prefetch",
    "ErrorPolicy": "mmfeed.loaders.planned.errors",
    "Feature": "mmfeed.loaders.sources.base",
    "Normalize": "mmfeed.loaders.planned.transforms",
    "Packing": "mmfeed.loaders.planned.config",
    "PlanConfig": "mmfeed.packing.plan",
    "PlannedDataset": "mmfeed.loaders.planned.dataset",
    "ReadOptions": "mmfeed.loaders.sources.options",
    "SampleError": "mmfeed.loaders.transport.errors",
    "ShardWriter": "mmfeed.loaders.conversion.writer",
    "StepTimer": "mmfeed.loaders.observe.timing",
    "StreamConfig": "mmfeed.loaders.streaming.dataset",
    "StreamingPackedDataset": "mmfeed.loaders.streaming.dataset",
    "TokenLayout": "mmfeed.packing.layout",
    "WindowSpec": "mmfeed.packing.windows",
    "open_dataset": "mmfeed.loaders.open",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
