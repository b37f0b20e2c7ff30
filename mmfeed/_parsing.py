"""Command-line value parsers shared by ``mmfeed``'s commands and the benchmarks' own command lines."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["height_width", "positive"]


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


def height_width(text: str) -> tuple[int, int]:
    """``(height, width)`` from ``HEIGHTxWIDTH`` (both even, >= 2), for argparse's ``type=`` (``--frame-size``)."""
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write the frame size as HEIGHTxWIDTH, e.g. 224x224") from None
    if min(height, width) < 2 or height % 2 or width % 2:
        raise argparse.ArgumentTypeError(f"{text!r}: height and width must be even and >= 2")
    return height, width
