"""The planned, packed dataset: one item per step of one rank's epoch plan.

``PackedEpisodeDataset`` is a map-style torch Dataset whose item ``(epoch, step)`` is the PackedBatch of that
step for this rank. The plan is recomputed from the index in each process that needs it (a pure function of
``(seed, epoch)``, milliseconds per epoch), so torch's worker processes, persistent or not, need no shared state,
and :class:`PlanSampler` resumes mid-epoch by starting at a step instead of replaying data.

Elastic resume: a loader state saved at one world size continues at another. The samples the job consumed are a
pure function of ``(seed, epoch, world size, steps done)``, so they are recomputed from the old plan, and the rest
of the epoch is every other sample planned afresh for the new world size
(:func:`~mmfeed.packing.plan.plan_remainder`); such a step is the item ``(epoch, step, done)``, ``done`` the
earlier ``(world_size, steps)`` segments. :meth:`PackedEpisodeDataset.reshard_state` rewrites a saved
``mmfeed.DataLoader`` state for this dataset's world size (one state, e.g. rank 0's, serves every new rank).

    >>> from mmfeed.loaders import ArraySource, TokenLayout, WindowSpec
    >>> src = ArraySource([{"proprio": np.zeros((n, 2), np.float32), "action": np.zeros((n, 2), np.float32),
    ...                      "task": "pick"} for n in (5, 7, 9)])
    >>> ds = PackedEpisodeDataset(src, layout=TokenLayout(), capacity=32,
    ...                           window=WindowSpec(offsets={"proprio": (0,), "action": (0, 1, 2)}))
    >>> batch = ds[0, 0]
    >>> batch.capacity, sorted(batch.data)[:2]
    (32, ['action', 'action_is_pad'])
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from mmfeed.codecs.text import ByteTokenizer
from mmfeed.loaders.collate import collate_rows
from mmfeed.loaders.errors import ErrorCounter, ErrorPolicy
from mmfeed.loaders.layout import TokenLayout
from mmfeed.packing.plan import Plan, PlanConfig, plan_remainder
from mmfeed.loaders.samples import SampleTable, SamplingConfig, build_samples, chunk_step_tokens
from mmfeed.loaders.sources import Source
from mmfeed.loaders.windows import WindowSpec
from mmfeed.packing import PackedBatch

__all__ = ["LONG_EPISODES", "PackedEpisodeDataset", "PlanSampler"]

LONG_EPISODES = ("split", "truncate")


class PackedEpisodeDataset(torch.utils.data.Dataset):
    """Packed batches of one rank, planned from the source's index.

    source: an episode source (see :func:`mmfeed.loaders.open_dataset`).
    layout: token prices and layout of the modalities.
    window: per-key offsets of windowed samples; None for whole-episode chunks of at most ``max_length`` steps.
    capacity, rows_per_batch, mode, ...: the plan (see :class:`~mmfeed.packing.plan.PlanConfig`); or pass ``plan``.
    tokenizer: ``encode(str) -> int32 ids`` for the task text (default: UTF-8 bytes).
    seed, rank, world_size: the plan is a pure function of these and the epoch.
    static_shapes: pad payloads so every batch has the same tensor shapes.
    errors: what a sample that cannot be loaded does (:class:`~mmfeed.loaders.errors.ErrorPolicy`; default raise).
    long_episodes: whole-episode chunks that do not fit a row: "split" them into consecutive chunks that do
        (default), or "truncate" each episode after its first fitting chunk; counted in ``stats`` either way.
    """

    def __init__(
        self,
        source: Source,
        *,
        layout: TokenLayout,
        window: WindowSpec | None = None,
        stride: int = 1,
        max_length: int | None = None,
        capacity: int = 8192,
        rows_per_batch: int = 1,
        plan: PlanConfig | None = None,
        tokenizer=None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        static_shapes: bool = False,
        errors: ErrorPolicy | None = None,
        long_episodes: str = "split",
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in range for world_size {world_size}")
        self.source = source
        self.config = plan or PlanConfig(capacity=capacity, rows_per_batch=rows_per_batch)
        if long_episodes not in LONG_EPISODES:
            raise ValueError(f"long_episodes must be one of {list(LONG_EPISODES)}, got {long_episodes!r}")
        self.stats: dict[str, int] = {"split_episodes": 0, "truncated_steps": 0}
        tokenizer = tokenizer or ByteTokenizer()
        self.sampling = SamplingConfig(window=window, stride=stride, max_length=max_length)
        self.table: SampleTable = build_samples(source, self.sampling, layout, tokenizer)
        if window is None:
            self._fit_chunks(source, layout, tokenizer, long_episodes)
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.static_shapes = static_shapes
        self.errors = errors or ErrorPolicy()
        self._counter = ErrorCounter(self.errors)  # consecutive failures in this process
        self._plan: tuple[int, Plan] | None = None
        self._num_steps: dict[int, int] = {}

    def _fit_chunks(self, source: Source, layout: TokenLayout, tokenizer, policy: str) -> None:
        """Whole-episode chunks longer than a row are split to fit it ("split") or cut after the first chunk
        ("truncate"), and counted in ``stats``."""
        per_step = chunk_step_tokens(layout, self.table.cameras)
        text = max((len(t) for t in self.table.text), default=0) * layout.tokens_per_text_token
        fit = (self.config.capacity - text) // per_step
        if fit < 1:
            raise ValueError(f"capacity {self.config.capacity} cannot hold one step of a chunk ({per_step} tokens) "
                             f"after {text} text tokens; raise the capacity or shrink the layout")
        lengths = np.asarray(source.lengths, dtype=np.int64)
        longest = min(self.sampling.max_length or int(lengths.max(initial=1)), fit)
        self.stats["split_episodes"] = int(np.sum(lengths > longest))
        if longest < (self.sampling.max_length or int(lengths.max(initial=1))):
            self.sampling = SamplingConfig(window=None, stride=self.sampling.stride, max_length=longest)
            self.table = build_samples(source, self.sampling, layout, tokenizer)
        if policy == "truncate":
            first = self.table.start == 0
            self.stats["truncated_steps"] = int(self.table.length[~first].sum())
            self.stats["split_episodes"] = 0
            t = self.table
            self.table = SampleTable(t.episode[first], t.start[first], t.length[first], t.tokens[first], t.text,
                                     t.sampling, t.layout, t.cameras)

    def plan(self, epoch: int, done: tuple[tuple[int, int], ...] = ()) -> Plan:
        """The whole epoch's plan (all ranks), cached for the last epoch asked; with ``done`` (earlier segments
        ``(world_size, steps)`` of an elastic resume) the plan of the rest of that epoch."""
        key = (int(epoch), tuple((int(w), int(k)) for w, k in done))
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, plan_remainder(self.table.tokens, self.config, seed=self.seed, epoch=key[0],
                                              world_size=self.world_size, done=key[1], groups=self.table.episode))
        return self._plan[1]

    def num_steps(self, epoch: int = 0, done: tuple[tuple[int, int], ...] = ()) -> int:
        """Steps of this epoch (the same on every rank); with ``done``, of the rest of it."""
        key = (int(epoch), tuple((int(w), int(k)) for w, k in done))
        if key not in self._num_steps:
            self._num_steps[key] = self.plan(*key).num_steps
        return self._num_steps[key]

    def __len__(self) -> int:
        return self.num_steps(0)

    def __getitem__(self, key: tuple[int, int] | tuple[int, int, tuple] | int) -> PackedBatch:
        if isinstance(key, tuple):
            epoch, step, done = key if len(key) == 3 else (*key, ())
        else:
            epoch, step, done = 0, key, ()
        plan = self.plan(int(epoch), done)
        if not 0 <= step < plan.num_steps:
            raise IndexError(f"step {step} out of range: epoch {epoch} has {plan.num_steps} steps"
                             + (f" after the segments {list(done)}" if done else ""))
        rows = plan.batch_rows(self.rank, int(step))
        num_rows = plan.steps.shape[2] if self.static_shapes else None
        return collate_rows(self.table, self.source, rows, plan.capacity, num_rows=num_rows,
                            static_shapes=self.static_shapes, errors=self._counter)

    def reshard_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """A ``mmfeed.DataLoader`` state saved at any world size, rewritten to resume on this dataset's.

        At the same world size the state comes back unchanged. Otherwise the steps the saved loader ran in its
        epoch become a done segment ``(old world size, steps)``: the resumed loader runs the plan of the samples
        not yet consumed, for this world size, from its first step. No sample of the epoch is lost or repeated.
        The state is the same on every rank, so any rank's saved state resumes every new rank::

            loader.load_state_dict(loader.dataset.reshard_state(torch.load("loader.pt")))

        Raises ValueError when the state was saved with another plan seed.
        """
        order = state.get("order") if isinstance(state, dict) else None
        if not isinstance(order, dict) or order.get("kind") != "stateful" or not isinstance(order.get("state"), dict):
            return copy.deepcopy(state)
        saved = order["state"]
        if int(saved.get("seed", 0)) != self.seed:
            raise ValueError(f"the state was saved with plan seed {saved.get('seed', 0)}, this dataset has seed "
                             f"{self.seed}; build it with seed={saved.get('seed', 0)}")
        old_world = int(saved.get("world_size", 1))
        if old_world == self.world_size:
            return copy.deepcopy(state)
        out = copy.deepcopy(state)
        sampler = out["order"]["state"]
        if not out.get("done"):  # mid-epoch: what this epoch ran so far becomes a segment of it
            sampler["done"] = [*map(list, sampler.get("done", [])), [old_world, int(out["batches"])]]
            out["batches"] = 0
        sampler.pop("world_size", None)
        if self.world_size != 1:
            sampler["world_size"] = self.world_size
        out["dataset_len"] = len(self)
        return out

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_plan"] = None  # workers recompute it: cheaper to send the index than the plan
        return state


class PlanSampler(torch.utils.data.Sampler):
    """Yields ``(epoch, step)`` for every step of one epoch of a planned dataset, from ``start`` on.

    Each pass runs the next epoch (the first pass runs ``epoch``), so successive ``iter(loader)`` calls walk
    through epochs 0, 1, 2, ... with fresh plans. ``state_dict()`` is what ``mmfeed.DataLoader`` saves at the
    start of each epoch (the loader counts the batches handed out and skips them as indices on resume):
    ``{"epoch"}`` plus, for a :class:`PackedEpisodeDataset`, ``"world_size"`` and ``"seed"`` of the plan and
    ``"done"``, the earlier ``[world_size, steps]`` segments of an elastically resumed epoch (each left out at its
    default: world size 1, seed 0, no segments). In such an epoch the items are ``(epoch, step, done)``.
    """

    def __init__(self, dataset, *, epoch: int = 0, start: int = 0) -> None:
        self.dataset, self.epoch, self.start = dataset, int(epoch), int(start)
        self.done: tuple[tuple[int, int], ...] = ()

    def set_epoch(self, epoch: int, start: int = 0, done: tuple[tuple[int, int], ...] = ()) -> None:
        self.epoch, self.start = int(epoch), int(start)
        self.done = tuple((int(w), int(k)) for w, k in done)

    def _elastic(self) -> bool:
        return callable(getattr(self.dataset, "reshard_state", None))

    def state_dict(self) -> dict:
        state: dict[str, Any] = {"epoch": self.epoch}
        if self._elastic():
            if self.dataset.world_size != 1:
                state["world_size"] = self.dataset.world_size
            if self.dataset.seed != 0:
                state["seed"] = self.dataset.seed
            if self.done:
                state["done"] = [list(d) for d in self.done]
        return state

    def load_state_dict(self, state: dict) -> None:
        if self._elastic():
            world, seed = int(state.get("world_size", 1)), int(state.get("seed", 0))
            if world != self.dataset.world_size or seed != self.dataset.seed:
                raise ValueError(f"the sampler state was saved at world size {world} with seed {seed}, this dataset "
                                 f"runs at world size {self.dataset.world_size} with seed {self.dataset.seed}; pass "
                                 "the loader state through dataset.reshard_state(state) before load_state_dict")
        elif "done" in state:
            raise ValueError(f"{type(self.dataset).__name__} cannot resume an elastic state (segments "
                             f"{state['done']}); only PackedEpisodeDataset replans the rest of an epoch")
        self.set_epoch(int(state["epoch"]), done=state.get("done", ()))

    def _steps(self) -> int:
        if self.done:
            return self.dataset.num_steps(self.epoch, self.done)
        return self.dataset.num_steps(self.epoch)

    def __len__(self) -> int:
        return max(self._steps() - self.start, 0)

    def __iter__(self):
        epoch, start, done, total = self.epoch, self.start, self.done, self._steps()
        self.epoch, self.start, self.done = epoch + 1, 0, ()
        for step in range(start, total):
            yield (epoch, step, done) if done else (epoch, step)
