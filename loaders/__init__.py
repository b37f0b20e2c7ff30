"""mmfeed.loaders"""

from mmfeed.loaders.dataloader import DataLoader
from mmfeed.loaders.dataset import PackedEpisodeDataset, PlanSampler
from mmfeed.loaders.dist import DistInfo, dist_info
from mmfeed.loaders.errors import ErrorPolicy, SampleError
from mmfeed.loaders.generic import PackedMapDataset
from mmfeed.loaders.index import (
    INDEX_FILENAME,
    build_index,
    read_shard_index,
    read_member,
    resolve_shard,
    stale_shards,
    write_index,
)
from mmfeed.loaders.layout import TokenLayout
from mmfeed.loaders.lerobot import LeRobotSource
from mmfeed.loaders.mixture import MixtureDataset
from mmfeed.loaders.packing_config import Packing
from mmfeed.packing.plan import Plan, PlanConfig, consumed_samples, plan_epoch, plan_remainder
from mmfeed.loaders.remote import RangeCache, read_range
from mmfeed.loaders.prefetch import DevicePrefetcher
from mmfeed.loaders.sources import ArraySource, EpisodeRequest, Source, open_dataset
from mmfeed.loaders.samples import SamplingConfig
from mmfeed.loaders.streaming import StreamConfig, StreamingPackedDataset
from mmfeed.loaders.timing import StepTimer, TimedBatch, TimedCollate, record_stage, stage
from mmfeed.loaders.webdataset import WebDatasetSource
from mmfeed.loaders.windows import WindowSpec

__all__ = sorted(
    [
        "ArraySource",
        "DataLoader",
        "DevicePrefetcher",
        "DistInfo",
        "EpisodeRequest",
        "ErrorPolicy",
        "INDEX_FILENAME",
        "LeRobotSource",
        "MixtureDataset",
        "PackedEpisodeDataset",
        "PackedMapDataset",
        "Packing",
        "Plan",
        "PlanConfig",
        "PlanSampler",
        "RangeCache",
        "SampleError",
        "SamplingConfig",
        "Source",
        "StepTimer",
        "StreamConfig",
        "StreamingPackedDataset",
        "TimedBatch",
        "TimedCollate",
        "TokenLayout",
        "WebDatasetSource",
        "WindowSpec",
        "build_index",
        "consumed_samples",
        "dist_info",
        "open_dataset",
        "plan_epoch",
        "plan_remainder",
        "read_member",
        "read_range",
        "read_shard_index",
        "record_stage",
        "resolve_shard",
        "stage",
        "stale_shards",
        "write_index",
    ]
)
