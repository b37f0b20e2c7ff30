"""``mmfeed convert SRC DST``: any episode source to indexed webdataset shards, on local processes or a Ray cluster.

SRC is a LeRobot v3 directory (a local path or an fsspec URL), mmfeed/webdataset shards (to re-shard or
transcode), HDF5 or Zarr demonstrations or an RLDS dataset (read with ``fps=``) or ``module:function`` naming a
generator of episodes (dicts of the keyword form
:meth:`~mmfeed.loaders.conversion.writer.ShardWriter.write` takes; see
:func:`~mmfeed.loaders.conversion.readers.normalize_episode`)::

    summary = convert("lerobot/droid", "shards/", codec="h264", gop=30, episodes_per_shard=8, workers=16)
    ds = open_dataset("shards/")          # every feature, every step's task, the stats (with quantiles)

- **Deterministic.** Episode ``i`` (source order) goes to shard ``i // episodes_per_shard`` (or, with
  ``shard_size_mb``, to shards cut where the size estimated from the source's bytes passes the target), in order,
  so shard k holds the same bytes whatever the engine, the number of workers and the day (fixed member times,
  a deterministic encoder, decoding always through PyAV). The index is then built from the shards' meta.json
  (:func:`~mmfeed.loaders.stores.index.write_index` with ``record_mtime=False``, so it is byte-identical too):
  mean/std/min/max/count merge exactly from per-episode partials; the quantiles q01..q99 come from a mergeable
  log-bucket sketch over every value (:mod:`~mmfeed.loaders.stores.quantiles`: within 1% of ``np.quantile``).
- **codec="copy"** keeps the source's compressed video when no re-encode is asked (no ``gop``, no
  ``frame_size`` for that feature): shard members are kept byte for byte; a LeRobot episode's packets are
  remuxed out of the camera file that concatenates many episodes (stream copy: the same packets, so decoded
  pixels equal the source's). Where that is not exact (the episode does not start on a keyframe, or its span
  holds another number of frames) the episode is re-encoded with the source's codec and a warning says so;
  frames that only exist decoded (LeRobot PNG images, generated arrays) are encoded as H.264.
- **Resumable and safe.** A shard is written as ``.shard-k.tar.partial`` and renamed when complete; the manifest
  ``mmfeed-convert.jsonl`` beside the shards (one JSON object a line: the job, then one line per finished shard
  with its size, sha256 and, under ``errors="skip"``, the episodes skipped and why, then a completion line) is
  appended as shards finish, and rewritten in shard order when the job completes. ``resume=True`` keeps finished
  shards (checked by size) and converts the rest, so a job killed at any moment and resumed ends with the bytes
  of an uninterrupted run. A DST that already holds a dataset is refused unless ``resume`` or ``overwrite``.
- **Engines.** ``local``: this process (``workers=1``) or ``workers`` spawned processes; ``ray`` (``pip install
  'mmfeed[ray]'``): joins the cluster at ``ray_address``, else a running one, else starts a local one with
  ``workers`` CPUs; each shard is a task retried ``max_retries`` times. DST must then be a path every node sees.
  Worker processes are spawned (never forked), so a script calling ``convert(..., workers=2)`` needs the usual
  ``if __name__ == "__main__":`` guard; each costs a second or two of start-up (imports) per job.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from mmfeed._parsing import FRAME_SIZE, frame_size
from mmfeed.loaders.conversion.engines import ConvertError, Progress, encoder_versions, run_local, run_ray

__all__ = ["MANIFEST", "ConvertError", "ConvertSummary", "add_arguments", "convert", "run"]

log = logging.getLogger(__name__)

MANIFEST = "mmfeed-convert.jsonl"
"""The manifest's file name, beside the shards."""

DEFAULT_EPISODES_PER_SHARD = 8
_FORMAT = {"format": "mmfeed-convert", "version": 1}


@dataclass(frozen=True)
class Job:
    """What decides the output's bytes (and where it goes): every worker gets one."""

    src: str
    kind: str
    dst: str
    codec: str
    gop: int | None
    crf: int | None
    frame_size: Any
    errors: str
    options: tuple = ()
    """``(name, value)`` of the read options the source is opened with (``fps``, ``layout``, ``split``)."""


