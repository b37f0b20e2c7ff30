"""Zarr ReplayBuffers as diffusion_policy and UMI keep demonstrations: ``data/<column>`` arrays of every step back
to back, cut into episodes by ``meta/episode_ends``. :mod:`.metadata` reads and checks the episode ends against the
arrays; :mod:`.source` is the episode reader (:class:`~mmfeed.loaders.formats.zarr.source.ZarrSource`). Reading
needs zarr (``pip install 'mmfeed[zarr]'``); a ReplayBuffer records no frame rate, so ``fps=`` is required.

Its ``detect`` names a local directory holding ``meta/episode_ends`` (zarr format 2 or 3), a local ``*.zarr.zip``
file, or a URL ending in ``.zarr``, reading nothing.
"""

from __future__ import annotations

import os

from mmfeed.loaders.formats import Format
from mmfeed.loaders.formats.zarr.metadata import is_replay_buffer
from mmfeed.loaders.formats.zarr.source import ZarrSource

__all__ = ["FORMAT", "ZarrSource"]


def detect(path: str) -> str | None:
    """``path`` when it is a ReplayBuffer store (see the module docstring), else None."""
    if "://" in path and not path.startswith("file://"):
        return path if path.rstrip("/").endswith(".zarr") else None
    local = path.removeprefix("file://")
    if is_replay_buffer(local):
        return local
    if os.path.isfile(local) and local.endswith(".zarr.zip"):
        return local
    return None


FORMAT = Format("zarr", ZarrSource, detect)
