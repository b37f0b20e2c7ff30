"""Bounded work and memory per input: every size a dataset's file states is checked against what is there, and
against the limits, before memory is allocated for it. Each case is a real file (an 8192x8192 H.264 stream PyAV
encodes, LeRobot directories and shards mmfeed.testing writes, tars tarfile writes) with one thing changed; each
is refused with one line naming the file (and member or feature) and the limit, measured in a fresh process to
peak well under 1 GB (the growth of the process's own high-water mark, VmHWM, across the refused call) within
seconds."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmfeed.codecs.arrays import load_npy, npy_header
from mmfeed.codecs.demux import MAX_FRAME_PIXELS, FramesTooLarge, probe
from mmfeed.codecs.errors import DecodeError
from mmfeed.loaders import open_dataset
from mmfeed.loaders.sources.base import EpisodeRequest
from mmfeed.loaders.stores.index import INDEX_FILENAME, write_index
from mmfeed.loaders.transport.json_limits import MAX_JSON_BYTES, MAX_JSON_DEPTH, json_depth
from mmfeed.loaders.sources.options import ReadOptions
from mmfeed.loaders.transport.tar import iter_shard
from mmfeed.testing import frame_pattern, make_episodes, write_lerobot, write_video, write_webdataset

from cli_lines import error_line

pytestmark = pytest.mark.slow  # each case in a fresh process (torch imported anew): about a minute in all

CAM = "observation.images.cam_high"
BOUND_MB = 256  # each refusal's peak growth; the reports: 1.8 to 6.1 GB, or a MemoryError under a 4 GB cap
QUICK_S = 5.0


# -- helpers -------------------------------------------------------------------------------------------------------

_CHILD = """
import json, resource, sys, time
import av, numpy, pyarrow.parquet
import mmfeed.loaders, mmfeed.loaders.formats.lerobot.source
import mmfeed.loaders.formats.webdataset.source, mmfeed.codecs.video

args = json.loads(sys.argv[1])
def peak():  # this memory map's own high-water mark (ru_maxrss would carry the parent's across vfork and exec)
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:"))) * 1024
{setup}
try:  # the high-water mark back to the resident size now, so that growth below an earlier peak counts too
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
before, start = peak(), time.perf_counter()
try:
{body}
except Exception as err:
    out = {{"error": [c.__name__ for c in type(err).__mro__], "message": str(err)}}
else:
    out = {{"error": None}}
