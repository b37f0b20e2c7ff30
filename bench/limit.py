"""The physical limit of ``mmfeed bench``: the frames a plan must decode, decoded and nothing else.

For the batches mmfeed delivered in a measured stretch, each batch's work is what any loader must decode to hand
those frames out: per video file, the sorted union of the frames the batch's samples ask for, each reached from
its keyframe (its GOP dependencies: seek to the keyframe at or before a wanted frame unless the decoder already
stands in that GOP or just before it, then decode forward). :class:`LimitPool` decodes that work with plain PyAV
in as many processes as the loader has workers (batches dealt round robin, as torch deals them), one decoder
thread each, every video opened beforehand and kept open, and times only the decoding, each batch once in
each variant (in turn first, so that both see the same moment's machine):

- "raw": the decoder's frames only (no colour conversion);
- "rgb": each wanted frame also converted to RGB ``uint8 [H, W, 3]``, the fastest way this machine has: swscale on
  one thread writing straight into the frame's slot of a batch-sized array, as a loader must hold a batch's
  frames at once (the array is reused from batch to batch; :class:`~mmfeed.codecs._sws.DirectRGB`, the conversion
  mmfeed's PyAV reader makes into its batch), or, for a layout that does not take, one ``VideoReformatter`` per
  video on one swscale thread (the array ``frame.to_ndarray(format="rgb24")`` gives; that call builds a new
  swscale context for every frame, several ms where the reused one takes well under 0.1 ms at 320x240, so it
  would not be the limit);
- "rgb_shared": the same conversion into slots in shared memory, as a loader whose workers hand batches to the
  training process must write them: shared memory gets no transparent huge pages unless
  ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` allows them (numpy gives the "rgb" variant's large array
  huge pages), so this variant says what the page size costs.

Nothing is copied, collated, packed or sent to another process. ``frames_per_s`` are the frames the batches
deliver (what mmfeed's delivered frames/s is measured in) per second of the slowest process; the report also
has the frames decoded (GOP dependencies included), the distinct frames wanted, the seeks and the seconds spent
seeking, per batch, and what opening a video costs (probe, container, the first conversion's swscale context).
"""

from __future__ import annotations

import io
import logging
import mmap
import multiprocessing as mp
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from mmfeed.codecs.demux import frames_at_times, input_options, probe

__all__ = ["LimitPool", "batch_work", "decode_work", "limit_figures"]

log = logging.getLogger(__name__)


def video_targets(source: Any, episode: int, feature: str, idx: np.ndarray) -> list[tuple[tuple, Any, np.ndarray]]:
    """``[(key, video, frame indices in that video)]`` of one request's frames of one video feature: a shard's
    member bytes (key: the member), a LeRobot file (key: the file, which holds many episodes), or the PNG/JPEG
    bytes of each image a LeRobot image feature stores in its parquet (key: the image; its one frame)."""
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource

    sub, local = source.leaf(episode)
    idx = np.asarray(idx, dtype=np.int64)
    if isinstance(sub, LeRobotSource):
        if sub.info["features"][feature]["dtype"] == "image":
            rows = sub._rows(local, feature, idx)
            first = int(sub._meta["dataset_from_index"][local])
            return [(("image", id(sub), feature, first + int(i)), bytes(data), np.zeros(1, np.int64))
                    for i, data in zip(idx.tolist(), rows)]
        path, times = sub._frame_times(local, feature, idx)
        return [(("file", str(path)), str(path), frames_at_times(probe(str(path)), times, sub.tolerance_s))]
    if not hasattr(sub, "member_bytes"):
        raise TypeError(f"{type(sub).__name__}: the decode limit reads shards and LeRobot directories")
    return [(("member", id(sub), local, feature), sub.member_bytes(local, feature), idx)]


def batch_work(items: Any, samples: np.ndarray) -> tuple[list[tuple[tuple, Any, np.ndarray]], int]:
    """What one batch of sample ids must decode: ``[(key, video, sorted unique frame indices)]`` per video file
    (per image of an image feature), and the frames it delivers (repeats included, as the batch holds them)."""
    source = items.source
    videos = {f for f, feature in source.features.items() if feature.kind == "video"}
    wanted: dict[tuple, list] = {}
    delivered = 0
    for read in items.requests(np.asarray(samples, dtype=np.int64)):
        request = read.request
        for feature, idx in request.indices.items():
            if feature not in videos or not len(idx):
                continue
            for key, video, frames in video_targets(source, request.episode, feature, idx):
                wanted.setdefault(key, [video, []])[1].append(frames)
            delivered += len(idx)
    return [(k, v, np.unique(np.concatenate(parts))) for k, (v, parts) in wanted.items()], delivered