@dataclass
class ConvertSummary:
    """What one :func:`convert` call did. ``episodes``, ``shards`` and ``bytes`` count this run's writes;
    ``total_episodes`` and ``total_shards`` what DST holds; ``resumed_shards`` the finished shards it kept.
    ``encode_seconds`` and ``read_seconds`` add up over workers (of ``busy_seconds``, the workers' time in
    shards' episodes; ``open_seconds``: opening the source in each process, imports included);
    ``index_seconds``: building the index on the driver; ``skipped``: every skipped episode in DST
    ``{"episode", "source", "reason"}``."""

    dst: str
    index: str | None
    episodes: int = 0
    shards: int = 0
    bytes: int = 0
    seconds: float = 0.0
    busy_seconds: float = 0.0
    open_seconds: float = 0.0
    read_seconds: float = 0.0
    encode_seconds: float = 0.0
    index_seconds: float = 0.0
    resumed_shards: int = 0
    total_episodes: int = 0
    total_shards: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def encode_share(self) -> float:
        """The share of the workers' time spent encoding video."""
        return self.encode_seconds / self.busy_seconds if self.busy_seconds else 0.0


CODEC_CHOICES = ("h264", "av1", "hevc", "copy")
"""The codecs shards are written with: :data:`mmfeed.codecs.encode.CODECS` and "copy" (named here: the command's
parser imports no codec)."""


def convert(src: Any, dst: str | os.PathLike, *, codec: str = "h264", gop: int | None = None,
            crf: int | None = None, frame_size: Any = None, episodes_per_shard: int | None = None,
            shard_size_mb: float | None = None, workers: int = 1, engine: str = "local",
            ray_address: str | None = None, max_retries: int = 3, resume: bool = False, overwrite: bool = False,
            errors: str = "raise", progress: bool = True, fps: float | None = None, layout: str | None = None,
            split: str | None = None) -> ConvertSummary:
    """Convert ``src`` into shards and their index in ``dst``; return a :class:`ConvertSummary`.

    codec: "h264", "av1", "hevc" (:data:`CODEC_CHOICES`; any other is a ValueError) or "copy" (see the
        module docstring). gop: keyframe interval when encoding (default 30; under "copy", asking for one
        re-encodes). crf: encoder quality (encode_video's default). frame_size: ``(H, W)`` for every video
        feature or ``{feature: (H, W)}``, resized inside the decoder. episodes_per_shard (default 8) or
        shard_size_mb (MB of 10^6 bytes, estimated before encoding: arrays exactly, videos from the source's
        compressed bytes, scaled by the frame area when resized; generated frames at 50:1): how episodes are cut
        into shards. workers: processes (local) or CPUs of a local Ray.
        errors: "raise" stops at the first episode that fails, with a :class:`ConvertError` naming it and its
        source file; "skip" records it in the manifest and converts the rest. progress: a tqdm bar on stderr
        (drawn only when stderr is a terminal). fps, layout, split: how HDF5 and Zarr demonstrations and RLDS
        datasets are read (see :class:`~mmfeed.loaders.sources.options.ReadOptions`; their files record no frame
        rate, so ``fps`` is required for them). An RLDS dataset's pictures become videos, its
        ``language_instruction`` each step's task and its per-episode texts (``episode_metadata.*``) the
        ``"text"`` of each episode's meta.json; its other per-step texts and ragged features are left out, with a
        warning naming them.
    """
    from mmfeed.loaders.conversion.readers import iter_generator, open_reader  # heavy: not at `mmfeed --help`

    read = {k: v for k, v in (("fps", fps), ("layout", layout), ("split", split)) if v is not None}
    job, plan = _check(src, dst, codec, gop, crf, frame_size, episodes_per_shard, shard_size_mb, workers, engine,
                       errors, max_retries, read)
    started = time.perf_counter()
    # the source first: one that cannot be read leaves DST as it was
    reader = open_reader(job) if job.kind != "generator" else None
    generated = iter_generator(src if callable(src) else job.src) if reader is None else None
    total = len(reader) if reader is not None else None
    header = {**_FORMAT, "job": {**{k: v for k, v in asdict(job).items()
                                    if k not in ("dst", "errors") and not (k == "options" and not v)},
                                 **plan, "encoder": encoder_versions()}}
    manifest = _Manifest(os.path.join(job.dst, MANIFEST), header)
    done, complete = _prepare(job, manifest, resume, overwrite)
    summary = ConvertSummary(dst=job.dst, index=None, resumed_shards=len(done))
    bar = Progress(total, sum(r["written"] + len(r["skipped"]) for r in done.values()), progress)
    tasks = iter(()) if complete else _tasks(job, generated, reader, plan, done)
    runner = run_local(job, tasks, workers) if engine == "local" else run_ray(job, tasks, workers, ray_address,
                                                                               max_retries)
    try:
        for record in runner:
            if record["encoder"] != header["job"]["encoder"]:
                log.warning("shard %d was encoded under %s, not %s as the job: its bytes may differ from a run "
                            "elsewhere", record["shard"], record["encoder"], header["job"]["encoder"])
            timing = record.pop("timing")
            record.pop("encoder")
            manifest.append(record)
            done[record["shard"]] = record
            summary.episodes += record["written"]
            summary.shards += bool(record["file"])
            summary.bytes += record["size"]
            summary.busy_seconds += timing["seconds"]
            summary.open_seconds += timing["open"]
            summary.read_seconds += timing["read"]
            summary.encode_seconds += timing["encode"]
            bar.update(record)
    finally:
        bar.close()
    index_start = time.perf_counter()
    summary.index = _finish(job, manifest, done)
    summary.index_seconds = time.perf_counter() - index_start
    summary.seconds = time.perf_counter() - started
    summary.total_episodes = sum(r["written"] for r in done.values())
    summary.total_shards = sum(bool(r["file"]) for r in done.values())
    summary.skipped = [s for k in sorted(done) for s in done[k]["skipped"]]
    return summary


