"""The decoded-frame cache (open_dataset(..., cache=DIR)): samples bit-identical to uncached ones through windows,
chunks and packed batches with 0 and 2 worker processes; warm reads never decode (the videos are overwritten with
garbage of the same size and mtime after warming); the budget evicts; a changed source is refilled; a writer killed
mid-fill leaves nothing a reader trusts."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from http_server import serve
from mmfeed import DataLoader
from mmfeed.cli import main
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.stores.frame_store import LAYOUT, FrameStore, Segment
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

CAM = "observation.images.cam_high"
SIZE = (32, 48)
SPEC = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], "observation.state": [0.0],
                                         "action": [i / 30 for i in range(4)]})


def packing(**kwargs):
    return Packing(layout=TokenLayout(tokens_per_frame={CAM: 8}), plan=PlanConfig(capacity=128, rows_per_batch=2),
                   seed=1, **kwargs)


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(3, seed=7, min_length=10, max_length=16, cameras=("cam_high",), height=48, width=64)


@pytest.fixture
def lerobot(tmp_path, episodes):
    return write_lerobot(tmp_path / "lr", episodes)  # AV1, GOP 2, as LeRobot writes


@pytest.fixture
def shards(tmp_path, episodes):
    write_webdataset(tmp_path / "wds", episodes, episodes_per_shard=2, gop=4)
    return tmp_path / "wds"


def windows(path, workers, **options):
    view = open_dataset(path, frame_size=SIZE, **options).windows(SPEC)
    loader = DataLoader(view, batch_size=8, shuffle=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(3))
    return [b[CAM].clone() for b in loader]


def packed(path, workers, **kwargs):
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in ("cache", "cache_bytes")}
    loader = DataLoader(open_dataset(path, frame_size=SIZE, **options), packing=packing(**kwargs),
                        num_workers=workers)
    return [b.data[CAM].clone() for b in loader]


def equal(a, b):
    return len(a) == len(b) > 0 and all(torch.equal(x, y) for x, y in zip(a, b))


def spoil_videos(root):
    """Overwrite every video under ``root`` with zeros of the same size and mtime: any decode now fails, while
    the cache keys (path, size, mtime) stay."""
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith((".mp4", ".tar")):
                path = os.path.join(folder, name)
                st = os.stat(path)
                if name.endswith(".tar"):  # keep the tar headers: overwrite only the mp4 members' bytes
                    continue
                with open(path, "r+b") as f:
                    f.write(bytes(st.st_size))
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def spoil_shard_videos(path):
    """Zero the bytes of every mp4 member of the shards at ``path``, keeping size and mtime."""
    source = open_dataset(path)
    offsets, sizes = source._members[CAM]
    for e in range(len(source)):
        shard = source._shards[source._shard_of[e]]
        st = os.stat(shard)
        with open(shard, "r+b") as f:
            f.seek(int(offsets[e]))
            f.write(bytes(int(sizes[e])))
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("workers", [0, 2])
def test_lerobot_windows_are_identical_cached_and_warm_reads_never_decode(lerobot, tmp_path, workers):
    plain = windows(lerobot, workers)
    cold = windows(lerobot, workers, cache=tmp_path / "c")
    assert FrameStore(tmp_path / "c").info().segments == 3  # one per episode of the one camera
    spoil_videos(lerobot)
    with pytest.raises(Exception):
        windows(lerobot, 0)  # the videos are garbage now: decoding fails
    warm = windows(lerobot, workers, cache=tmp_path / "c")
    assert equal(plain, cold) and equal(plain, warm)


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_packed_batches_and_chunks_are_identical_cached_and_warm_reads_never_decode(shards, tmp_path,
                                                                                         workers):
    plain = packed(shards, workers, window=SPEC)
    plain_chunks = packed(shards, 0, max_length=6)
    cold = packed(shards, workers, window=SPEC, cache=tmp_path / "c")
    spoil_shard_videos(shards)
    warm = packed(shards, workers, window=SPEC, cache=tmp_path / "c")
    chunks = packed(shards, 0, max_length=6, cache=tmp_path / "c")
    assert equal(plain, cold) and equal(plain, warm) and equal(plain_chunks, chunks)
    assert FrameStore(tmp_path / "c").info().segments == 3


def test_yuv420_frames_are_cached_as_delivered(lerobot, tmp_path):
    plain = windows(lerobot, 0, frame_format="yuv420")
    assert plain[0].shape[-2:] == (SIZE[0] * 3 // 2, SIZE[1])
    assert equal(plain, windows(lerobot, 0, frame_format="yuv420", cache=tmp_path / "c"))
    assert equal(plain, windows(lerobot, 0, frame_format="yuv420", cache=tmp_path / "c"))
    assert equal(windows(lerobot, 0), windows(lerobot, 0, cache=tmp_path / "c"))  # RGB: segments of their own
    assert FrameStore(tmp_path / "c").info().segments == 6


def test_a_warm_source_opens_no_decoder(lerobot, tmp_path):
    windows(lerobot, 0, cache=tmp_path / "c")
    source = open_dataset(lerobot, frame_size=SIZE, cache=tmp_path / "c")
    view = source.windows(SPEC)
    for i in range(len(view)):
        view[i]
    assert sum(c.opened for c in source._videos.values()) == 0 and source._store.filled == 0
    assert source._store.hits >= len(view)


def test_a_remote_lerobot_directory_is_cached_alike(lerobot, tmp_path):
    """Over HTTP (videos keyed by URL and size): the same windows as the local copy, and a warm source opens no
    decoder and asks the server for no video byte (only the video's size, part of its key)."""
    with serve(os.path.dirname(lerobot)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/{os.path.basename(lerobot)}"
        assert equal(windows(lerobot, 0), windows(url, 0, cache=tmp_path / "c"))
        served = len(server.served)
        source = open_dataset(url, frame_size=SIZE, cache=tmp_path / "c")
        view = source.windows(SPEC)
        for i in range(len(view)):
            view[i]
        assert sum(c.opened for c in source._videos.values()) == 0 and source._store.hits >= len(view)
        assert not [r for r in server.served[served:] if ".mp4" in r[1] and r[0] != "HEAD"]  # HEAD: its size


def test_budget_evicts_least_recently_used_and_never_stores_a_segment_over_it(lerobot, tmp_path):
    plain = windows(lerobot, 0)
    one = SIZE[0] * SIZE[1] * 3 * 16  # the longest episode's frames
    small = windows(lerobot, 0, cache=tmp_path / "small", cache_bytes=int(one * 1.5))
    info = FrameStore(tmp_path / "small").info()
    assert info.bytes <= one * 1.5 + 4096 and 1 <= info.segments < 3
    tiny = windows(lerobot, 0, cache=tmp_path / "tiny", cache_bytes=100)
    assert FrameStore(tmp_path / "tiny").info().segments == 0
    assert equal(plain, small) and equal(plain, tiny)


def test_a_changed_video_is_refilled(lerobot, tmp_path, episodes):
    windows(lerobot, 0, cache=tmp_path / "c")
    write_lerobot(lerobot, make_episodes(3, seed=8, min_length=10, max_length=16, cameras=("cam_high",), height=48,
                                         width=64))
    video = next(os.path.join(d, n) for d, _, ns in os.walk(lerobot) for n in ns if n.endswith(".mp4"))
    os.utime(video, ns=(0, os.stat(video).st_mtime_ns + 10**9))  # a new file, even within the mtime resolution
    assert equal(windows(lerobot, 0), windows(lerobot, 0, cache=tmp_path / "c"))
    assert FrameStore(tmp_path / "c").info().segments == 6  # the stale three age out under the budget


KILLED_WRITER = """
import os, signal, sys
import numpy as np
from mmfeed.loaders.stores.frame_store import FrameStore, Segment
store = FrameStore(sys.argv[1])
def decode(out):
    out[: len(out) // 2] = 7
    out.flush()
    os.kill(os.getpid(), signal.SIGKILL)
store.fill(Segment(("video", 1), frames=8, shape=(4, 6, 3)), decode)
"""


def test_a_writer_killed_mid_fill_leaves_no_frames_and_the_next_writer_refills(tmp_path):
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], timeout=60)
    assert done.returncode == -9
    store = FrameStore(tmp_path)
    segment = Segment(("video", 1), frames=8, shape=(4, 6, 3))
    assert store.get(segment) is None and store.info().partial == 1
    frames = store.fill(segment, lambda out: out.__setitem__(slice(None), np.arange(8)[:, None, None, None]))
    assert [int(f[0, 0, 0]) for f in frames] == list(range(8))
    assert store.info().partial == 0 and FrameStore(tmp_path).get(segment) is not None


