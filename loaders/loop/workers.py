"""The worker processes of an mmfeed DataLoader: what they run first, and how they are started.

:class:`WorkerInit` is the ``worker_init_fn`` the torch loader gets: the worker watches the process that started it
(:func:`exit_with_parent`), turns its payload pool on where the loader recycles buffers, then runs the user's.
:func:`start_torch_iterator` is ``iter(torch_loader)``, with the garbage of this process kept out of reach of the
workers it forks.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.context
import multiprocessing.queues
import os
import queue
import threading
import time
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

from torch.utils.data import DataLoader as TorchDataLoader

from mmfeed.codecs.nt_copy import warm
from mmfeed.loaders.shm import enable_pool

__all__ = ["PARENT_POLL_S", "DirectQueue", "WorkerInit", "direct_queues", "exit_with_parent", "start_torch_iterator"]

PARENT_POLL_S = 0.5


class WorkerInit:
    """worker_init_fn of mmfeed's worker processes: watch the parent (:func:`exit_with_parent`), turn the
    worker's payload pool on where the loader recycles buffers (``per_key``), then run the user's."""

    def __init__(self, per_key: int | None, inner: Any) -> None:
        self.per_key, self.inner = per_key, inner

    def __call__(self, worker_id: int) -> None:
        exit_with_parent()
        if self.per_key is not None:
            enable_pool(self.per_key)
        if self.inner is not None:
            self.inner(worker_id)


def exit_with_parent() -> None:
    """End this worker process within :data:`PARENT_POLL_S` of its parent's death (a training process killed
    with SIGKILL, by the OOM killer say). torch's worker loop notices a dead parent too, but then exits through
    multiprocessing's finalizers, which join the result queue's feeder thread: a feeder blocked on a full result
    pipe (batches pickled by value) never returns, because the workers hold that pipe's read end themselves, and
    the worker lives on for ever. A daemon thread ends the process with ``os._exit`` once the process that forked
    it is gone (its pid changes: the training process under fork and spawn, the fork server under forkserver,
    which ends with the training process) or multiprocessing's parent sentinel says the training process is."""
    forked_by = os.getppid()
    parent = multiprocessing.parent_process()

    def watch() -> None:
        while os.getppid() == forked_by and (parent is None or parent.is_alive()):
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="mmfeed-parent-watch", daemon=True).start()


class DirectQueue(multiprocessing.queues.Queue):
    """A multiprocessing queue whose ``put`` pickles and writes in the calling thread: no feeder thread, so
    no thread woken per message on either side (the training process puts an index, a worker puts a batch).
    ``put`` returns once the message is in the pipe, so it blocks while the pipe is full; that suits messages
    that are small and few in flight, as a recycling loader's are (indices, and batches whose payload is in
    shared memory: a batch of handles), and only those. A message that cannot be pickled raises in ``put``."""

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        if not self._sem.acquire(block, timeout):
            raise queue.Full
        try:
            data = ForkingPickler.dumps(obj)
        except BaseException:
            self._sem.release()
            raise
        if self._wlock is None:  # one process end per pipe end (Windows): no lock to take
            self._writer.send_bytes(data)
        else:
            with self._wlock:
                self._writer.send_bytes(data)


_DIRECT: dict[type, type] = {}


def direct_queues(context: Any = None) -> multiprocessing.context.BaseContext:
    """``context`` (a multiprocessing context, its start method's name, or None for the default) whose
    ``Queue()`` is a :class:`DirectQueue`, for torch's loader (``multiprocessing_context=``): the index and
    result queues of its workers."""
    if context is None or isinstance(context, str):
        context = multiprocessing.get_context(context)
    context = context.get_context()  # the default context: the one it stands for
    kind = _DIRECT.get(type(context))
    if kind is None:
        def direct_queue(self: Any, maxsize: int = 0) -> DirectQueue:
            return DirectQueue(maxsize, ctx=self)

        kind = _DIRECT[type(context)] = type(f"Direct{type(context).__name__}", (type(context),),
                                             {"Queue": direct_queue, "__module__": __name__})
    direct = kind.__new__(kind)
    direct.__dict__.update(context.__dict__)
    return direct


class _ForkedWorkers:
    """While this process forks DataLoader workers (``with FORKS:``), each child freezes the garbage collector's
    view of what it inherited (``gc.freeze()``, in the child, right after the fork, before it runs any Python).

    A forked worker inherits every object of this process, the unreachable ones too; its own collector would then
    tear down, say, a video decoder in a reference cycle made here, which can wait forever on threads that exist
    only in this process. Frozen, the inherited objects are never collected in the worker (the objects the worker
    makes itself are, as usual); this process collects its garbage itself, where it was made, whenever its
    collector runs. It costs nothing here: the alternative, collecting this process's whole heap before each fork,
    costs a full garbage collection per ``iter(loader)`` (a second for a large training process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forking = 0
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    def __enter__(self) -> None:
        with self._lock:
            self._forking += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._forking -= 1

    def _after_fork_in_child(self) -> None:
        if self._forking:
            gc.freeze()
            self._forking = 0  # the worker's own forks are its business
            self._lock = threading.Lock()  # a lock held by another thread at the fork stays held in the child


FORKS = _ForkedWorkers()


def start_torch_iterator(loader: TorchDataLoader) -> Iterator[Any]:
    """``iter(loader)``; the workers it forks leave this process's garbage alone (see :class:`_ForkedWorkers`;
    under spawn and forkserver, and when persistent workers run on, nothing is forked here and nothing happens)."""
    if loader.num_workers == 0:
        return iter(loader)
    warm()  # the frame copy's compiled kernel, loaded once here rather than in every forked worker
    with FORKS:
        return iter(loader)
