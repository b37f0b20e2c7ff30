"""StepTimer: the stall fraction matches the known pipeline/step speeds, and a slow stage is named.

Simulated with sleeps (2-core machine: sleeping workers do not fight the simulated step for the CPU) and real
worker processes (num_workers=2). Tolerance for stall fractions: |measured - expected| < 0.1.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from mmfeed import DataLoader
from mmfeed.loaders import StepTimer
from mmfeed.loaders.clock import TimedCollate, record_stage, stage
from mmfeed.loaders.clock import drain_stages
from mmfeed.loaders.observe.timing import diagnose

TOL = 0.1


class Sleepy(Dataset):
    """Each sample costs `read_s` in stage "read" and `decode_s` in stage "decode" (sleeps)."""

    def __init__(self, n: int, read_s: float, decode_s: float) -> None:
        self.n, self.read_s, self.decode_s = n, read_s, decode_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        with stage("read"):
            time.sleep(self.read_s)
        with stage("decode"):
            time.sleep(self.decode_s)
        return torch.tensor([i])


def train(loader, step_s: float) -> dict:
    for _ in loader:
        time.sleep(step_s)  # the simulated training step
    return loader.timer.report()


def test_stall_near_zero_when_loader_is_faster_than_the_step():
    """2 workers x 40 ms per batch = 20 ms per batch of capacity, 40 ms steps: the loop never waits. (The
    prefetch thread, device="cpu", also takes the main-process receive/unpickle of each batch, ~1-3 ms on a
    busy 2-core machine, off the loop; without it that cost would show up as wait.)"""
    timer = StepTimer(warmup=2)
    loader = DataLoader(Sleepy(48, 0.0, 0.02), batch_size=2, num_workers=2, timer=timer, device="cpu")
    rep = train(loader, 0.04)
    assert rep["steps"] == 22
    assert abs(rep["stall_fraction"] - 0.0) < TOL
    assert rep["bottleneck"]["stage"] == "compute"


def test_stall_matches_one_minus_step_over_load_when_loader_is_slower():
    """2 workers x 120 ms per batch = 60 ms per batch, 30 ms steps: stall = 1 - 30/60 = 0.5; decode is named."""
    timer = StepTimer(warmup=2)
    loader = DataLoader(Sleepy(44, 0.005, 0.055), batch_size=2, num_workers=2, timer=timer)
    rep = train(loader, 0.03)
    assert abs(rep["stall_fraction"] - 0.5) < TOL
    stages = rep["stages"]
    assert set(stages) == {"read", "decode", "collate"}
    # 2 samples x 55 ms, carried back: never less than the sleeps, more only by what a loaded machine adds to them
    assert 0.105 <= stages["decode"]["mean_s"] <= 0.2
    assert rep["bottleneck"]["stage"] == "decode"
    assert "workers" in rep["bottleneck"]["recommendation"]


def test_delay_injected_into_one_stage_is_attributed_to_it():
    """The same loader with the delay moved into "read": the bottleneck follows it, with storage advice."""
    timer = StepTimer(warmup=1)
    rep = train(DataLoader(Sleepy(24, 0.03, 0.001), batch_size=2, num_workers=2, timer=timer), 0.005)
    assert rep["bottleneck"]["stage"] == "read"
    assert "storage" in rep["bottleneck"]["recommendation"]
    assert rep["stages"]["read"]["share"] > 0.8


def test_a_loop_that_breaks_out_still_reports_its_last_step():
    timer = StepTimer()
    loader = DataLoader(torch.arange(10), batch_size=1, timer=timer)
    for i, _ in enumerate(loader):
        time.sleep(0.02)
        if i == 2:
            break
    rep = timer.report()
    assert rep["steps"] == 3 and rep["compute_s"]["total"] >= 0.06
    assert timer.report()["steps"] == 3  # reporting does not end the step: it counts once, however often asked
    next(iter(loader))
    assert len(timer.wait_s) == 3


def test_record_and_report_statistics():
    """Known steps in, known figures out: means, medians, totals, stall = total wait / total step."""
    t = StepTimer()
    for i in range(10):
        t.record(wait_s=0.01 * (i % 2), compute_s=0.1, copy_s=0.002, stages={"decode": 0.05})
    rep = t.report()
    assert rep["steps"] == 10
    assert rep["wait_s"]["total"] == pytest.approx(0.05)
    assert rep["wait_s"]["median"] == pytest.approx(0.005)
    assert rep["step_s"]["mean"] == pytest.approx(0.105)
    assert rep["stall_fraction"] == pytest.approx(0.05 / 1.05)
    assert rep["copy_s"]["mean"] == pytest.approx(0.002)
    assert rep["stages"] == {"decode": {"mean_s": pytest.approx(0.05), "share": 1.0}}
    assert rep["bottleneck"]["stage"] == "compute"
    assert "ranks" not in rep


def test_summary_prints_the_report_in_a_few_lines():
    """print(loader.timer.summary()) shows the report: stall over the steps, per-step phases, worker stages, MFU
    when known and the bottleneck with its recommendation, each from the report's own figures."""
    t = StepTimer(warmup=1, flops_per_step=2e9, peak_flops=1e12)
    for i in range(5):
        t.record(wait_s=0.02, compute_s=0.08, copy_s=0.004, stages={"decode": 0.3, "collate": 0.1})
    rep = t.report()
    lines = t.summary().splitlines()
    assert lines[0] == "stall 20.0% over 4 step(s) (warm-up 1 left out)"
    assert lines[1] == "per step: wait 20.00 ms, copy 4.00 ms, compute 80.00 ms"
    assert lines[2] == "worker stages per batch: collate 100.00 ms (25%), decode 300.00 ms (75%)"
    assert lines[3] == f"MFU {rep['mfu']:.1%}" and rep["mfu"] == pytest.approx(2e9 / 0.1 / 1e12)
    assert lines[4] == f"bottleneck: {rep['bottleneck']['stage']}: {rep['bottleneck']['recommendation']}"
    assert len(lines) == 5 and StepTimer().summary().startswith("stall 0.0% over 0 step(s)")


