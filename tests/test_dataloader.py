"""mmfeed.DataLoader: drop-in equality with torch's DataLoader, and exact mid-epoch resume.

Invariants:
* given only torch's arguments, mmfeed.DataLoader yields exactly torch's batches, epoch after epoch, and leaves
  torch's global RNG in the same state (same RNG draws in the same order);
* after load_state_dict, a new loader (any num_workers, with or without the original generator) yields exactly
  the batches an uninterrupted run would have yielded from the cut on, into the next epoch, and never fetches a
  skipped sample.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, Dataset, IterableDataset, RandomSampler, Sampler, get_worker_info
from torch.utils.data import DataLoader as TorchDataLoader

from mmfeed import DataLoader
from mmfeed.loaders import StepTimer
from mmfeed.loaders.clock import TimedCollate


class Squares(Dataset):
    """Sample i is a dict of tensors derived from i (deterministic, so loaders can be compared)."""

    def __init__(self, n: int = 23) -> None:
        self.n = n
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.fetched.append(int(i))
        return {"x": torch.tensor([i, i * i]), "y": torch.tensor(float(i))}


class Stream(IterableDataset):
    """0..n-1 split across workers by worker id; resumable through state_dict with num_workers=0."""

    def __init__(self, n: int = 20) -> None:
        self.n = n
        self.pos = 0

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        while self.pos < self.n:
            i, self.pos = self.pos, self.pos + 1
            if i % nw == wid:
                yield torch.tensor([i])
        self.pos = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.pos = sd["pos"]


class Reversed(Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))


class ReversedStateful(Reversed):
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass


class Pairs(Sampler):
    """A batch sampler: [0, 1], [2, 3], ... then the odd one out."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return (self.n + 1) // 2

    def __iter__(self):
        for i in range(0, self.n, 2):
            yield list(range(i, min(i + 2, self.n)))


def sum_collate(samples):
    return torch.stack([s["x"] for s in samples]).sum(0)


def flat(batch) -> list:
    """A batch as nested Python lists (comparable with ==; equal lists mean torch.equal tensors)."""
    if isinstance(batch, torch.Tensor):
        return [batch.dtype, batch.tolist()]
    if isinstance(batch, dict):
        return [(k, flat(v)) for k, v in sorted(batch.items())]
    return [flat(b) for b in batch]


def epochs(loader, n_epochs: int = 2) -> list:
    return [[flat(b) for b in loader] for _ in range(n_epochs)]


