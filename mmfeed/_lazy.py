"""Names a package exports but imports on first use, so importing the package (and the ``mmfeed`` command) stays
fast: ``__getattr__, __dir__ = lazy_exports(__name__, {name: module}, __all__)`` in its ``__init__``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str], names: list[str]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps each lazy name to the
    module that defines it; the value is imported once and kept in the package's namespace."""

    def __getattr__(name: str) -> object:
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__
