"""One resume contract for every stateful stage: stop anywhere, save ``state_dict()``, build a fresh stage, load it,
and the rest equals what the uninterrupted run would have given.

Each case below builds a stage, says how to run it and how to compare its outputs; the one test checks the
contract for every case at several cut points. A stage nests its children's state under constant keys (the loader
under "order" and "dataset", a stream under "packer"), so the states here are the whole of what resumes.
"""

import copy
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
from mmfeed.loaders.planned.dataset import PlanSampler
from mmfeed.loaders.planned.filters import FrameFilter
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.loaders.sources.concat import ConcatSource
from mmfeed.loaders.streaming.dataset import StreamConfig, StreamingPackedDataset
from mmfeed.packing import OnlinePacker, SizeWeights
from mmfeed.testing import make_episodes, write_webdataset

from replay import resumed_elsewhere

SPEC = WindowSpec.from_delta_timestamps({"observation.state": [0.0], "action": [0.0, 1 / 30, 2 / 30]})
PACKING = Packing(layout=TokenLayout(), window=SPEC, plan=PlanConfig(capacity=48, rows_per_batch=2), seed=5)


def source(n=5, seed=0, name="arrays", dim=14):
    eps = make_episodes(n, seed=seed, min_length=6, max_length=14, cameras=(), state_dim=dim, action_dim=dim)
    return ArraySource([{**e.arrays(), "task": e.task, "fps": e.fps} for e in eps], name=name)


def robots():
    """Three robots of different widths (7, 14, 2) as one mixture padded to 16."""
    return ConcatSource([source(4, 1, "arm", 7), source(3, 2, "bimanual"), source(5, 3, "base", 2)],
                        pad_to={"observation.state": 16, "action": 16, "observation.velocity": 16})


# a tempered, filtered mixture: weights size^0.5, one arm episode cut to a range, idle steps of the base dropped
ROBOTS = Packing(layout=TokenLayout(), window=SPEC, plan=PlanConfig(capacity=48, rows_per_batch=2), seed=5,
                 weights=SizeWeights(0.5), frame_filter=FrameFilter.of(
                     keep=[{"dataset": "arm", "episode": 1, "start": 2, "end": 6}],
                     drop=[{"dataset": 2, "episode": 0, "start": 0, "end": 4}, ["base", 3, 1, 3]]))


def batch_key(batch) -> tuple:
    """What identifies a packed batch: its samples, ids and payloads."""
    return (tuple(batch.metadata["sample"].tolist()), tuple(batch.document_ids.flatten().tolist()),
            tuple((k, tuple(v.flatten().tolist())) for k, v in sorted(batch.data.items())))


@dataclass
class Stage:
    """A stateful stage: ``build()`` a fresh one, ``run(stage)`` its outputs from where it stands, ``key`` what
    compares them."""

    build: Callable[[], Any]
    run: Callable[[Any], Any]
    key: Callable[[Any], Any] = lambda x: x


def loader_stage(make_dataset, **kwargs) -> Stage:
    return Stage(lambda: DataLoader(make_dataset(), **kwargs), lambda loader: iter(loader),
                 lambda b: batch_key(b) if hasattr(b, "metadata") else tuple(torch.as_tensor(b).flatten().tolist()))


class Pushes:
    """An online packer fed a fixed sequence of item lengths, as a stage: its outputs are the rows it emits, its
    state the packer's (under "packer") and the rows emitted but not yet handed out (one push may complete
    several)."""

    lengths = np.random.default_rng(3).integers(1, 30, size=60)

    def __init__(self) -> None:
        self.packer, self.pending = OnlinePacker(64, window=8), []

    def __iter__(self):
        while True:
            while self.pending:
                yield tuple(self.pending.pop(0))
            if self.packer.pushed < len(self.lengths):
                self.pending = self.packer.push(None, int(self.lengths[self.packer.pushed]))
            elif self.packer.pending:
                self.pending = self.packer.flush()
            else:
                return

    def state_dict(self):
        return {"packer": self.packer.state_dict(), "pending": [list(r) for r in self.pending]}

    def load_state_dict(self, state):
        self.packer.load_state_dict(state["packer"])
        self.pending = [list(r) for r in state["pending"]]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance")
    write_webdataset(out, make_episodes(4, seed=2, min_length=6, max_length=12, cameras=("cam",), height=16,
                                        width=32), episodes_per_shard=2)
    return out


