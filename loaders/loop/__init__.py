"""mmfeed.loaders.loop: the training loop's side of loading.

:class:`~mmfeed.loaders.loop.dataloader.DataLoader` (torch's DataLoader, wrapped: same arguments, same batches,
plus device prefetch, timing and exact resume), :mod:`~mmfeed.loaders.loop.prefetch` (batches copied to the device
on a side stream ahead of the step), :mod:`~mmfeed.loaders.loop.threads` (workers as threads of the training
process), :mod:`~mmfeed.loaders.loop.epochs` (the one owner of the epochs' position: cursor, index, chain of epochs,
the loop's iterator, the loader's state), :mod:`~mmfeed.loaders.loop.epoch_iter` (one epoch as the loop iterates
it), :mod:`~mmfeed.loaders.loop.resume` (the position's record, and how each order source resumes) and
:mod:`~mmfeed.loaders.loop.dist` (rank, world size and worker of this process). Two worker-process helpers live
beside the loop rather than in it, because the planned path uses them in the workers and never imports the loop:
:mod:`mmfeed.loaders.shm` (shared-memory buffers recycled between the workers and the loop) and
:mod:`mmfeed.loaders.heap` (the free heap a worker process gives back between epochs). Their old names,
``mmfeed.loaders.loop.shm`` and ``mmfeed.loaders.loop.heap``, still import, as aliases of the new modules, with a
DeprecationWarning.
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports, moved_modules

MOVED = {"shm": "mmfeed.loaders.shm", "heap": "mmfeed.loaders.heap"}
"""Old module name under ``mmfeed.loaders.loop`` -> where it lives now."""
moved_modules(__name__, MOVED)

_EXPORTS = {
    "DataLoader": "mmfeed.loaders.loop.dataloader",
    "DevicePrefetcher": "mmfeed.loaders.loop.prefetch",
    "DistInfo": "mmfeed.loaders.loop.dist",
    "dist_info": "mmfeed.loaders.loop.dist",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
