"""HDF5 demonstrations as research code keeps them: robomimic's layout (also LIBERO's: ``data/demo_<k>/...``,
``mask/<split>``, the instruction in ``problem_info``) and ACT/ALOHA's (one file per episode: ``/action``,
``/observations/qpos``, ``/observations/images/<camera>``, raw or JPEG). :mod:`.metadata` reads and checks what
the files hold; :mod:`.source` is the episode reader (:class:`~mmfeed.loaders.formats.hdf5.source.Hdf5Source`).
Reading needs h5py (``pip install 'mmfeed[hdf5]'``); these files record no frame rate, so ``fps=`` is required.

Its ``detect`` names a local ``.hdf5`` / ``.h5`` file, or a folder that holds such files (and no LeRobot
metadata, which is asked first), reading nothing.
"""

from __future__ import annotations

import os

from mmfeed.loaders.formats import Format
from mmfeed.loaders.formats.hdf5.metadata import HDF5_SUFFIXES
from mmfeed.loaders.formats.hdf5.source import Hdf5Source

__all__ = ["FORMAT", "Hdf5Source"]


def detect(path: str) -> str | None:
    """``path`` when it is a local HDF5 file or a folder holding HDF5 files, else None."""
    local = path.removeprefix("file://")
    if "://" in local:
        return None
    if os.path.isfile(local):
        return local if local.lower().endswith(HDF5_SUFFIXES) else None
    if os.path.isdir(local):
        try:
            entries = os.scandir(local)
        except OSError:
            return None
        with entries:
            if any(e.name.lower().endswith(HDF5_SUFFIXES) and e.is_file() for e in entries):
                return local
    return None


FORMAT = Format("hdf5", Hdf5Source, detect)
