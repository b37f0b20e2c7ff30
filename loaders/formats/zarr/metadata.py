"""What a Zarr ReplayBuffer holds, read from its metadata and ``meta/episode_ends`` alone, and checked: the episode
ends are a non-decreasing list of row counts within every ``data/`` array's rows. What disagrees is a one-line
ValueError naming the store and the key.

The layout is diffusion_policy's ``ReplayBuffer`` (also UMI's): a group ``data`` of arrays, one row per step of
every episode back to back (``img``, ``state``, ``action``, ...; nested groups too), and ``meta/episode_ends``,
int64 ``[E]``, the row after each episode's last. Zarr formats 2 and 3 read alike, from a directory store, a
``.zip`` store (UMI ships ``*.zarr.zip``) or an fsspec URL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["LAYOUTS", "ZIP_SUFFIX", "array_columns", "episode_ends", "is_replay_buffer", "open_root", "zarr_module"]

LAYOUTS = ("replay_buffer",)
ZIP_SUFFIX = ".zip"
_META = ("meta/episode_ends/.zarray", "meta/episode_ends/zarr.json")


def zarr_module() -> Any:
    """The zarr module, or an ImportError naming the extra that installs it."""
    try:
        import zarr
    except ImportError as err:
        raise ImportError("reading Zarr ReplayBuffers needs zarr: pip install 'mmfeed[zarr]' (or pip install zarr)"
                          ) from err
    return zarr


def is_replay_buffer(path: str) -> bool:
    """Whether the local directory ``path`` holds ``meta/episode_ends`` (zarr format 2 or 3); nothing is read."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, m)) for m in _META)


def open_root(path: str) -> Any:
    """The root group of the store at ``path`` (a directory, a ``.zip`` file or an fsspec URL), read-only; a store
    zarr cannot open is a ValueError naming it."""
    zarr = zarr_module()
    try:
        if path.endswith(ZIP_SUFFIX) and "://" not in path:
            storage = getattr(zarr, "storage", zarr)
            store = storage.ZipStore(path, mode="r")
            return zarr.open_group(store, mode="r")
        return zarr.open_group(path, mode="r")
    except (OSError, ValueError, KeyError, TypeError) as err:
        if isinstance(err, FileNotFoundError) and not os.path.exists(path) and "://" not in path:
            raise
        reason = " ".join(str(err).split()) or type(err).__name__
        major = int(str(getattr(zarr, "__version__", "3")).split(".")[0] or 3)
        if major < 3 and "://" not in path and os.path.isfile(os.path.join(path, "zarr.json")):
            raise ValueError(f"{path}: the store is in zarr format 3, which zarr {zarr.__version__} cannot read; "
                             "pip install 'zarr>=3' (Python 3.11 or later)") from err
        raise ValueError(f"{path}: not a readable Zarr store ({reason})") from err


def _get(group: Any, key: str, where: str, what: str) -> Any:
    try:
        return group[key]
    except KeyError:
        raise ValueError(f"{where}: {what} {key!r} is missing; a ReplayBuffer keeps its steps' arrays in data/ and "
                         "the row after each episode in meta/episode_ends") from None


def episode_ends(root: Any, where: str) -> np.ndarray:
    """``meta/episode_ends`` as int64 ``[E]``, checked: one dimension, non-decreasing, none negative."""
    meta = _get(root, "meta", where, "group")
    ends = _get(meta, "episode_ends", where, "array")
    try:
        values = np.asarray(ends[...])
    except Exception as err:  # noqa: BLE001 - a torn chunk or codec failure, named with the key
        raise ValueError(f"{where}: meta/episode_ends cannot be read ({' '.join(str(err).split())})") from err
    if values.ndim != 1 or values.dtype.kind not in "iu":
        raise ValueError(f"{where}: meta/episode_ends is {values.dtype} {list(values.shape)}; it must be integers "
                         "[episodes]")
    values = values.astype(np.int64)
    if len(values) and (values[0] < 0 or (np.diff(values) < 0).any()):
        k = 0 if values[0] < 0 else int(np.flatnonzero(np.diff(values) < 0)[0]) + 1
        raise ValueError(f"{where}: meta/episode_ends[{k}] = {int(values[k])} goes back (the ends must be "
                         "non-decreasing row counts)")
    return values


def _walk(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    zarr = zarr_module()
    for name, item in sorted(group.members() if hasattr(group, "members") else group.items()):
        path = f"{prefix}{name}"
        if isinstance(item, zarr.Group):
            yield from _walk(item, f"{path}/")
        else:
            yield path, item


def array_columns(root: Any, ends: np.ndarray, where: str) -> dict[str, str]:
    """``{feature: path under data/}`` of every numeric array in ``data/`` (nested groups joined with "."),
    checked against the episode ends: each has at least ``ends[-1]`` rows."""
    data = _get(root, "data", where, "group")
    rows = int(ends[-1]) if len(ends) else 0
    out = {}
    for path, array in _walk(data):
        if len(array.shape) == 0 or np.dtype(array.dtype).kind not in "biuf":
            continue
        if array.shape[0] < rows:
            raise ValueError(f"{where}: meta/episode_ends ends at row {rows}, past the {array.shape[0]} rows of "
                             f"data/{path}; the episodes and the data disagree")
        out[path.replace("/", ".")] = path
    if not out:
        raise ValueError(f"{where}: data/ holds no numeric arrays")
    return out