class _Video:
    """One open video: container, stream (one thread), its frames' pts and keyframes, a reused conversion and
    the array it writes to. ``open_s``: the seconds opening took (probe, container, first frame decoded and
    converted, which builds the swscale context): what a loader pays again each time it reopens a video it had
    closed."""

    def __init__(self, video: Any) -> None:
        import av
        from av.video.reformatter import VideoReformatter

        from mmfeed.codecs._sws import DirectRGB

        start = time.perf_counter()
        self.info = probe(video)
        in_memory = isinstance(video, (bytes, bytearray))  # the demuxers and protocols mmfeed's reader allows
        self.container = av.open(io.BytesIO(video) if in_memory else video,
                                 container_options=input_options(path=not in_memory))
        self.stream = self.container.streams.video[0]
        self.stream.thread_count, self.stream.thread_type = 1, "SLICE"
        self.index_of = {int(p): i for i, p in enumerate(self.info.pts)}
        self.reformatter = VideoReformatter()
        first = next(self.container.decode(self.stream))
        self.direct = DirectRGB()
        self.out = _aligned(1, first.height, first.width)[0]  # where a frame converted on its own goes
        # swscale on one thread per call, where PyAV takes it (its default picks threads per call, which costs
        # more than converting a small frame): the fastest conversion, as mmfeed's reader converts
        self.one_thread = {"threads": 1}
        try:
            self.rgb(first)
        except TypeError:
            self.one_thread = {}
            self.rgb(first)
        self.open_s = time.perf_counter() - start

    def reformat(self, frame: Any) -> np.ndarray:
        """``frame`` as uint8 RGB ``[H, W, 3]`` through this video's reformatter."""
        return self.reformatter.reformat(frame, format="rgb24", width=frame.width, height=frame.height,
                                         **self.one_thread).to_ndarray()

    def rgb(self, frame: Any, out: np.ndarray | None = None) -> np.ndarray:
        """``frame`` as uint8 RGB ``[H, W, 3]``: straight into ``out`` (or this video's own array) where
        swscale takes the layout, else through the reformatter."""
        out = self.out if out is None else out
        if self.direct.convert_into(frame, out, self.reformat):
            return out
        return self.reformat(frame)

    def close(self) -> None:
        self.direct.close()
        self.container.close()


