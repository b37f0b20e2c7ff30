"""A dataset's metadata checked against its data when it opens: what every format's checks share.

A dataset a stranger published is untrusted input: its metadata may disagree with its data by accident or on
purpose, and a reader that believes it trains on wrong rows (an episode's rows pointing at another episode's,
read under the wrong task and video) or plans without end (an index length of ``10**12`` on a 19-row episode).
Each format checks its own metadata, vectorized over the episodes so a million-episode dataset still opens in
about a second (LeRobot v3: :mod:`mmfeed.loaders.formats.lerobot.metadata`; webdataset shard indexes:
:mod:`mmfeed.loaders.formats.webdataset.metadata`), and reports what it found as a :class:`Verdict`.

A disagreement is a ValueError naming the file, the episode and both values; with ``errors="skip"``
(:class:`~mmfeed.loaders.sources.options.ReadOptions`) the episodes that disagree are left out of the dataset
instead (:func:`settle`), each listed in the source's ``skipped`` (``{"episode", "source", "reason"}``) and
counted in a warning. An episode is never given another episode's rows either way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ERROR_CHOICES", "Verdict", "is_number", "is_rate", "settle", "shown"]

log = logging.getLogger(__name__)

ERROR_CHOICES = ("raise", "skip")
"""What opening does with an episode whose metadata disagrees with the data: refuse the dataset, or leave it out."""


def shown(value: Any) -> str:
    """A value for a message, never the whole of a large one: numbers and short strings as they are, containers
    and long strings by their type and size."""
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a string of {len(value)} characters"
    if isinstance(value, (list, tuple, dict)):
        kind = "an object" if isinstance(value, dict) else "a list"
        return f"{kind} of {len(value)} items"
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_rate(value: Any) -> bool:
    """A finite number > 0 (ints of any size included; float() of a huge int is inf, which is refused)."""
    try:
        return is_number(value) and 0 < float(value) < math.inf
    except OverflowError:
        return False


class Verdict:
    """Which episodes disagree with their data: ``bad`` (bool over the episodes) are left out under
    ``errors="skip"``, ``strict`` (``bad`` and more, e.g. rows between two episodes) refused under "raise";
    ``reason(k)`` says why (one line naming the file, the episode and both values) and ``what(k)`` is
    ``(episode, file)`` for the record of a skipped one."""

    def __init__(self, bad: np.ndarray, reason: Callable[[int], str], what: Callable[[int], tuple[Any, str]],
                 strict: np.ndarray | None = None) -> None:
        self.bad, self.reason, self.what = bad, reason, what
        self.strict = bad if strict is None else strict


def settle(verdict: Verdict, errors: str, name: str) -> tuple[np.ndarray | None, list[dict]]:
    """What opening does with ``verdict``: ``(None, [])`` when every episode passes; under ``errors="raise"`` the
    first bad episode's reason as a ValueError; under "skip" the mask of the episodes kept and one record
    ``{"episode", "source", "reason"}`` per episode left out (counted in a warning). An error when none is left."""
    if errors != "skip":
        if verdict.strict.any():
            raise ValueError(verdict.reason(int(np.flatnonzero(verdict.strict)[0])))
        return None, []
    bad = verdict.bad
    if not bad.any():
        return None, []
    first = int(np.flatnonzero(bad)[0])
    if bad.all():
        raise ValueError(f"{name}: every episode's metadata disagrees with the data (errors='skip' leaves none); "
                         f"the first: {verdict.reason(first)}")
    skipped = []
    for k in np.flatnonzero(bad).tolist():
        episode, source = verdict.what(k)
        skipped.append({"episode": episode, "source": source, "reason": verdict.reason(k)})
    log.warning("%s: %d episode(s) skipped, their metadata disagreeing with the data (errors='skip'); the first: %s",
                name, len(skipped), skipped[0]["reason"])
    return ~bad, skipped
