"""Epochs through the decoded-frame cache: what ``open_dataset(..., cache=DIR)`` buys when training runs many epochs
on few episodes.

:func:`cache_epochs` runs one mmfeed loader (``lerobot_compare``'s sampling: global shuffle, fixed batches,
persistent workers) over a dataset with a cold cache in a fresh directory for ``epochs`` whole epochs, and times
each: epoch 1 decodes every segment it touches whole into the store (the fill), later epochs copy frames out of
the mapped store. ``lerobot_compare --cache`` runs it after its throughput comparison and reports
``cache.epoch3_over_limit``: epoch 3's samples/s over the decode limit's measured in the same run::

    python -m mmfeed.bench.lerobot_compare --lerobot-python /work/lerobot-venv/bin/python --root DIR --cache \
        --json out.json
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["cache_epochs"]


def cache_epochs(make_loader: Callable[..., Any], *, epochs: int = 3, cache_dir: str | None = None,
                 **loader_args: Any) -> dict[str, Any]:
    """Samples/s of each of ``epochs`` epochs of ``make_loader(cache=DIR, **loader_args)`` (a DataLoader whose
    batches have ``num_documents``), the cache cold at the start: ``DIR`` is a fresh folder under ``cache_dir``
    (default the system's temporary folder), deleted afterwards. Each epoch is timed from asking for its first
    batch to receiving its last (epoch 1 includes starting the workers). Also the store's size after the run."""
    from mmfeed.loaders.stores.frame_store import FrameStore

    folder = tempfile.mkdtemp(prefix="mmfeed-cache-bench-", dir=cache_dir)
    try:
        loader = make_loader(cache=folder, **loader_args)
        runs = []
        for epoch in range(epochs):
            samples, start = 0, time.perf_counter()
            for batch in loader:
                samples += int(batch.num_documents)
            seconds = time.perf_counter() - start
            runs.append({"epoch": epoch + 1, "samples": samples, "seconds": seconds,
                         "samples_per_s": samples / seconds})
        del loader
        info = FrameStore(folder).info()
        return {"epochs": runs, "samples_per_s": [r["samples_per_s"] for r in runs],
                "store_segments": info.segments, "store_bytes": info.bytes}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def over_limit(cache: Mapping[str, Any], limit_samples_per_s: float) -> dict[str, float]:
    """Each epoch's samples/s over the decode limit's (``epoch3_over_limit`` and the others)."""
    return {f"epoch{r['epoch']}_over_limit": r["samples_per_s"] / limit_samples_per_s for r in cache["epochs"]}
