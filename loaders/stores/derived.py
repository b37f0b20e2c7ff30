"""Columns derived from a dataset's metadata, kept once per node: what a reader computes from metadata files at open
(a LeRobot directory's episode columns from ``meta/episodes``, whose footers alone take seconds at a million
episodes) is written to ``$MMFEED_CACHE/derived/<key>/`` as ``.npy`` files, and every later open on the node, by any
rank or process, maps them instead (copy-on-write: a reader may change its copy, never the cache).

The key names the dataset, the reader's derivation and the stamps (size and mtime, or remote size and modification
time) of every metadata file it read, so a changed file is derived again. The folder is written under a temporary
name and renamed into place: ranks that derive at once each write their own, and the first rename wins. A cache
that cannot be written (a read-only disk) only costs the next open its derivation again, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["derived_dir", "key_of", "load", "save"]

log = logging.getLogger(__name__)

_DONE = "columns.json"


def derived_dir() -> Path:
    """``$MMFEED_CACHE/derived`` (default ``~/.cache/mmfeed/derived``)."""
    return Path(os.environ.get("MMFEED_CACHE") or Path.home() / ".cache" / "mmfeed") / "derived"


def key_of(*parts: Any) -> str:
    """The cache key of ``parts`` (JSON-serializable: the dataset, the derivation's version, the files' stamps)."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load(key: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The arrays (mapped copy-on-write) and the JSON ``extra`` saved under ``key``, or None when there are none."""
    folder = derived_dir() / key
    try:
        info = json.loads((folder / _DONE).read_text())
        arrays = {name: np.load(folder / f"{i}.npy", mmap_mode="c", allow_pickle=False)
                  for i, name in enumerate(info["arrays"])}
    except (OSError, ValueError, KeyError) as err:
        if folder.exists():
            log.warning("%s: unreadable derived columns (%s); deriving them again", folder, err)
        return None
    return arrays, info.get("extra", {})


def save(key: str, arrays: Mapping[str, np.ndarray], extra: Mapping[str, Any]) -> bool:
    """Write ``arrays`` (numeric numpy arrays) and ``extra`` (JSON) under ``key``; False, with a warning, where
    the cache cannot be written. Another process's folder already in place is kept."""
    root = derived_dir()
    folder = root / key
    if (folder / _DONE).exists():
        return True
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        names = list(arrays)
        for i, name in enumerate(names):
            np.save(tmp / f"{i}.npy", np.ascontiguousarray(arrays[name]), allow_pickle=False)
        (tmp / _DONE).write_text(json.dumps({"arrays": names, "extra": dict(extra)}))
        try:
            os.replace(tmp, folder)
        except OSError:  # another process renamed its folder into place first
            shutil.rmtree(tmp, ignore_errors=True)
        return True
    except OSError as err:
        log.warning("%s: cannot keep derived columns there (%s); the next open derives them again", root, err)
        return False
