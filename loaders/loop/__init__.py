"""mmfeed.loaders.loop: the training loop's side of loading.

:class:`~mmfeed.loaders.loop.dataloader.DataLoader` (torch's DataLoader, wrapped: same arguments, same batches,
plus device prefetch, timing and exact resume), :mod:`~mmfeed.loaders.loop.prefetch` (batches copied to the device
on a side stream ahead of the step), :mod:`~mmfeed.loaders.loop.threads` (workers as threads of the training
process), :mod:`~mmfeed.loaders.loop.shm` (shared-memory buffers recycled between workers and the loop),
:mod:`~mmfeed.loaders.loop.epochs` (the one owner of the epochs' position: cursor, index, chain of epochs, the
loop's iterator, the loader's state), :mod:`~mmfeed.loaders.loop.epoch_iter` (one epoch as the loop iterates it),
:mod:`~mmfeed.loaders.loop.resume` (the position's record, and how each order source resumes),
:mod:`~mmfeed.loaders.loop.heap` (the free heap a worker process gives back between epochs) and
:mod:`~mmfeed.loaders.loop.dist` (rank, world size and worker of this process).
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

_EXPORTS = {
    "DataLoader": "mmfeed.loaders.loop.dataloader",
    "DevicePrefetcher": "mmfeed.loaders.loop.prefetch",
    "DistInfo": "mmfeed.loaders.loop.dist",
    "dist_info": "mmfeed.loaders.loop.dist",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