KILLED_SOURCE = """
import os, signal, sys
import numpy as np
import mmfeed.loaders.stores.frame_store as frame_store
from mmfeed.loaders import open_dataset
from mmfeed.loaders.sources.requests import EpisodeRequest
real = frame_store.decode_with_context
def decode_then_die(cache, requests, where):
    real(cache, requests, where)
    out = requests[0].out
    out[len(out) // 2:] = 255  # a torn write: the second half not yet decoded
    out.flush()
    os.kill(os.getpid(), signal.SIGKILL)
frame_store.decode_with_context = decode_then_die
source = open_dataset(sys.argv[1], frame_size=(32, 48), cache=sys.argv[2])
source.read_many([EpisodeRequest(0, {"observation.images.cam_high": np.arange(3)})])
"""


def test_a_source_killed_mid_fill_is_refilled_and_reads_the_same_frames(lerobot, tmp_path):
    done = subprocess.run([sys.executable, "-c", KILLED_SOURCE, str(lerobot), str(tmp_path / "c")], timeout=60)
    assert done.returncode == -9
    info = FrameStore(tmp_path / "c").info()
    assert info.segments == 0 and info.partial == 1
    assert equal(windows(lerobot, 0), windows(lerobot, 0, cache=tmp_path / "c"))
    info = FrameStore(tmp_path / "c").info()
    assert info.segments == 3 and info.partial == 0