def stages(shards) -> dict[str, Stage]:
    def stream():
        return StreamingPackedDataset(shards, packing=PACKING, config=StreamConfig(window_items=6))

    def sampler():
        return PlanSampler(PACKING.dataset(source()))

    return {
        "torch-shuffle": Stage(lambda: DataLoader(torch.arange(40), batch_size=3, shuffle=True,
                                                  generator=torch.Generator().manual_seed(4)),
                               lambda loader: iter(loader), lambda b: tuple(b.tolist())),
        "torch-sequential": loader_stage(lambda: torch.arange(40), batch_size=4),
        "planned": loader_stage(lambda: PACKING.dataset(source())),
        "planned-workers": loader_stage(lambda: PACKING.dataset(source()), num_workers=2),
        "mixture": loader_stage(lambda: Packing(layout=TokenLayout(), window=SPEC, plan=PlanConfig(capacity=48),
                                                weights=[2.0, 1.0]).dataset(
            ConcatSource([source(3, 1, "a"), source(4, 2, "b")]))),
        "robots-weighted-filtered": loader_stage(lambda: ROBOTS.dataset(robots()), num_workers=2),
        "records": loader_stage(lambda: __import__("mmfeed").loaders.PlannedDataset.records(
            [torch.arange(n) for n in range(1, 30)], list(range(1, 30)), plan=PlanConfig(capacity=40), seed=1)),
        "stream-in-loader": loader_stage(stream, batch_size=None),
        "stream": Stage(stream, lambda ds: iter(ds), batch_key),
        "plan-sampler": Stage(sampler, lambda s: iter(s)),
        "online-packer": Stage(Pushes, lambda p: iter(p)),
    }


CASES = ["torch-shuffle", "torch-sequential", "planned", "planned-workers", "mixture", "robots-weighted-filtered",
         "records",
         "stream-in-loader", "stream", "plan-sampler", "online-packer"]


@pytest.mark.parametrize("name", CASES)
def test_every_stateful_stage_resumes_exactly(shards, name):
    stage = stages(shards)[name]
    full = [stage.key(x) for x in stage.run(stage.build())]
    assert len(full) >= 3, f"{name}: too short to test a cut"
    for cut in sorted({1, len(full) // 2, len(full) - 1}):
        first = stage.build()
        it = stage.run(first)
        head = [stage.key(next(it)) for _ in range(cut)]
        state = first.state_dict()
        state = pickle.loads(pickle.dumps(copy.deepcopy(state)))  # self-contained and serializable
        fresh = stage.build()
        fresh.load_state_dict(state)
        rest = [stage.key(x) for x in stage.run(fresh)]
        assert head + rest == full, f"{name}: resuming after {cut} of {len(full)} outputs differs"


@pytest.mark.parametrize("new_world", [1, 3])
def test_a_weighted_filtered_mixture_resumes_at_another_world_size(new_world):
    """Two ranks run two steps of the robots' mixture; the state resumes at world size 1 or 3: every sample the
    epoch drew comes out once (the rest plan's listed drops aside), none of the filtered steps ever anchors one."""
    mix = robots()
    before = [DataLoader(ROBOTS.dataset(mix, rank=r, world_size=2)) for r in range(2)]
    batches = resumed_elsewhere(before, lambda rank: DataLoader(ROBOTS.dataset(mix, rank=rank, world_size=new_world)),
                                new_world)
    drawn = before[0].dataset.epoch_samples(0)
    dropped = ROBOTS.dataset(mix, world_size=new_world).plan(0, ((2, 2),)).dropped
    used = np.concatenate([b.metadata["sample"].numpy() for b in batches] + [drawn[dropped]])
    assert sorted(used.tolist()) == sorted(drawn.tolist())
    steps = {(int(e), int(t)) for b in batches for e, t in zip(b.metadata["episode"], b.metadata["start_step"])}
    filtered = {(1, t) for t in range(14) if t not in range(2, 6)} | {(7, t) for t in range(4)} | {(10, 1), (10, 2)}
    assert not steps & filtered, "a filtered step anchored a window"
    assert {t for e, t in steps if e == 1} and {t for e, t in steps if e == 7}, "the filtered episodes still run"
    assert {int(d) for b in batches for d in b.metadata["dataset"]} == {0, 1, 2}
