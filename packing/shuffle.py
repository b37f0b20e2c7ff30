"""A seeded, bijective shuffle of ``[0, n)`` computed per position: O(1) memory at any ``n``.

``index_shuffle(positions, n, seed=, epoch=)`` is the id at each position of the epoch's shuffled order. It is a
permutation of ``[0, n)`` (every id exactly once), random access (position ``p`` costs the same whatever ``p``)
and a pure function of ``(n, seed, epoch)``, so a plan over a billion samples never holds the order: each rank
and worker computes the ids of the positions it loads.

Construction: a balanced Feistel network on ``2 * h`` bits (``4**h >= n``, so the domain is under ``4 n``) with
six rounds keyed by ``(seed, epoch)`` through splitmix64, made to stay inside ``[0, n)`` by cycle walking (a
value outside is encrypted again until it lands inside; that keeps the map a bijection of ``[0, n)``).

>>> import numpy as np
>>> ids = index_shuffle(np.arange(10), 10, seed=0, epoch=0)
>>> sorted(ids.tolist()) == list(range(10))
True
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
from numba import njit

__all__ = ["index_shuffle", "shuffle_keys"]

_ROUNDS = 6


@njit(cache=True, inline="always")
def _mix(z):
    """splitmix64's finaliser (uint64 -> uint64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def shuffle_keys(seed: int, epoch: int, stream: int = 0) -> np.ndarray:
    """uint64 ``[6]``: the round keys of ``(seed, epoch)`` (read-only); ``stream > 0`` gives other, independent
    keys of the same ``(seed, epoch)``, for several orders drawn in one epoch."""
    if any(isinstance(v, bool) or int(v) < 0 for v in (seed, epoch, stream)):
        raise ValueError(f"seed, epoch and stream must be integers >= 0, got {seed!r}, {epoch!r} and {stream!r}")
    return _keys(int(seed), int(epoch), int(stream))


_RECENT_EPOCHS = 4
# (seed, epoch) -> stream -> keys, of the few epochs planned last (a chained loader plans the next epoch while the
# loop is in this one): an epoch's steps ask for its keys again and again, a past epoch's never; a cache keyed by
# epoch alone kept every epoch's keys in every persistent worker
_recent: OrderedDict[tuple[int, int], dict[int, np.ndarray]] = OrderedDict()
_recent_lock = threading.Lock()


def _keys(seed: int, epoch: int, stream: int) -> np.ndarray:
    with _recent_lock:
        streams = _recent.get((seed, epoch))
        if streams is None:
            streams = _recent[seed, epoch] = {}
            while len(_recent) > _RECENT_EPOCHS:
                _recent.popitem(last=False)
        else:
            _recent.move_to_end((seed, epoch))
        keys = streams.get(stream)
    if keys is None:
        entropy = [seed, epoch, 0x6D6D66656564]  # seed, epoch, "mmfeed"
        state = np.random.SeedSequence(entropy + [stream] if stream else entropy)
        keys = state.generate_state(_ROUNDS, dtype=np.uint64)
        keys.flags.writeable = False
        with _recent_lock:
            streams[stream] = keys
    return keys


@njit(cache=True)
def _shuffle_kernel(positions, n, half, keys, out):
    mask = (np.uint64(1) << np.uint64(half)) - np.uint64(1)
    h = np.uint64(half)
    un = np.uint64(n)
    for i in range(positions.size):
        x = np.uint64(positions[i])
        while True:
            left, right = x >> h, x & mask
            for r in range(keys.size):
                left, right = right, left ^ (_mix(right ^ keys[r]) & mask)
            x = (left << h) | right
            if x < un:
                break
        out[i] = np.int64(x)


def index_shuffle(positions: np.ndarray | int, n: int, *, seed: int, epoch: int, stream: int = 0) -> np.ndarray:
    """int64, shaped like ``positions``: the sample id at each position of the shuffled order of ``[0, n)``
    (``stream``: one of several independent orders of the same ``(seed, epoch)``)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    pos = np.asarray(positions)
    if pos.size and (pos.dtype.kind not in "iu" or pos.min() < 0 or pos.max() >= n):
        raise ValueError(f"positions must be integers in [0, {n}), got {pos.dtype} in "
                         f"[{pos.min()}, {pos.max()}]")
    flat = np.ascontiguousarray(pos, dtype=np.int64).reshape(-1)
    out = np.empty(flat.size, np.int64)
    if n <= 1:
        out[:] = flat
    else:
        half = max(1, (int(n - 1).bit_length() + 1) // 2)
        _shuffle_kernel(flat, int(n), half, shuffle_keys(seed, epoch, stream), out)
    return out.reshape(pos.shape)
