"""Step-time attribution: injected delays land in the phase they were injected in.

- exposed communication: a real ``torchrun`` job (gloo, 2 ranks, tests/comm_job.py) trains a DDP model under a
  StepTimer that watches it, with a 40 ms delay injected in the comm hook, in each collective, in the forward, or
  in a collective that the backward pass hides;
- input: a delay in a worker stage shows as wait; the stall fraction agrees with a stopwatch around the loop;
- MFU against a hand count of an MLP's FLOPs; useful MFU against a packed batch's padding;
- the Chrome trace: valid JSON, one track per worker, the stages and the steps in it;
- the bottleneck named right when loading runs in the loop and when the pipeline refills at each epoch start.

Delays are sleeps (a 2-core machine: sleeping workers do not fight the loop for the CPU); comparisons use
medians over the steps after a warm-up.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

import procs
from mmfeed import DataLoader
from mmfeed.loaders import DevicePrefetcher, StepTimer
from mmfeed.loaders.observe.flops import count_flops
from mmfeed.loaders.clock import stage
from mmfeed.packing import PackedBatch

JOB = Path(__file__).with_name("comm_job.py")
DELAY_S = 0.04  # as in comm_job.py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def comm(tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("comm")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(JOB), str(where / "out.json"), str(where / "trace.json")]
    done = procs.run(cmd, env=env, timeout=180)
    if done.returncode != 0 and "exitcode: -6" in done.stderr:
        # A rank aborted inside torch ("terminate called without an active exception"): seen about once in 20
        # runs on a loaded 2-core machine, never on a quiet one. Run the job once more and say so.
        print("comm job: a rank aborted (SIGABRT); running it again")
        done = procs.run(cmd[:-4] + [str(free_port()), *cmd[-3:]], env=env, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads((where / "out.json").read_text())
    out["trace"] = json.loads((where / "trace.json").read_text())
    return out


def median(report: dict, key: str) -> float:
    return report[key]["median"]


def delta(comm: dict, scenario: str, key: str) -> float:
    return median(comm[scenario], key) - median(comm["base"], key)


def shows_the_delay(seconds: float) -> bool:
    """A sleep of DELAY_S, measured: never less (minus timer noise), and on a loaded 2-core machine a few ms more
    (the woken rank waits for a core; once 45 ms for 40)."""
    return 0.9 * DELAY_S <= seconds <= 1.25 * DELAY_S


@pytest.mark.slow  # a torchrun DDP job
@pytest.mark.parametrize("scenario", ["hook_sleep", "slow_collective"])
def test_delay_in_the_comm_hook_shows_in_comm_not_compute(comm, scenario):
    assert shows_the_delay(delta(comm, scenario, "comm_s")), delta(comm, scenario, "comm_s")
    assert abs(delta(comm, scenario, "compute_s")) < 0.1 * DELAY_S
    assert comm[scenario]["bottleneck"]["stage"] == "comm"
    # every rank reported it, and the report carries the slowest
    assert comm[scenario]["ranks"]["max"]["comm_s.median"] >= median(comm[scenario], "comm_s") - 1e-9


@pytest.mark.slow  # a torchrun DDP job
def test_delay_in_the_forward_shows_in_compute_not_comm(comm):
    assert shows_the_delay(delta(comm, "forward_sleep", "compute_s")), delta(comm, "forward_sleep", "compute_s")
    assert abs(delta(comm, "forward_sleep", "comm_s")) < 0.1 * DELAY_S


@pytest.mark.slow  # a torchrun DDP job
def test_a_collective_hidden_behind_backward_is_not_exposed(comm):
    """The slow collective runs while a layer below still computes its backward: comm_total_s holds it all,
    comm_s (what the optimizer step waited for) stays near 0."""
    report = comm["overlapped"]
    assert median(report, "comm_total_s") >= DELAY_S
    assert median(report, "comm_s") < 0.25 * DELAY_S
    assert median(report, "compute_s") >= 2 * DELAY_S  # the backward sleep is compute
    assert report["phases"]["comm"] == pytest.approx(report["comm_s"]["mean"])


@pytest.mark.slow  # a torchrun DDP job
def test_comm_trace_has_the_buckets_and_the_exposed_tail(comm):
    events = comm["trace"]["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"training loop", "comm"} <= names
    buckets = [e for e in events if e["ph"] == "X" and e["tid"] == 1]
    tails = [e for e in events if e["ph"] == "X" and e["name"] == "comm (exposed)"]
    assert buckets and len(tails) >= comm["slow_collective"]["steps"]
    assert min(e["dur"] for e in tails) >= 0.9 * DELAY_S * 1e6


class Sleepy(Dataset):
    """Each sample sleeps ``decode_s`` inside stage "decode"."""

    def __init__(self, n: int, decode_s: float) -> None:
        self.n, self.decode_s = n, decode_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with stage("decode"):
            time.sleep(self.decode_s)
        return torch.tensor([i])


def test_delay_in_a_worker_stage_shows_as_wait_when_it_exceeds_the_step():
    """One worker, 60 ms of decode per batch, 20 ms steps: the loop waits the 40 ms the worker is behind."""
    decode, step = 0.06, 0.02
    timer = StepTimer(warmup=3)
    for _ in DataLoader(Sleepy(24, decode), batch_size=1, num_workers=1, timer=timer):
        time.sleep(step)
    report = timer.report()
    assert report["wait_s"]["median"] == pytest.approx(decode - step, abs=0.1 * decode)
    assert report["compute_s"]["median"] == pytest.approx(step, abs=0.1 * decode)
    assert report["stages"]["decode"]["mean_s"] == pytest.approx(decode, rel=0.1)
    assert report["bottleneck"]["stage"] == "decode"


@pytest.mark.parametrize("load", [0.5, 1.0, 2.0])
def test_stall_fraction_agrees_with_a_stopwatch_around_the_loop(load):
    """2 workers x 40 ms per batch (20 ms of capacity per batch); steps that ask for 0.5x, 1x, 2x of it."""
    step = 0.02 / load
    warmup, steps = 4, 30
    timer = StepTimer(warmup=warmup)
    it = iter(DataLoader(Sleepy(steps + warmup, 0.04), batch_size=1, num_workers=2, timer=timer))
    waited, start = 0.0, None
    for k in range(steps + warmup):
        if k == warmup:
            waited, start = 0.0, time.perf_counter()
        t0 = time.perf_counter()
        next(it)
        waited += time.perf_counter() - t0
        time.sleep(step)
    total = time.perf_counter() - start
    report = timer.report()
    assert report["steps"] == steps
    assert report["stall_fraction"] == pytest.approx(waited / total, abs=0.02)
    del it


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_flops_of_a_step_match_a_hand_count():
    """Forward 2*B*in*out per layer; backward the same twice (input and weight grads), except the first layer,
    whose input needs no gradient (weight grad only)."""
    model, batch = MLP(), 32
    x = torch.randn(batch, 64, generator=torch.Generator().manual_seed(0))
    forward = 2 * batch * (64 * 128 + 128 * 16)
    backward = 2 * batch * 64 * 128 + 2 * 2 * batch * 128 * 16
    assert count_flops(lambda: model(x).square().mean().backward()) == forward + backward


def test_mfu_is_achieved_flops_over_the_peak_and_useful_mfu_excludes_padding():
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    flops = count_flops(lambda: model(x).square().mean().backward())
    opt.zero_grad()
    rows = [[100, 60], [200], [50, 50, 50]]  # 510 of 3 x 256 slots are tokens
    batches = [PackedBatch.from_lengths(rows, 256) for _ in range(12)]
    peak = 1e11
    timer = StepTimer(flops_per_step=flops, peak_flops=peak)
    start = time.perf_counter()
    for _ in DevicePrefetcher(batches, "cpu", depth=0, timer=timer):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    total = time.perf_counter() - start
    report = timer.report()
    # the timer's rate is over the steps after warmup; the loop's wall clock also holds the warmup and start-up
    assert report["achieved_flops_per_s"] == pytest.approx(flops / report["step_s"]["mean"])
    assert 0.8 < report["achieved_flops_per_s"] / (flops * 12 / total) < 2.0
    assert report["mfu"] == pytest.approx(report["achieved_flops_per_s"] / peak)
    assert report["useful_fraction"] == pytest.approx(510 / 768)
    assert report["useful_mfu"] / report["mfu"] == pytest.approx(510 / 768)
    assert StepTimer().report()["mfu"] is None


def test_chrome_trace_has_a_track_per_worker_with_its_stages(tmp_path):
    timer = StepTimer()
    for _ in DataLoader(Sleepy(16, 0.01), batch_size=2, num_workers=2, timer=timer):
        time.sleep(0.005)
    trace = timer.export_chrome_trace(tmp_path / "trace.json")
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded == json.loads(json.dumps(trace))
    events = loaded["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(tracks.values()) == ["training loop", "worker 0", "worker 1"]
    workers = {tid for tid, name in tracks.items() if name.startswith("worker")}
    decodes = [e for e in events if e["ph"] == "X" and e["name"] == "decode"]
    assert len(decodes) == 16 and {e["tid"] for e in decodes} == workers
    assert min(e["dur"] for e in decodes) >= 0.01 * 1e6
    steps = [e for e in events if e["ph"] == "X" and e["tid"] == 0 and e["name"].startswith("step ")]
    assert [e["args"]["step"] for e in steps] == list(range(8))
    assert all(e["ts"] >= 0 for e in events if "ts" in e)
    # a batch's stages precede the step that consumed it
    first_step = {e["args"]["step"]: e["ts"] for e in steps}
    assert all(e["ts"] + e["dur"] <= first_step[e["args"]["step"]] + 1.0 for e in decodes)
    assert any(e["ph"] == "i" and e["name"] == "epoch 0" for e in events)


def test_loading_in_the_loop_is_named_as_such():
    timer = StepTimer()
    for _ in DataLoader(Sleepy(12, 0.01), batch_size=1, num_workers=0, timer=timer):
        time.sleep(0.002)
    bottleneck = timer.report()["bottleneck"]
    assert bottleneck["stage"] == "inline"
    assert "num_workers" in bottleneck["recommendation"] and "prefetch" not in bottleneck["recommendation"]


def test_an_epoch_boundary_refill_is_named_as_such():
    """Persistent workers outpace the loop, so it never waits, except while the pipeline refills at the start
    of each epoch (torch asks for the next epoch's batches only when it begins). The margins are wide so a
    loaded machine's stray mid-epoch waits stay far below the three refills: each refill waits a whole sample
    (0.06 s), while the loop spends 0.07 s a step and two workers deliver a sample every 0.03 s."""
    timer = StepTimer(warmup=2)
    loader = DataLoader(Sleepy(16, 0.06), batch_size=1, num_workers=2, persistent_workers=True, timer=timer)
    for _ in range(4):
        for _ in loader:
            time.sleep(0.07)
    report = timer.report()
    assert report["epoch_refill_share"] > 0.5
    assert report["bottleneck"]["stage"] == "epoch_boundary"
    assert timer.epoch_starts == [0, 16, 32, 48]
