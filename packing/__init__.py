"""mmfeed.packing: pure numeric planning: bin packing, lower bounds, online packing, rank balance, bucketing,
the epoch plan (per sample; arithmetic for samples of one price over a per-position shuffle; by price class, packed
from counts, for samples whose prices come in runs such as an episode's windows).

>>> from mmfeed.packing import lower_bound, pack
>>> plan = pack([5, 3, 7, 1], capacity=8)
>>> plan.num_bins, lower_bound([5, 3, 7, 1], 8), plan.efficiency
(2, 2, 1.0)

Everything here is a function of integer arrays, ints and an explicit ``seed``/``epoch``; nothing imports torch
except the attention-metadata module, which is imported lazily on first use.
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

from mmfeed.packing.balance import REMAINDER_POLICIES, RankPlan, balance, row_costs, step_balance
from mmfeed.packing.bins import ALGORITHMS, PackPlan, pack
from mmfeed.packing.bounds import lower_bound
from mmfeed.packing.bucketing import OVERSIZE_POLICIES, bucket_batches, bucket_boundaries
from mmfeed.packing.classes import ClassPlan, PriceClasses, class_remainder, pack_classes
from mmfeed.packing.filters import kept_segments
from mmfeed.packing.mixture import SizeWeights
from mmfeed.packing.online import OnlinePacker, pack_stream
from mmfeed.packing.plan import MODES, Plan, PlanConfig, consumed_samples, plan_epoch, plan_remainder, worker_steps
from mmfeed.packing.shuffle import index_shuffle
from mmfeed.packing.uniform import UniformPlan, uniform_remainder

# public name -> module, imported on first attribute access: PackedBatch lives in packing/batch.py, the only
# packing module that imports torch, so `import mmfeed.packing` stays torch-free.
_LAZY: dict[str, str] = {"PackedBatch": "mmfeed.packing.batch"}

__all__ = sorted(
    [
        "ALGORITHMS",
        "ClassPlan",
        "MODES",
        "OVERSIZE_POLICIES",
        "OnlinePacker",
        "PackPlan",
        "Plan",
        "PlanConfig",
        "PriceClasses",
        "REMAINDER_POLICIES",
        "RankPlan",
        "SizeWeights",
        "UniformPlan",
        "balance",
        "bucket_batches",
        "bucket_boundaries",
        "class_remainder",
        "consumed_samples",
        "index_shuffle",
        "kept_segments",
        "lower_bound",
        "pack",
        "pack_classes",
        "pack_stream",
        "plan_epoch",
        "plan_remainder",
        "row_costs",
        "step_balance",
        "uniform_remainder",
        "worker_steps",
        *_LAZY,
    ]
)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
