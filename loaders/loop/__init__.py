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

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from mmfeed._lazy import lazy_exports

MOVED = {"shm": "mmfeed.loaders.shm", "heap": "mmfeed.loaders.heap"}
"""Old module name under ``mmfeed.loaders.loop`` -> where it lives now."""


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``mmfeed.loaders.loop.<old>`` as the module now at ``MOVED[old]`` (the same module object, so its
    pool, registry and classes are the ones every other importer sees)."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, leaf = fullname.rpartition(".")
        if prefix != __name__ or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name.rpartition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.append(_Moved())

_EXPORTS = {
    "DataLoader": "mmfeed.loaders.loop.dataloader",
    "DevicePrefetcher": "mmfeed.loaders.loop.prefetch",
    "DistInfo": "mmfeed.loaders.loop.dist",
    "dist_info": "mmfeed.loaders.loop.dist",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