def test_a_segment_another_process_is_filling_is_decoded_as_asked_without_waiting(tmp_path):
    store = FrameStore(tmp_path)
    segment = Segment(("video", 4), frames=4, shape=(2, 2, 3))
    os.makedirs(store.root)
    fd = os.open(os.path.join(store.root, segment.key + ".lock"), os.O_RDWR | os.O_CREAT)
    held = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; fcntl.flock(int(sys.argv[1]), "
                             "fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)", str(fd)],
                            pass_fds=[fd], stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline().strip() == "locked"
        os.close(fd)
        assert store.fill(segment, lambda out: out.fill(1)) is None and store.info().segments == 0
    finally:
        held.kill()
        held.wait()
    assert store.fill(segment, lambda out: out.fill(1)) is not None  # its lock died with it


def test_a_segment_another_process_evicted_is_filled_again_not_served_from_an_old_map(tmp_path):
    """This process filled (and so mapped) a segment; another process's eviction deletes its file. The next fill
    here finds it missing and stores it again, rather than taking the old map for a stored segment."""
    store = FrameStore(tmp_path)
    segment = Segment(("video", 7), frames=3, shape=(2, 2, 3))
    assert store.fill(segment, lambda out: out.fill(5)) is not None and store.filled == 1
    code = ("import sys; from mmfeed.loaders.stores.frame_store import FrameStore; "
            "store = FrameStore(sys.argv[1], budget_bytes=1); print(store.evict())")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0 and int(done.stdout) == segment.nbytes + 128, done.stderr[-2000:]
    assert store.info().segments == 0 and store.read(segment, np.arange(3)) is None
    again = store.fill(segment, lambda out: out.fill(6))
    assert again is not None and (again == 6).all() and store.filled == 2 and store.info().segments == 1
    assert (store.read(segment, np.arange(3)) == 6).all()


@settings(max_examples=40, deadline=None)
@given(reads=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=25),
       budget=st.integers(1, 300))
def test_the_store_stays_within_its_budget_and_returns_what_was_filled(tmp_path_factory, reads, budget):
    """Any sequence of reads of segments (id, frames of 10 bytes): the store never holds more than the budget
    (but the segment just filled, when it alone fits), a segment over the budget is never stored, and every
    segment read back holds the bytes it was filled with."""
    store = FrameStore(tmp_path_factory.mktemp("budget"), budget_bytes=budget)
    for video, frames in reads:
        segment = Segment(("video", video), frames=frames, shape=(10,))
        got = store.get(segment)
        if got is None:
            got = store.fill(segment, lambda out, v=video: out.fill(v))
        if frames * 10 > budget:
            assert got is None
        else:
            assert got is not None and got.shape == (frames, 10) and (np.asarray(got) == video).all()
        assert store.info().bytes <= budget + 128 * 10  # the .npy headers (128 bytes each) aside
        assert store.info().bytes - 128 * store.info().segments <= budget


FULL_DISK = """
import resource, signal, sys
from mmfeed.loaders.stores.frame_store import FrameStore, Segment
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
store = FrameStore(sys.argv[1], budget_bytes=10**9)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # no file may grow past 4 KiB: a disk that is full
print(store.fill(Segment(("video", 5), frames=10, shape=(100, 100, 3)), lambda out: out.fill(1)))
"""


