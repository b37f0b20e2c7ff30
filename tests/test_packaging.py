"""What `pip install mmfeed` ships is the whole library: pyproject.toml lists every package folder of the four
roots it maps, each folder is a package, the version has one source, and the wheel built from the checkout holds
every module (imported from a fresh venv in CI's wheel check, `.ci/wheel_check.py`)."""

from __future__ import annotations

import subprocess
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package (the dev extra installs it there)
    import tomli as tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Every folder under a mapped root that holds Python modules, by the package name it must ship as."""
    setup = PYPROJECT["tool"]["setuptools"]
    roots = {name: ROOT / folder for name, folder in setup["package-dir"].items()}
    out = {}
    for name, folder in roots.items():
        for sub in [folder, *sorted(p for p in folder.rglob("*") if p.is_dir())]:
            if sub.name == "__pycache__" or not any(sub.glob("*.py")):
                continue
            out[".".join([name, *sub.relative_to(folder).parts])] = sub
    return out


def test_every_package_folder_is_listed_and_is_a_package():
    """A new folder of modules under packing/, loaders/, codecs/, bench/ or mmfeed/ fails here until pyproject
    lists it (the wheel would leave it out, and `import` would fail for whoever installed it)."""
    folders = package_folders()
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert set(folders) == listed, {"not listed": sorted(set(folders) - listed),
                                    "no folder": sorted(listed - set(folders))}
    assert [name for name, folder in folders.items() if not (folder / "__init__.py").exists()] == []


def test_version_has_one_source_and_the_release_files_exist():
    import mmfeed

    assert PYPROJECT["project"]["dynamic"] == ["version"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mmfeed.__version__"}
    assert f"## {mmfeed.__version__}" in (ROOT / "CHANGELOG.md").read_text(), "the changelog names this version"
    assert "Apache License" in (ROOT / "LICENSE").read_text() and PYPROJECT["project"]["license"] == "Apache-2.0"
    assert (ROOT / "mmfeed" / "py.typed").exists()
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["mmfeed"] == ["py.typed"]


@pytest.mark.slow
def test_the_wheel_holds_every_module(tmp_path):
    """Built as a user's pip builds it: every .py of the mapped folders lands under its package, with py.typed,
    the licence and the console script."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("mmfeed-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"{dotted.replace('.', '/')}/{py.name}" for dotted, folder in package_folders().items()
            for py in folder.glob("*.py")}
    assert want - names == set()
    assert "mmfeed/py.typed" in names
    dist_info = {n.split("/", 1)[1] for n in names if n.startswith("mmfeed-") and ".dist-info/" in n}
    assert "licenses/LICENSE" in dist_info and "entry_points.txt" in dist_info
