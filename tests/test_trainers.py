"""mmfeed.DataLoader beside Hugging Face Accelerate and Lightning, for real (each skipped, saying why, where it is
not installed).

``Accelerator.prepare`` takes any ``torch.utils.data.DataLoader``, so it takes mmfeed's, and rebuilds it as its own
``DataLoaderShard`` from the loader's dataset and torch settings. The planned epochs survive: the rebuilt loader
indexes the dataset ``0..len-1`` and calls its ``set_epoch`` before each epoch, so each epoch runs its own plan
(PackedBatch included). The loader's own additions do not (device prefetch, the timer, ``state_dict()``: the
object is Accelerate's). The way that keeps the loader whole, as
the README says: leave it out of ``prepare``, give it ``device=accelerator.device``, and
``accelerator.register_for_checkpointing(loader)``, so that ``save_state`` / ``load_state`` carry its exact
mid-epoch position. Lightning's ``Trainer`` (one device) iterates the loader it is given, whole: the epochs of the
plan follow one another and the timer times them.
"""

from __future__ import annotations

import pytest
import torch

from mmfeed import DataLoader, PackedBatch
from mmfeed.loaders import PlanConfig, PlannedDataset


DOCS = [torch.arange(n) + n for n in (30, 70, 12, 44, 9, 61, 25, 38, 50, 17)]


def packed(**kwargs) -> DataLoader:
    dataset = PlannedDataset.records(DOCS, [len(d) for d in DOCS], plan=PlanConfig(capacity=96, rows_per_batch=1))
    return DataLoader(dataset, **kwargs)


def texts(batches) -> list[list[int]]:
    return [b.data["text"].tolist() for b in batches]


def accelerate():
    return pytest.importorskip("accelerate", reason="Hugging Face Accelerate is not installed (pip install accelerate)")


def prepared_accelerator() -> tuple:
    acc = accelerate().Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return acc, model, optimizer


def test_prepare_takes_the_loader_and_rebuilds_it_as_accelerates_own():
    acc = accelerate().Accelerator(cpu=True)
    plain = DataLoader(torch.arange(20), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    reference = [b.tolist() for b in DataLoader(torch.arange(20), batch_size=4, shuffle=True,
                                                generator=torch.Generator().manual_seed(0))]
    rebuilt = acc.prepare(plain)
    assert isinstance(rebuilt, torch.utils.data.DataLoader) and not isinstance(rebuilt, DataLoader)
    assert [b.tolist() for b in rebuilt] == reference


@pytest.mark.parametrize("workers", [{}, {"num_workers": 2}, {"num_workers": 2, "persistent_workers": True}])
def test_prepared_planned_loader_runs_each_epochs_own_plan(workers):
    """Accelerate's rebuilt loader indexes the dataset 0..len-1 and calls its set_epoch before each epoch: each
    epoch is mmfeed's plan of that epoch (PackedBatch included), workers (persistent ones too) following."""
    acc = accelerate().Accelerator(cpu=True)
    ours = packed()
    expected = [texts(ours) for _ in range(3)]
    assert expected[0] != expected[1] != expected[2]  # the plans differ from epoch to epoch
    shard = acc.prepare(packed(**workers))
    got = []
    for _ in range(3):
        batches = list(shard)
        assert all(isinstance(b, PackedBatch) for b in batches)
        got.append(texts(batches))
    assert got == expected


def test_planned_dataset_set_epoch_names_the_epoch_a_plain_index_reads():
    dataset = packed().dataset
    first = [dataset[i].data["text"].tolist() for i in range(len(dataset))]
    dataset.set_epoch(2)
    assert dataset.epoch == 2 and len(dataset) == dataset.num_steps(2)
    assert [dataset[i].data["text"].tolist() for i in range(len(dataset))] == \
        [dataset[(2, i)].data["text"].tolist() for i in range(dataset.num_steps(2))] != first
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        dataset.set_epoch(-1)


def test_the_loader_kept_out_of_prepare_resumes_through_save_state(tmp_path):
    acc, _, _ = prepared_accelerator()
    loader = packed(device=acc.device)
    acc.register_for_checkpointing(loader)
    it = iter(loader)
    taken = [next(it)]
    acc.save_state(tmp_path)
    rest = texts(it)
    assert len(rest) >= 2 and all(b.data["text"].device.type == acc.device.type for b in taken)

    acc2, _, _ = prepared_accelerator()
    fresh = packed(device=acc2.device)
    acc2.register_for_checkpointing(fresh)
    acc2.load_state(tmp_path)
    assert texts(fresh) == rest


def test_lightning_trainer_iterates_the_loader_whole():
    lightning = pytest.importorskip("lightning", reason="Lightning is not installed (pip install lightning)")
    seen: list[tuple[int, list[int]]] = []

    class Model(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: PackedBatch, index: int) -> torch.Tensor:
            seen.append((self.current_epoch, batch.data["text"].tolist()))
            return self.layer(batch.data["text"][:1].float()[None]).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    loader = packed(timer=True)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), train_dataloaders=loader)
    assert trainer.train_dataloader is loader
    reference = packed()
    assert [t for e, t in seen if e == 0] == texts(reference) and [t for e, t in seen if e == 1] == texts(reference)
    assert loader.timer.report()["steps"] == len(seen)
