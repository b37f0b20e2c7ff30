"""Distributed loading: real torchrun jobs (gloo) over v2 shards, elastic resume across world sizes (a mixture
included) and the worker split (shards read over HTTP: tests/test_remote.py).

Layouts are simulated with integers first (ranks as plain arguments to ``Packing.dataset``), then checked with
real processes: tests/dist_job.py runs at 2 ranks, saves a loader state, and a second job resumes it at 3.
"""

import json
import os
import socket
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import procs
from dist_job import packing
from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, PlannedDataset, WindowSpec, open_dataset
from mmfeed.loaders.loop.dist import DistInfo, dist_info
from mmfeed.loaders.planned.dataset import PlanSampler
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.loaders.sources.concat import ConcatSource
from mmfeed.packing.plan import consumed_samples, plan_epoch, plan_remainder, worker_steps
from mmfeed.testing import make_episodes, write_webdataset

JOB = Path(__file__).with_name("dist_job.py")
EPISODES = dict(cameras=("cam_high",), camera_fps={"cam_high": 15.0}, height=32, width=32)
MIX_WEIGHTS = [1.0, 2.0]
SAVED_STEPS = 3  # steps run at world size 2 before the state is saved


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Even shards (2 x 2 episodes of 10-16 steps), uneven ones (4 + 1 episodes of 6-40 steps) and two datasets
    "a" (3 episodes) and "b" (4 episodes) for a mixture; a 15 fps camera beside the 30 Hz clock."""
    out = tmp_path_factory.mktemp("dist")
    for name, n, seed, shortest, longest, per_shard in (("even", 4, 3, 10, 16, 2), ("uneven", 5, 4, 6, 40, 4),
                                                         ("a", 3, 5, 8, 20, 2), ("b", 4, 6, 8, 20, 2)):
        episodes = make_episodes(n, seed=seed, min_length=shortest, max_length=longest, **EPISODES)
        write_webdataset(out / name, episodes, episodes_per_shard=per_shard)
    return out


def run_config(shards, name: str, num_workers: int = 1, **extra) -> dict:
    """A run of the job over ``name`` (a mixture is the datasets a and b by MIX_WEIGHTS)."""
    mixed = name == "mixture"
    return {"data": [str(shards / "a"), str(shards / "b")] if mixed else str(shards / name),
            "weights": MIX_WEIGHTS if mixed else None, "num_workers": num_workers, **extra}


# -- the real jobs --------------------------------------------------------------------------------------------
def torchrun(nproc: int, config: dict, where: Path) -> dict:
    (where / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(JOB), str(where / "config.json"),
           str(where / "result.json")]
    done = procs.run(cmd, env=env, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((where / "result.json").read_text())


@pytest.fixture(scope="module")
def job(shards, tmp_path_factory):
    """The 2-rank job (whole epochs, saved states, the worker probe), then the 3-rank job resuming the states."""
    where = tmp_path_factory.mktemp("job")
    states = {name: str(where / f"{name}.pt") for name in ("uneven", "mixture")}
    first = torchrun(2, {
        "epochs": {"even": run_config(shards, "even", 2, mark=True), "uneven": run_config(shards, "uneven"),
                   "mixture": run_config(shards, "mixture")},
        "save": {name: run_config(shards, name, steps=SAVED_STEPS, state=state) for name, state in states.items()},
        "probe": True}, where)
    later = where / "resume"
    later.mkdir()
    second = torchrun(3, {"resume": {name: run_config(shards, name, state=state)
                                     for name, state in states.items()}}, later)
    return {"world2": first, "world3": second}


def planned(shards, name: str, world: int) -> list[PlannedDataset]:
    """This process's own plan of ``name`` for every rank of ``world`` (what the job's ranks must have run)."""
    run = run_config(shards, name)
    source = open_dataset(run["data"])
    return [packing(run["weights"]).dataset(source, rank=r, world_size=world) for r in range(world)]


def plan_steps(ds: PlannedDataset, done: tuple = (), epoch: int = 0) -> list[list[int]]:
    """The sample ids of each of this rank's batches in its plan of ``epoch`` (the rest plan after ``done``)."""
    return [np.concatenate(ds.batch_samples(epoch, s, done)).tolist() for s in range(ds.num_steps(epoch, done))]


def drawn_samples(ds: PlannedDataset) -> np.ndarray:
    """The sample ids of epoch 0, a repeated id as often as it is drawn (each sample once without weights)."""
    drawn = ds.epoch_samples(0)
    return np.arange(len(ds.items), dtype=np.int64) if drawn is None else drawn


