"""Command-line value parsers shared by ``mmfeed``'s commands and the benchmarks' own command lines."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FRAME_SIZE", "FrameSize", "frame_size", "positive"]

FRAME_SIZE = "WIDTHxHEIGHT"
"""How every frame-size flag of the command lines is written (ffmpeg's order), its metavar and its help's word."""


def positive(kind: type, minimum: float) -> Callable[[str], float]:
    """A parser of a number of ``kind`` no smaller than ``minimum``, for argparse's ``type=``."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum:g}")
        return value

    return parse


@dataclass(frozen=True)
class FrameSize:
    """A frame size read from the command line as ``WIDTHxHEIGHT``. Not a tuple on purpose: the Python APIs take
    ``(height, width)`` (``open_dataset(frame_size=(H, W))``, as torchvision), so a caller says which with
    :attr:`hw` and the two orders are never confused by unpacking."""

    width: int
    height: int

    @property
    def hw(self) -> tuple[int, int]:
        """``(height, width)``, what ``frame_size=`` of the Python APIs takes."""
        return self.height, self.width

    def __str__(self) -> str:
        return f"{self.width}x{self.height}"


def frame_size(min_width: int = 2, min_height: int = 2) -> Callable[[str], FrameSize]:
    """A parser of ``WIDTHxHEIGHT`` (both even, at least ``min_width`` and ``min_height``) into a
    :class:`FrameSize`, for argparse's ``type=``: every frame-size flag of ``mmfeed`` and of the benchmarks."""
    def parse(text: str) -> FrameSize:
        try:
            width, height = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: write the frame size as {FRAME_SIZE}, e.g. 320x240 "
                                             "(320 wide, 240 high)") from None
        if width < min_width or height < min_height or width % 2 or height % 2:
            raise argparse.ArgumentTypeError(f"{text!r} ({FRAME_SIZE}): the width must be even and >= {min_width}, "
                                             f"the height even and >= {min_height}")
        return FrameSize(width, height)

    return parse
