"""The one error type of :mod:`mmfeed.codecs`.

:class:`DecodeError` subclasses :class:`ValueError`: every case it covers is a problem with the input (a bad
index or time, a file that is not a readable video, a codec the chosen backend cannot read), so code that already
handles bad input with ``except ValueError`` keeps working, and code that wants to tell decode failures apart
catches ``DecodeError``.
"""

from __future__ import annotations

__all__ = ["DecodeError"]


class DecodeError(ValueError):
    """A video, array or text payload that cannot be decoded as asked.

    The message always names the file (or key); the attributes carry the same facts for programs:

    - ``path``: the file or key, as given (``"<N bytes in memory>"`` for in-memory sources)
    - ``index`` / ``timestamp``: the requested frame index or time in seconds, when one was at fault
    - ``num_frames`` / ``duration``: the video's length in frames and seconds, when known

    >>> err = DecodeError("clip.mp4: frame 9 is out of range", path="clip.mp4", index=9, num_frames=5)
    >>> isinstance(err, ValueError), err.num_frames
    (True, 5)
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        index: int | None = None,
        timestamp: float | None = None,
        num_frames: int | None = None,
        duration: float | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.index = index
        self.timestamp = timestamp
        self.num_frames = num_frames
        self.duration = duration
