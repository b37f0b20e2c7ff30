"""One check for whatever is seeded per sample (transforms): a pass of a loader gives the same batches with
worker processes and after a resume from ``state_dict()`` at any step."""

from collections.abc import Callable
from typing import Any

import torch


def run(make_loader: Callable[[int], Any], value: Callable[[Any], torch.Tensor], num_workers: int,
        resume_after: int | None = None) -> list[torch.Tensor]:
    """``value(batch)`` of every batch of one pass of ``make_loader(num_workers)``; with ``resume_after``, the pass
    stops after that many batches and a fresh loader, given the state saved there, runs the rest."""
    loader = make_loader(num_workers)
    out = []
    it = iter(loader)
    for i, batch in enumerate(it):
        out.append(value(batch))
        if resume_after is not None and i + 1 == resume_after:
            state = loader.state_dict()
            del it
            fresh = make_loader(num_workers)
            fresh.load_state_dict(state)
            out.extend(value(b) for b in fresh)
            break
    return out


def replayed(make_loader: Callable[[int], Any], value: Callable[[Any], torch.Tensor],
             resumes: tuple[tuple[int, int], ...]) -> list[torch.Tensor]:
    """``value(batch)`` of one pass of ``make_loader(0)``, after checking that two workers give the same, and so
    does every resume ``(num_workers, after how many batches)`` of ``resumes``."""
    plain = run(make_loader, value, 0)
    for other in [run(make_loader, value, 2), *(run(make_loader, value, w, k) for w, k in resumes)]:
        assert len(other) == len(plain) and all(torch.equal(a, b) for a, b in zip(plain, other))
    return plain


def resumed_elsewhere(before: list[Any], make_after: Callable[[int], Any], new_world: int,
                      steps: int = 2) -> list[Any]:
    """An elastic resume: each loader of ``before`` (one per rank) hands out ``steps`` batches, then the state of
    the first is loaded into ``make_after(rank)`` for each of ``new_world`` ranks, which run to the epoch's end.
    The batches of both phases."""
    done = []
    for loader in before:
        it = iter(loader)
        done.extend(next(it) for _ in range(steps))
    state = before[0].state_dict()
    after = []
    for rank in range(new_world):
        loader = make_after(rank)
        loader.load_state_dict(state)
        after.extend(loader)
    return done + after
