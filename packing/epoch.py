"""The plan of an epoch: which planner runs, and the plan it builds, from the sample table alone.

:func:`plan_for` is a pure function of the sample table (:mod:`mmfeed.packing.samples`), the plan's settings,
``(seed, epoch)``, the world size and the segments an elastic resume already ran (``done``). It chooses one of
three planners by this rule, in this order:

1. **uniform** (:class:`~mmfeed.packing.uniform.UniformPlan`): every sample costs the same and fits a row, and
   the epoch is planned in pack mode over the whole epoch, each sample once (no episode blocks, no weighted
   draw). The plan is arithmetic over a seeded per-position shuffle: nothing is stored per sample.
2. **classes** (:class:`~mmfeed.packing.classes.ClassPlan`): samples come in runs of one price (windows: an
   episode's windows cost one price, save where its task text changes length), in pack mode over the whole
   epoch, each sample once, with a decreasing algorithm ("bfd", "ffd"). Packed from the count of each price:
   nothing per sample either.
3. **samples** (:func:`~mmfeed.packing.plan.plan_remainder`): everything else (whole-episode chunks, weighted
   mixtures, episode blocks, bucket and fixed modes, the "nf" algorithm), planned sample by sample: about 16
   bytes a sample.

The choice and why are returned with the plan (:class:`EpochPlan`), so a loader can say which planner ran.
:data:`PLAN_VERSION` counts changes of any planner's order: a saved cursor of another version is refused.

    >>> from mmfeed.packing.plan import PlanConfig
    >>> from mmfeed.packing.samples import SampleTable
    >>> planned = plan_for(SampleTable.of_prices([5, 3, 7, 2]), PlanConfig(capacity=8), seed=0, epoch=0)
    >>> planned.planner, planned.plan.num_steps
    ('samples', 3)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Union

import numpy as np

from mmfeed.packing.bins import _DECREASING
from mmfeed.packing.classes import ClassPlan, class_remainder
from mmfeed.packing.plan import Plan, PlanConfig, plan_remainder
from mmfeed.packing.samples import SampleTable
from mmfeed.packing.uniform import UniformPlan, uniform_remainder

__all__ = ["EAGER_WARN", "PLANNERS", "PLAN_VERSION", "EpochPlan", "plan_for"]

logger = logging.getLogger(__name__)

PLAN_VERSION = 5
"""Counts changes of the plan's order; a saved state of another version is refused (its cursor would point into
another order)."""

PLANNERS = ("uniform", "classes", "samples")

EAGER_WARN = 20_000_000
"""Samples planned one by one past which the plan's memory is worth a warning."""

AnyPlan = Union[Plan, UniformPlan, ClassPlan]


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """The plan of one epoch (all ranks), which planner made it and why.

    plan: the plan; its sample ids are positions in ``drawn`` when the epoch's samples are drawn by weight, else
        the table's sample ids.
    drawn: the sample ids of a weighted mixture's epoch (None: every sample once).
    planner: "uniform", "classes" or "samples" (see the module docstring); reason: why, in words.
    """

    plan: AnyPlan
    drawn: np.ndarray | None
    planner: str
    reason: str

    def samples(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        """The table's sample ids of plan rows (positions mapped through ``drawn``)."""
        return rows if self.drawn is None else [self.drawn[r] for r in rows]


def choose_planner(table: SampleTable, config: PlanConfig, drawn: np.ndarray | None) -> tuple[str, str]:
    """``(planner, reason)`` by the rule of the module docstring."""
    whole = []
    if drawn is not None:
        whole.append("the samples are drawn by weight")
    if config.mode != "pack":
        whole.append(f"mode {config.mode!r}")
    if config.episode_block:
        whole.append(f"episode blocks of {config.episode_block}")
    if config.reuse > 1:
        whole.append(f"spans of {config.reuse} samples of one episode")
    if whole:
        return "samples", f"planned sample by sample: {', '.join(whole)}"
    price = table.uniform_price
    if price is not None and price <= config.capacity:
        return "uniform", f"every sample costs {price} tokens"
    if table.price_runs is None:
        return "samples", f"planned sample by sample: {table.kind} have no runs of one price"
    if not _DECREASING[config.algorithm]:
        return "samples", f"planned sample by sample: algorithm {config.algorithm!r} is not decreasing"
    return "classes", f"{len(table.classes.prices)} prices in runs of windows, packed by class"


def plan_for(table: SampleTable, config: PlanConfig, *, seed: int, epoch: int, world_size: int = 1,
             done: tuple[tuple[int, int], ...] = ()) -> EpochPlan:
    """The plan of ``epoch`` (of what is left of it after the segments ``done``, each ``(world size, steps)``)
    for ``world_size`` ranks, by the planner the rule chooses."""
    drawn = table.draw(seed, epoch)
    planner, reason = choose_planner(table, config, drawn)
    if planner == "uniform":
        plan = uniform_remainder(len(table), table.uniform_price, config, seed=seed, epoch=epoch,
                                 world_size=world_size, done=done)
    elif planner == "classes":
        plan = class_remainder(table.classes, config, seed=seed, epoch=epoch, world_size=world_size, done=done)
    else:
        if len(table) > EAGER_WARN:
            logger.warning("planning %d samples one by one, about 40 bytes each: per-frame windows plan without "
                           "anything per sample in pack mode over the whole epoch (no episode blocks, no weighted "
                           "draw) with a decreasing algorithm", len(table))
        tokens = table.tokens
        groups = table.groups if config.episode_block or config.reuse > 1 else None
        if drawn is not None and config.reuse > 1:
            raise ValueError(f"PlanConfig.reuse={config.reuse} takes spans of consecutive samples of an episode, "
                             "which samples drawn by weight (a weighted mixture) do not have: use reuse=1 there")
        if groups is None and config.reuse > 1:
            raise ValueError(f"PlanConfig.reuse={config.reuse} needs each sample's episode, which {table.kind} "
                             "do not have")
        if drawn is not None:
            tokens = tokens[drawn]
            groups = None if groups is None else groups[drawn]
        plan = plan_remainder(tokens, config, seed=seed, epoch=epoch, world_size=world_size, done=done,
                              groups=groups)
    return EpochPlan(plan, drawn, planner, reason)
