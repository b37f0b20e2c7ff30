"""One error policy for loading: raise, skip or warn, with a limit on consecutive failures.

Per-sample failures (a truncated video, a member missing from a shard, an array of the wrong shape, NaN in a
float feature) go through :class:`ErrorPolicy`. Under ``"raise"`` (the default) the first one stops training with
an error naming the shard or file, the episode key, the feature and the frame or time. Under ``"skip"`` and ``"warn"``
the failing sample is left out of its batch, which still goes out, so every rank keeps the same number of steps;
each skip is counted and listed (source, episode, reason) in the batch's ``metadata["errors"]`` and in
``mmfeed.DataLoader.stats``; ``"warn"`` also logs it. More than ``max_consecutive_errors`` failures in a row
raise: a dataset that fails everywhere is broken, not noisy. System errors (MemoryError, KeyboardInterrupt) are
always fatal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mmfeed.loaders.transport.errors import SampleError

__all__ = ["ERROR_MODES", "NONFINITE_MODES", "ErrorCounter", "ErrorPolicy", "SampleError"]

log = logging.getLogger(__name__)

ERROR_MODES = ("raise", "skip", "warn")
NONFINITE_MODES = ("raise", "mask")


@dataclass(frozen=True, kw_only=True)
class ErrorPolicy:
    """What happens when a sample cannot be loaded.

    on_error: "raise" stops at the first failure; "skip" leaves the sample out and counts it; "warn" also logs.
    max_consecutive_errors: under skip/warn, raise after this many failed samples in a row (per worker).
    nonfinite: NaN or inf in a float array feature: "raise", or "mask" (set to 0 and flagged in
        ``<feature>_is_pad``).
    """

    on_error: str = "raise"
    max_consecutive_errors: int = 10
    nonfinite: str = "raise"

    def __post_init__(self) -> None:
        if self.on_error not in ERROR_MODES:
            raise ValueError(f"on_error must be one of {list(ERROR_MODES)}, got {self.on_error!r}")
        if self.nonfinite not in NONFINITE_MODES:
            raise ValueError(f"nonfinite must be one of {list(NONFINITE_MODES)}, got {self.nonfinite!r}")
        if isinstance(self.max_consecutive_errors, bool) or not isinstance(self.max_consecutive_errors, int) \
                or self.max_consecutive_errors < 1:
            raise ValueError(f"max_consecutive_errors must be an int >= 1, got {self.max_consecutive_errors!r}")


class ErrorCounter:
    """Running count of consecutive failures in one process (kept apart from the frozen policy)."""

    def __init__(self, policy: ErrorPolicy) -> None:
        self.policy = policy
        self.consecutive = 0

    def failed(self, record: dict) -> None:
        self.consecutive += 1
        if self.policy.on_error == "warn":
            log.warning("skipped sample %s of %s: %s", record.get("sample"), record.get("source"), record["reason"])
        if self.consecutive > self.policy.max_consecutive_errors:
            raise SampleError(f"{self.consecutive} samples in a row failed (max_consecutive_errors="
                              f"{self.policy.max_consecutive_errors}); last: {record['reason']}")

    def succeeded(self) -> None:
        self.consecutive = 0