def test_json_export_and_log_every(tmp_path, caplog):
    t = StepTimer(log_every=3)
    with caplog.at_level(logging.INFO, logger="mmfeed.loaders.observe.timing"):
        for _ in range(7):
            t.record(0.02, 0.08)
    lines = [r.getMessage() for r in caplog.records if r.name == "mmfeed.loaders.observe.timing"]
    assert len(lines) == 2 and "stall=20.0%" in lines[0]
    out = t.to_json(tmp_path / "timing.json")
    assert json.loads((tmp_path / "timing.json").read_text())["steps"] == out["steps"] == 7


def test_worker_side_api_and_collate_wrapper():
    """record_stage/stage accumulate per stage; TimedCollate drains them into the batch it returns."""
    drain_stages()
    record_stage("read", 0.25)
    record_stage("read", 0.25)
    tb = TimedCollate(lambda xs: torch.stack(xs))([torch.zeros(2), torch.ones(2)])
    assert tb.stages["read"] == pytest.approx(0.5) and "collate" in tb.stages
    assert torch.equal(tb.batch, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert drain_stages() == {}
    with pytest.raises(ValueError, match="seconds"):
        record_stage("decode", -1.0)
    with pytest.raises(ValueError, match="stage name"):
        record_stage("", 1.0)
    with pytest.raises(ValueError, match="log_every"):
        StepTimer(log_every=-2)


def test_diagnose_rules():
    """Pure rules: slow copy -> copy advice; workers keep up on average -> deeper prefetch."""
    assert diagnose(0.3, 0.01, 0.05, {"decode": 0.01}, 2)["stage"] == "copy"
    assert diagnose(0.3, 0.05, None, {"decode": 0.02}, 2)["stage"] == "prefetch"
    d = diagnose(0.6, 0.01, None, {"decode": 0.05, "read": 0.01}, 2, cores=8)
    assert d["stage"] == "decode" and "about 6 workers would keep up" in d["recommendation"]
    assert diagnose(0.3, 0.05, None, {}, 2)["stage"] == "unknown"


def test_diagnose_never_advises_more_workers_than_cores():
    """A 1 ms step whose batch takes 34 worker-ms: 34 workers would keep up, but on 2 cores the advice is 2
    workers and a cheaper batch or more cores; where the workers already fill the cores, not more workers."""
    inline = diagnose(0.6, 0.001, None, {"decode": 0.034}, 0, cores=2)["recommendation"]
    assert "about 34 workers but this machine has 2 cores: use num_workers=2" in inline, inline
    assert "cheaper" in inline and "more cores" in inline
    assert "about 34 workers" in diagnose(0.6, 0.001, None, {"decode": 0.034}, 0, cores=64)["recommendation"]
    staged = diagnose(0.6, 0.01, None, {"decode": 0.05, "read": 0.01}, 1, cores=2)["recommendation"]
    assert "use num_workers=2" in staged and "6 workers would keep up" not in staged, staged
    full = diagnose(0.6, 0.01, None, {"decode": 0.05}, 2, cores=2)
    assert full["stage"] == "decode" and "already fill this machine's 2 cores" in full["recommendation"]
    assert "more workers" not in full["recommendation"]
    # by default the cores this process may run on: no advised count above them
    from mmfeed.loaders.observe.diagnosis import usable_cores

    cores = usable_cores()
    assert 1 <= cores <= (os.cpu_count() or cores)
    advice = diagnose(0.6, 1e-4, None, {"decode": 1.0}, 0)["recommendation"]
    assert max(int(n) for n in re.findall(r"num_workers=(\d+)", advice)) <= cores, advice


def test_report_reduced_across_ranks_with_gloo(tmp_path):
    """Under torch.distributed (gloo, one rank via a FileStore) the report carries max and mean per figure."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = StepTimer()
        t.record(0.01, 0.09, stages={"decode": 0.2})
        ranks = t.report()["ranks"]
    finally:
        dist.destroy_process_group()
    assert ranks["world_size"] == 1
    assert ranks["max"]["stall_fraction"] == pytest.approx(0.1) == ranks["mean"]["stall_fraction"]
    assert ranks["max"]["stages.decode.mean_s"] == pytest.approx(0.2)


def test_forked_workers_start_with_no_inherited_stage_time():
    """Stage seconds recorded in the parent before the workers fork are never charged to a worker's batch."""
    record_stage("decode", 100.0)  # the parent "decoded" for 100 s before the loader started
    timer = StepTimer()
    rep = train(DataLoader(Sleepy(8, 0.01, 0.0), batch_size=2, num_workers=2, timer=timer), 0.0)
    assert rep["stages"]["decode"]["mean_s"] < 1.0
    drain_stages()