def gen(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


CASES = {
    "shuffle": dict(batch_size=4, shuffle=True),
    "shuffle-workers": dict(batch_size=4, shuffle=True, num_workers=2),
    "shuffle-generator": dict(batch_size=4, shuffle=True, generator="gen"),
    "shuffle-generator-workers": dict(batch_size=4, shuffle=True, generator="gen", num_workers=2),
    "sequential-drop-last": dict(batch_size=5, drop_last=True),
    "batch-size-none": dict(batch_size=None, shuffle=True),
    "collate-fn": dict(batch_size=3, collate_fn=sum_collate, shuffle=True),
    "sampler": dict(batch_size=4, sampler="reversed"),
    "batch-sampler": dict(batch_sampler="pairs", num_workers=2),
    "persistent-workers": dict(batch_size=4, shuffle=True, num_workers=2, persistent_workers=True),
    "pin-memory-false": dict(batch_size=4, shuffle=True, pin_memory=False, generator="gen"),
    "random-sampler-arg": dict(batch_size=4, sampler="random"),
}


def build(cls, ds, case: dict):
    kw = dict(case)
    if kw.get("generator") == "gen":
        kw["generator"] = gen()
    if kw.get("sampler") == "reversed":
        kw["sampler"] = Reversed(len(ds))
    if kw.get("sampler") == "random":
        kw["sampler"] = RandomSampler(ds)
    if kw.get("batch_sampler") == "pairs":
        kw["batch_sampler"] = Pairs(len(ds))
    return cls(ds, **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_batches_as_torch_over_two_epochs(name):
    """Same arguments, same seed: identical batches in both epochs, and the global RNG ends in the same state."""
    torch.manual_seed(1234)
    want = epochs(build(TorchDataLoader, Squares(), CASES[name]))
    after_torch = torch.rand(3)
    torch.manual_seed(1234)
    got = epochs(build(DataLoader, Squares(), CASES[name]))
    assert got == want
    assert torch.equal(torch.rand(3), after_torch)


def test_iterable_dataset_with_workers_same_as_torch():
    torch.manual_seed(0)
    want = epochs(TorchDataLoader(Stream(), batch_size=3, num_workers=2))
    torch.manual_seed(0)
    loader = DataLoader(Stream(), batch_size=3, num_workers=2)
    assert epochs(loader) == want


def test_len_attributes_and_device_cpu_prefetch_match_torch():
    """len() and the public attributes equal torch's; device='cpu' with a prefetch thread changes nothing."""
    ds = Squares()
    ref = TorchDataLoader(ds, batch_size=4, drop_last=True, num_workers=0)
    ours = DataLoader(ds, batch_size=4, drop_last=True, device="cpu", prefetch=2)
    assert len(ours) == len(ref) and ours.batch_size == 4 and ours.drop_last is True
    assert isinstance(DataLoader(ds, shuffle=True).sampler, RandomSampler)
    assert isinstance(ours.batch_sampler, BatchSampler) and ours.timeout == 0
    torch.manual_seed(5)
    want = epochs(TorchDataLoader(ds, batch_size=4, shuffle=True, num_workers=2))
    torch.manual_seed(5)
    assert epochs(DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, device="cpu", prefetch=2)) == want


def test_timer_keeps_batch_types():
    """With timing on the loop still gets torch's batches (the TimedBatch wrapper never escapes)."""
    torch.manual_seed(3)
    want = epochs(TorchDataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2), 1)
    torch.manual_seed(3)
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2, timer=True)
    assert epochs(loader, 1) == want
    rep = loader.timer.report()
    assert rep["steps"] == len(loader) and "collate" in rep["stages"]


def test_bad_arguments_raise_naming_the_value():
    with pytest.raises(ValueError, match="prefetch"):
        DataLoader(Squares(), prefetch=-1)
    with pytest.raises(TypeError, match="timer"):
        DataLoader(Squares(), timer="yes")
    with pytest.raises(ValueError, match="mutually exclusive"):  # torch's own validation
        DataLoader(Squares(), sampler=Reversed(3), shuffle=True)


# ---------------------------------------------------------------------------------------------------------------
# resume

def run_with_cut(make_a, make_b, cut: int, n_epochs: int = 2):
    """Batches of loader A up to `cut` in epoch 0, then of a fresh loader B loaded with A's state."""
    a = make_a()
    it = iter(a)
    head = [flat(next(it)) for _ in range(cut)]
    sd = a.state_dict()
    del it
    b = make_b()
    b.load_state_dict(sd)
    rest = [flat(x) for x in b]
    later = [[flat(x) for x in b] for _ in range(n_epochs - 1)]
    return [head + rest, *later]


@pytest.mark.parametrize("cut", [0, 1, 3, 5, 6])
@pytest.mark.parametrize("workers", [(0, 0), (2, 0), (0, 2)])
def test_resume_with_generator_equals_uninterrupted(cut, workers):
    """Cut anywhere in epoch 0, resume in a NEW loader WITHOUT the generator, any num_workers: the remaining
    batches and the whole next epoch equal the uninterrupted run's."""
    wa, wb = workers
    kw = dict(batch_size=4, shuffle=True)
    want = epochs(DataLoader(Squares(), generator=gen(), num_workers=wa, **kw))
    got = run_with_cut(lambda: DataLoader(Squares(), generator=gen(), num_workers=wa, **kw),
                       lambda: DataLoader(Squares(), num_workers=wb, **kw), cut)
    assert got == want


