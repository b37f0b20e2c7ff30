"""The progress bars of ``mmfeed``'s commands: one tqdm bar on stderr, drawn only where a person watches it.

A bar is drawn when it is asked for (``--no-progress`` asks not) and stderr is a terminal; into a pipe, a file or
a CI log it draws nothing at all (no carriage returns, no partial lines), while its ``update``,
``set_postfix_str`` and ``close`` still work, so callers never test for it.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar", "shows_progress"]


def shows_progress(enabled: bool = True, stream: Any = None) -> bool:
    """Whether a bar would be drawn: ``enabled`` and ``stream`` (default stderr) a terminal."""
    stream = sys.stderr if stream is None else stream
    if not enabled or stream is None:
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def progress_bar(total: int | None = None, *, desc: str, unit: str, enabled: bool = True, initial: int = 0) -> Any:
    """A ``tqdm`` bar on stderr of ``total`` ``unit``s (None: a count without an end), labelled ``desc``, that
    draws only when :func:`shows_progress` (``enabled`` and stderr a terminal); it leaves no line behind."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr,
                disable=not shows_progress(enabled), leave=False, dynamic_ncols=True, mininterval=0.5)