out.update(peak_mb=(peak() - before) / 2**20, seconds=time.perf_counter() - start)
print(json.dumps(out))
"""


def refused(body: str, setup: str = "", **args) -> dict:
    """Run ``body`` (Python, ``args`` in scope as a dict) in a fresh interpreter; it must raise a ValueError.
    Returns its message, how much its peak resident memory grew and how long it took."""
    code = _CHILD.format(setup=textwrap.dedent(setup), body=textwrap.indent(textwrap.dedent(body), "    "))
    run = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["error"] is not None, "nothing was refused"
    assert "ValueError" in out["error"], out
    assert "\n" not in out["message"], out["message"]
    assert out["peak_mb"] < BOUND_MB and out["seconds"] < QUICK_S, out
    return out


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def write_tar(path: Path, members: dict[str, bytes], *, zeros_after: tuple[str, int] | None = None) -> Path:
    """A tar of ``members`` written by tarfile; ``zeros_after=(name, n)``: that member is followed by ``n`` zero
    bytes that its tar header counts in, left as a hole in the file (sparse: nothing written to disk for them)."""
    if zeros_after is None:
        with tarfile.open(path, "w") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path
    with open(path, "wb") as f:  # tarfile's headers, laid out as tarfile lays them out
        for name, data in members.items():
            extra = zeros_after[1] if name == zeros_after[0] else 0
            info = tarfile.TarInfo(name)
            info.size = len(data) + extra
            f.write(info.tobuf(format=tarfile.GNU_FORMAT) + data)
            f.seek(extra + -(len(data) + extra) % 512, os.SEEK_CUR)  # the zeros and the block's padding: a hole
        f.write(bytes(1024))  # the two closing blocks
    return path


def meta(length: int, **extra) -> bytes:
    return json.dumps({"fps": 15, "length": length, "task": "t", **extra}).encode()


@pytest.fixture(scope="module")
def huge_frames(tmp_path_factory) -> Path:
    """A one-frame 8192x8192 H.264 mp4 (a black picture: a 198 KB file that decodes into gigabytes), encoded by
    PyAV in a process of its own (the encoder holds the 100 MB picture)."""
    path = tmp_path_factory.mktemp("huge") / "huge.mp4"
    code = textwrap.dedent("""
        import sys, av
        with av.open(sys.argv[1], "w") as c:
            s = c.add_stream("libx264", rate=15)
            s.width = s.height = 8192
            s.pix_fmt = "yuv420p"
            s.options = {"preset": "ultrafast", "crf": "51"}
            f = av.VideoFrame(8192, 8192, "yuv420p")
            for p in f.planes:
                p.update(bytes(p.buffer_size))
            f.pts = 0
            for packet in [*s.encode(f), *s.encode()]:
                c.mux(packet)
    """)
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=120)
    return path


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory) -> Path:
    episodes = make_episodes(2, seed=3, cameras=("cam_high",), height=48, width=64, min_length=6, max_length=8)
    return Path(write_lerobot(tmp_path_factory.mktemp("limits") / "lerobot", episodes, codec="h264"))


def copy_of(root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(root, tmp_path / root.name))


def edit_info(root: Path, change) -> None:
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


# -- frames: the stream header against the limit and the metadata, before anything is decoded ----------------------

def test_an_8192x8192_h264_stream_is_refused_from_its_header(huge_frames):
    assert huge_frames.stat().st_size < 400_000
    out = refused("""
        from mmfeed.codecs.video import read_frames
        read_frames(args["path"])
    """, path=str(huge_frames))
    assert out["message"] == (f"{huge_frames}: frames of 8192x8192 (67.1 MP) exceed max_frame_pixels=16777216 "
                              "(16.8 MP); pass a larger max_frame_pixels= to read them")
    assert out["peak_mb"] < 64, out  # the header only: decoding it took 1.6 GB


def test_the_bytes_of_an_8192x8192_member_are_refused_by_every_backend(huge_frames):
    from mmfeed.codecs._decord import decord_available
    from mmfeed.codecs.video import read_frames

    data = huge_frames.read_bytes()
    with pytest.raises(FramesTooLarge, match=r"bytes in memory>: frames of 8192x8192 .*max_frame_pixels=16777216"):
        probe(data)
    backends = ["pyav"] + (["decord"] if decord_available() else [])
    for backend in backends:
        with pytest.raises(DecodeError, match="exceed max_frame_pixels=16777216") as info:
            read_frames(data, backend=backend)
        assert isinstance(info.value, ValueError)
    with pytest.raises(DecodeError, match=r"frames of 8192x8192 \(67.1 MP\) exceed max_frame_pixels=1000000 "):
        read_frames(data, max_frame_pixels=1_000_000)
    assert MAX_FRAME_PIXELS == 4096 * 4096
    with pytest.raises(ValueError, match="max_frame_pixels must be an int >= 1"):
        ReadOptions(max_frame_pixels=0)


def test_a_shard_holding_an_8192x8192_member_is_refused_when_indexed(huge_frames, tmp_path, capsys):
    shard = write_tar(tmp_path / "shard-000000.tar", {"ep0.meta.json": meta(1),
                                                      f"ep0.{CAM}.mp4": huge_frames.read_bytes()})
    out = refused("""
        from mmfeed.loaders.stores.index import build_index
        build_index([args["shard"]])
    """, shard=str(shard))
    assert out["message"].startswith(f"{str(shard)!r} key 'ep0' member ep0.{CAM}.mp4: ")
    assert "frames of 8192x8192 (67.1 MP) exceed max_frame_pixels=16777216" in out["message"]
    line = error_line(capsys, "index", str(tmp_path))
    assert f"member ep0.{CAM}.mp4" in line and "exceed max_frame_pixels" in line


def test_an_index_declaring_16384x16384_frames_is_refused_when_the_dataset_opens(huge_frames, tmp_path):
    """The index says what it says (meta.json's features entry); opening refuses it before ``features`` or a loader
    is sized by it."""
    described = {CAM: {"kind": "video", "dtype": "uint8", "shape": [16384, 16384, 3], "frames": 1}}
    write_tar(tmp_path / "shard-000000.tar", {"ep0.meta.json": meta(1, features=described),
                                              f"ep0.{CAM}.mp4": huge_frames.read_bytes()})
    write_index(str(tmp_path / "shard-000000.tar"))
    out = refused("""
        import mmfeed.loaders
        mmfeed.loaders.open_dataset(args["root"])
    """, root=str(tmp_path))
    assert out["message"] == (f"{tmp_path / INDEX_FILENAME}: feature {CAM!r} declares frames of 16384x16384 "
                              "(268.4 MP), more than max_frame_pixels=16777216 (16.8 MP); pass a larger "
                              "max_frame_pixels= to open it")


def test_a_member_larger_than_its_index_says_is_refused_before_it_is_decoded(huge_frames, tmp_path):
    """The index promises 48x64 (meta.json's features entry); the member is 8192x8192: the read refuses it from
    its header, naming the shard, key and feature. With the limit lifted, the sizes are compared instead."""
    described = {CAM: {"kind": "video", "dtype": "uint8", "shape": [48, 64, 3], "frames": 1}}
    write_tar(tmp_path / "shard-000000.tar", {"ep0.meta.json": meta(1, features=described),
                                              f"ep0.{CAM}.mp4": huge_frames.read_bytes()})
    write_index(str(tmp_path / "shard-000000.tar"))
    read = """
        import numpy, mmfeed.loaders
        from mmfeed.loaders.sources.base import EpisodeRequest
        ds = mmfeed.loaders.open_dataset(args["root"], max_frame_pixels=args["limit"])
        ds.read_many([EpisodeRequest(0, {args["cam"]: numpy.arange(1)})])
    """
    out = refused(read, root=str(tmp_path), cam=CAM, limit=MAX_FRAME_PIXELS)
    assert out["message"] == (f"{tmp_path / 'shard-000000.tar'} key 'ep0' feature {CAM!r}: frames of 8192x8192 "
                              "(67.1 MP) exceed max_frame_pixels=16777216 (16.8 MP); pass a larger "
                              "max_frame_pixels= to read them")
    out = refused(read, root=str(tmp_path), cam=CAM, limit=None)
    assert out["message"].endswith(f"key 'ep0' feature {CAM!r}: the video holds 1 frames of 8192x8192 but the index "
                                   "promises 1 of 48x64; rebuild it with `mmfeed index`")


def test_info_json_declaring_16384x16384_frames_is_refused_at_open(lerobot, tmp_path, capsys):
    root = copy_of(lerobot, tmp_path)
    edit_info(root, lambda info: info["features"][CAM].update(shape=[16384, 16384, 3]))
    out = refused("""
        import mmfeed.loaders
        mmfeed.loaders.open_dataset(args["root"])
    """, root=str(root))
    assert out["message"] == (f"{root / 'meta' / 'info.json'}: feature {CAM!r} declares frames of 16384x16384 "
                              "(268.4 MP), more than max_frame_pixels=16777216 (16.8 MP); pass a larger "
                              "max_frame_pixels= to open it")
    assert "max_frame_pixels" in error_line(capsys, "inspect", str(root))
    # lifted, the dataset opens and reports what info.json says (the stream is compared when first read)
    assert open_dataset(root, max_frame_pixels=None).features[CAM].shape == (16384, 16384, 3)


def test_a_lerobot_video_of_another_size_than_info_json_declares_is_refused_before_decoding(lerobot, tmp_path,
                                                                                          huge_frames):
    root = copy_of(lerobot, tmp_path)
    video = next((root / "videos" / CAM).rglob("*.mp4"))
    write_video(video, frame_pattern(8, height=96, width=128), fps=30.0)
    with pytest.raises(ValueError) as info:
        open_dataset(root).read_many([EpisodeRequest(0, {CAM: np.arange(2)})])
    assert str(info.value) == (f"{root} episode 0 feature {CAM!r} ({video}): the video's frames are 96x128 but "
                               "meta/info.json declares 48x64")
    shutil.copyfile(huge_frames, video)
    out = refused("""
        import numpy, mmfeed.loaders
        from mmfeed.loaders.sources.base import EpisodeRequest
        mmfeed.loaders.open_dataset(args["root"]).read_many([EpisodeRequest(0, {args["cam"]: numpy.arange(1)})])
    """, root=str(root), cam=CAM)
    assert out["message"] == (f"{root} episode 0 feature {CAM!r} ({video}): frames of 8192x8192 (67.1 MP) exceed "
                              "max_frame_pixels=16777216 (16.8 MP); pass a larger max_frame_pixels= to read them "
                              "(meta/info.json declares 48x64)")


def test_the_limit_is_an_option_of_every_format_and_lerobot_data_still_reads(lerobot):
    ds = open_dataset(lerobot, max_frame_pixels=48 * 64)
    frames = ds.read_many([EpisodeRequest(0, {CAM: np.arange(3)})])[0][CAM]
    assert frames.shape == (3, 48, 64, 3)
    with pytest.raises(ValueError, match=rf"feature {CAM!r} declares frames of 48x64 \(0.0 MP\), more than "
                                         r"max_frame_pixels=3071 "):
        open_dataset(lerobot, max_frame_pixels=48 * 64 - 1)


# -- arrays: a member's size against its header and its shard, before it is read ------------------------------------

def test_an_npy_member_followed_by_gigabytes_of_zeros_is_refused_unread(tmp_path, capsys):
    """A valid array, then 6 GB its tar header counts in (a hole in the file: nothing written): indexing and
    streaming the shard refuse the member from its npy header, without reading it (6.1 GB before)."""
    state = npy(np.zeros((4, 2), np.float32))
    shard = write_tar(tmp_path / "shard-000000.tar", {"ep0.meta.json": meta(4), "ep0.observation.state.npy": state},
                      zeros_after=("ep0.observation.state.npy", 6 * 10**9))
    with tarfile.open(shard) as tar:  # a readable tar, its member as long as the header says
        assert tar.getmember("ep0.observation.state.npy").size == len(state) + 6 * 10**9
    where = f"{str(shard)!r} key 'ep0' member ep0.observation.state.npy"
    out = refused("""
        from mmfeed.loaders.stores.index import build_index
        build_index([args["shard"]])
    """, shard=str(shard))
    assert out["message"] == (f"{where}: 6000000000 trailing bytes: the .npy holds {len(state) + 6 * 10**9} bytes "
                              f"but its header promises {len(state)} (float32 [4, 2]); a .npy file holds its array "
                              "and nothing after it")
    out = refused("""
        from mmfeed.loaders.transport.tar import iter_shard
        list(iter_shard(args["shard"]))
    """, shard=str(shard))
    assert out["message"].startswith(f"{where}: 6000000000 trailing bytes")
    assert "6000000000 trailing bytes" in error_line(capsys, "index", str(tmp_path))


def test_load_npy_refuses_trailing_bytes_and_truncation_alike():
    data = npy(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert load_npy(data, key="a.npy").tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(DecodeError, match=r"^a.npy: 3 trailing bytes after the \(2, 3\) int16 array \(12 bytes\)"):
        load_npy(data + b"\0\0\0", key="a.npy")
    with pytest.raises(DecodeError, match=r"^a.npy: truncated .npy"):
        load_npy(data[:-1], key="a.npy")
    assert npy_header(data[:128], key="a.npy") == (np.dtype(np.int16), (2, 3), False, 128)


def _index_with(root: Path, feature: str, **values) -> dict:
    """Rewrite the index of ``root`` with the first episode's ``feature`` entry given ``values`` (offset, size, ...);
    returns the entry as it was."""
    path = root / INDEX_FILENAME
    table = pq.read_table(path)
    features = table["features"].to_pylist()
    entry = next(e for e in features[0] if e["name"] == feature)
    was = dict(entry)
    entry.update(values)
    column = pa.array(features, table.schema.field("features").type)
    pq.write_table(table.set_column(table.schema.get_field_index("features"), "features", column), path)
    return was


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    write_webdataset(root, make_episodes(2, seed=4, cameras=("cam_high",), min_length=6, max_length=8),
                     episodes_per_shard=2)
    write_index(sorted(str(p) for p in root.glob("*.tar")))
    return root


def test_an_index_member_size_of_3e9_is_refused_at_open(shards, tmp_path, capsys):
    """Past the shard's end (a video member) or past what the array's dtype, shape and frames take (an npy
    member): refused when the dataset opens, vectorized over the index (a bare MemoryError before)."""
    root = copy_of(shards, tmp_path)
    shard = root / "shard-000000.tar"
    size = shard.stat().st_size
    _index_with(root, CAM, size=3 * 10**9)
    out = refused("""
        import mmfeed.loaders
        mmfeed.loaders.open_dataset(args["root"])
    """, root=str(root))
    assert out["message"].startswith(f"{root / INDEX_FILENAME}: feature {CAM!r} of {shard} key 'episode_000000': "
                                     "the index places its member at bytes ")
    assert out["message"].endswith(f"outside the shard's {size} bytes; rebuild the index with `mmfeed index`")
    assert "outside the shard's" in error_line(capsys, "inspect", str(root))

    root = copy_of(shards, tmp_path / "array")
    _index_with(root, "observation.state", size=3 * 10**9)
    out = refused("""
        import mmfeed.loaders
        mmfeed.loaders.open_dataset(args["root"], check_index=False)
    """, root=str(root))
    assert out["message"].startswith(f"{root / INDEX_FILENAME}: feature 'observation.state' of ")
    assert "the index gives its .npy member 3000000000 bytes, but " in out["message"]
    assert re.search(r"\d+ frames of float32 \[14\] take \d+ bytes and a header of at most 10012; rebuild the index "
                     r"with `mmfeed index`$", out["message"]), out["message"]


def test_without_check_index_a_member_past_the_shards_end_is_refused_before_it_is_read(shards, tmp_path):
    root = copy_of(shards, tmp_path)
    _index_with(root, CAM, size=3 * 10**9)
    shard = root / "shard-000000.tar"
    out = refused("""
        import numpy, mmfeed.loaders
        from mmfeed.loaders.sources.base import EpisodeRequest
        ds = mmfeed.loaders.open_dataset(args["root"], check_index=False)
        ds.read_many([EpisodeRequest(0, {args["cam"]: numpy.arange(1)})])
    """, root=str(root), cam=CAM)
    assert out["message"].startswith(f"'{shard}' ends at byte {shard.stat().st_size}, before the member the index "
                                     "places at ")
    assert out["message"].endswith("rebuild it with `mmfeed index`")


def test_an_index_member_its_tar_header_disagrees_with_is_refused_when_read(shards, tmp_path):
    """Inside the shard and plausible, but not where (or not as long as) the tar says a member is."""
    root = copy_of(shards, tmp_path)
    shard = root / "shard-000000.tar"
    was = _index_with(root, CAM, size=_index_with(root, CAM)["size"] - 1)
    with pytest.raises(ValueError) as info:
        open_dataset(root).read_many([EpisodeRequest(0, {CAM: np.arange(1)})])
    assert str(info.value) == (f"{str(shard)!r}: the index places a member of {was['size'] - 1} bytes at byte "
                               f"{was['offset']}, but its tar header gives {was['size']}: the index is out of date or "
                               "not this shard's; rebuild it with `mmfeed index`")
    _index_with(root, CAM, size=was["size"], offset=was["offset"] + 512)
    with pytest.raises(ValueError, match=rf"a member of {was['size']} bytes at byte {was['offset'] + 512}, but no "
                                         "tar header precedes it"):
        open_dataset(root).read_many([EpisodeRequest(0, {CAM: np.arange(1)})])


# -- metadata JSON: size from the file before reading, depth before parsing -------------------------------------------

def test_a_60_mb_info_json_is_refused_unread(lerobot, tmp_path, capsys):
    root = copy_of(lerobot, tmp_path)
    info = root / "meta" / "info.json"
    edit_info(root, lambda fields: fields.update(padding="x" * (60 * 2**20)))  # valid JSON, 60 MB
    out = refused("""
        import mmfeed.loaders
        mmfeed.loaders.open_dataset(args["root"])
    """, root=str(root))
    assert out["message"] == (f"{info}: {info.stat().st_size} bytes of JSON, more than the 16 MiB a metadata file "
                              "may have; mmfeed does not read it")
    assert out["peak_mb"] < 32, out  # not read at all (1.8 GB before)
    assert "bytes of JSON, more than the 16 MiB" in error_line(capsys, "inspect", str(root))


@pytest.mark.parametrize("name", ["info.json", "stats.json"])
def test_json_nested_200000_deep_is_refused_before_parsing(lerobot, tmp_path, capsys, name):
    root = copy_of(lerobot, tmp_path)
    path = root / "meta" / name
    if name == "info.json":
        edit_info(root, lambda info: info.update(deep="@"))
        path.write_text(path.read_text().replace('"@"', "[" * 200_000 + "]" * 200_000))
    else:
        path.write_text('{"observation.state": ' + "[" * 200_000 + "]" * 200_000 + "}")
    out = refused("""
        import mmfeed.loaders
        mmfeed.loaders.open_dataset(args["root"])
    """, root=str(root))
    assert out["message"] == (f"{path}: JSON nested 200001 levels deep, more than the 100 a metadata file may have; "
                              "mmfeed does not parse it")  # a RecursionError before
    assert "levels deep" in error_line(capsys, "inspect", str(root))


def test_a_shards_meta_json_is_bounded_in_size_and_depth(tmp_path):
    state = npy(np.zeros((4, 2), np.float32))
    deep = write_tar(tmp_path / "deep.tar", {"ep0.meta.json": b'{"fps": 15, "length": 4, "x": ' + b"[" * 200_000
                                             + b"]" * 200_000 + b"}", "ep0.observation.state.npy": state})
    big = write_tar(tmp_path / "big.tar", {"ep0.meta.json": meta(4, pad=" " * MAX_JSON_BYTES),
                                           "ep0.observation.state.npy": state})
    from mmfeed.loaders.stores.index import build_index

    with pytest.raises(ValueError, match=r"^ep0.meta.json in shard '.*deep.tar': JSON nested 200001 levels deep, "
                                         r"more than the 100 a metadata"):
        build_index([str(deep)])
    with pytest.raises(ValueError, match=r"^ep0.meta.json in shard '.*big.tar': \d+ bytes of JSON, more than the "
                                         "16 MiB"):
        build_index([str(big)])
    with pytest.raises(ValueError, match=r"JSON nested 200001 levels deep"):
        list(iter_shard(str(deep)))
    with pytest.raises(ValueError, match=r"key 'ep0' member ep0.meta.json: \d+ bytes of JSON, more than the 16 MiB"):
        list(iter_shard(str(big)))


def test_json_depth_counts_brackets_outside_strings_only():
    def depth(value) -> int:
        return 1 + max(map(depth, value.values() if isinstance(value, dict) else value), default=0) \
            if isinstance(value, (dict, list)) else 0

    rng = np.random.default_rng(0)
    for text in ['1', '"[[["', '{}', '{"a": "[\\"[[", "b": [[1]]}', '["\\\\", [[]]]', '["\\\\\\"[[[", []]',
                 '{"k\\\\": {"x": ["]]]"]}}', json.dumps({"s": [["[", "\\\"]", {"t": "{{"}]] * 3})]:
        assert json_depth(text.encode()) == depth(json.loads(text)), text
    nested = 0
    for _ in range(50):
        nested = ["]]\"[" * int(rng.integers(3)), {"k": nested}] if rng.random() < 0.5 else [nested]
    assert json_depth(json.dumps(nested).encode()) == depth(nested) <= MAX_JSON_DEPTH