@pytest.mark.slow  # torchrun jobs
@pytest.mark.parametrize("name", ["even", "uneven", "mixture"])
def test_torchrun_ranks_cover_the_epoch_exactly_once_in_equal_steps(job, shards, name):
    """Each rank's batches are its plan's, in step order, in as many steps as every other rank (each step ended
    in an all_reduce, so unequal counts would have hung the job); ranks are disjoint; the union is every drawn
    sample but the plan's listed drops, each as often as it was drawn (a mixture draws by weight). The cost
    balance is the plan's (near 1 here); the StepTimer report holds the max and mean of every figure over ranks."""
    result = job["world2"]["epochs"][name]
    datasets = planned(shards, name, 2)
    assert result["world_size"] == 2
    num_steps = datasets[0].num_steps(0)
    assert [len(s) for s in result["steps"]] == [num_steps, num_steps] and num_steps > 0
    for rank, ds in enumerate(datasets):
        assert result["steps"][rank] == plan_steps(ds), "each rank's batches are its plan's, in step order"
    positions = [np.concatenate([np.concatenate(ds.plan(0).batch_rows(r, s)) for s in range(num_steps)])
                 for r, ds in enumerate(datasets)]
    assert not set(positions[0].tolist()) & set(positions[1].tolist()), "ranks are disjoint"
    seen = [s for rank in result["steps"] for step in rank for s in step]
    drawn = drawn_samples(datasets[0])
    dropped = drawn[datasets[0].plan(0).dropped].tolist()
    assert Counter(seen) + Counter(dropped) == Counter(drawn.tolist())
    assert len(dropped) < len(drawn) // 4
    if name == "mixture":  # both datasets in their shares: b (weight 2) draws twice what a does
        of = datasets[0].source.dataset_of[datasets[0].items.table.groups[drawn]]
        assert abs(int((of == 1).sum()) - 2 * int((of == 0).sum())) <= 2
    else:
        assert len(seen) == len(set(seen)), "no sample is seen twice"
    balance, ranks = result["cost_balance"], result["timer_ranks"]
    assert balance["mean"] <= balance["max"] and 0.8 < balance["mean_over_max"] <= 1.0
    assert ranks["world_size"] == 2 and ranks["max"]["steps"] == ranks["mean"]["steps"] == num_steps
    assert all(ranks["max"][k] >= ranks["mean"][k] - 1e-12 for k in ranks["mean"])
    assert {"wait_s.mean", "stall_fraction", "stages.decode.mean_s"} <= set(ranks["max"])


@pytest.mark.slow  # torchrun jobs
def test_torchrun_dist_info_and_round_robin_workers(job):
    """dist_info() gives each process its own rank of 2 (also inside DataLoader workers); a rank's two workers
    load the items round robin, item i on worker i % 2 as worker_steps says, and so do the packed batches: step
    s of rank r was read and transformed by worker s % 2 of rank r."""
    result = job["world2"]
    assert result["dist_info"] == [[0, 2, 0, 2], [1, 2, 1, 2]]
    for rank, items in enumerate(result["workers"]):
        assert [i for i, *_ in items] == list(range(8))
        assert all(r == rank and w == 2 and n == 2 for _, r, w, _, n in items)
        for worker in range(2):
            assert [i for i, *_, wk, _ in items if wk == worker] == worker_steps(8, 2, worker).tolist()
    marks = result["epochs"]["even"]["marks"]
    for rank, per_step in enumerate(marks):
        assert len(per_step) > 2
        for worker in range(2):
            assert [s for s, m in enumerate(per_step) if m == [rank * 10 + worker]] == \
                worker_steps(len(per_step), 2, worker).tolist()


@pytest.mark.slow  # torchrun jobs
@pytest.mark.parametrize("name", ["uneven", "mixture"])
def test_torchrun_elastic_resume_from_2_to_3_ranks_loses_and_repeats_nothing(job, shards, name):
    """A loader state saved after 3 steps at 2 ranks (the same state on both) resumes at 3 ranks: every new rank
    runs the rest plan of its rank in equal steps, and what both jobs saw plus the rest plan's listed drops is
    the epoch's drawn samples exactly (each as often as drawn: a mixture's weights may draw a sample twice)."""
    saved, resumed = job["world2"]["save"][name], job["world3"]["resume"][name]
    assert saved["states_equal"], "every rank saves the same state"
    state = saved["state"]
    assert state["batches"] == SAVED_STEPS and state["order"]["state"]["world_size"] == 2
    old, new = planned(shards, name, 2), planned(shards, name, 3)
    done = ((2, SAVED_STEPS),)
    for rank, ds in enumerate(old):
        assert saved["steps"][rank] == plan_steps(ds)[:SAVED_STEPS]
    assert resumed["world_size"] == 3
    assert len({len(s) for s in resumed["steps"]}) == 1 and len(resumed["steps"][0]) > 0
    for rank, ds in enumerate(new):
        assert resumed["steps"][rank] == plan_steps(ds, done), "each new rank runs its part of the rest plan"
    seen = [s for rank in saved["steps"] for step in rank for s in step]
    rest = [s for rank in resumed["steps"] for step in rank for s in step]
    drawn = drawn_samples(old[0])
    dropped = drawn[new[0].plan(0, done).dropped].tolist()
    assert Counter(seen) + Counter(rest) + Counter(dropped) == Counter(drawn.tolist())
    assert len(dropped) < len(drawn) // 4 and len(rest) > len(seen)