def test_a_disk_too_full_for_a_segment_stores_nothing_and_says_so_without_a_crash(tmp_path):
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], timeout=60, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
    assert FrameStore(tmp_path).info().segments == 0 and FrameStore(tmp_path).info().partial == 0


def test_a_damaged_file_is_dropped_and_refilled(tmp_path):
    store = FrameStore(tmp_path)
    segment = Segment(("video", 2), frames=4, shape=(2, 2, 3))
    store.fill(segment, lambda out: out.fill(5))
    path = os.path.join(tmp_path, LAYOUT, segment.key + ".npy")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    assert FrameStore(tmp_path).get(segment) is None and not os.path.exists(path)


def test_a_decode_error_during_fill_leaves_nothing(tmp_path):
    store = FrameStore(tmp_path)
    segment = Segment(("video", 3), frames=4, shape=(2, 2, 3))
    with pytest.raises(RuntimeError, match="broken"):
        store.fill(segment, lambda out: (_ for _ in ()).throw(RuntimeError("broken")))
    assert store.info().segments == 0 and store.info().partial == 0


def test_options_are_checked():
    with pytest.raises(ValueError, match="cache_bytes must be an int >= 1"):
        ReadOptions(cache="x", cache_bytes=0)
    with pytest.raises(ValueError, match="give cache=DIR as well"):
        ReadOptions(cache_bytes=10)
    with pytest.raises(TypeError, match="cache must be a directory path"):
        ReadOptions(cache=3)


def test_cli_fills_the_cache_ahead_then_reads_never_decode(lerobot, tmp_path, capsys):
    # WIDTHxHEIGHT on the command line: SIZE is (height, width), as open_dataset takes it
    assert main(["cache", str(lerobot), "--dir", str(tmp_path / "c"), "--frame-size", f"{SIZE[1]}x{SIZE[0]}"]) == 0
    out = capsys.readouterr().out
    assert "3 segments" in out
    plain = windows(lerobot, 0)
    spoil_videos(lerobot)
    assert equal(plain, windows(lerobot, 0, cache=tmp_path / "c"))
    assert main(["cache", "--dir", str(tmp_path / "c"), "--info"]) == 0
    assert "3 segments" in capsys.readouterr().out
    assert main(["cache", "--dir", str(tmp_path / "c"), "--clear"]) == 0
    assert FrameStore(tmp_path / "c").info().segments == 0


def test_reads_go_by_pread_into_the_slot_and_map_nothing(tmp_path):
    """A read copies the asked frames (runs of consecutive ones, repeats, any order) from the segment's file into
    the slot given, contiguous or not, mapping nothing into the process; a file whose header or size no longer
    fits the segment is deleted and reported missing, even after its frames' offset was kept."""
    store = FrameStore(tmp_path)
    segment = Segment(("video", 9), frames=10, shape=(3, 4, 3))
    rng = np.random.default_rng(4)
    want = rng.integers(0, 256, (10, 3, 4, 3), dtype=np.uint8)
    store.fill(segment, lambda out: out.__setitem__(slice(None), want))
    reader = FrameStore(tmp_path)  # another process's view: nothing filled, nothing mapped
    idx = np.array([2, 3, 4, 9, 0, 0, 5])
    assert np.array_equal(reader.read(segment, idx), want[idx])
    slot = np.zeros((len(idx), 3, 8, 3), np.uint8)[:, :, ::2]  # not contiguous
    assert reader.read(segment, idx, slot) is slot and np.array_equal(slot, want[idx])
    assert len(reader._mapped) == 0 and reader.hits == 2
    path = tmp_path / LAYOUT / f"{segment.key}.npy"
    path.write_bytes(path.read_bytes()[:-40])  # truncated after its offset was kept
    assert reader.read(segment, np.array([9])) is None and not path.exists()
    with open(path, "wb") as f:  # as many bytes, another shape in its header
        np.save(f, want.reshape(10, 4, 3, 3))
    assert FrameStore(tmp_path).read(segment, np.array([1])) is None and not path.exists()
    FrameStore(tmp_path).fill(segment, lambda out: out.__setitem__(slice(None), want))  # a process that maps none
    assert np.array_equal(FrameStore(tmp_path).read(segment, np.array([1])), want[[1]])
