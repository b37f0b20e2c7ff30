"""mmfeed.DataLoader is a torch.utils.data.DataLoader: the class, its type parameter, and its attributes.

Invariants:
* ``isinstance(loader, torch.utils.data.DataLoader)``, and ``DataLoader[T]`` works in annotations and at run time;
* assigning ``batch_size``, ``batch_sampler``, ``sampler``, ``drop_last``, ``dataset`` or ``persistent_workers``
  after construction raises torch's ValueError, and the loader yields what it yielded before;
* the same assignments of the settings torch reads when it starts loading (``num_workers``, ``collate_fn``,
  ``worker_init_fn``, ``generator``, ``prefetch_factor``, ...) give the same batches as torch's loader, from the
  next ``iter(loader)`` on; an epoch under way goes on as it began, as torch's does.
"""

from __future__ import annotations

import os
import typing

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info
from torch.utils.data import DataLoader as TorchDataLoader

from mmfeed import DataLoader
from mmfeed.loaders import StepTimer

FIXED = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


class Where(Dataset):
    """Sample i: (i, the worker's id or -1 in the main process, the worker's torch seed)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        info = get_worker_info()
        return i, -1 if info is None else info.id, torch.initial_seed() if info is not None else 0


class Pids(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return os.getpid()


def _ids_collate(batch: list) -> list:
    return [sample[0] * 10 for sample in batch]


def _reseed(worker_id: int) -> None:
    torch.manual_seed(1000 + worker_id)


def _loaded(loader) -> list:
    torch.manual_seed(0)  # the workers' seeds come from torch's RNG without a generator: the same for both
    return [[t.tolist() if isinstance(t, torch.Tensor) else t for t in batch] for batch in loader]


def test_is_a_torch_dataloader_with_a_type_parameter():
    loader = DataLoader(torch.arange(6), batch_size=2)
    assert isinstance(loader, TorchDataLoader) and issubclass(DataLoader, TorchDataLoader)
    assert typing.get_origin(DataLoader[int]) is DataLoader and typing.get_args(DataLoader[int]) == (int,)

    def make(n: int) -> DataLoader[torch.Tensor]:
        return DataLoader(torch.arange(n))

    assert typing.get_type_hints(make)["return"] == DataLoader[torch.Tensor]
    assert [b.tolist() for b in make(3)] == [[0], [1], [2]]


@pytest.mark.parametrize("name", FIXED)
def test_assigning_what_fixes_the_batches_raises_as_torch_does(name):
    ours, theirs = (cls(Where(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3))
                    for cls in (DataLoader, TorchDataLoader))
    before = getattr(ours, name)
    with pytest.raises(ValueError) as got:
        setattr(ours, name, 5)
    with pytest.raises(ValueError) as want:
        setattr(theirs, name, 5)
    assert str(got.value) == str(want.value) and name in str(got.value)
    assert getattr(ours, name) is before
    assert _loaded(ours) == _loaded(theirs)


@pytest.mark.parametrize("settings", [
    {"num_workers": 2, "prefetch_factor": 2},  # torch needs both (it fills in prefetch_factor only when built)
    {"num_workers": 2, "generator": "seeded", "prefetch_factor": 3, "worker_init_fn": _reseed, "timeout": 60.0},
    {"collate_fn": _ids_collate, "pin_memory": False, "pin_memory_device": ""},
], ids=["workers", "worker-settings", "collate"])
def test_settings_assigned_after_construction_give_torchs_batches(settings):
    loaders = [cls(Where(), batch_size=3) for cls in (DataLoader, TorchDataLoader)]
    for loader in loaders:
        for name, value in settings.items():
            setattr(loader, name, torch.Generator().manual_seed(7) if value == "seeded" else value)
    ours, theirs = (_loaded(loader) for loader in loaders)
    assert ours == theirs
    if loaders[0].num_workers:
        assert {wid for batch in ours for wid in batch[1]} == {0, 1}  # loaded in the two workers


def test_an_epoch_under_way_goes_on_as_it_began():
    loader = DataLoader(Where(), batch_size=3)
    it = iter(loader)
    first = next(it)
    loader.num_workers = 2  # read at the next iter(loader), as torch reads it
    rest = list(it)
    assert {int(w) for batch in [first, *rest] for w in batch[1]} == {-1}
    assert {int(w) for batch in loader for w in batch[1]} == {0, 1}


def test_persistent_workers_restart_with_new_settings():
    loader = DataLoader(Pids(), batch_size=4, num_workers=1, persistent_workers=True)
    first = {int(p) for b in loader for p in b}
    assert {int(p) for b in loader for p in b} == first  # the same worker, epoch after epoch
    loader.worker_init_fn = _reseed
    again = {int(p) for b in loader for p in b}
    assert len(again) == 1 and again != first and os.getpid() not in again


def test_multiprocessing_context_is_checked_as_torchs():
    for cls in (DataLoader, TorchDataLoader):
        loader = cls(Where(), num_workers=1)
        with pytest.raises(ValueError, match="valid start method"):
            loader.multiprocessing_context = "no-such-method"
        single = cls(Where())
        with pytest.raises(ValueError, match=r"num_workers > 0"):
            single.multiprocessing_context = "fork"


def test_mmfeed_settings_assigned_after_construction_are_checked_and_used():
    loader = DataLoader(Where(), batch_size=4)
    loader.device = "cpu"
    assert loader.device == torch.device("cpu")
    for name, bad, error in (("prefetch", -1, ValueError), ("worker_mode", "fibres", ValueError),
                             ("timer", "yes", TypeError)):
        with pytest.raises(error, match=name):
            setattr(loader, name, bad)
    loader.timer = True
    assert isinstance(loader.timer, StepTimer)
    assert len(list(loader)) == 3 and loader.timer.report()["steps"] > 0
    loader.worker_mode, loader.num_workers = "thread", 2
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_the_iterator_reads_through_to_torchs():
    loader = DataLoader(Where(), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    assert len(it._workers) == 2 and all(w.is_alive() for w in it._workers)
    workers = it._workers
    del it
    for w in workers:
        w.join(10)
        assert not w.is_alive()
