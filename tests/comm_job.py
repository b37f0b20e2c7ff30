"""The job tests/test_attribution.py starts with ``torchrun`` (gloo, 2 ranks): DDP training steps under a
StepTimer that watches the model, in scenarios with a known delay injected in one place.

Usage: ``python -m torch.distributed.run --nproc_per_node=2 tests/comm_job.py OUT.json [TRACE.json]``. For each
scenario rank 0 writes the timer's report (``comm_s``, ``comm_total_s``, ``compute_s``, ``wait_s`` ...) to OUT:

- ``base``: a small MLP, nothing injected;
- ``hook_sleep``: the comm hook of the first bucket sleeps ``DELAY_S`` before its all-reduce (on the autograd
  thread, so the backward pass cannot go on meanwhile);
- ``slow_collective``: each bucket's future completes ``DELAY_S`` after its all-reduce did (a slow network);
- ``forward_sleep``: the forward pass sleeps ``DELAY_S``;
- ``overlapped``: a large last layer whose collective is made ``DELAY_S`` slower but runs while the backward pass
  still computes (a 2 x ``DELAY_S`` sleep in the backward of a layer below), and a small first layer whose
  collective is the last and quick: all of the slow collective is hidden behind compute.
"""

import json
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from mmfeed import DataLoader
from mmfeed.loaders import StepTimer

DELAY_S = 0.04
STEPS, WARMUP = 24, 4


class SlowBackward(torch.autograd.Function):
    """Identity forward; its backward sleeps (compute the collective of the layers above can hide behind)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class Net(torch.nn.Module):
    def __init__(self, forward_sleep=0.0, backward_sleep=0.0, wide=64):
        super().__init__()
        self.first = torch.nn.Linear(16, 16)
        self.last = torch.nn.Linear(16, wide)
        self.forward_sleep, self.backward_sleep = forward_sleep, backward_sleep

    def forward(self, x):
        if self.forward_sleep:
            time.sleep(self.forward_sleep)
        h = torch.relu(self.first(x))
        if self.backward_sleep:
            h = SlowBackward.apply(h, self.backward_sleep)
        return self.last(h)


def hook_sleep(state, bucket):
    if bucket.index() == 0:
        time.sleep(DELAY_S)
    return allreduce_hook(state, bucket)


def slow_collective(state, bucket, only_not_last=False):
    fut = allreduce_hook(state, bucket)
    if only_not_last and bucket.is_last():
        return fut
    out = torch.futures.Future()
    fut.add_done_callback(lambda f: threading.Timer(DELAY_S, out.set_result, args=(f.value(),)).start())
    return out


def scenario(name):
    torch.manual_seed(0)
    if name == "overlapped":
        model = Net(backward_sleep=2 * DELAY_S, wide=512)
        hook = lambda s, b: slow_collective(s, b, only_not_last=True)  # noqa: E731
    else:
        model = Net(forward_sleep=DELAY_S if name == "forward_sleep" else 0.0)
        hook = {"hook_sleep": hook_sleep, "slow_collective": slow_collective}.get(name)
    # small buckets: the two layers' gradients travel in buckets of their own
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001)
    timer = StepTimer(warmup=WARMUP)
    timer.watch(ddp, hook=hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    data = torch.randn(STEPS * 8, 16, generator=torch.Generator().manual_seed(dist.get_rank()))
    for x in DataLoader(data, batch_size=8, timer=timer):
        ddp(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return timer, ddp


def main():
    dist.init_process_group("gloo")
    out, models = {}, []  # every model lives to the end: none is torn down while the process group runs
    for name in ("base", "hook_sleep", "slow_collective", "forward_sleep", "overlapped"):
        timer, ddp = scenario(name)
        models.append(ddp)
        report = timer.report()
        out[name] = report
        if name == "slow_collective" and len(sys.argv) > 2 and dist.get_rank() == 0:
            timer.export_chrome_trace(sys.argv[2])
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
