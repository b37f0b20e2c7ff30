"""Distributed loading: a real 2-process torchrun job (gloo), elastic resume across world sizes, worker split.

Layouts are simulated with integers first (ranks as plain arguments), then checked once with real processes.
"""

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed import DataLoader
from mmfeed.loaders import (ArraySource, Packing, PackedEpisodeDataset, PlanConfig, PlanSampler, TokenLayout, WindowSpec,
                            open_dataset)
from mmfeed.loaders.dist import DistInfo, dist_info
from mmfeed.loaders.index import INDEX_FILENAME, read_shard_index
from mmfeed.packing.plan import consumed_samples, plan_epoch, plan_remainder, worker_steps
from mmfeed.loaders.remote import RangeCache, default_cache
from mmfeed.loaders.sources import EpisodeRequest
from mmfeed.testing import make_episodes, write_webdataset

JOB = Path(__file__).with_name("dist_job.py")
SPEC = WindowSpec(offsets={"frames.cam_high": (-2, 0), "proprio": (0,), "action": tuple(range(5))})
PACKING = Packing(layout=TokenLayout(tokens_per_frame={"cam_high": 16}), window=SPEC,
                  plan=PlanConfig(capacity=160, rows_per_batch=2), seed=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Even shards (2 x 2 episodes of 10-16 steps) and uneven ones (4 + 1 episodes of 6-40 steps)."""
    out = tmp_path_factory.mktemp("dist")
    write_webdataset(out / "even", make_episodes(4, seed=3, min_length=10, max_length=16, cameras=("cam_high",),
                                                 height=32, width=32), episodes_per_shard=2)
    write_webdataset(out / "uneven", make_episodes(5, seed=4, min_length=6, max_length=40, cameras=("cam_high",),
                                                   height=32, width=32), episodes_per_shard=4)
    return out


# -- the real job ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def job(shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("job") / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(JOB), str(out), f"even={shards / 'even'}",
           f"uneven={shards / 'uneven'}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", ["even", "uneven"])
def test_torchrun_ranks_cover_the_epoch_exactly_once_in_equal_steps(job, name):
    """The union over ranks is every sample but the plan's listed drops; ranks are disjoint; every rank ran the
    same number of steps (each step ended in an all_reduce, so unequal counts would have hung the job)."""
    result = job[name]
    ranks = result["ranks"]
    assert len(ranks) == 2
    assert {r["steps"] for r in ranks} == {result["num_steps"]} and result["num_steps"] > 0
    first, second = (set(r["samples"]) for r in ranks)
    assert not first & second, "ranks are disjoint"
    assert all(len(r["samples"]) == len(set(r["samples"])) for r in ranks), "no rank sees a sample twice"
    assert sorted(first | second | set(result["dropped"])) == list(range(result["num_samples"]))
    assert not (first | second) & set(result["dropped"])
    assert all(r["in_plan_order"] for r in ranks), "each rank's batches are its plan's, in step order"


def test_torchrun_reports_cost_balance_and_timer_reduced_over_ranks(job):
    """The cost balance is the plan's (mean <= max, near 1 on these shards); the StepTimer report carries the max
    and mean over both ranks of every figure, and the max is never below the mean."""
    for name in ("even", "uneven"):
        balance = job[name]["cost_balance"]
        assert balance["mean"] <= balance["max"] and 0.8 < balance["mean_over_max"] <= 1.0
        ranks = job[name]["timer_ranks"]
        assert ranks["world_size"] == 2
        assert ranks["max"]["steps"] == ranks["mean"]["steps"] == job[name]["num_steps"]
        assert all(ranks["max"][k] >= ranks["mean"][k] - 1e-12 for k in ranks["mean"])
        assert {"wait_s.mean", "stall_fraction", "stages.decode.mean_s"} <= set(ranks["max"])


def test_torchrun_dist_info_and_round_robin_workers(job):
    """dist_info() gives each process its own rank of 2 (also inside DataLoader workers), and a rank's two
    workers load the items round robin: item i on worker i % 2, as worker_steps says."""
    assert job["dist_info"] == [[0, 2, 0, 2], [1, 2, 1, 2]]
    for rank, items in enumerate(job["workers"]):
        assert [i for i, *_ in items] == list(range(8))
        assert all(r == rank and w == 2 and n == 2 for _, r, w, _, n in items)
        for worker in range(2):
            assert [i for i, *_, wk, _ in items if wk == worker] == worker_steps(8, 2, worker).tolist()


def test_dist_info_from_the_environment(monkeypatch):
    """Without a process group, torchrun's variables decide; bad ones raise a ValueError naming the variable."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert dist_info() == DistInfo()
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    info = dist_info()
    assert (info.rank, info.world_size, info.local_rank, info.node, info.worker, info.num_workers) == (5, 8, 1, 1, 0, 1)
    monkeypatch.setenv("RANK", "8")
    with pytest.raises(ValueError, match="RANK=8"):
        dist_info()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x'"):
        dist_info()


# -- elastic resume, simulated ranks ------------------------------------------------------------------------
def array_source() -> ArraySource:
    lengths = np.random.default_rng(7).integers(3, 40, size=24)
    return ArraySource([{"proprio": np.zeros((n, 2), np.float32), "action": np.zeros((n, 2), np.float32),
                         "task": "t"} for n in lengths])


ARRAY_PLAN = PlanConfig(capacity=48, rows_per_batch=2)
ARRAY_WINDOW = WindowSpec(offsets={"proprio": (0,), "action": (0, 1, 2)})


def array_loaders(source, world: int) -> list[DataLoader]:
    return [DataLoader(PackedEpisodeDataset(source, layout=TokenLayout(), window=ARRAY_WINDOW, plan=ARRAY_PLAN,
                                            seed=3, rank=r, world_size=world)) for r in range(world)]


def ids(batch) -> list[int]:
    return batch.metadata["sample"].tolist()


def run_rest(loaders, state) -> list[list[int]]:
    """Each rank's samples after resuming from ``state``; every rank must run the same number of steps."""
    out = []
    for loader in loaders:
        loader.load_state_dict(loader.dataset.reshard_state(state))
        out.append([ids(b) for b in loader])
    assert len({len(r) for r in out}) == 1, "every new rank runs the same number of steps"
    return out


@pytest.mark.parametrize("new_world", [1, 4])
@pytest.mark.parametrize("cut", [1, 3])
def test_state_saved_at_world_2_resumes_at_other_world_sizes_exactly(new_world, cut):
    """After k steps at world size 2, the rest at world size 1 or 4 holds every sample not yet seen, once each,
    except the rest plan's listed drops; the sample ids seen before come from the old plan alone."""
    source = array_source()
    old = array_loaders(source, 2)
    seen, states = [], []
    for loader in old:
        it = iter(loader)
        seen += [s for _ in range(cut) for s in ids(next(it))]
        states.append(loader.state_dict())
    assert states[0] == states[1], "the state is the same on every rank"
    assert len(seen) == len(set(seen))
    table = old[0].dataset.table
    assert sorted(seen) == consumed_samples(table.tokens, ARRAY_PLAN, seed=3, epoch=0, done=[(2, cut)]).tolist()
    new = array_loaders(source, new_world)
    rest = [s for rank in run_rest(new, states[0]) for batch in rank for s in batch]
    dropped = new[0].dataset.plan(0, ((2, cut),)).dropped.tolist()
    assert len(rest) == len(set(rest)) and not set(rest) & set(seen) and not set(dropped) & set(seen + rest)
    assert sorted(seen + rest + dropped) == list(range(len(table)))
    assert len(dropped) < len(table) // 4


def test_elastic_resume_twice_and_then_the_next_epoch_is_fresh():
    """2 ranks for 2 steps, then 4 ranks for 1 step, then 3 ranks to the end: still every sample once; the epoch
    after that is the plain plan at 3 ranks."""
    source = array_source()
    seen = []
    first = array_loaders(source, 2)
    for loader in first:
        it = iter(loader)
        seen += [s for _ in range(2) for s in ids(next(it))]
    state = first[0].state_dict()
    second = array_loaders(source, 4)
    for loader in second:
        loader.load_state_dict(loader.dataset.reshard_state(state))
        seen += ids(next(iter(loader)))
    state = second[0].state_dict()
    assert state["order"]["state"]["done"] == [[2, 2]] and state["batches"] == 1
    third = array_loaders(source, 3)
    rest = [s for rank in run_rest(third, state) for batch in rank for s in batch]
    dropped = third[0].dataset.plan(0, ((2, 2), (4, 1))).dropped.tolist()
    assert len(seen + rest) == len(set(seen + rest))
    assert sorted(seen + rest + dropped) == list(range(len(third[0].dataset.table)))
    plain = third[0].dataset.plan(1)
    assert [ids(b) for b in third[0]] == [plain.batch_samples(0, s).tolist() for s in range(plain.num_steps)]


def test_loader_reshards_by_itself_and_refuses_a_foreign_seed():
    """mmfeed.DataLoader.load_state_dict re-plans a state saved at another world size on its own (the same as an
    explicit reshard_state); the sampler alone refuses such a state rather than be silently wrong; a state from
    another plan seed is refused."""
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
    other = PackedEpisodeDataset(source, layout=TokenLayout(), window=ARRAY_WINDOW, plan=ARRAY_PLAN, seed=4,
                                 world_size=4)
    with pytest.raises(ValueError, match="seed=3"):
        other.reshard_state(state)
    same = array_loaders(source, 2)[1]
    assert same.dataset.reshard_state(state) == state  # same world size: unchanged


def test_a_finished_epoch_resumes_at_another_world_size_with_the_next_plain_epoch():
    """A state saved after a whole epoch at 2 ranks continues at 4 ranks with epoch 1's plain plan."""
    source = array_source()
    old = array_loaders(source, 2)[0]
    list(old)
    state = old.state_dict()
    for rank, loader in enumerate(array_loaders(source, 4)):
        loader.load_state_dict(loader.dataset.reshard_state(state))
        plan = loader.dataset.plan(1)
        assert [ids(b) for b in loader] == [plan.batch_samples(rank, s).tolist() for s in range(plan.num_steps)]


def test_elastic_resume_through_env_ranks_and_real_shards(shards, monkeypatch):
    """mmfeed.DataLoader(packing=...) over real shards, ranks from RANK/WORLD_SIZE: save at 2 ranks after one
    step, resume at 1 rank (with a worker process): every sample once."""
    seen, state = [], None
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = DataLoader(shards / "uneven", packing=PACKING)
        it = iter(loader)
        seen += ids(next(it))
        state = loader.state_dict()
        del it
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = DataLoader(shards / "uneven", packing=PACKING, num_workers=1)
    resumed.load_state_dict(resumed.dataset.reshard_state(state))
    rest = [s for b in resumed for s in ids(b)]
    dropped = resumed.dataset.plan(0, ((2, 1),)).dropped.tolist()
    assert len(seen + rest) == len(set(seen + rest))
    assert sorted(seen + rest + dropped) == list(range(len(resumed.dataset.table)))


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


# -- remote shards over HTTP --------------------------------------------------------------------------------
class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves the files of ``server.root`` with HTTP Range support (the stdlib handler has none) and logs every
    request as ``(method, path, bytes sent)`` in ``server.served``."""

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = os.path.join(self.server.root, urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/"))
        if not os.path.isfile(path):
            self.send_error(404)
            return
        size = os.path.getsize(path)
        start, end, status = 0, size, 200
        wanted = self.headers.get("Range")
        if wanted:
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted.strip())
            if not match or match.groups() == ("", ""):
                self.send_error(416)
                return
            first, last = match.groups()
            if first == "":
                start = max(size - int(last), 0)
            else:
                start, end = int(first), min(int(last) + 1, size) if last else size
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        data = b""
        if body:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
        # logged before the body goes out, so the client never sees the bytes before the log does
        self.server.served.append((self.command, urllib.parse.urlsplit(self.path).path, len(data)))
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture(scope="module")
def http_shards(shards):
    """An HTTP server on 127.0.0.1 serving the uneven shards; yields (base URL, server)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    server.root, server.served = str(shards / "uneven"), []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server
    server.shutdown()
    server.server_close()


def tar_bytes(server) -> int:
    return sum(n for method, path, n in server.served if method == "GET" and path.endswith(".tar"))


def members(shards):
    """(shard name, member name, offset, size) of every member in the index, in index order."""
    table = read_shard_index(shards / "uneven" / INDEX_FILENAME).to_pylist()
    return [(row["shard"], m["name"], m["offset"], m["size"]) for row in table for m in row["members"]]


@pytest.mark.parametrize("block_size", [0, 4096])
def test_range_cache_fetches_only_needed_ranges_and_stays_under_its_bound(http_shards, shards, block_size):
    """Every member read over HTTP equals the local bytes; a read costs one request for no more than its blocks;
    a repeated read costs none; the cache never holds more than max_bytes."""
    base, server = http_shards
    cache = RangeCache(max_bytes=12_000, block_size=block_size)
    served = tar_bytes(server)
    for shard, name, offset, size in members(shards):
        local = (shards / "uneven" / shard).read_bytes()[offset : offset + size]
        requests = cache.stats.requests
        assert cache.read(f"{base}/{shard}", offset, size) == local
        new_bytes, served = tar_bytes(server) - served, tar_bytes(server)
        assert cache.stats.requests - requests <= 1
        blocks = block_size * ((offset + size - 1) // block_size - offset // block_size + 1) if block_size else size
        assert new_bytes <= blocks
        assert cache.cached_bytes <= cache.max_bytes
        if size <= cache.max_bytes:
            again = cache.stats.requests
            assert cache.read(f"{base}/{shard}", offset, size) == local and cache.stats.requests == again
    total = sum(p.stat().st_size for p in (shards / "uneven").glob("*.tar"))
    assert cache.stats.fetched_bytes < total, "headers and padding are never fetched"


def test_open_dataset_over_http_reads_the_same_episodes(http_shards, shards):
    """open_dataset on a brace pattern of shard URLs gives the episodes the local shards give, pixels included."""
    base, _ = http_shards
    remote = open_dataset(base + "/shard-{000000..000001}.tar")
    local = open_dataset(shards / "uneven")
    assert len(remote) == len(local) == 5
    a, b = remote.episode(4), local.episode(4)
    assert a["task"] == b["task"] and all(np.array_equal(a[k], b[k]) for k in ("proprio", "action",
                                                                               "frames.cam_high"))


def test_index_url_partial_read_fetches_a_fraction_of_the_shards(http_shards, shards, monkeypatch):
    """Opened from its index URL, one episode's arrays cost a small fraction of the shard bytes (range requests
    driven by the index), and the process cache stays under MMFEED_REMOTE_CACHE_BYTES."""
    base, server = http_shards
    monkeypatch.setenv("MMFEED_REMOTE_CACHE_BYTES", "8192")
    monkeypatch.setenv("MMFEED_REMOTE_BLOCK_BYTES", "2048")
    before = tar_bytes(server)
    ds = open_dataset(f"{base}/{INDEX_FILENAME}")
    steps = np.arange(int(ds.lengths[2]))
    got = ds.read_many([EpisodeRequest(2, {"proprio": steps, "action": steps})])[0]
    want = open_dataset(shards / "uneven").read_many([EpisodeRequest(2, {"proprio": steps, "action": steps})])[0]
    assert all(np.array_equal(got[k], want[k]) for k in want)
    total = sum(p.stat().st_size for p in (shards / "uneven").glob("*.tar"))
    assert tar_bytes(server) - before < total / 4
    assert default_cache().cached_bytes <= 8192


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