def test_dist_info_from_the_environment(monkeypatch):
    """Without a process group, torchrun's variables decide; bad ones raise a ValueError naming the variable."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert dist_info() == DistInfo()
    for name, value in (("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4")):
        monkeypatch.setenv(name, value)
    info = dist_info()
    assert (info.rank, info.world_size, info.local_rank, info.node, info.worker, info.num_workers) == (5, 8, 1, 1, 0, 1)
    monkeypatch.setenv("RANK", "8")
    with pytest.raises(ValueError, match="RANK=8"):
        dist_info()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x'"):
        dist_info()


# -- layouts and elastic resume, simulated ranks ----------------------------------------------------------------
def array_source(n: int = 24, seed: int = 7, name: str = "arrays") -> ArraySource:
    """Episodes of 3-40 steps whose tasks have 1-7 characters, so that samples have different prices."""
    lengths = np.random.default_rng(seed).integers(3, 40, size=n)
    return ArraySource([{"observation.state": np.full((k, 2), i, np.float32), "action": np.zeros((k, 2), np.float32),
                         "task": "t" * (1 + i % 7)} for i, k in enumerate(lengths)], name=name)


ARRAY_PACKING = Packing(window=WindowSpec.from_delta_timestamps({"observation.state": [0.0],
                                                                 "action": [0.0, 1 / 30, 2 / 30]}),
                        plan=PlanConfig(capacity=48, rows_per_batch=2), seed=3)


def array_loaders(source, world: int, config: Packing = ARRAY_PACKING) -> list[DataLoader]:
    return [DataLoader(config.dataset(source, rank=r, world_size=world)) for r in range(world)]


def ids(batch) -> list[int]:
    return batch.metadata["sample"].tolist()


def segment(loaders, steps: int, state: dict | None = None) -> tuple[list[int], dict]:
    """``steps`` steps on every rank, resumed from ``state`` if given (the loader re-plans a state saved at another
    world size by itself): the samples seen and the state saved after them, the same on every rank."""
    seen, states = [], []
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        seen += [s for _ in range(steps) for s in ids(next(it))]
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states), "the state is the same on every rank"
    return seen, states[0]


def run_rest(loaders, state) -> list[list[list[int]]]:
    """Each rank's batches after resuming from ``state``; every rank must run the same number of steps."""
    out = []
    for loader in loaders:
        loader.load_state_dict(loader.dataset.reshard_state(state))
        out.append([ids(b) for b in loader])
    assert len({len(r) for r in out}) == 1, "every new rank runs the same number of steps"
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_layout_runs_equal_steps_on_disjoint_ranks_and_covers_the_epoch(world):
    """At any world size: the same step count on every rank, disjoint ranks, every sample once but the plan's
    drops; the loaded batches are the plan's, and two worker processes give the same batches in step order."""
    source = array_source()
    loaders = array_loaders(source, world)
    batches = [[ids(b) for b in loader] for loader in loaders]
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == loaders[0].dataset.num_steps(0) > 0
    for loader, rank in zip(loaders, batches):
        assert rank == plan_steps(loader.dataset)
    per_rank = [{s for batch in rank for s in batch} for rank in batches]
    assert sum(len(r) for r in per_rank) == len(set().union(*per_rank)), "ranks are disjoint"
    dropped = loaders[0].dataset.plan(0).dropped.tolist()
    assert sorted([s for r in per_rank for s in r] + dropped) == list(range(len(loaders[0].dataset.items)))
    last = loaders[-1].dataset
    with_workers = DataLoader(ARRAY_PACKING.dataset(source, rank=last.rank, world_size=world), num_workers=2)
    assert [ids(b) for b in with_workers] == batches[-1]
    for start in (0, 1):  # a resumed epoch deals its steps round robin from the first step it runs
        split = [worker_steps(last.num_steps(0), 2, w, start=start).tolist() for w in range(2)]
        assert sorted(split[0] + split[1]) == list(range(start, last.num_steps(0)))
        assert all(s % 2 == (start + w) % 2 for w in range(2) for s in split[w])


