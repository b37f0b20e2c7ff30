"""Quantiles that merge exactly: a log-bucketed histogram of every value (DDSketch's mapping), whose integer
counts add up in any order, so quantiles of shards indexed one by one, by many processes or on many machines are
the same numbers as those of one pass over everything.

A value ``x`` with ``|x| >= MIN_MAGNITUDE`` falls in bucket ``i = ceil(log_gamma |x|)`` of its sign
(``gamma = (1 + ALPHA) / (1 - ALPHA)``), whose representative ``2 gamma^i / (gamma + 1)`` is within ``ALPHA``
(1%) of every value in the bucket; smaller magnitudes count as 0 and magnitudes above ``MAX_MAGNITUDE`` fall in the
top bucket. :meth:`Sketch.quantiles` reads the order statistics at ranks ``floor(q (n - 1))`` and
``ceil(q (n - 1))`` off the cumulative counts, clamps them into the exact ``[min, max]`` and interpolates linearly
between them, as ``np.quantile``'s default does; each quantile is therefore within ``ALPHA`` times the larger
magnitude of those two order statistics (plus ``MIN_MAGNITUDE``) of ``np.quantile`` of the values: within
``ALPHA`` relative where they are close, as they are in all but tiny or sparse data:

    >>> x = np.random.default_rng(0).normal(size=(1000, 2))
    >>> s = Sketch((2,)); s.add(x[:300]); s.add(x[300:])
    >>> q = s.quantiles(x.min(0), x.max(0))["q90"]
    >>> bool(np.all(np.abs(q - np.quantile(x, 0.9, axis=0)) <= ALPHA * np.abs(np.quantile(x, 0.9, axis=0)) + 1e-9))
    True
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ALPHA", "MAX_ELEMENTS", "QUANTILES", "Sketch"]

ALPHA = 0.01
"""Relative accuracy of every bucket's representative value."""

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
"""The quantiles reported (LeRobot's set; ``Normalize(mode="quantile")`` uses q01 and q99)."""

MIN_MAGNITUDE = 1e-9
MAX_MAGNITUDE = 1e12
MAX_ELEMENTS = 1024
"""Features with more numbers per step than this get no quantiles (each number keeps ~5k counters)."""

_GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LOG_GAMMA = math.log(_GAMMA)
_LO = math.ceil(math.log(MIN_MAGNITUDE) / _LOG_GAMMA)
_HI = math.ceil(math.log(MAX_MAGNITUDE) / _LOG_GAMMA)
_N = _HI - _LO + 1  # buckets per sign; column _N holds zero, _N + 1 + j positive bucket _LO + j, _N - 1 - j negative


class Sketch:
    """Counts of every value of a feature ``[T, *shape]`` per element of the step shape, in log buckets."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.counts = np.zeros((max(1, math.prod(self.shape)), 2 * _N + 1), dtype=np.int64)

    def add(self, values: np.ndarray) -> None:
        """Count ``values`` ``[T, *shape]`` (NaNs are left out)."""
        x = np.asarray(values, dtype=np.float64)
        if math.prod(x.shape[1:]) != len(self.counts) or x.ndim == 0:
            raise ValueError(f"values of step shape {list(np.shape(values)[1:])} do not fit a sketch of {self.shape}")
        d, width = self.counts.shape
        x = x.reshape(len(x), d)
        magnitude = np.abs(x)
        with np.errstate(divide="ignore", invalid="ignore"):
            bucket = np.ceil(np.log(np.maximum(magnitude, MIN_MAGNITUDE)) / _LOG_GAMMA)
        np.clip(bucket, _LO, _HI, out=bucket)
        bucket -= _LO - 1
        column = np.where(magnitude < MIN_MAGNITUDE, 0.0, np.copysign(bucket, x)) + _N
        flat = (column + np.arange(d) * width)[~np.isnan(x)].astype(np.int64)  # one bincount for every element
        self.counts += np.bincount(flat, minlength=self.counts.size).reshape(self.counts.shape)

    def merge(self, other: Sketch) -> None:
        """Add ``other``'s counts (same step shape) to this sketch."""
        if other.counts.shape != self.counts.shape:
            raise ValueError(f"cannot merge a sketch of {other.shape} into one of {self.shape}")
        self.counts += other.counts

    def quantiles(self, minimum: np.ndarray, maximum: np.ndarray) -> dict[str, np.ndarray]:
        """``{"q01", ..., "q99"}`` float64 arrays of the step shape (the shape of ``minimum``), each clamped into
        the exact ``[minimum, maximum]``; NaN where nothing was counted."""
        lo_clamp = np.asarray(minimum, np.float64).reshape(-1)
        hi_clamp = np.asarray(maximum, np.float64).reshape(-1)
        cumulative = np.cumsum(self.counts, axis=1)
        total = cumulative[:, -1]
        out_shape = np.shape(minimum)
        out = {}
        for name, q in QUANTILES.items():
            rank = q * np.maximum(total - 1, 0)
            below, above = np.floor(rank), np.ceil(rank)
            a = self._at(cumulative, below.astype(np.int64), lo_clamp, hi_clamp)
            b = self._at(cumulative, above.astype(np.int64), lo_clamp, hi_clamp)
            value = a + (b - a) * (rank - below)
            out[name] = np.where(total > 0, value, np.nan).reshape(out_shape)
        return out

    @staticmethod
    def _at(cumulative: np.ndarray, rank: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The representative value of the bucket holding order statistic ``rank`` of each row, clamped."""
        column = np.array([np.searchsorted(row, r, side="right") for row, r in zip(cumulative, rank)], np.int64)
        column = np.minimum(column, cumulative.shape[1] - 1)
        signed = column - _N
        index = np.abs(signed) - 1 + _LO
        value = np.where(signed == 0, 0.0, np.sign(signed) * 2 * _GAMMA ** index.astype(np.float64) / (_GAMMA + 1))
        return np.clip(value, lo, hi)