@pytest.mark.parametrize("cut", [0, 1, 4])
def test_resume_without_generator_uses_saved_seed(cut):
    """Without a generator the epoch's seed came from torch's global RNG; the state carries it, so the rest of
    the epoch is exact whatever the global RNG does in the new process."""
    torch.manual_seed(99)
    want = epochs(DataLoader(Squares(), batch_size=4, shuffle=True), 1)
    torch.manual_seed(99)
    a = DataLoader(Squares(), batch_size=4, shuffle=True)
    it = iter(a)
    head = [flat(next(it)) for _ in range(cut)]
    sd = a.state_dict()
    torch.manual_seed(12345)  # a different global RNG in the "new process"
    b = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2)
    b.load_state_dict(sd)
    assert head + [flat(x) for x in b] == want[0]


@pytest.mark.parametrize("case", ["sequential-drop-last", "batch-size-none", "sampler-stateful", "pairs-stateful"])
def test_resume_other_orders(case):
    kw = {"sequential-drop-last": dict(batch_size=5, drop_last=True),
          "batch-size-none": dict(batch_size=None, shuffle=True, generator="gen"),
          "sampler-stateful": dict(batch_size=3, sampler="rs"),
          "pairs-stateful": dict(batch_sampler="ps")}[case]

    def make(workers):
        k = dict(kw)
        if k.get("generator") == "gen":
            k["generator"] = gen()
        if k.get("sampler") == "rs":
            k["sampler"] = ReversedStateful(23)
        if k.get("batch_sampler") == "ps":
            ps = Pairs(23)
            ps.state_dict, ps.load_state_dict = dict, lambda sd: None
            k["batch_sampler"] = ps
        return DataLoader(Squares(), num_workers=workers, **k)

    want = epochs(make(0))
    assert run_with_cut(lambda: make(0), lambda: make(2), 3) == want


def test_resume_skips_indices_not_data():
    """Restoring fetches only the samples of the remaining batches, never the skipped ones."""
    a = DataLoader(Squares(), batch_size=4, shuffle=True, generator=gen())
    it = iter(a)
    head = [next(it)["y"] for _ in range(3)]
    ds = Squares()
    b = DataLoader(ds, batch_size=4, shuffle=True)
    b.load_state_dict(a.state_dict())
    rest = [x["y"] for x in b]
    seen = torch.cat(head + rest).long().tolist()
    assert sorted(seen) == list(range(23))
    assert sorted(ds.fetched) == sorted(torch.cat(rest).long().tolist())


def test_resume_at_end_of_epoch_starts_the_next():
    """A state saved after StopIteration resumes at the next epoch, equal to the uninterrupted next epoch."""
    want = epochs(DataLoader(Squares(), batch_size=4, shuffle=True, generator=gen()), 2)
    a = DataLoader(Squares(), batch_size=4, shuffle=True, generator=gen())
    first = [flat(x) for x in a]
    b = DataLoader(Squares(), batch_size=4, shuffle=True)
    b.load_state_dict(a.state_dict())
    assert [first, [flat(x) for x in b]] == want


def test_resume_iterable_dataset_through_its_state():
    want = [flat(x) for x in DataLoader(Stream(), batch_size=3)]
    a = DataLoader(Stream(), batch_size=3, device="cpu", prefetch=2)  # the prefetch thread runs ahead
    it = iter(a)
    head = [flat(next(it)) for _ in range(2)]
    sd = a.state_dict()
    it.close()
    b = DataLoader(Stream(), batch_size=3)
    b.load_state_dict(sd)
    assert head + [flat(x) for x in b] == want
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(Stream(), batch_size=3, num_workers=2).state_dict()


def test_unresumable_sampler_and_mismatched_state_raise():
    with pytest.raises(TypeError, match="state_dict"):
        DataLoader(Squares(), batch_size=2, sampler=Reversed(23)).state_dict()
    sd = DataLoader(Squares(), batch_size=4, shuffle=True).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(Squares(), batch_size=5, shuffle=True).load_state_dict(sd)
    with pytest.raises(ValueError, match="samples"):
        DataLoader(Squares(30), batch_size=4, shuffle=True).load_state_dict(sd)


def test_timer_is_a_steptimer():
    t = StepTimer()
    assert DataLoader(Squares(), timer=t).timer is t and t.num_workers == 0


@settings(max_examples=40)
@given(n=st.integers(1, 40), bs=st.integers(1, 7), drop_last=st.booleans(), cut=st.integers(0, 45),
       seed=st.integers(0, 2**31 - 1), batched=st.booleans())
