"""The project's Python files (library, benchmarks, tests, examples) keep lines to 120 characters."""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package (the dev extra installs it there)
    import tomli as tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
FOLDERS = (*LIBRARY, "tests", "examples")  # the library's folders as pyproject maps them, and the rest
WIDTH = 120


def test_every_line_fits_in_120_characters():
    assert {"packing", "loaders", "codecs", "bench", "mmfeed"} <= set(FOLDERS)
    long = [f"{path.relative_to(ROOT)}:{n}: {len(line)}"
            for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > WIDTH]
    assert long == []
