"""mmfeed.loaders.planned: the planned path, from an epoch's plan to packed batches.

A batch walks one way: :class:`~mmfeed.loaders.planned.dataset.PlannedDataset` plans the epoch from its items'
sample table (:func:`mmfeed.packing.epoch.plan_for`) and, for one step, asks its items
(:class:`~mmfeed.loaders.planned.reads.Items`: :mod:`~mmfeed.loaders.planned.items`, an episode source's windows or
chunks; :mod:`~mmfeed.loaders.planned.records`, a map-style dataset's records) what the step's samples read, as
data (:mod:`~mmfeed.loaders.planned.reads`; episode samples' frames built by :mod:`mmfeed.loaders.sources.requests`),
and hands that to :func:`~mmfeed.loaders.planned.collate.collate_batch`, one straight pipeline per kind through the
steps of :mod:`~mmfeed.loaders.planned.steps`: read under the error policy (:mod:`~mmfeed.loaders.planned.errors`)
-> check -> transform (:mod:`~mmfeed.loaders.planned.transforms`) -> lay out.
:class:`~mmfeed.loaders.planned.config.Packing` is what ``mmfeed.DataLoader(..., packing=...)`` is configured with.
:mod:`~mmfeed.loaders.planned.device_transforms` holds the batched transforms the loop runs on whole batches after
the copy to the device (``DataLoader(..., device_transform=...)``), seeded per sample as the workers' are.
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

_EXPORTS = {
    "EpisodeItems": "mmfeed.loaders.planned.items",
    "ErrorPolicy": "mmfeed.loaders.planned.errors",
    "Normalize": "mmfeed.loaders.planned.transforms",
    "Packing": "mmfeed.loaders.planned.config",
    "PlanSampler": "mmfeed.loaders.planned.dataset",
    "PlannedDataset": "mmfeed.loaders.planned.dataset",
    "RecordItems": "mmfeed.loaders.planned.records",
    "EpisodeReads": "mmfeed.loaders.planned.reads",
    "Items": "mmfeed.loaders.planned.reads",
    "RecordReads": "mmfeed.loaders.planned.reads",
    "Records": "mmfeed.loaders.planned.records",
    "SampleRead": "mmfeed.loaders.planned.reads",
    "collate": "mmfeed.loaders.planned.collate",
    "collate_batch": "mmfeed.loaders.planned.collate",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
