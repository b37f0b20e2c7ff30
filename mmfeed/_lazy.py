"""Names a package exports but imports on first use, so importing the package (and the ``mmfeed`` command) stays
fast: ``__getattr__, __dir__ = lazy_exports(__name__, {name: module}, __all__)`` in its ``__init__``; and the old
names of modules that moved, kept importable (:func:`moved_modules`)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
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


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``<package>.<old>`` as the module now at ``moved[old]`` (the same module object, so its classes,
    registries and pickles are the ones every other importer sees), with a DeprecationWarning."""

    def __init__(self, package: str, moved: Mapping[str, str]) -> None:
        self.package, self.moved = package, dict(moved)

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, leaf = fullname.rpartition(".")
        if prefix != self.package or leaf not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = self.moved[spec.name.rpartition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # already executed under its new name


def moved_modules(package: str, moved: Mapping[str, str]) -> None:
    """Keep the old names of modules that left ``package`` importable: ``moved`` maps each old module name under
    it to the module's new full name."""
    if not any(isinstance(f, _Moved) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_Moved(package, moved))