def test_resume_anywhere_equals_uninterrupted(n, bs, drop_last, cut, seed, batched):
    """Property: for any dataset size, batch size, drop_last and cut point (clamped to the epoch), head + resumed
    rest + the next epoch equal two uninterrupted epochs."""
    kw = dict(batch_size=bs, drop_last=drop_last) if batched else dict(batch_size=None)
    want = epochs(DataLoader(Squares(n), shuffle=True, generator=gen(seed), **kw))
    cut = min(cut, len(want[0]))
    got = run_with_cut(lambda: DataLoader(Squares(n), shuffle=True, generator=gen(seed), **kw),
                       lambda: DataLoader(Squares(n), shuffle=True, **kw), cut)
    assert got == want


def test_timed_collate_pickles_for_spawned_workers():
    tc = pickle.loads(pickle.dumps(TimedCollate(torch.utils.data.default_collate)))
    assert torch.equal(tc([torch.tensor(1), torch.tensor(2)]).batch, torch.tensor([1, 2]))


def test_cuda_device_without_cuda_fails_at_construction():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available"):
        DataLoader(Squares(), device="cuda")


def test_resume_distributed_sampler_restores_its_epoch():
    """DistributedSampler's order is fixed by (seed, epoch): the state carries the epoch, so a fresh sampler
    (epoch 0) continues the epoch-5 order."""
    from torch.utils.data import DistributedSampler

    def make():
        return DataLoader(Squares(), batch_size=3,
                          sampler=DistributedSampler(Squares(), num_replicas=2, rank=1, shuffle=True, seed=3))

    ref = make()
    ref.sampler.set_epoch(5)
    want = [flat(x) for x in ref]
    a = make()
    a.sampler.set_epoch(5)
    it = iter(a)
    head = [flat(next(it)) for _ in range(2)]
    b = make()
    b.load_state_dict(a.state_dict())
    assert head + [flat(x) for x in b] == want


def test_break_mid_epoch_with_persistent_workers_and_prefetch_thread():
    """Leaving an epoch early closes its prefetch thread before torch resets the persistent workers: the next
    epoch is complete (every sample once) and nothing hangs."""
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                        device="cpu", prefetch=2, timer=True)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    seen = sorted(int(v) for b in loader for v in b["y"])
    assert seen == list(range(23))
    assert loader.state_dict()["done"] is True and loader.state_dict()["epoch"] == 1


def test_signature_starts_with_torchs_in_the_same_order():
    """Every torch argument, same name, kind, default and position; mmfeed's extras come after, keyword-only."""
    import inspect

    theirs = list(inspect.signature(TorchDataLoader.__init__).parameters.values())
    ours = list(inspect.signature(DataLoader.__init__).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[:len(theirs)]] == \
        [(p.name, p.kind, p.default) for p in theirs]
    assert [p.name for p in ours[len(theirs):]] == ["device", "prefetch", "timer", "packing", "recycle_buffers",
                                                "worker_mode", "device_transform"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs):])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_device_batches_equal_torchs_moved():
    torch.manual_seed(8)
    want = epochs(TorchDataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2), 1)
    torch.manual_seed(8)
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, num_workers=2, device="cuda", prefetch=2,
                        timer=True)
    got = []
    for b in loader:
        assert b["x"].is_cuda and b["y"].is_cuda
        got.append(flat(b))
    assert got == want[0]
    assert loader.timer.report()["copy_s"] is not None


@pytest.mark.parametrize("with_generator", [False, True])
def test_state_dict_before_iterating_changes_nothing(with_generator):
    """Asking for the state of a fresh loader draws no RNG: the batches still equal torch's; loading that state
    into a new loader gives the same first epoch."""
    def make(cls):
        return cls(Squares(), batch_size=4, shuffle=True, generator=gen() if with_generator else None)

    torch.manual_seed(21)
    want = epochs(make(TorchDataLoader), 1)
    torch.manual_seed(21)
    a = make(DataLoader)
    sd = a.state_dict()
    assert epochs(a, 1) == want
    torch.manual_seed(21)
    b = make(DataLoader)
    b.load_state_dict(sd)
    assert epochs(b, 1) == want
