"""Command-line value parsers shared by ``mmfeed``'s commands and the benchmarks' own command lines."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["positive"]


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