def _check(src, dst, codec, gop, crf, frame_size, episodes_per_shard, shard_size_mb, workers, engine, errors,
           max_retries, read: dict[str, Any] | None = None) -> tuple[Job, dict[str, Any]]:
    """The job and its shard plan settings, every argument validated before anything is read or written."""
    from mmfeed.codecs.encode import encoder_name
    from mmfeed.loaders.conversion.readers import source_kind

    if codec not in CODEC_CHOICES:
        raise ValueError(f"codec {codec!r} is not one mmfeed writes shards with; choose one of {list(CODEC_CHOICES)}")
    if codec != "copy":
        encoder_name(codec)  # this PyAV has the encoder
    for name, value, low in (("gop", gop, 1), ("episodes_per_shard", episodes_per_shard, 1), ("workers", workers, 1),
                             ("max_retries", max_retries, 0)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if episodes_per_shard is not None and shard_size_mb is not None:
        raise ValueError("give episodes_per_shard or shard_size_mb, not both")
    if shard_size_mb is not None and not (isinstance(shard_size_mb, (int, float)) and shard_size_mb > 0):
        raise ValueError(f"shard_size_mb must be a number > 0, got {shard_size_mb!r}")
    if engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    if isinstance(frame_size, Mapping):
        frame_size = {str(k): tuple(int(v) for v in s) for k, s in sorted(frame_size.items())}
    elif frame_size is not None:
        frame_size = tuple(int(v) for v in frame_size)
        if len(frame_size) != 2 or min(frame_size) < 2 or frame_size[0] % 2 or frame_size[1] % 2:
            raise ValueError(f"frame_size must be (height, width), both even and >= 2, got {frame_size!r}")
    kind = source_kind(src)
    if kind == "generator":
        spec = _jsonable(src) if callable(src) else os.fspath(src)
    elif "://" in os.fspath(src) and not os.fspath(src).startswith("file://"):
        spec = os.fspath(src)
    else:
        spec = os.path.abspath(os.fspath(src).removeprefix("file://"))
        if not os.path.exists(spec) and not any(c in spec for c in "{*?["):
            raise FileNotFoundError(f"{src}: no such file or directory (SRC is a LeRobot v3 directory, webdataset "
                                    "shards or module:function)")
    dst = os.path.abspath(os.fspath(dst))
    if kind != "generator" and os.path.realpath(spec.rstrip("/")) == os.path.realpath(dst):
        raise ValueError(f"DST {dst} is SRC: write the conversion to another directory")
    plan = {"episodes_per_shard": None if shard_size_mb is not None else episodes_per_shard or
            DEFAULT_EPISODES_PER_SHARD, "shard_size_mb": shard_size_mb}
    read = dict(read or {})
    if read and kind != "dataset":
        what = {"generator": "a generator", "lerobot": "a LeRobot directory"}.get(kind, "webdataset shards")
        raise ValueError(f"{src}: {sorted(read)} are read options of HDF5 and Zarr demonstrations and RLDS "
                         f"datasets, and SRC is {what}; drop them")
    if read.get("fps") is not None:
        from mmfeed.loaders.sources.options import ReadOptions

        ReadOptions(fps=read["fps"])  # a number > 0, checked now
    return Job(spec, kind, dst, codec, gop, crf, frame_size, errors, tuple(sorted(read.items()))), plan


def _tasks(job: Job, generated: Iterator | None, reader: Any, plan: dict[str, Any], done: dict[int, dict]
           ) -> Iterator[tuple[int, list]]:
    """``(shard, items)`` for every shard not finished yet, in shard order; items are episode indices or, for a
    generator, its episodes normalized (the generator is run here, in the driver, and must be deterministic)."""
    if reader is not None:
        estimate = reader.estimate if plan["shard_size_mb"] is not None else None
        stream = ((i, i, estimate(i) if estimate else 0.0) for i in range(len(reader)))
    else:
        stream = _generated(job, generated, plan["shard_size_mb"] is not None)
    for k, chunk in enumerate(_cut(stream, plan)):
        first, last = chunk[0][0], chunk[-1][0] + 1
        if k in done:
            if done[k]["episodes"] != [first, last]:
                raise ValueError(f"{job.dst}: shard {k} was planned with episodes {done[k]['episodes']} but now "
                                 f"gets [{first}, {last}): the source changed since the run being resumed")
            continue
        yield k, [item for _, item, _ in chunk]


def _generated(job: Job, generated: Iterator, estimate: bool) -> Iterator[tuple[int, dict, float]]:
    from mmfeed.loaders.conversion.readers import estimate_generated, normalize_episode

    keys: dict[str, int] = {}
    for i, episode in enumerate(generated):
        item = normalize_episode(episode, i)
        if item["key"] in keys:
            raise ValueError(f"{job.src}: episodes {keys[item['key']]} and {i} both have key {item['key']!r}; keys "
                             "must be unique")
        keys[item["key"]] = i
        yield i, item, estimate_generated(item) if estimate else 0.0


def _cut(stream: Iterator[tuple[int, Any, float]], plan: dict[str, Any]) -> Iterator[list]:
    """Consecutive episodes in shards: ``episodes_per_shard`` each, or closed before the estimated bytes would
    pass ``shard_size_mb`` (a shard holds at least one episode)."""
    chunk: list = []
    size, target = 0.0, (plan["shard_size_mb"] or 0) * 1e6
    for entry in stream:
        if chunk and (len(chunk) == plan["episodes_per_shard"] if not target else size + entry[2] > target):
            yield chunk
            chunk, size = [], 0.0
        chunk.append(entry)
        size += entry[2]
    if chunk:
        yield chunk


class _Manifest:
    """The JSON-lines manifest: the job, one line per finished shard, a completion line."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path, self.header = path, json.loads(json.dumps(header, default=_jsonable))

    def read(self) -> tuple[dict | None, dict[int, dict], bool]:
        """``(header, {shard: record}, complete)`` of the file; a torn last line (a killed append) is ignored."""
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        parsed = []
        for n, line in enumerate(lines):
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                if n != len(lines) - 1:
                    raise ValueError(f"{self.path}: line {n + 1} is not JSON; the manifest is damaged") from None
        header = parsed[0] if parsed and parsed[0].get("format") == _FORMAT["format"] else None
        records = {int(r["shard"]): r for r in parsed[1:] if "shard" in r}
        return header, records, any(r.get("complete") for r in parsed[1:])

    def rewrite(self, records: Mapping[int, dict], footer: dict | None = None) -> None:
        """The manifest in canonical form (header, shards in order, footer), atomically."""
        lines = [self.header, *(records[k] for k in sorted(records)), *([footer] if footer else [])]
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as f:
            f.write("".join(_line(x) for x in lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, self.path)

    def append(self, record: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(_line(record))
            f.flush()
            os.fsync(f.fileno())


def _line(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable) + "\n"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    if callable(obj):
        return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"
    raise TypeError(f"{obj!r} is not JSON serializable")


def _prepare(job: Job, manifest: _Manifest, resume: bool, overwrite: bool) -> tuple[dict[int, dict], bool]:
    """Make DST ready: refuse one holding another dataset (unless overwrite), or a conversion with other
    settings; return the shards a resumed job keeps (their files checked by size) and whether it was complete
    (then nothing is left to convert, and the source is not read again)."""
    from mmfeed.loaders.stores.index import INDEX_FILENAME

    dst = job.dst
    os.makedirs(dst, exist_ok=True)
    ours = [os.path.join(dst, n) for n in (MANIFEST, INDEX_FILENAME)]
    held = sorted(glob.glob(os.path.join(dst, "*.tar")) + [p for p in ours if os.path.exists(p)]
                  + [p for p in (os.path.join(dst, "meta", "info.json"),) if os.path.exists(p)])
    header, records, complete = None, {}, False
    if os.path.exists(manifest.path):
        header, records, complete = manifest.read()
        if header is not None and not records and not complete:  # a job that finished no shard: nothing to keep
            held.remove(manifest.path)
    if overwrite and held:
        for path in glob.glob(os.path.join(dst, "shard-*.tar")) + glob.glob(os.path.join(dst, ".*.partial")) + ours:
            if os.path.exists(path):
                os.unlink(path)
        left = sorted(glob.glob(os.path.join(dst, "*.tar")) + glob.glob(os.path.join(dst, "meta", "info.json")))
        if left:
            raise FileExistsError(f"DST {dst} holds files that are not a conversion's ({left[:3]}); overwrite removes "
                                  "only shard-*.tar, the index and the manifest: choose another directory")
        log.warning("overwrite: removed the shards, index and manifest in %s", dst)
        header, records, held, complete = None, {}, [], False
    if held and not (resume and header is not None):
        what = ("a conversion (its manifest " + MANIFEST + ")" if header is not None else
                f"another dataset ({', '.join(os.path.basename(p) for p in held[:3])})")
        hint = "resume=True (--resume) finishes it" if header is not None else "resume only continues a conversion"
        raise FileExistsError(f"DST {dst} already holds {what}: pass overwrite=True (--overwrite) to replace it; "
                              f"{hint}")
    if header is not None and records and header != manifest.header:
        diff = sorted(k for k in set(header["job"]) | set(manifest.header["job"])
                      if header["job"].get(k) != manifest.header["job"].get(k))
        there, now = ([h["job"].get(k) for k in diff] for h in (header, manifest.header))
        raise ValueError(f"DST {dst} holds a conversion made with other settings ({', '.join(diff)}: {there} there, "
                         f"{now} now); resume it with the same settings, or pass overwrite=True")
    kept = {}
    for k, record in records.items():
        path = os.path.join(dst, record["file"]) if record["file"] else None
        if path is None or os.path.isfile(path) and os.path.getsize(path) == record["size"]:
            kept[k] = record
        else:
            log.warning("%s: shard %d is listed as finished but its file is missing or changed; converting it again",
                        dst, k)
            complete = False
    listed = {os.path.join(dst, r["file"]) for r in kept.values() if r["file"]}
    for stray in glob.glob(os.path.join(dst, ".shard-*.tar.partial")) + glob.glob(os.path.join(dst, "shard-*.tar")):
        if stray not in listed:  # unfinished, or renamed just before a kill could record it: converted again
            os.unlink(stray)
    if kept:
        log.info("resuming %s: %d shard(s) already finished", dst, len(kept))
    manifest.rewrite(kept)
    return kept, complete


def _finish(job: Job, manifest: _Manifest, done: dict[int, dict]) -> str | None:
    """Write the index of every finished shard (in shard order) and the manifest's completion line."""
    from mmfeed.loaders.stores.index import INDEX_FILENAME, write_index

    shards = [os.path.join(job.dst, done[k]["file"]) for k in sorted(done) if done[k]["file"]]
    index = os.path.join(job.dst, INDEX_FILENAME)
    footer = {"complete": True, "episodes": sum(r["written"] for r in done.values()),
              "shards": len(shards), "skipped": sum(len(r["skipped"]) for r in done.values())}
    if shards:
        partial = os.path.join(job.dst, f".{INDEX_FILENAME}.partial")
        write_index(shards, partial, quantiles=True, record_mtime=False)
        os.replace(partial, index)
    else:
        log.warning("%s: no episode was converted; no index written", job.dst)
        index = None
    manifest.rewrite(done, footer)
    return index


# --------------------------------------------------------------------------------------------------------- CLI


def _int(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        return value

    return parse


HELP = "convert a LeRobot v3 dataset, shards or your own episodes into indexed shards (local processes or Ray)"
DESCRIPTION = ("Convert SRC (a LeRobot v3 directory or fsspec URL, webdataset shards, or module:function naming a "
               "generator of episode dicts) into webdataset shards with their index in DST: episode i goes to "
               "shard i // --episodes-per-shard, byte-identical whatever the engine or the number of workers; "
               "videos encoded with --codec (copy keeps the source's compressed video); stats merged exactly, "
               "quantiles from a mergeable sketch. A manifest beside the shards lists finished shards; "
               "--resume continues a killed job to the same bytes.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``mmfeed convert`` options, on ``parser`` (a subcommand's)."""
    parser.add_argument("src", metavar="SRC", help="LeRobot v3 directory or URL, webdataset shards (directory, "
                                                  "pattern), HDF5 or Zarr demonstrations or an RLDS dataset "
                                                  "(with --fps) or module:function (a generator of episodes)")
    parser.add_argument("dst", metavar="DST", help="output directory (new or empty, unless --resume/--overwrite)")
    parser.add_argument("--codec", default="h264", choices=CODEC_CHOICES,
                        help="h264 (default), av1, hevc, or copy: keep the source's video bytes when no --gop or "
                             "--frame-size asks for a re-encode")
    parser.add_argument("--gop", type=_int(1), default=None, help="keyframe interval when encoding (default 30)")
    parser.add_argument("--crf", type=_int(0), default=None, help="encoder quality (default: the codec's)")
    parser.add_argument("--frame-size", type=frame_size(), default=None, metavar=FRAME_SIZE,
                        help=f"resize every video to {FRAME_SIZE}, e.g. 320x240: 320 wide, 240 high (inside the "
                             "decoder)")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--episodes-per-shard", type=_int(1), default=None, metavar="N",
                       help=f"episodes per shard (default {DEFAULT_EPISODES_PER_SHARD})")
    sizes.add_argument("--shard-size-mb", type=float, default=None, metavar="MB",
                       help="cut shards near this size instead, estimated from the source's bytes")
    parser.add_argument("--workers", type=_int(1), default=1,
                        help="processes (local) or CPUs of a Ray cluster started here (default 1)")
    parser.add_argument("--engine", choices=["local", "ray"], default="local",
                        help="local processes (default) or Ray tasks (pip install 'mmfeed[ray]')")
    parser.add_argument("--ray-address", default=None, help="Ray cluster to join (default: a running one, else a "
                                                            "local one)")
    parser.add_argument("--max-retries", type=_int(0), default=3, help="Ray retries of a failed shard (default 3)")
    parser.add_argument("--resume", action="store_true", help="continue the conversion in DST")
    parser.add_argument("--overwrite", action="store_true", help="replace the shards, index and manifest in DST")
    parser.add_argument("--errors", choices=["raise", "skip"], default="raise",
                        help="raise: stop at an episode that fails (default); skip: record it in the manifest")
    parser.add_argument("--fps", type=float, default=None, help="steps per second of HDF5 and Zarr "
                        "demonstrations and RLDS datasets (their files record none)")
    parser.add_argument("--layout", default=None, help="HDF5: robomimic or aloha; Zarr: replay_buffer (default: "
                        "detected)")
    parser.add_argument("--split", default=None, help="RLDS: the split (default train; "
                        "'train[:90%%]' slices it); HDF5 (robomimic): the episodes of mask/<SPLIT> only")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (one is drawn only when "
                        "stderr is a terminal)")


def run(args: argparse.Namespace) -> int:
    """Run ``mmfeed convert`` from parsed arguments; print the summary; return the exit status (0)."""
    size = None if args.frame_size is None else args.frame_size.hw  # WIDTHxHEIGHT on the command line, (H, W) here
    summary = convert(args.src, args.dst, codec=args.codec, gop=args.gop, crf=args.crf, frame_size=size,
                      episodes_per_shard=args.episodes_per_shard, shard_size_mb=args.shard_size_mb,
                      workers=args.workers, engine=args.engine, ray_address=args.ray_address,
                      max_retries=args.max_retries, resume=args.resume, overwrite=args.overwrite, errors=args.errors,
                      progress=not args.no_progress, fps=args.fps, layout=args.layout, split=args.split)
    seconds = max(summary.seconds, 1e-9)
    print(f"converted {summary.episodes} episode(s) into {summary.shards} shard(s), {summary.bytes / 1e6:.1f} MB, in "
          f"{summary.seconds:.1f} s ({summary.episodes / seconds:.2f} episodes/s, {summary.bytes / 1e6 / seconds:.1f} "
          f"MB/s, {summary.encode_share:.0%} of worker time encoding)"
          + (f"; kept {summary.resumed_shards} finished shard(s)" if summary.resumed_shards else ""))
    print(f"{summary.dst}: {summary.total_episodes} episode(s) in {summary.total_shards} shard(s), index "
          f"{summary.index}")
    for s in summary.skipped:
        print(f"skipped episode {s['episode']} ({s['source']}): {s['reason']}")
    return 0

