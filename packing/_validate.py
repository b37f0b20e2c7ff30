"""Input checks shared by the packing modules: turn user input into int64 arrays and ints, or raise ValueError."""

from __future__ import annotations

import numbers

import numpy as np


def as_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as a Python int (bools and floats refused), checked against ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def as_lengths(lengths: object, name: str = "lengths") -> np.ndarray:
    """``lengths`` as a contiguous 1-D int64 array of non-negative integers.

    Integer-valued floats (``3.0``) are accepted; fractional, NaN, infinite, negative and boolean values are not.
    """
    if isinstance(lengths, (str, bytes)):
        raise ValueError(f"{name} must be a 1-D array of non-negative integers, got a string {lengths!r}")
    arr = np.asarray(lengths)
    if arr.dtype == np.bool_:
        raise ValueError(f"{name} must hold integers, got booleans; convert with .astype(np.int64) if intended")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}; flatten it or pass one sequence per call")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.floor(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name} must be integers, got {arr[i]!r} at index {i}")
        if np.abs(arr).max() >= 2.0**62:
            raise ValueError(f"{name} are too large for int64: max {arr.max()!r}")
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "u":
        if arr.dtype.itemsize == 8 and arr.max() > np.iinfo(np.int64).max:
            raise ValueError(f"{name} are too large for int64: max {arr.max()!r}")
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "i":
        arr = arr.astype(np.int64, copy=False)
    elif arr.dtype.kind == "O":
        try:
            return as_lengths(np.array([as_int(f"{name}[{i}]", v) for i, v in enumerate(arr)], dtype=np.int64), name)
        except OverflowError as err:
            raise ValueError(f"{name} are too large for int64: {err}") from None
    else:
        raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.min() < 0:
        i = int(np.argmin(arr))
        raise ValueError(f"{name} must be >= 0, got {arr[i]} at index {i}")
    return np.ascontiguousarray(arr)


def as_capacity(capacity: object) -> int:
    """The row capacity as an int >= 1."""
    return as_int("capacity", capacity, 1)


def check_choice(name: str, value: object, choices: dict | tuple | list | frozenset) -> str:
    """``value`` if it is one of ``choices`` (a registry's keys), else ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {sorted(choices)}")
    return value
