"""DevicePrefetcher: batches arrive unchanged and in order, errors reach the loop, the thread always stops.

CPU path always; the CUDA path (side stream, events, pinned memory, record_stream) on a CUDA machine only.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import namedtuple

import pytest
import torch

from mmfeed.loaders import DevicePrefetcher, StepTimer
from mmfeed.loaders.clock import TimedBatch
from mmfeed.loaders.loop.prefetch import move_to, pin, walk_tensors

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

Pair = namedtuple("Pair", "a b")


class Packed:
    """A PackedBatch-like object: moves and pins itself, holds tensors as attributes and in a dict."""

    def __init__(self, ids: torch.Tensor, data: dict[str, torch.Tensor]) -> None:
        self.ids, self.data = ids, data
        self.max_seqlen = int(ids.numel())

    def to(self, device, non_blocking: bool = False) -> Packed:
        return Packed(self.ids.to(device, non_blocking=non_blocking),
                      {k: v.to(device, non_blocking=non_blocking) for k, v in self.data.items()})

    def pin_memory(self) -> Packed:
        return Packed(self.ids.pin_memory(), {k: v.pin_memory() for k, v in self.data.items()})


def make_batches(n: int = 6) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        x = torch.randn(4, 3, generator=g)
        kind = i % 4
        if kind == 0:
            out.append(x)
        elif kind == 1:
            out.append({"x": x, "nested": [x + 1, (x + 2, "text")]})
        elif kind == 2:
            out.append(Pair(x, torch.arange(i)))
        else:
            out.append(Packed(torch.arange(5) + i, {"frames": x.to(torch.uint8)}))
    return out


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, Packed):
        return isinstance(b, Packed) and same(a.ids, b.ids) and same(a.data, b.data)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mmfeed-prefetch"]


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_cpu_batches_unchanged_and_in_order(depth):
    """Every batch comes out equal to what went in, same container types, same order, and the thread ends."""
    batches = make_batches()
    out = list(DevicePrefetcher(batches, "cpu", depth=depth))
    assert len(out) == len(batches) and all(same(a, b) for a, b in zip(batches, out))
    time.sleep(0.05)
    assert prefetch_threads() == []


def source_that_fails(n_ok: int):
    for i in range(n_ok):
        yield torch.tensor([i])
    raise KeyError("broken sample 17")


@pytest.mark.parametrize("depth", [0, 2])
def test_source_error_reaches_the_loop_with_its_traceback(depth):
    """The source's own exception type is raised in the loop after the good batches, with the source's frame
    in its traceback; the thread has stopped."""
    got = []
    with pytest.raises(KeyError, match="broken sample 17") as info:
        for b in DevicePrefetcher(source_that_fails(3), "cpu", depth=depth):
            got.append(int(b))
    assert got == [0, 1, 2]
    assert "source_that_fails" in "".join(traceback.format_tb(info.value.__traceback__))
    time.sleep(0.05)
    assert prefetch_threads() == []


def test_close_stops_the_thread_without_hang():
    """Closing after one batch of an endless source returns promptly and stops the producer."""

    def endless():
        i = 0
        while True:
            i += 1
            yield torch.tensor([i])

    pf = DevicePrefetcher(endless(), "cpu", depth=2)
    assert int(next(pf)) == 1
    start = time.monotonic()
    pf.close()
    assert time.monotonic() - start < 5.0
    assert prefetch_threads() == []
    with pytest.raises(StopIteration):
        next(pf)


def test_dropping_the_prefetcher_stops_its_thread():
    """A prefetcher abandoned mid-stream (no close) does not leave its thread running."""
    pf = DevicePrefetcher(iter(range(10**9)), "cpu", depth=2)
    assert next(pf) == 0
    del pf
    deadline = time.monotonic() + 5.0
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert prefetch_threads() == []


def test_timer_records_wait_and_unwraps_timed_batches():
    """TimedBatch items come out as their batch; their stage seconds and the waits land in the timer."""
    timer = StepTimer()
    items = [TimedBatch(torch.tensor([i]), {"decode": 0.01 * i}) for i in range(4)]
    out = []
    for b in DevicePrefetcher(items, "cpu", depth=1, timer=timer):
        out.append(int(b))
    assert out == [0, 1, 2, 3]
    rep = timer.report()
    assert rep["steps"] == 4
    assert rep["stages"]["decode"]["mean_s"] == pytest.approx(0.015)


def test_helpers_and_bad_arguments():
    b = make_batches(4)
    assert len(list(walk_tensors(b))) == 1 + 3 + 2 + 2
    assert same(move_to(b, torch.device("cpu")), b)
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([], "cpu", depth=-1)
    with pytest.raises(ValueError, match="device"):
        DevicePrefetcher([], "nonsense")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            DevicePrefetcher([], "cuda")


@needs_cuda
def test_cuda_values_equal_after_copy_on_side_stream():
    """Batches arrive on the GPU equal to the host batches; the copy ran on a side stream and the consumer's
    stream waited for it (reading right away, without a sync, gives the right values)."""
    batches = make_batches(8)
    timer = StepTimer()
    pf = DevicePrefetcher(batches, "cuda", depth=2, timer=timer)
    assert pf._stream is not None and pf._stream != torch.cuda.current_stream()
    out = []
    for b in pf:
        assert all(t.is_cuda for t in walk_tensors(b))
        out.append(move_to(b, torch.device("cpu"), non_blocking=False))  # on the current stream
    assert all(same(a, c) for a, c in zip(batches, out))
    rep = timer.report()
    assert rep["copy_s"] is not None and rep["copy_s"]["mean"] >= 0 and rep["gpu_compute_s"] is not None


@needs_cuda
def test_cuda_pins_and_records_streams():
    """Host tensors are pinned before the copy, and freed device tensors are not reused while the consumer
    stream still has work queued on them (record_stream)."""
    x = torch.randn(1024, 1024)
    assert pin(x).is_pinned() and pin({"a": x})["a"].is_pinned()
    pf = DevicePrefetcher([x.clone() for _ in range(4)], "cuda", depth=2)
    results = []
    for b in pf:
        torch.cuda._sleep(2_000_000)  # queue long work on the consumer stream that reads b afterwards
        results.append((b * 2).sum())
        del b
    torch.cuda.synchronize()
    want = (x * 2).sum().item()
    assert all(abs(r.item() - want) < 1e-2 * abs(want) + 1 for r in results)
