"""Thread workers: batches loaded by threads of the training process (``DataLoader(worker_mode="thread")``).

Decoding spends its time in FFmpeg, which releases the GIL (PyAV's decode and swscale calls), so threads of the
training process can load batches side by side, like worker processes, without what processes cost: no dataset
copy per worker, no pickling of batches, no shared-memory hand-off and no second address space to fault in.
What stays serial is the Python around the decode (planning a batch's requests, collating), which is why
processes remain the default; ``mmfeed bench --worker-mode thread`` measures both on the same samples.

:class:`ThreadedBatches` walks the torch loader's index sampler (so sampling, batching and resume are exactly the
process loader's), keeps ``depth`` batches in flight on ``num_workers`` threads, and hands them over in order. Each
thread has its own decoders (the sources keep one per thread) and its own stage timings (``stage()`` is
thread-local). ``worker_init_fn(i)`` runs once in thread ``i`` before its first batch.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader as TorchDataLoader

__all__ = ["ThreadedBatches"]


class ThreadedBatches:
    """Iterate ``loader``'s batches (a torch DataLoader with ``num_workers=0``) loaded by ``num_workers`` threads,
    ``depth`` ahead, in order; ``close()`` (or dropping it) cancels what is in flight and ends the threads."""

    def __init__(self, loader: TorchDataLoader, num_workers: int, depth: int, *,
                 worker_init_fn: Callable[[int], Any] | None = None, pin_memory: bool = False,
                 timeout: float = 0) -> None:
        from torch.utils.data._utils.fetch import _MapDatasetFetcher

        self._fetcher = _MapDatasetFetcher(loader.dataset, loader._auto_collation, loader.collate_fn,
                                           loader.drop_last)
        self._indices: Iterator[Any] = iter(loader._index_sampler)
        # as torch's iterators do, after starting the sampler: the draw that seeds its workers, so that a shuffle
        # drawn from the same generator (or the global RNG) gives torch's order
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        ids = itertools.count()
        lock = threading.Lock()

        def initialize() -> None:
            with lock:
                i = next(ids)
            if worker_init_fn is not None:
                worker_init_fn(i)

        self._pool = concurrent.futures.ThreadPoolExecutor(max(int(num_workers), 1), "mmfeed-load", initialize)
        self._pending: collections.deque[concurrent.futures.Future] = collections.deque()
        self._depth = max(int(depth), 1)
        self._pin = bool(pin_memory)
        self._timeout = float(timeout) or None
        self._done = False

    def _load(self, index: Any) -> Any:
        batch = self._fetcher.fetch(index)
        if self._pin:
            from torch.utils.data._utils.pin_memory import pin_memory

            batch = pin_memory(batch)
        return batch

    def __iter__(self) -> ThreadedBatches:
        return self

    def __next__(self) -> Any:
        while not self._done and len(self._pending) < self._depth:
            try:
                index = next(self._indices)
            except StopIteration:
                self._done = True
                break
            self._pending.append(self._pool.submit(self._load, index))
        if not self._pending:
            self.close()
            raise StopIteration
        future = self._pending.popleft()
        try:
            return future.result(timeout=self._timeout)
        except concurrent.futures.TimeoutError:
            self.close()
            raise RuntimeError(f"a loader thread took more than timeout={self._timeout} s for one batch") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Cancel the batches not yet started and let the threads end (those running finish their batch)."""
        self._done = True
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
