"""PyTorch's own DataLoader test suite, run against ``mmfeed.DataLoader``.

The suite is torch's ``test/test_dataloader.py`` (repository pytorch/pytorch, BSD-3-Clause licence), kept beside
this module unedited as ``pytorch_test_dataloader.py`` (its origin, checksum and licence in ``ORIGIN.md`` and
``LICENSE.pytorch``); ``MMFEED_TORCH_SUITE`` names another copy to run instead (the version of another torch). It
runs unchanged: this module executes the file's source as its own body (so the processes the tests start import
it, and the substitution, under this module's name), every ``DataLoader`` the suite resolves being mmfeed's:
``from torch.utils.data import DataLoader`` at import, and ``torch.utils.data.DataLoader`` inside the tests
(patched for each test of this module only, and for good in the processes the tests start).
``MMFEED_TORCH_SUITE_LOADER=torch`` runs it with torch's own DataLoader, the baseline. One thing differs from
running the file alone: after each test the start method of multiprocessing is put back
(``test_worker_init_fn_forkserver`` sets forkserver for the rest of the process, which would start every later
worker through a fork server). Torch's test helpers need ``expecttest`` and ``psutil`` (the dev extra).

    python -m pytest -q tests/torch_suite                              # mmfeed's loader, the default subset
    MMFEED_TORCH_SUITE_LOADER=torch python -m pytest -q tests/torch_suite   # torch's, the baseline
    MMFEED_TORCH_SUITE_FULL=1 python -m pytest -q tests/torch_suite    # every test, slow ones included

Figures (torch 2.13.0, CPU, 2 cores; ``MMFEED_TORCH_SUITE_FULL=1``): 195 tests, 167 pass with torch's DataLoader and
the same 167 with mmfeed's, 28 skip alike by the suite's own conditions: no CUDA (10), no CUDA/PrivateUse1 IPC (14),
``@slowTest`` (``test_proper_exit``, 2: ``PYTORCH_TEST_WITH_SLOW=1`` runs them, and they pass with both) and the
segfault test the suite skips on Linux (2). None is excluded here: the tests that reach into torch's iterator
(``it._workers``, ``dl._iterator``) pass too, since mmfeed's iterator reads through to torch's.

By default the slow tests below are left out (the whole suite takes about 140 s on 2 cores, the default 40 s: 159
pass and 36 skip, with either loader); ``MMFEED_TORCH_SUITE_FULL=1`` runs them too. Each starts worker processes
under spawn or in spawned processes (a fresh interpreter importing torch, mmfeed and this suite for each, a second
or more on 2 cores):

* ``IntegrationTestDataLoaderDataPipe.test_shuffler_iterdatapipe``: 18 loaders whose workers start under spawn
  (about 60 s);
* ``TestDataLoader.test_batch_sampler`` and ``TestDataLoaderPersistentWorkers.test_batch_sampler``,
  ``TestDataLoaderPersistentWorkers.test_sampler``: 4 workers started under spawn (3-9 s);
* ``TestDataLoaderPersistentWorkers.test_get_worker_info``, ``.test_large_sampler_indices``, ``.test_timeout``,
  ``.test_no_segfault``: the loader runs in a spawned process, as in the same tests of ``TestDataLoader``, which
  do run, here with persistent workers (4-7 s each).
"""

from __future__ import annotations

import multiprocessing
import os
import unittest
from collections.abc import Iterator

import pytest
import torch.utils.data

from mmfeed.loaders import DataLoader as MmfeedDataLoader

_SPAWNED = "the loader runs in a spawned process, as in the same test of TestDataLoader, with persistent workers"
SLOW: dict[str, str] = {
    "IntegrationTestDataLoaderDataPipe.test_shuffler_iterdatapipe": "18 loaders whose workers start under spawn",
    "TestDataLoader.test_batch_sampler": "4 workers started under spawn",
    "TestDataLoaderPersistentWorkers.test_batch_sampler": "4 workers started under spawn",
    "TestDataLoaderPersistentWorkers.test_sampler": "4 workers started under spawn",
    "TestDataLoaderPersistentWorkers.test_get_worker_info": _SPAWNED,
    "TestDataLoaderPersistentWorkers.test_large_sampler_indices": _SPAWNED,
    "TestDataLoaderPersistentWorkers.test_timeout": _SPAWNED,
    "TestDataLoaderPersistentWorkers.test_no_segfault": _SPAWNED,
}
"""``Class.test`` -> why it is left out of the default run (see the module docstring)."""

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.environ.get("MMFEED_TORCH_SUITE") or os.path.join(HERE, "pytorch_test_dataloader.py")
LOADER = os.environ.get("MMFEED_TORCH_SUITE_LOADER", "mmfeed")
if LOADER not in ("mmfeed", "torch"):
    raise ValueError(f"MMFEED_TORCH_SUITE_LOADER must be 'mmfeed' or 'torch', got {LOADER!r}")
if not os.path.isfile(SUITE):
    raise FileNotFoundError(f"MMFEED_TORCH_SUITE={SUITE} is not a file: point it at pytorch's test/test_dataloader.py")
pytest.importorskip("expecttest", reason="torch's test helpers need expecttest: pip install expecttest")
pytest.importorskip("psutil", reason="torch's DataLoader suite needs psutil: pip install psutil")

TORCH_DATALOADER = torch.utils.data.DataLoader
SUBSTITUTE = MmfeedDataLoader if LOADER == "mmfeed" else TORCH_DATALOADER

torch.utils.data.DataLoader = SUBSTITUTE  # the suite's `from torch.utils.data import DataLoader` binds it
try:
    with open(SUITE) as _f:
        # dont_inherit: the suite's annotations are evaluated as it wrote them, not under this module's __future__
        exec(compile(_f.read(), SUITE, "exec", dont_inherit=True), globals())  # noqa: S102 - the suite is the body
finally:
    if multiprocessing.parent_process() is None:  # in the test session: patched per test (below) only
        torch.utils.data.DataLoader = TORCH_DATALOADER


if not os.environ.get("MMFEED_TORCH_SUITE_FULL"):
    for _name, _why in SLOW.items():
        _cls_name, _method = _name.split(".")
        _skip = unittest.skip(f"slow ({_why}): MMFEED_TORCH_SUITE_FULL=1 runs it")
        setattr(globals()[_cls_name], _method, _skip(getattr(globals()[_cls_name], _method)))


@pytest.fixture(autouse=True)
def _dataloader_is_substituted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``torch.utils.data.DataLoader`` is the loader under test while a test of this module runs; the start method
    of multiprocessing is put back after it (``test_worker_init_fn_forkserver`` sets forkserver for good)."""
    monkeypatch.setattr(torch.utils.data, "DataLoader", SUBSTITUTE)
    method = multiprocessing.get_start_method(allow_none=True)
    yield
    if multiprocessing.get_start_method(allow_none=True) != method:
        multiprocessing.set_start_method(method, force=True)