@pytest.mark.parametrize("new_world", [1, 4])
@pytest.mark.parametrize("cut", [1, 3])
def test_state_saved_at_world_2_resumes_at_other_world_sizes_exactly(new_world, cut):
    """After k steps at world size 2, the rest at world size 1 or 4 holds every sample not yet seen, once each,
    except the rest plan's listed drops; the sample ids seen before come from the old plan alone."""
    source = array_source()
    old = array_loaders(source, 2)
    seen, state = segment(old, cut)
    assert len(seen) == len(set(seen))
    items, plan = old[0].dataset.items, old[0].dataset.plan(0)
    assert sorted(seen) == sorted(s for rank in range(2) for step in range(cut) for s in plan.batch_samples(rank, step))
    new = array_loaders(source, new_world)
    rest = [s for rank in run_rest(new, state) for batch in rank for s in batch]
    dropped = new[0].dataset.plan(0, ((2, cut),)).dropped.tolist()
    assert len(rest) == len(set(rest)) and not set(rest) & set(seen) and not set(dropped) & set(seen + rest)
    assert sorted(seen + rest + dropped) == list(range(len(items)))
    assert len(dropped) < len(items) // 4


@pytest.mark.parametrize("mixed", [False, True])
def test_elastic_resume_twice_and_then_the_next_epoch_is_fresh(mixed):
    """2 ranks for 2 steps, then 4 ranks for 1 step, then 3 ranks to the end: every sample of the epoch comes out
    as often as it was drawn (once each; a weighted mixture draws some twice) but the rest plan's drops; the
    epoch after that is the plain plan, at 3 ranks or (from the state saved at its end) at 2."""
    source, config = array_source(), ARRAY_PACKING
    if mixed:
        source = ConcatSource([array_source(8, seed=1, name="one"), array_source(6, seed=2, name="two")])
        config = Packing(window=ARRAY_PACKING.window, plan=ARRAY_PACKING.plan, seed=5, weights=MIX_WEIGHTS)
    seen, state = segment(array_loaders(source, 2, config), 2)
    more, state = segment(array_loaders(source, 4, config), 1, state)
    assert state["order"]["state"]["done"] == [[2, 2]] and state["batches"] == 1
    third = array_loaders(source, 3, config)
    rest = [s for rank in run_rest(third, state) for batch in rank for s in batch]
    ds = third[0].dataset
    drawn = drawn_samples(ds)
    assert (len(set(drawn.tolist())) < len(drawn)) == mixed, "only the weights draw a sample twice"
    dropped = drawn[ds.plan(0, ((2, 2), (4, 1))).dropped].tolist()
    assert Counter(seen + more + rest + dropped) == Counter(drawn.tolist())
    finished = third[0].state_dict()
    assert [ids(b) for b in third[0]] == plan_steps(ds, epoch=1)
    for loader in array_loaders(source, 2, config):  # the end of a resumed epoch goes on at any world size
        loader.load_state_dict(finished)
        assert [ids(b) for b in loader] == plan_steps(loader.dataset, epoch=1)


def test_loader_reshards_by_itself_and_refuses_a_foreign_seed():
    """mmfeed.DataLoader.load_state_dict re-plans a state saved at another world size on its own (the same as an
    explicit reshard_state); the sampler alone refuses such a state rather than be silently wrong; a state from
    another plan seed is refused; a state saved after a whole epoch at 2 ranks goes on at 4 ranks with epoch 1's
    plain plan."""
    source = array_source()
    old = array_loaders(source, 2)[0]
    it = iter(old)
    next(it)
    state = old.state_dict()
    automatic, explicit = array_loaders(source, 4)[0], array_loaders(source, 4)[0]
    automatic.load_state_dict(state)
    explicit.load_state_dict(explicit.dataset.reshard_state(state))
    assert [ids(b) for b in automatic] == [ids(b) for b in explicit]
    with pytest.raises(ValueError, match="reshard_state"):
        PlanSampler(automatic.dataset).load_state_dict(state["order"]["state"])
    other = Packing(window=ARRAY_PACKING.window, plan=ARRAY_PACKING.plan, seed=4).dataset(source, world_size=4)
    with pytest.raises(ValueError, match="seed=3"):
        other.reshard_state(state)
    same = array_loaders(source, 2)[1]
    assert same.dataset.reshard_state(state) == state  # same world size: unchanged
    list(it)  # the rest of epoch 0
    for loader in array_loaders(source, 4):
        loader.load_state_dict(old.state_dict())
        assert [ids(b) for b in loader] == plan_steps(loader.dataset, epoch=1)


