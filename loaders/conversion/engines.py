"""Where :func:`mmfeed.loaders.convert` runs its shards: :func:`convert_shard` writes one shard (the unit
of work, of retry and of resume), :func:`run_local` runs shards in this process or a pool of processes,
:func:`run_ray` as Ray tasks with retries, and :class:`Progress` shows episodes, MB written, rate and ETA. The two
engines run any job's unit of work (``work=``): ``mmfeed stats`` runs its own on them.

Shard ``k`` holds the episodes the plan gave it, in plan order, and is written to ``.shard-k.tar.partial`` then
renamed, so its bytes do not depend on where or when it ran, nor on what else ran beside it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["ConvertError", "Progress", "convert_shard", "encoder_versions", "run_local", "run_ray", "shard_name"]

log = logging.getLogger(__name__)


class ConvertError(ValueError):
    """An episode could not be converted; the message names it, its key and its source file(s)."""


def shard_name(k: int) -> str:
    """The file name of shard ``k``."""
    return f"shard-{k:06d}.tar"


def encoder_versions() -> dict[str, str]:
    """The PyAV and libavcodec versions: the same inputs give the same bytes only under the same ones."""
    import av

    codec = av.library_versions.get("libavcodec", ())
    return {"pyav": av.__version__, "libavcodec": ".".join(str(v) for v in codec)}


def convert_shard(job: Any, k: int, items: list) -> dict[str, Any]:
    """Write shard ``k`` of ``job`` from ``items`` (episode indices of the source, or generated episodes) and
    return its record: file, planned episode range, episodes written, size, sha256, skipped episodes (under
    ``errors="skip"``) and this run's seconds: opening the source (imports included, once per process), then in
    the shard's episodes (total, reading/decoding, encoding)."""
    opened = time.perf_counter()
    from mmfeed.loaders.conversion.readers import open_reader
    from mmfeed.loaders.conversion.writer import ShardFile, episode_sample

    reader = open_reader(job)
    before = dict(reader.seconds)
    start = time.perf_counter()
    shard = ShardFile(os.path.join(job.dst, shard_name(k)))
    indices = [item if isinstance(item, int) else item["index"] for item in items]
    skipped = []
    try:
        for index, item in zip(indices, items):
            try:
                episode = reader.read(item)
                sample = episode_sample(episode["features"], fps=episode["fps"], task=episode["task"],
                                        rates=episode["rates"], key=episode["key"],
                                        codec="h264" if job.codec == "copy" else job.codec, gop=job.gop or 30,
                                        crf=job.crf, text=episode.get("text"))
            except Exception as err:  # noqa: BLE001 (any failure of one episode is that episode's)
                where = _where(reader, item)
                reason = f"{type(err).__name__}: {' '.join(str(err).split())}"
                if job.errors == "raise":
                    raise ConvertError(f"episode {index} ({where}) failed: {reason}") from err
                log.warning("skipping episode %d (%s): %s", index, where, reason)
                skipped.append({"episode": index, "source": where, "reason": reason})
                continue
            shard.add(sample)
    except BaseException:
        shard.discard()
        raise
    if shard.episodes:
        shard.close()
    return {"shard": k, "file": shard_name(k) if shard.episodes else None,
            "episodes": [indices[0], indices[-1] + 1] if indices else [0, 0], "written": shard.episodes,
            "size": shard.size or 0, "sha256": shard.sha256, "skipped": skipped,
            "timing": {"seconds": time.perf_counter() - start, "open": start - opened,
                       **{k_: reader.seconds[k_] - before[k_] for k_ in reader.seconds}},
            "encoder": encoder_versions()}


def _where(reader: Any, item: Any) -> str:
    try:
        return reader.describe(item)
    except Exception as err:  # noqa: BLE001 (the description must not hide the failure it describes)
        return f"{reader.job.src} ({type(err).__name__} describing it)"