def _aligned(n: int, height: int, width: int, shared: bool = False, phase: int = 0) -> np.ndarray:
    """A uint8 ``[n, height, width, 3]`` array starting ``phase`` bytes past a 64-byte boundary (0: aligned, as a
    batch's video frame slots in shared memory are); ``shared``: in shared memory itself, its pages mapped (4 KB
    pages: shared memory gets no transparent huge pages unless ``/sys/kernel/mm/transparent_hugepage/shmem_enabled``
    allows them, where numpy gives a large private array huge pages)."""
    size = n * height * width * 3
    if shared:
        raw = np.frombuffer(mmap.mmap(-1, size + 128), np.uint8)
        raw[:] = 0
    else:
        raw = np.empty(size + 128, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64 + phase
    return raw[offset : offset + size].reshape(n, height, width, 3)


def decode_work(video: _Video, targets: np.ndarray, convert: bool,
                out: np.ndarray | None = None) -> tuple[int, int, float]:
    """Decode ``targets`` (sorted, unique) of one video as a batch must, from a fresh seek; with ``convert``,
    target ``k`` is converted into ``out[k]`` (its own array when ``out`` is None); (frames decoded, seeks,
    seconds seeking)."""
    info, container, stream = video.info, video.container, video.stream
    frames, pos, decoded, seeks, seek_s = None, -1, 0, 0, 0.0
    for k, target in enumerate(targets.tolist()):
        key = int(info.gop_start[target])
        if frames is None or target <= pos or key > pos + 1:
            start = time.perf_counter()
            container.seek(int(info.pts[key]), stream=stream, backward=True, any_frame=False)
            seek_s += time.perf_counter() - start
            frames, pos, seeks = container.decode(stream), -1, seeks + 1
        got = None
        for frame in frames:
            decoded += 1
            i = video.index_of.get(frame.pts, -1) if frame.pts is not None else -1
            if i < 0:
                continue
            pos = i
            if i >= target:
                got = frame if i == target else None
                break
        if got is None:
            raise RuntimeError(f"{info.path}: the decoder did not produce frame {target} after seeking to {key}")
        if convert:
            video.rgb(got, None if out is None else out[k])
    return decoded, seeks, seek_s


_VARIANTS = ("rgb", "raw", "rgb_shared")
"""Each batch decoded with conversion, without it, and with it into slots in shared memory (as a batch that goes to
another process must be written)."""


def _measure(items: Any, videos: dict[tuple, _Video], batches: Sequence[np.ndarray], lead: int) -> dict[str, Any]:
    """Each batch decoded three times, with and without conversion and with it into shared memory (each in turn
    first), each timed on its own: the variants see the same moment's machine, so their differences (the
    conversion, the page size of shared memory) hold under changing load."""
    work = [batch_work(items, b) for b in batches]
    opened = []
    for batch, _ in work:  # open every video first: opening is no part of the limit
        for key, video, _ in batch:
            if key not in videos:
                videos[key] = _Video(video)
                opened.append(videos[key].open_s)
    slots, shared = _BatchSlots(), _BatchSlots(shared=True)
    for batch, _ in work[:lead]:  # untimed: the loaders' last in-flight batches finish meanwhile
        for (key, _, targets), slot in zip(batch, slots.of(batch, videos)):
            decode_work(videos[key], targets, True, slot)
    out: dict[str, Any] = {"batches": len(work), "delivered": 0, "wanted": 0, "opened": len(opened),
                           "open_s": sum(opened)}
    out.update({f"{v}_{k}": 0.0 for v in _VARIANTS for k in ("seconds", "cpu_s", "decoded", "seeks", "seek_s")})
    for n, (batch, delivered) in enumerate(work):
        outs = {"rgb": slots.of(batch, videos), "rgb_shared": shared.of(batch, videos)}
        outs["raw"] = outs["rgb"]
        for variant in _VARIANTS[n % 3:] + _VARIANTS[:n % 3]:
            start, cpu = time.perf_counter(), time.process_time()
            for (key, _, targets), slot in zip(batch, outs[variant]):
                decoded, seeks, seek_s = decode_work(videos[key], targets, variant != "raw", slot)
                out[f"{variant}_decoded"] += decoded
                out[f"{variant}_seeks"] += seeks
                out[f"{variant}_seek_s"] += seek_s
            out[f"{variant}_seconds"] += time.perf_counter() - start
            out[f"{variant}_cpu_s"] += time.process_time() - cpu
        out["delivered"] += delivered
        out["wanted"] += sum(len(t) for _, _, t in batch)
    return out


class _BatchSlots:
    """The frame slots of one batch, per frame size one array for all of the batch's frames of that size, reused
    from batch to batch (grown when a batch holds more)."""

    def __init__(self, shared: bool = False) -> None:
        self._arrays: dict[tuple[int, int], np.ndarray] = {}
        self.shared = shared

    def of(self, batch: list[tuple[tuple, Any, np.ndarray]], videos: dict[tuple, _Video]) -> list[np.ndarray]:
        """``[len(targets), H, W, 3]`` slots for each video of ``batch``, side by side in one array per size."""
        sizes = [videos[key].out.shape[:2] for key, _, _ in batch]
        need: dict[tuple[int, int], int] = {}
        for size, (_, _, targets) in zip(sizes, batch):
            need[size] = need.get(size, 0) + len(targets)
        for size, n in need.items():
            if size not in self._arrays or len(self._arrays[size]) < n:
                self._arrays[size] = _aligned(n, *size, shared=self.shared)
        used = dict.fromkeys(need, 0)
        outs = []
        for size, (_, _, targets) in zip(sizes, batch):
            outs.append(self._arrays[size][used[size] : used[size] + len(targets)])
            used[size] += len(targets)
        return outs


def _serve(conn: Any, items: Any) -> None:
    """A limit process: measure each task it receives until it receives None."""
    videos: dict[tuple, _Video] = {}
    try:
        while True:
            task = conn.recv()
            if task is None:
                break
            try:
                conn.send(_measure(items, videos, *task))
            except Exception as err:  # reported in the parent, which raises it
                conn.send({"error": f"{type(err).__name__}: {err}"})
    finally:
        for video in videos.values():
            video.close()
        conn.close()


class LimitPool:
    """``processes`` forked decode processes (fork them before any loader starts its threads).

    ``measure(batches)``: the batches (sample ids of ``items``) dealt round robin and decoded side by side, each
    with and without conversion (see :meth:`measure`).
    """

    def __init__(self, items: Any, processes: int) -> None:
        ctx = mp.get_context("fork")
        self.processes = max(1, int(processes))
        self._conns, self._procs = [], []
        for _ in range(self.processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, items), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    def measure(self, batches: Sequence[np.ndarray], *, lead: int = 0) -> dict[str, Any]:
        """Decode ``batches`` (dealt round robin) with and without conversion, and with it into shared memory:
        ``{"rgb": figures, "raw": figures, "rgb_shared": figures}``, each the sums over the processes
        (``worker_s``, ``cpu_s``, ``decoded``, ``seeks``, ``seek_s``, ``delivered``, ``wanted``, ``batches``,
        ``opened``, ``open_s``), ``seconds`` the slowest process's, ``frames_per_s`` the delivered frames per
        second of it and ``decoded_frames_per_s``."""
        parts = [list(batches[w :: self.processes]) for w in range(self.processes)]
        busy = [(c, p) for c, p in zip(self._conns, parts) if p]
        for conn, part in busy:
            conn.send((part, min(lead, len(part))))
        results = [conn.recv() for conn, _ in busy]
        for r in results:
            if "error" in r:
                raise RuntimeError(f"decode limit: {r['error']}")
        common = {k: sum(r[k] for r in results) for k in ("batches", "delivered", "wanted", "opened", "open_s")}
        out: dict[str, Any] = {}
        for v in _VARIANTS:
            got = dict(common, **{k: sum(r[f"{v}_{k}"] for r in results) for k in ("cpu_s", "decoded", "seeks",
                                                                                   "seek_s")})
            got["worker_s"] = sum(r[f"{v}_seconds"] for r in results)
            got["seconds"] = max((r[f"{v}_seconds"] for r in results), default=0.0)
            s = got["seconds"] or float("nan")
            got.update(frames_per_s=got["delivered"] / s, decoded_frames_per_s=got["decoded"] / s)
            out[v] = got
        return out

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []

    def __enter__(self) -> LimitPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def limit_figures(ours: dict[str, Any], capacity: list[dict], limits: dict[str, list], workers: int,
                  open_s: float) -> None:
    """Put the limit's figures into mmfeed's (``bench/run.py``): its rates and ``limit_fraction`` round by round
    (``capacity``: mmfeed's capacity stretches; ``limits``: ``{"rgb": [...], "raw": [...]}`` of
    :meth:`LimitPool.measure`, one per stretch), ``limit`` (its own figures) and ``breakdown`` (where a batch's
    worker seconds go; ``open_s``: the seconds one video takes to open)."""
    rgb, raw = limits["rgb"], limits["raw"]
    reps = ours["repeats"]
    reps["decode_limit_frames_per_s"] = [r["frames_per_s"] for r in rgb]
    reps["decode_limit_raw_frames_per_s"] = [r["frames_per_s"] for r in raw]
    reps["limit_fraction"] = [c["delivered_frames_per_s"] / r["frames_per_s"] for c, r in zip(capacity, rgb)]
    # the same in CPU seconds (mmfeed's: its process and workers), which other processes on the machine disturb less
    reps["limit_fraction_cpu"] = [c["frames_per_cpu_second"] * r["cpu_s"] / max(r["delivered"], 1)
                                  for c, r in zip(capacity, rgb)]
    for key in ("decode_limit_frames_per_s", "decode_limit_raw_frames_per_s", "limit_fraction", "limit_fraction_cpu"):
        ours[key] = statistics.median(reps[key])
    med = statistics.median
    limit = {"processes": max(1, workers), "batches": med(r["batches"] for r in rgb),
             "decoded_frames_per_s": med(r["decoded_frames_per_s"] for r in rgb),
             "decoded_per_delivered": med(r["decoded"] / max(r["delivered"], 1) for r in rgb),
             "wanted_per_delivered": med(r["wanted"] / max(r["delivered"], 1) for r in rgb),
             "seeks_per_batch": med(r["seeks"] / max(r["batches"], 1) for r in raw), "open_s": open_s,
             # CPU seconds / wall seconds of the limit's processes: below 1, other processes took the CPUs too
             "cpu_share": med(r["cpu_s"] / r["worker_s"] for r in rgb if r["worker_s"])}
    wall = 1.0 / ours["capacity_batches_per_s"]
    stages = ours["stage_s"]
    decode_s = med(r["worker_s"] / max(r["batches"], 1) for r in raw)
    convert_s = med(a["worker_s"] / max(a["batches"], 1) - b["worker_s"] / max(b["batches"], 1)
                    for a, b in zip(rgb, raw))
    budget = max(1, workers) * wall
    ours["breakdown"] = {
        "wall_s": wall, "worker_budget_s": budget, "limit_decode_s": decode_s, "limit_convert_s": convert_s,
        "limit_seek_s": med(r["seek_s"] / max(r["batches"], 1) for r in raw),
        "decode_beyond_limit_s": stages.get("decode", 0.0) - decode_s - convert_s,
        "reopen_s": ours["readers_opened_per_batch"] * open_s,
        "unstaged_s": budget - sum(stages.values()), **{f"stage_{k}_s": v for k, v in stages.items()}}
    ours["limit"] = limit
