"""Every example in the library's docstrings runs, and prints what it says it prints.

The examples are what a reader copies from ``help()``; each module's are run here as the package's own module
(``mmfeed.loaders.sources.arrays``, not ``loaders/sources/arrays.py`` by path). Run them this way, not with
``pytest --doctest-modules FILE``: a file imported under another name (``loaders.stores.parquet_direct``) leaves
numba's cache beside it holding kernels of a module ``loaders``, which an installed mmfeed then fails to load.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

from test_layering import MODULES

WITH_EXAMPLES = sorted(name for name, path in MODULES.items()
                       if not name.endswith(".__main__") and ">>> " in path.read_text())


def test_the_examples_are_found():
    assert len(WITH_EXAMPLES) >= 60, WITH_EXAMPLES  # the library's count when this test was written: 73
    assert "mmfeed.loaders.sources.arrays" in WITH_EXAMPLES and "mmfeed.packing.bins" in WITH_EXAMPLES


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_every_example_of_the_module_runs_as_written(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name} has '>>> ' in its source but no docstring example was found"
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