def test_elastic_resume_through_env_ranks_and_real_shards(shards, monkeypatch):
    """mmfeed.DataLoader(packing=...) over real shards, ranks from RANK/WORLD_SIZE: save at 2 ranks after one
    step, resume at 1 rank (with a worker process): every sample once, but the rest plan's drops."""
    loaders = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        loaders.append(DataLoader(shards / "uneven", packing=packing()))
        assert (loaders[-1].dataset.rank, loaders[-1].dataset.world_size) == (rank, 2)
    seen, state = segment(loaders, 1)
    del loaders
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = DataLoader(shards / "uneven", packing=packing(), num_workers=1)
    resumed.load_state_dict(resumed.dataset.reshard_state(state))
    rest = [s for b in resumed for s in ids(b)]
    dropped = resumed.dataset.plan(0, ((2, 1),)).dropped.tolist()
    assert len(seen + rest) == len(set(seen + rest))
    assert sorted(seen + rest + dropped) == list(range(len(resumed.dataset.items)))


@settings(max_examples=40)
@given(st.lists(st.integers(1, 70), min_size=0, max_size=60), st.integers(0, 3), st.integers(1, 5),
       st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4)), max_size=3),
       st.sampled_from(["pack", "bucket", "fixed"]), st.integers(0, 2))
def test_remainder_partitions_the_epoch(lengths, seed, world, segments, mode, block):
    """For any segments (each cut to its plan's length), in every plan mode, with or without episode blocks:
    consumed, the rest plan's samples and its drops partition all samples, and the rest plan gives every rank
    the same step count; with no segment the rest plan is the epoch plan itself."""
    tokens = np.array(lengths, dtype=np.int64)
    groups = np.arange(len(tokens)) // 3
    config = PlanConfig(capacity=64, rows_per_batch=2, mode=mode, batch_size=3, num_buckets=3,
                        episode_block=block if mode == "pack" else 0)
    done = []
    for seg_world, steps in segments:
        plan = plan_remainder(tokens, config, seed=seed, epoch=0, world_size=seg_world, done=done, groups=groups)
        done.append((seg_world, min(steps, plan.num_steps)))
    seen = consumed_samples(tokens, config, seed=seed, epoch=0, done=done, groups=groups)
    rest = plan_remainder(tokens, config, seed=seed, epoch=0, world_size=world, done=done, groups=groups)
    ran = np.concatenate([rest.batch_samples(r, s) for r in range(world) for s in range(rest.num_steps)] or
                         [np.zeros(0, np.int64)])
    everything = np.concatenate([seen, ran, rest.dropped])
    assert sorted(everything.tolist()) == list(range(len(tokens)))
    assert rest.steps.shape[:2] == (world, rest.num_steps)
    if not done:
        full = plan_epoch(tokens, config, seed=seed, epoch=0, world_size=world, groups=groups)
        assert np.array_equal(full.steps, rest.steps) and np.array_equal(full.row_samples, rest.row_samples)


# -- the scaling simulation ---------------------------------------------------------------------------------
def test_scaling_simulation_accounts_for_every_sample(tmp_path):
    """For each world size: ranks x samples per rank + dropped = all samples, steps shrink as ranks grow, the
    balances are fractions and the planned per-step balance is no worse than dealing the same rows shuffled."""
    from mmfeed.bench.scaling import main, simulate

    rows = simulate(4000, ranks=(2, 4, 8), capacity=2048, rows_per_batch=2, seed=1)
    assert [r["ranks"] for r in rows] == [2, 4, 8]
    for r in rows:
        assert r["ranks"] * r["samples_per_rank"] + r["dropped"] == 4000
        assert r["rows_per_rank"] == 2 * r["steps"]
        assert 0 < r["epoch_balance"] <= 1 and 0 < r["shuffled_step_balance"] <= r["step_balance"] <= 1
    assert rows[0]["steps"] >= 2 * rows[1]["steps"] - 1 and rows[1]["steps"] >= 2 * rows[2]["steps"] - 1
    assert main(["--episodes", "2000", "--ranks", "2,4", "--capacity", "2048", "--json", str(tmp_path / "s.json"),
                 "--plot", str(tmp_path / "s.png")]) == 0
    assert len(json.loads((tmp_path / "s.json").read_text())["rows"]) == 2 and (tmp_path / "s.png").stat().st_size