def run_local(job: Any, tasks: Iterable[tuple[int, list]], workers: int,
              work: Callable[[Any, int, Any], Any] = convert_shard) -> Iterator[Any]:
    """Shard records as shards finish: in this process (``workers == 1``) or on a pool of ``workers`` spawned
    processes, at most two shards per process in flight (generated episodes wait in the driver). ``work(job, k,
    items)`` is what a task runs (another job's unit of work, e.g. ``mmfeed stats``'s)."""
    if workers == 1:
        for k, items in tasks:
            yield work(job, k, items)
        return
    pending: dict[Any, int] = {}
    todo = iter(tasks)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            while True:
                for k, items in _take(todo, 2 * workers - len(pending)):
                    pending[pool.submit(work, job, k, items)] = k
                if not pending:
                    return
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=pending.get):
                    k = pending.pop(future)
                    try:
                        yield future.result()
                    except BrokenProcessPool as err:
                        raise ConvertError(f"a worker process died while running {_unit(work)} {k} (killed, or "
                                           f"out of memory?): {err}") from err
        finally:
            for future in pending:
                future.cancel()


def run_ray(job: Any, tasks: Iterable[tuple[int, list]], workers: int, address: str | None,
            max_retries: int, work: Callable[[Any, int, Any], Any] = convert_shard) -> Iterator[Any]:
    """Shard records as shards finish, each shard a Ray task (one CPU) retried up to ``max_retries`` times on
    any failure. Joins the cluster at ``address``, else a running one (``address="auto"``), else starts a local
    one with ``workers`` CPUs (and stops it at the end). Workers write to ``job.dst``, which every node must see.
    ``work`` as for :func:`run_local`."""
    try:
        import ray
    except ImportError as err:
        raise ImportError("engine='ray' needs Ray: pip install 'mmfeed[ray]' (or 'ray[data]>=2.9')") from err
    started = not ray.is_initialized()
    if started:
        quiet = {"include_dashboard": False, "logging_level": logging.WARNING}
        if address:
            ray.init(address=address, logging_level=logging.WARNING)
        else:
            try:
                ray.init(address="auto", logging_level=logging.WARNING)
            except ConnectionError:
                ray.init(num_cpus=workers, **quiet)
    remote = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=True)(work)
    pending: dict[Any, int] = {}
    try:
        capacity = max(1, int(ray.cluster_resources().get("CPU", workers)))
        todo = iter(tasks)
        while True:
            for k, items in _take(todo, 2 * capacity - len(pending)):
                pending[remote.remote(job, k, items)] = k
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(ready[0])
            try:
                yield ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None) or err
                raise ConvertError(f"{_unit(work)} {k} failed {max_retries + 1} time(s) on Ray: {cause}") from cause
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started:
            ray.shutdown()


def _unit(work: Callable) -> str:
    """What a task of ``work`` is called in a message: a shard of a conversion, else a task."""
    return "shard" if work is convert_shard else "task"


def _take(iterator: Iterator, n: int) -> list:
    out = []
    for _ in range(max(0, n)):
        try:
            out.append(next(iterator))
        except StopIteration:
            break
    return out


class Progress:
    """A tqdm bar on stderr: episodes done (of the total, where known), MB written, MB/s, rate and ETA; drawn
    only when ``enabled`` and stderr is a terminal (:func:`mmfeed._progress.progress_bar`)."""

    def __init__(self, total: int | None, done: int, enabled: bool) -> None:
        from mmfeed._progress import progress_bar

        self.start, self.bytes = time.perf_counter(), 0
        self.bar = progress_bar(total, initial=done, unit="ep", desc="convert", enabled=enabled)

    def update(self, record: dict[str, Any]) -> None:
        self.bytes += record["size"]
        mb = self.bytes / 1e6
        self.bar.set_postfix_str(f"{mb:.1f} MB, {mb / max(time.perf_counter() - self.start, 1e-9):.1f} MB/s",
                                 refresh=False)
        self.bar.update(record["written"] + len(record["skipped"]))

    def close(self) -> None:
        self.bar.close()
