"""RLDS datasets read without TensorFlow, checked against TFDS itself.

The corpus (``tests/rlds_corpus/``) was written by TFDS's own builder and its oracle is TFDS's own decoding of
every episode (``tests/rlds_corpus/make_corpus.py`` regenerates both in a TensorFlow venv): every step feature of
every episode of both splits must equal it, JPEG pictures exactly where simplejpeg decodes them (libjpeg-turbo's
fast integer DCT, as TensorFlow's) and within JPEG rounding where Pillow does, PNGs exactly. Then the rest of mmfeed on
it (windows, packing, a mixture with a LeRobot directory, resume) and broken input (truncated, corrupt, missing shards,
features.json against the records).
"""

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.formats.rlds.example import parse_example
from mmfeed.loaders.formats.rlds.pictures import SLOT_PHASE, decode_picture, jpeg_decoder
from mmfeed.loaders.formats.rlds.tfrecord import crc32c, masked_crc32c, scan_records
from mmfeed.loaders.sources.requests import EpisodeRequest
from mmfeed.loaders.transport.errors import SampleError
from mmfeed.testing import make_episodes, write_lerobot

CORPUS = Path(__file__).parent / "rlds_corpus"
DATASET = CORPUS / "mmfeed_rlds_corpus"
VERSION = DATASET / "1.0.0"
IMAGE, WRIST, STATE, ACTION = "observation.image", "observation.wrist_image", "observation.state", "action"
SHARD = "mmfeed_rlds_corpus-train.tfrecord-{:05d}-of-00003"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mmfeed-cache")


@pytest.fixture(autouse=True)
def cache(cache_dir, monkeypatch):
    monkeypatch.setenv("MMFEED_CACHE", str(cache_dir))


def oracle(split):
    """TFDS's decoded episodes: ``[{key below the episode: array}]`` in TFDS's order."""
    with np.load(CORPUS / f"oracle-{split}.npz") as z:
        episodes: dict[int, dict] = {}
        for key in z.files:
            e, rest = key.split("/", 1)
            episodes.setdefault(int(e), {})[rest] = z[key]
    return [episodes[e] for e in range(len(episodes))]


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_step_feature_of_every_episode_equals_tfds(split):
    ds = open_dataset(VERSION, split=split)
    want = oracle(split)
    assert len(ds) == len(want)
    for e, tfds_episode in enumerate(want):
        got = ds.episode(e)
        steps = len(tfds_episode["steps/is_first"])
        assert int(ds.lengths[e]) == steps
        checked = set()
        for key, value in tfds_episode.items():
            if key.startswith("steps/contacts/"):
                continue
            name = key.removeprefix("steps/").replace("/", ".")
            mine = got[name]
            checked.add(name)
            if key.startswith("episode_metadata/"):  # the episode's own value, with every step
                assert len(mine) == steps and all(m == value for m in mine.tolist()), (e, key)
                assert mine.dtype == (object if value.dtype.kind == "U" else value.dtype), (e, key)
            elif name == IMAGE:  # JPEG: exact with TensorFlow's fast integer DCT, else Pillow's accurate one
                assert mine.shape == value.shape and mine.dtype == np.uint8
                if jpeg_decoder() == "simplejpeg":
                    assert np.array_equal(mine, value), e
                diff = np.abs(mine.astype(np.int16) - value.astype(np.int16))
                assert diff.max() <= 12 and diff.mean() < 1.5, (e, diff.max(), diff.mean())
            elif value.dtype.kind == "U":
                assert mine.dtype == object and mine.tolist() == value.tolist(), (e, key)
            else:  # PNG exactly; every array in features.json's dtype (float64 where it says so)
                assert mine.dtype == value.dtype and np.array_equal(mine, value), (e, key)
        assert checked == set(ds.features)
        rows = np.split(tfds_episode["steps/contacts/flat"], np.cumsum(tfds_episode["steps/contacts/lengths"])[:-1])
        assert len(got["contacts"]) == steps
        assert all(m.dtype == np.int32 and np.array_equal(m, r) for m, r in zip(got["contacts"], rows))
        assert [ds.task(e, t) for t in range(steps)] == tfds_episode["steps/language_instruction"].tolist()


def test_the_corpus_has_what_it_is_meant_to_test():
    ds = open_dataset(VERSION)
    assert 1 in ds.lengths.tolist()  # a 1-step episode
    assert (ds.episode_tasks == -1).any()  # an episode whose task changes
    assert len(ds.files.glob("*train.tfrecord*")) == 3


def test_the_dataset_directory_opens_its_highest_version_and_splits_are_named(tmp_path):
    root = tmp_path / "mmfeed_rlds_corpus"
    shutil.copytree(VERSION, root / "1.0.0")
    shutil.copytree(VERSION, root / "0.9.0")  # a lower version, broken: never opened
    (root / "0.9.0" / "features.json").write_text("{}")
    ds = open_dataset(root)
    assert ds.files.root.endswith("1.0.0") and len(ds) == 9 and ds.split == "train"
    assert len(open_dataset(root, split="val")) == 4
    with pytest.raises(ValueError, match=r"no split 'test'; the dataset has \['train', 'val'\]"):
        open_dataset(VERSION, split="test")


def test_the_index_is_kept_in_the_cache_and_keyed_by_the_shards(tmp_path, cache_dir):
    copy = tmp_path / "ds"
    shutil.copytree(VERSION, copy)
    before = set((cache_dir / "index" / "rlds").glob("*.npz")) if (cache_dir / "index" / "rlds").exists() else set()
    open_dataset(copy)
    made = set((cache_dir / "index" / "rlds").glob("*.npz")) - before
    assert len(made) == 1
    open_dataset(copy)  # read from the cache: no new file
    assert set((cache_dir / "index" / "rlds").glob("*.npz")) - before == made
    shard = copy / SHARD.format(1)
    shard.write_bytes(shard.read_bytes())  # same bytes, a new mtime: a new key
    open_dataset(copy)
    assert len(set((cache_dir / "index" / "rlds").glob("*.npz")) - before) == 2


def test_the_indexs_step_arrays_are_mapped_from_its_file_and_read_the_same(tmp_path, cache_dir, monkeypatch):
    """Loaded, the per-step arrays (tasks, pictures' ranges) map the cached file read-only (every one here, with the
    size threshold at 0) and the episodes read the same; a member whose header disagrees with its size is refused."""
    import zipfile

    from mmfeed.loaders.formats.rlds import index as index_mod

    copy = tmp_path / "ds"
    shutil.copytree(VERSION, copy)
    read = open_dataset(copy)
    path = max((cache_dir / "index" / "rlds").glob("*.npz"), key=lambda p: p.stat().st_mtime)
    monkeypatch.setattr(index_mod, "MAPPED_BYTES", 0)
    loaded = index_mod.RecordIndex.load(path)
    for array in (loaded.task_flat, *loaded.pictures.values()):
        assert isinstance(array, np.memmap) and not array.flags.writeable and str(array.filename) == str(path)
    with np.load(path) as z:
        assert np.array_equal(loaded.task_flat, z["task_flat"])
        assert all(np.array_equal(a, z[f"pictures_{i}"]) for i, a in enumerate(loaded.pictures.values()))
    mapped = open_dataset(copy)
    for e in range(len(read)):
        ours, theirs = mapped.episode(e), read.episode(e)
        assert set(ours) == set(theirs) and all(np.array_equal(ours[k], theirs[k]) for k in ours
                                                if isinstance(ours[k], np.ndarray) and ours[k].dtype != object)
    bad = tmp_path / "bad.npz"
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(bad, "w") as out:
        for info in z.infolist():
            data = z.read(info)
            out.writestr(info, data[:-12] if info.filename == "pictures_0.npy" else data)  # a step short
    with pytest.raises(ValueError, match="member 'pictures_0' does not hold the array its header describes"):
        index_mod.RecordIndex.load(bad)


def test_crc32c_and_the_example_decoder_agree_with_the_formats_definitions():
    from mmfeed.loaders.formats.rlds import tfrecord

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0
    data = np.random.default_rng(1).integers(0, 256, 300, dtype=np.uint8)
    hardware = tfrecord._KERNEL is tfrecord._crc32c_hardware  # SSE 4.2 and the JIT on
    kernels = [tfrecord._crc32c_kernel] + ([tfrecord._crc32c_hardware] if hardware else [])
    for start in range(9):  # every alignment, every tail length
        for stop in (start, start + 1, start + 7, start + 8, start + 9, 300):
            assert len({int(k(data[start:stop], tfrecord._TABLES)) for k in kernels}) == 1, (start, stop)
    if hardware:  # three interleaved 512-byte lanes, and the words and bytes after them
        long = np.random.default_rng(2).integers(0, 256, 3 * 1536 + 20, dtype=np.uint8)
        for start in (0, 1, 5):
            for n in (1535, 1536, 1537, 1543, 1544, 3072, 3079, 3 * 1536 + 3):
                got = tfrecord._crc32c_hardware(long[start:start + n], tfrecord._TABLES)
                assert got == tfrecord._crc32c_kernel(long[start:start + n], tfrecord._TABLES), (start, n)
    spans = np.array([[0, 0], [3, 11], [0, 300], [299, 300], [5, 5], [7, 260]], np.int64)
    one_by_one = [crc32c(data[a:b]) for a, b in spans.tolist()]
    many = [tfrecord._spans_table] + ([tfrecord._spans_hardware] if hardware else [])
    assert all(k(data, spans, tfrecord._TABLES).tolist() == one_by_one for k in many)
    assert tfrecord.crc32c_spans(data.tobytes(), spans).tolist() == one_by_one
    with pytest.raises(ValueError, match="spans outside the 300 bytes given"):
        tfrecord.crc32c_spans(data, np.array([[290, 301]]))
    data = VERSION.joinpath(SHARD.format(0)).read_bytes()
    length, length_crc = struct.unpack_from("<QI", data)
    assert masked_crc32c(data[:8]) == length_crc
    payload = data[12:12 + length]
    assert masked_crc32c(payload) == struct.unpack_from("<I", data, 12 + length)[0]
    parsed = parse_example(payload)
    assert parsed["steps/is_first"].values[0] == 1
    assert parsed["steps/observation/image"].values[0][:3] == b"\xff\xd8\xff"


def test_windows_need_fps_and_say_so():
    ds = open_dataset(VERSION)
    assert ds.episode(0)["fps"] is None  # whole episodes read without it
    spec = WindowSpec.from_delta_timestamps({STATE: [0.0]})
    with pytest.raises(ValueError, match=r"RLDS records no control rate; pass fps="):
        ds.windows(spec)[0]


SPEC = WindowSpec.from_delta_timestamps({IMAGE: [-0.1, 0.0], WRIST: [0.0], STATE: [0.0],
                                         ACTION: [0.0, 0.1, 0.2, 0.3]})


def test_windows_and_packed_batches_hold_the_episodes_steps():
    ds = open_dataset(VERSION, fps=10, frame_size={IMAGE: (16, 20)})
    assert ds.features[IMAGE].shape == (16, 20, 3)
    view = ds.windows(SPEC)
    assert len(view) == int(ds.lengths.sum())
    sample = view[4]
    e, t = sample["episode_index"], sample["frame_index"]
    whole = ds.episode(e)
    assert torch.equal(sample[STATE][0], torch.as_tensor(whole[STATE][t]))
    assert sample[IMAGE].shape == (2, 16, 20, 3) and sample["task"] == ds.task(e, t)
    packing = Packing(layout=TokenLayout(tokens_per_frame={IMAGE: 4, WRIST: 2}), window=SPEC,
                      plan=PlanConfig(capacity=64, rows_per_batch=2), seed=1)
    loader = DataLoader(ds, packing=packing, num_workers=2)
    seen = []
    for batch in loader:
        assert batch.data[IMAGE].dtype == torch.uint8 and batch.data[IMAGE].shape[1:] == (16, 20, 3)
        # decoded in a worker into its batch's slots, whose run starts where libjpeg-turbo stores fastest
        assert batch.data[IMAGE].data_ptr() % 64 == SLOT_PHASE and batch.data[IMAGE].untyped_storage().is_shared()
        n = len(batch.metadata["sample"])
        assert batch.data[STATE].shape == (n, 8) and batch.data[STATE].dtype == torch.float64
        for k in range(n):
            want = view[int(batch.metadata["sample"][k])]
            assert torch.equal(batch.data[ACTION][4 * k:4 * k + 4], want[ACTION])
            assert torch.equal(batch.data[STATE][k:k + 1], want[STATE])
        seen += batch.metadata["sample"].tolist()
    assert sorted(seen + loader.dataset.plan(0).dropped.tolist()) == list(range(len(view)))


def batch_key(batch) -> tuple:
    return (tuple(batch.metadata["sample"].tolist()),
            tuple((k, tuple(v.flatten().tolist())) for k, v in sorted(batch.data.items()) if v.dtype != torch.bool))


def test_a_mixture_with_a_lerobot_directory_packs_and_resumes(tmp_path):
    lerobot = write_lerobot(tmp_path / "lerobot", make_episodes(3, seed=2, cameras=("front",), height=32, width=40,
                                                                fps=10, min_length=4, max_length=7, state_dim=8,
                                                                action_dim=7))
    mix = open_dataset({"rlds": VERSION, "lerobot": lerobot}, fps=10,
                       rename={"rlds": {IMAGE: "observation.images.front", STATE: "observation.joints"}})
    spec = WindowSpec.from_delta_timestamps({"observation.images.front": [0.0], ACTION: [0.0, 0.1]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={"observation.images.front": 4}), window=spec,
                      plan=PlanConfig(capacity=40, rows_per_batch=2), seed=3)
    whole = [batch_key(b) for b in DataLoader(mix, packing=packing)]
    datasets = set()
    for batch in DataLoader(mix, packing=packing):
        datasets |= set(batch.metadata["dataset"].tolist())
    assert datasets == {0, 1} and len(whole) >= 4
    first = DataLoader(mix, packing=packing)
    it = iter(first)
    head = [batch_key(next(it)) for _ in range(2)]
    state = first.state_dict()
    resumed = DataLoader(mix, packing=packing)
    resumed.load_state_dict(state)
    assert head + [batch_key(b) for b in resumed] == whole


# -- broken input ---------------------------------------------------------------------------------------------

@pytest.fixture
def copy(tmp_path):
    target = tmp_path / "mmfeed_rlds_corpus" / "1.0.0"
    shutil.copytree(VERSION, target)
    return target


def records(path):
    with open(path, "rb") as f:
        return scan_records(f, path.stat().st_size, str(path))


def test_a_truncated_shard_names_the_file_and_record_and_skip_counts_it(copy):
    shard = copy / SHARD.format(1)
    offsets, lengths = records(shard)
    shard.write_bytes(shard.read_bytes()[:int(offsets[2]) + 30])
    with pytest.raises(ValueError, match=rf"{shard.name}: record 2 at byte {offsets[2]} is truncated") as err:
        open_dataset(copy)
    assert "\n" not in str(err.value)
    ds = open_dataset(copy, errors="skip")
    assert len(ds) == 8 and len(ds.skipped) == 1 and shard.name in ds.skipped[0]["reason"]


def test_a_flipped_byte_fails_its_crc_naming_the_file_and_record(copy):
    shard = copy / SHARD.format(0)
    offsets, lengths = records(shard)
    data = bytearray(shard.read_bytes())
    data[int(offsets[1]) + 12 + int(lengths[1]) // 2] ^= 0x20
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{shard.name} record 1 \(byte {offsets[1]}\): the record's data fails "
                                         "its CRC-32C check") as err:
        open_dataset(copy)
    assert "\n" not in str(err.value)
    ds = open_dataset(copy, errors="skip")
    assert len(ds) == 8 and "CRC-32C" in ds.skipped[0]["reason"]
    clean = open_dataset(VERSION)  # the episodes kept are the others, in order
    assert ds.lengths.tolist() == np.delete(clean.lengths, 1).tolist()
    assert np.array_equal(ds.episode(1)[ACTION], clean.episode(2)[ACTION])
    assert ds.describe(1) == f"{shard} record 2 (byte {offsets[2]})"  # its place in the shard, the skipped one counted


def test_a_byte_flipped_after_indexing_fails_the_sample_naming_the_record(copy):
    ds = open_dataset(copy)
    shard = copy / SHARD.format(2)
    offsets, lengths = records(shard)
    data = bytearray(shard.read_bytes())
    data[int(offsets[0]) + 20] ^= 0x01
    shard.write_bytes(bytes(data))
    e = int(np.flatnonzero(ds._shard_of == 2)[0])
    with pytest.raises(SampleError, match=rf"{shard.name} record 0 \(byte {offsets[0]}\): the record's data fails"):
        ds.episode(e)


def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_sample_reads_only_its_own_pictures_and_keys_each_checked_against_the_index(copy):
    """A byte flipped inside one picture after indexing fails only the samples that read that picture, naming
    the shard, record, feature and byte range; a sample of the same episode beside it reads, equal to the clean
    dataset (so it read neither the damaged picture nor the whole record); a flipped byte in the state's key fails
    naming the key; the whole episode still reads its record and fails its CRC."""
    ds, clean = open_dataset(copy), open_dataset(VERSION)
    e = int(np.flatnonzero((ds._shard_of == 0) & (ds.lengths >= 4))[0])
    shard, record = copy / SHARD.format(0), int(ds._offset[e])
    start, stop, _ = (int(v) for v in ds._picture_at[IMAGE][int(ds._task_start[e]) + 3])
    _flip(shard, record + 12 + (start + stop) // 2)
    request = EpisodeRequest(e, {IMAGE: np.array([0, 1]), WRIST: np.array([3]), STATE: np.array([0, 3])})
    got, want = ds.read_many([request])[0], clean.read_many([request])[0]
    assert all(np.array_equal(got[f], want[f]) for f in want)
    with pytest.raises(SampleError, match=rf"{shard.name} record \d+ \(byte {record}\): feature '{IMAGE}' picture 1 "
                                          rf"of the request \(bytes {start}..{stop} of the record\) fails its CRC-32C"):
        ds.read_many([EpisodeRequest(e, {IMAGE: np.array([2, 3])})])
    with pytest.raises(SampleError, match="the record's data fails its CRC-32C"):
        ds.episode(e)
    _flip(shard, record + 12 + (start + stop) // 2)  # mended: the next opening indexes it again
    fresh = open_dataset(VERSION)
    f = int(np.flatnonzero(fresh._shard_of == 1)[0])
    key = fresh._key_of["steps/observation/state"]
    a, b = (int(v) for v in fresh._key_span[f, key])
    other = copy / SHARD.format(1)
    ds = open_dataset(copy)  # indexed before the flip below
    _flip(other, int(ds._offset[f]) + 12 + (a + b) // 2)
    with pytest.raises(SampleError, match=rf"key 'steps/observation/state' \(bytes {a}..{b} of the record\) fails"):
        ds.read_many([EpisodeRequest(f, {STATE: np.array([0])})])
    assert np.array_equal(ds.read_many([EpisodeRequest(f, {ACTION: np.array([0])})])[0][ACTION],
                          clean.read_many([EpisodeRequest(f, {ACTION: np.array([0])})])[0][ACTION])


def test_a_batch_of_requests_read_by_ranges_equals_the_same_read_from_whole_records():
    """Many requests across every shard, repeated steps, steps out of order and both cameras, with and without
    slots to decode into: pictures gathered by range for the whole batch land in the right request, camera and
    step, equal to those read from whole records (the path remote datasets take)."""
    ranged, whole = open_dataset(VERSION), open_dataset(VERSION)
    whole._ranges = None
    rng = np.random.default_rng(7)
    requests, slotted = [], []
    for e in rng.integers(0, len(ranged), 24).tolist():
        n = int(ranged.lengths[e])
        picks = {IMAGE: rng.integers(0, n, 3), WRIST: rng.integers(0, n, 2), STATE: rng.integers(0, n, 2)}
        requests.append(EpisodeRequest(e, picks))
        slots = {f: np.zeros((len(picks[f]), *ranged.features[f].shape), np.uint8) for f in (IMAGE, WRIST)}
        slotted.append(EpisodeRequest(e, picks, slots))
    assert len({int(ranged._shard_of[r.episode]) for r in requests}) == 3
    want = whole.read_many(requests)
    for got in (ranged.read_many(requests), ranged.read_many(slotted)):
        for g, w in zip(got, want):
            assert all(np.array_equal(g[f], w[f]) for f in w)
    assert all(np.shares_memory(g[IMAGE], r.out[IMAGE]) for g, r in zip(ranged.read_many(slotted), slotted))


def test_gathered_ranges_read_only_their_pieces_and_small_gaps_in_each_shard(tmp_path):
    """Pieces of two shards: neighbours within 64 KiB share a read, far ones do not, whatever offsets the other
    shard's pieces have; each piece comes back where asked, checked; a piece whose bytes changed fails naming it."""
    from mmfeed.loaders.formats.rlds.ranges import RecordRanges

    rng = np.random.default_rng(3)
    files = [tmp_path / "a", tmp_path / "b"]
    data = [rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes() for _ in files]
    for f, d in zip(files, data):
        f.write_bytes(d)
    wanted = [(0, 900_000, 905_000), (1, 10, 2_000), (1, 500_000, 501_000), (1, 2_100, 3_000), (0, 0, 100)]
    pieces = np.array([[k, s, -12, a, b, crc32c(data[s][a:b])] for k, (s, a, b) in enumerate(wanted)], np.int64)
    ranges = RecordRanges([str(f) for f in files], lambda e: f"episode {e}")
    buffer, where = ranges.gather(pieces, lambda k: f"piece {k}")
    for (s, a, b), (x, y) in zip(wanted, where.tolist()):
        assert buffer[x:y].tobytes() == data[s][a:b]
    need = sum(b - a for _, a, b in wanted)
    assert buffer.size == need + 100, buffer.size  # the only gap read: 100 bytes between two pieces of shard b
    # into the thread's scratch: the same bytes, in one buffer used again by the next such call (a new one if it
    # must grow), never by a call without it
    first, _ = ranges.gather(pieces, lambda k: f"piece {k}", scratch=True)
    assert np.array_equal(first, buffer) and not np.shares_memory(first, ranges.gather(pieces, str)[0])
    second, _ = ranges.gather(pieces[:2], lambda k: f"piece {k}", scratch=True)
    assert np.shares_memory(first, second) and second.tobytes() == data[0][900_000:905_000] + data[1][10:2_000]
    bigger = np.concatenate([pieces, [[5, 0, -12, 0, 1 << 20, crc32c(data[0])]]])
    grown, where = ranges.gather(bigger, lambda k: f"piece {k}", scratch=True)
    assert not np.shares_memory(grown, first) and grown[slice(*where[-1])].tobytes() == data[0]
    pieces[2, 5] ^= 1
    with pytest.raises(SampleError, match=r"episode 2: piece 2 \(bytes 500000..501000 of the record\) fails its "
                                          "CRC-32C check"):
        ranges.gather(pieces, lambda k: f"piece {k}")


def test_a_shard_truncated_after_indexing_fails_the_sample_that_reads_past_its_end(copy):
    ds = open_dataset(copy)
    shard = copy / SHARD.format(2)
    e = int(np.flatnonzero(ds._shard_of == 2)[-1])
    shard.write_bytes(shard.read_bytes()[:int(ds._offset[e]) + 20])
    with pytest.raises(SampleError, match=rf"{shard.name} record \d+ \(byte {int(ds._offset[e])}\): "
                                          r".*bytes \d+..\d+ of "
                                          r"the (record|shard) end \d+ bytes short: the shard is truncated"):
        ds.read_many([EpisodeRequest(e, {IMAGE: np.array([0])})])


@pytest.mark.parametrize("bgr", [False, True])
@pytest.mark.parametrize("size", [None, (16, 20), (12, 14)])
def test_jpeg_decoders_agree_on_every_size_and_channel_order_and_decode_into_the_slot(size, bgr):
    """simplejpeg (libjpeg-turbo, DCT scaling then a resize) and Pillow (draft, then a resize) give the same
    pictures within JPEG rounding at the stored size, half of it (DCT scaling alone) and a size that needs both;
    decoding into a slot fills it; a picture of another size than declared is refused by both."""
    pytest.importorskip("simplejpeg")
    ds = open_dataset(VERSION)
    blob = ds._picture_bytes(0, IMAGE, np.array([1]))[0]
    pillow = decode_picture(blob, size, (32, 40), "rgb24", bgr, None, decoder="pillow")
    slot = np.zeros((*(size or (32, 40)), 3), np.uint8)
    fast = decode_picture(blob, size, (32, 40), "rgb24", bgr, None, out=slot, decoder="simplejpeg")
    assert fast is slot and pillow.shape == slot.shape
    diff = np.abs(fast.astype(np.int16) - pillow)
    if size in (None, (16, 20)):  # the same DCT scaling in both: JPEG rounding apart
        assert diff.max() <= 12 and diff.mean() < 2, (diff.max(), diff.mean())
    else:  # libjpeg-turbo scales by any eighth, Pillow's draft by halves: then a resize of different pictures
        assert diff.max() <= 32 and diff.mean() < 6, (diff.max(), diff.mean())
    if size is None:
        want = oracle("train")[0]["steps/observation/image"][1]
        assert np.array_equal(fast, want[..., ::-1] if bgr else want)
    for decoder in ("simplejpeg", "pillow"):
        with pytest.raises(ValueError, match="a picture of 32x40, features.json declares 30x40"):
            decode_picture(blob, None, (30, 40), "rgb24", False, None, decoder=decoder)
        with pytest.raises(ValueError, match="cannot be decoded"):
            decode_picture(bytes(blob)[:40], None, (32, 40), "rgb24", False, None, decoder=decoder)


@pytest.mark.parametrize("size", [None, (16, 20)])
def test_a_run_of_pictures_decodes_as_each_picture_alone_and_names_the_one_that_fails(size):
    """decode_pictures (one loop for a batch's pictures of a camera: JPEGs of the declared size straight into
    their slots) gives decode_picture's pixels, at the stored size and a smaller one; a picture cut short, one
    of another size, one that is no picture and one over max_frame_pixels each fail as PictureError naming
    that picture and saying what decode_picture says of it."""
    from mmfeed.loaders.formats.rlds.pictures import PictureError, decode_pictures

    ds = open_dataset(VERSION)
    blobs = [bytes(b) for b in ds._picture_bytes(0, IMAGE, np.arange(3))]
    data = np.frombuffer(b"".join(blobs), np.uint8)
    ends = np.cumsum([len(b) for b in blobs])
    spans = np.column_stack([ends - [len(b) for b in blobs], ends])
    h, w = size or (32, 40)
    out = np.zeros((3, h, w, 3), np.uint8)
    decode_pictures(data, spans, out, (32, 40), size, "rgb24", False, None)
    for i, blob in enumerate(blobs):
        assert np.array_equal(out[i], decode_picture(blob, size, (32, 40), "rgb24", False, None))
    bad = {"a picture of 32x40, features.json declares 30x40": (blobs, (30, 40), None),
           "cannot be decoded": ([blobs[0], blobs[1][:40], blobs[2]], (32, 40), None),
           "neither JPEG nor PNG": ([blobs[0], blobs[1], b"\x00" * 50], (32, 40), None),
           "more than max_frame_pixels=100": (blobs, (32, 40), 100)}
    for message, (pieces, declared, limit) in bad.items():
        data = np.frombuffer(b"".join(pieces), np.uint8)
        ends = np.cumsum([len(b) for b in pieces])
        spans = np.column_stack([ends - [len(b) for b in pieces], ends])
        with pytest.raises(PictureError, match=message) as err:
            decode_pictures(data, spans, np.zeros((3, *(size or declared), 3), np.uint8), declared, size, "rgb24",
                            False, limit)
        assert err.value.index == (0 if message.startswith(("a picture", "more")) else 1 if "cannot" in message
                                   else 2)


def _jpeg(mode: str, *, jfif: bool = True, adobe: int | None = None, ids: bytes | None = None, **save) -> bytes:
    """A 24x40 JPEG Pillow writes in ``mode``, then: its JFIF marker removed, an Adobe marker with that transform
    put first, its three components renamed ``ids`` (in the frame and the scan)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    colour = {"L": 90, "CMYK": (10, 200, 30, 40)}.get(mode, (200, 30, 90))
    Image.new(mode, (40, 24), colour).save(buffer, "JPEG", **save)
    blob = buffer.getvalue()
    if not jfif and blob[2:4] == b"\xff\xe0":
        blob = blob[:2] + blob[4 + int.from_bytes(blob[4:6], "big"):]
    if adobe is not None:
        blob = blob[:2] + b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00" + bytes([adobe]) + blob[2:]
    if ids is not None:
        sof = max(blob.find(b"\xff\xc0"), blob.find(b"\xff\xc2"))
        blob = bytearray(blob)
        sos = blob.find(b"\xff\xda")  # the scan names its components too
        for c in range(3):
            blob[sof + 10 + 3 * c] = blob[sos + 5 + 2 * c] = ids[c]
        blob = bytes(blob)
    return blob


def _frames(blobs: list[bytes]) -> list[tuple[int, int, int]]:
    from mmfeed.loaders.formats.rlds.pictures import jpeg_frames

    data = np.frombuffer(b"".join(blobs) or b"\x00", np.uint8)
    ends = np.cumsum([len(b) for b in blobs], dtype=np.int64)
    spans = np.column_stack([ends - [len(b) for b in blobs], ends]).astype(np.int64).reshape(-1, 2)
    return [tuple(row) for row in jpeg_frames(data, spans).tolist()]


@pytest.mark.kernels
def test_jpeg_frame_headers_say_what_libjpeg_turbo_says():
    """jpeg_frames (the frame headers of a batch's pictures, one compiled call) gives the size libjpeg-turbo
    reads and the colour space it decides on, for JPEGs Pillow writes (YCbCr at each subsampling, progressive,
    grey, CMYK) and for the markers that decide the colour of three components (no JFIF, an Adobe transform,
    components named R, G, B); a PNG, a cut-short JPEG and bytes that are no picture have no frame header.
    tests/naive.py's marker walk agrees on every one."""
    simplejpeg = pytest.importorskip("simplejpeg")
    from naive import naive_jpeg_frame

    kinds = {"YCbCr": 1, "Gray": 2}
    blobs = [_jpeg("RGB", subsampling=s) for s in (0, 1, 2)] + [
        _jpeg("RGB", progressive=True), _jpeg("L"), _jpeg("CMYK"), _jpeg("RGB", jfif=False),
        _jpeg("RGB", jfif=False, adobe=0), _jpeg("RGB", jfif=False, adobe=1), _jpeg("RGB", jfif=False, ids=b"RGB"),
        _jpeg("RGB", adobe=0)]
    got = _frames(blobs)
    for blob, frame in zip(blobs, got):
        h, w, colour, _ = simplejpeg.decode_jpeg_header(blob)
        assert frame == (h, w, kinds.get(colour, 0)) == naive_jpeg_frame(blob)
    assert [g[2] for g in got] == [1, 1, 1, 1, 2, 0, 1, 0, 1, 0, 1]  # the cases meant: CMYK, RGB by Adobe or ids
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("RGB", (40, 24)).save(png, "PNG")
    others = [png.getvalue(), blobs[0][:60], b"\xff\xd8\xff", b"", b"\x00" * 40]
    assert _frames(others) == [(-1, -1, -1)] * 5 == [naive_jpeg_frame(b) for b in others]


@pytest.mark.kernels
def test_jpeg_frame_headers_of_damaged_bytes_agree_with_the_naive_walk_and_stay_in_their_span():
    """Bytes flipped, cut or spliced anywhere in real JPEGs: jpeg_frames equals tests/naive.py's walk on each
    picture alone and on the same pictures side by side (nothing read past a picture's span), and where it finds
    a frame libjpeg-turbo reads the same size."""
    simplejpeg = pytest.importorskip("simplejpeg")
    from naive import naive_jpeg_frame

    rng = np.random.default_rng(7)
    sources = [_jpeg("RGB"), _jpeg("L"), _jpeg("CMYK"), _jpeg("RGB", progressive=True, jfif=False, adobe=0)]
    blobs = []
    for _ in range(400):
        blob = bytearray(sources[rng.integers(len(sources))])
        for _ in range(rng.integers(1, 4)):
            at = int(rng.integers(len(blob)))
            blob[at] = int(rng.integers(256)) if rng.random() < 0.8 else 0xFF
        blob = blob[:int(rng.integers(2, len(blob) + 1))] if rng.random() < 0.4 else blob
        blobs.append(bytes(blob[:min(len(blob), 400)]) if rng.random() < 0.5 else bytes(blob))
    together = _frames(blobs)
    assert together == [_frames([b])[0] for b in blobs] == [naive_jpeg_frame(b) for b in blobs]
    for blob, (h, w, colour) in zip(blobs, together):
        if colour > 0:
            try:
                header = simplejpeg.decode_jpeg_header(blob)
            except ValueError:
                continue  # libjpeg-turbo refuses it: decoding it fails the same way
            assert header[:2] == (h, w)


@pytest.mark.kernels
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5000), st.integers(0, 3000), st.integers(0, 400)),
                min_size=1, max_size=40), st.integers(0, 600))
def test_the_read_plan_of_record_ranges_equals_the_naive_one(rows, gap):
    """read_plan (which pieces of a batch's records share a read, and where each lands in the buffer) equals
    tests/naive.py's sort-and-join, for pieces that overlap, touch, repeat or lie apart in several shards."""
    from naive import naive_read_plan

    from mmfeed.loaders.formats.rlds.ranges import read_plan

    pieces = [[k, shard, record, start, start + size, 0] for k, (shard, record, start, size) in enumerate(rows)]
    groups, where, total = read_plan(np.array(pieces, np.int64), 12, gap)
    reads, naive_where, naive_total = naive_read_plan(pieces, 12, gap)
    assert groups.tolist() == reads and where.tolist() == naive_where and total == naive_total


def test_a_missing_shard_names_the_file(copy):
    (copy / SHARD.format(2)).unlink()
    with pytest.raises(ValueError, match=rf"{SHARD.format(2)}: the shard is missing") as err:
        open_dataset(copy)
    assert "\n" not in str(err.value)
    ds = open_dataset(copy, errors="skip")
    assert len(ds) == 6 and len(ds.skipped) == 3


def test_features_json_that_does_not_match_the_records_names_the_file_record_and_key(copy):
    path = copy / "features.json"
    tree = json.loads(path.read_text())
    steps = tree["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    steps["action"]["tensor"]["shape"]["dimensions"] = ["6"]  # the records hold 7 per step
    path.write_text(json.dumps(tree))
    with pytest.raises(ValueError, match=rf"{SHARD.format(0)} record 0: key 'steps/action' holds \d+ values, "
                                         r"\d+ steps of float32 \[6\] take") as err:
        open_dataset(copy)
    assert "\n" not in str(err.value)
    steps["action"]["tensor"]["shape"]["dimensions"] = ["7"]
    steps["gripper_width"] = {"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                              "tensor": {"dtype": "float32", "encoding": "none", "shape": {}}}
    path.write_text(json.dumps(tree))
    with pytest.raises(ValueError, match=r"record 0: no key 'steps/gripper_width' in the record, which "
                                         "features.json declares"):
        open_dataset(copy)
    with pytest.raises(ValueError, match="every episode's metadata disagrees"):
        open_dataset(copy, errors="skip")


def test_options_other_formats_read_are_refused_and_rlds_options_checked():
    with pytest.raises(ValueError, match=r"option 'tolerance_s' applies to LeRobot v3 only.*is RLDS\); "
                                         "drop tolerance_s="):
        open_dataset(VERSION, tolerance_s=0.1)
    with pytest.raises(ValueError, match="fps must be the control rate"):
        open_dataset(VERSION, fps=0)


# -- remote ---------------------------------------------------------------------------------------------------

def same_episodes(remote, local):
    assert len(remote) == len(local) and remote.lengths.tolist() == local.lengths.tolist()
    assert remote.tasks == local.tasks and remote.features == local.features
    for e in range(len(local)):
        a, b = remote.episode(e), local.episode(e)
        assert a.keys() == b.keys()
        for key in b:
            if key == "contacts":
                assert all(np.array_equal(x, y) for x, y in zip(a[key], b[key]))
            elif isinstance(b[key], np.ndarray):
                assert np.array_equal(a[key], b[key]), (e, key)
            else:
                assert a[key] == b[key], (e, key)


def test_the_corpus_over_http_reads_the_local_episodes():
    from http_server import serve

    with serve(CORPUS) as server:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        remote = open_dataset(f"{base}/mmfeed_rlds_corpus/1.0.0", split="val", fps=5)
        assert remote.files.remote
        same_episodes(remote, open_dataset(VERSION, split="val", fps=5))
        served = [path for method, path, n in server.served if method == "GET" and "tfrecord" in path]
        assert served  # the records came over HTTP, by range


def test_the_corpus_from_a_local_s3_server_reads_the_local_episodes():
    from s3_server import moto_s3

    with moto_s3() as s3:
        s3.create_bucket(Bucket="oxe")
        for path in VERSION.iterdir():
            s3.upload_file(str(path), "oxe", f"mmfeed_rlds_corpus/1.0.0/{path.name}")
        remote = open_dataset("s3://oxe/mmfeed_rlds_corpus", fps=5)  # the dataset directory: its highest version
        assert remote.files.root == "s3://oxe/mmfeed_rlds_corpus/1.0.0"
        same_episodes(remote, open_dataset(VERSION, fps=5))


def test_mmfeed_inspect_surveys_a_split_with_its_stats_from_the_index(tmp_path, capsys):
    from mmfeed.cli import main

    report = tmp_path / "inspect.json"
    assert main(["inspect", str(DATASET), "--split", "val", "--fps", "10", "--horizon", "4", "--capacity", "256",
                 "--tokens-per-frame", "16", "--json", str(report)]) == 0
    assert "RldsSource): 4 episodes" in capsys.readouterr().out
    info = json.loads(report.read_text())
    want = np.concatenate([episode["steps/observation/state"] for episode in oracle("val")])
    state = info["features"][STATE]
    assert (state["kind"], state["dtype"], state["shape"], state["fps"]) == ("array", "float64", [8], 10.0)
    np.testing.assert_allclose(state["stats"]["mean"], want.mean(axis=0), rtol=1e-9)
    assert info["features"][IMAGE]["stats"] == {}


def test_split_slices_take_the_episodes_tfds_would():
    whole = open_dataset(VERSION, fps=10)
    for split, want in (("train[:50%]", slice(0, 4)), ("train[2:5]", slice(2, 5)), ("train[-2:]", slice(7, 9)),
                        ("train[10%:]", slice(1, 9))):  # TFDS rounds percent bounds to the nearest episode
        part = open_dataset(VERSION, split=split, fps=10)
        assert part.lengths.tolist() == whole.lengths[want].tolist(), split
        assert np.array_equal(part.episode(0)[ACTION], whole.episode(want.start)[ACTION]), split
    with pytest.raises(ValueError, match=r"split 'train\[:90\]%': give a split's name, or one sliced as TFDS"):
        open_dataset(VERSION, split="train[:90]%")
    with pytest.raises(ValueError, match="both bounds are percents or neither"):
        open_dataset(VERSION, split="train[1:50%]")
    with pytest.raises(ValueError, match=r"holds no episode of the 9 in split 'train'"):
        open_dataset(VERSION, split="train[5:5]")


def test_a_damaged_record_is_an_example_error_or_decodes_never_another_exception():
    from mmfeed.loaders.formats.rlds.example import ExampleError

    data = (VERSION / "mmfeed_rlds_corpus-val.tfrecord-00000-of-00003").read_bytes()
    record = data[12:12 + struct.unpack_from("<Q", data)[0]]
    rng = np.random.default_rng(0)
    outcomes = set()
    for _ in range(1500):
        damaged = bytearray(record)
        how = int(rng.integers(3))
        if how == 0:  # bytes changed
            for at in rng.integers(len(damaged), size=int(rng.integers(1, 4))):
                damaged[at] = int(rng.integers(256))
        elif how == 1:  # cut short
            damaged = damaged[:int(rng.integers(len(damaged)))]
        else:  # bytes inserted
            at = int(rng.integers(len(damaged)))
            damaged[at:at] = rng.integers(0, 256, int(rng.integers(1, 10)), dtype=np.uint8).tobytes()
        try:
            for values in parse_example(bytes(damaged)).values():
                len(values.values)  # bytes lists split when asked
            outcomes.add("decoded")
        except ExampleError:
            outcomes.add("refused")
    assert outcomes == {"decoded", "refused"}


def test_bgr_swaps_the_channels_of_every_picture():
    rgb, bgr = open_dataset(VERSION).episode(2), open_dataset(VERSION, bgr=True).episode(2)
    for camera in (IMAGE, WRIST):
        assert np.array_equal(bgr[camera], rgb[camera][..., ::-1])
    with pytest.raises(ValueError, match="bgr=True swaps the channels of RGB frames"):
        open_dataset(VERSION, bgr=True, frame_format="yuv420")


def test_mmfeed_index_builds_every_splits_record_index_ahead(tmp_path, monkeypatch, capsys):
    from mmfeed.cli import main

    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))
    assert main(["index", str(DATASET)]) == 0
    out = capsys.readouterr().out
    assert "[train]: 9 episodes, 37 steps, 3 shard(s)" in out and "[val]: 4 episodes" in out
    assert len(list((tmp_path / "cache" / "index" / "rlds").glob("*.npz"))) == 2
    open_dataset(VERSION, split="val")  # found there: nothing new written
    assert len(list((tmp_path / "cache" / "index" / "rlds").glob("*.npz"))) == 2


def test_a_tensor_declared_huge_is_refused_before_anything_of_its_size_is_allocated(copy):
    path = copy / "features.json"
    tree = json.loads(path.read_text())
    observation = tree["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"][
        "observation"]["featuresDict"]["features"]
    observation["depth"]["tensor"]["shape"]["dimensions"] = ["100000", "100000", "1000"]  # 40 TB a step
    path.write_text(json.dumps(tree))
    with pytest.raises(ValueError, match=r"key 'steps/observation/depth': a value of 80 bytes, float32 \[100000, "
                                         r"100000, 1000\] takes 40000000000000"):
        open_dataset(copy, split="val").episode(0)


def test_yuv420_frames_are_limited_range_bt601_planes_of_the_pictures():
    ds = open_dataset(VERSION, split="val", frame_format="yuv420")
    assert ds.features[WRIST].shape == (24, 16) and ds.features[IMAGE].shape == (48, 40)
    for e, tfds_episode in enumerate(oracle("val")):
        got = ds.episode(e)
        for camera, key in ((WRIST, "steps/observation/wrist_image"), (IMAGE, "steps/observation/image")):
            rgb = tfds_episode[key].astype(np.float64)
            luma = 16 + (65.481 * rgb[..., 0] + 128.553 * rgb[..., 1] + 24.966 * rgb[..., 2]) / 255
            diff = np.abs(got[camera][:, :rgb.shape[1]] - luma)  # the Y plane: not subsampled
            assert diff.mean() < (1.0 if camera == WRIST else 2.0), (e, camera, diff.mean())


def test_camera_dropout_drops_rlds_cameras_as_it_drops_videos():
    from mmfeed.loaders.planned.transforms import CameraDropout

    ds = open_dataset(VERSION, fps=10)
    window = WindowSpec.from_delta_timestamps({IMAGE: [0.0], WRIST: [0.0], STATE: [0.0]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={IMAGE: 2, WRIST: 2}), window=window,
                      plan=PlanConfig(capacity=48, rows_per_batch=2), seed=3, transform=CameraDropout(0.5))
    dropped = []
    for batch in DataLoader(ds, packing=packing):
        for camera in (IMAGE, WRIST):
            pad = batch.data[f"{camera}_is_pad"]
            assert not batch.data[camera][pad].any() and batch.data[camera][~pad].any()
        dropped.append(torch.stack([batch.data[f"{c}_is_pad"] for c in (IMAGE, WRIST)], 1))
    dropped = torch.cat(dropped)
    assert dropped.any() and not dropped.all(1).any()  # some cameras dropped, never both of a window


def test_mmfeed_stats_of_the_corpus_are_the_oracles(tmp_path):
    from mmfeed.cli import main

    report = tmp_path / "stats.json"
    assert main(["stats", str(VERSION), "--features", f"{STATE},{ACTION}", "--no-progress", "--json",
                 str(report)]) == 0
    [dataset] = json.loads(report.read_text())["datasets"]
    assert dataset["name"].endswith("[train]")
    want = np.concatenate([episode["steps/observation/state"] for episode in oracle("train")])
    np.testing.assert_allclose(dataset["stats"][STATE]["mean"], want.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(dataset["stats"][STATE]["max"], want.max(axis=0), rtol=1e-12)


def test_task_key_names_a_step_text_feature():
    with pytest.raises(ValueError, match=r"task_key='instruction' names no text feature of the steps; they are "
                                         r"\['language_instruction'\]"):
        open_dataset(VERSION, task_key="instruction")


# -- conversion to shards -------------------------------------------------------------------------------------

def converted_members(dst: Path) -> dict[str, dict]:
    """Each episode's meta.json in the shards of ``dst``, by episode key."""
    import tarfile

    metas = {}
    for shard in sorted(dst.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".meta.json"):
                    metas[member.name.split(".", 1)[0]] = json.loads(tar.extractfile(member).read())
    return metas


@pytest.mark.parametrize("split", ["train", "val"])
def test_convert_to_shards_reads_back_every_array_task_and_picture(tmp_path, split, caplog):
    """Every array feature equals TFDS's, every step's task its language_instruction, episode texts are in
    meta.json; lossless H.264 (crf 0) keeps the PNG camera's yuv420 planes exactly and the JPEG camera's luma
    within JPEG decoders' rounding (TensorFlow's and Pillow's IDCT against libjpeg's YUV output)."""
    from mmfeed.cli import main
    from mmfeed.loaders import convert

    dst = tmp_path / "shards"
    if split == "train":
        summary = convert(VERSION, dst, fps=5, crf=0, episodes_per_shard=4, progress=False)
        assert summary.episodes == 9 and summary.shards == 3
    else:
        assert main(["convert", str(DATASET), str(dst), "--fps", "5", "--split", "val", "--crf", "0",
                     "--no-progress"]) == 0
    assert "ragged features ['contacts'] left out" in caplog.text
    shards = open_dataset(dst)
    source = open_dataset(VERSION, split=split, fps=5, frame_format="yuv420")
    planes = open_dataset(dst, frame_format="yuv420")
    want = oracle(split)
    assert len(shards) == len(want) and shards.features[ACTION].fps == 5.0
    arrays = {key.removeprefix("steps/").replace("/", "."): key for key in want[0]
              if want[0][key].dtype.kind != "U" and not key.startswith("steps/contacts/")
              and key not in ("steps/observation/image", "steps/observation/wrist_image")}
    assert set(arrays) == {f for f, spec in shards.features.items() if spec.kind == "array"}
    metas = converted_members(dst)
    for e, tfds_episode in enumerate(want):
        got = shards.episode(e)
        steps = len(tfds_episode["steps/is_first"])
        assert int(shards.lengths[e]) == steps
        for name, key in arrays.items():
            value = tfds_episode[key]
            if key.startswith("episode_metadata/"):
                value = np.repeat(value[None], steps, axis=0)
            assert got[name].dtype == value.dtype and np.array_equal(got[name], value), (e, name)
        assert [shards.task(e, t) for t in range(steps)] == tfds_episode["steps/language_instruction"].tolist()
        assert metas[f"episode_{e:06d}"]["text"] == {
            "episode_metadata.file_path": str(tfds_episode["episode_metadata/file_path"])}
        mine, theirs = planes.episode(e), source.episode(e)
        assert np.array_equal(mine[WRIST], theirs[WRIST]), e  # PNG: lossless
        luma = source.features[IMAGE].shape[0] * 2 // 3
        diff = np.abs(mine[IMAGE][:, :luma].astype(np.int16) - theirs[IMAGE][:, :luma].astype(np.int16))
        assert mine[IMAGE].shape == theirs[IMAGE].shape and diff.max() <= 10 and diff.mean() < 0.5, e
        assert got[IMAGE].shape == (steps, 32, 40, 3) and got[WRIST].shape == (steps, 16, 16, 3)


def test_convert_of_rlds_needs_fps_before_anything_is_written(tmp_path):
    from mmfeed.loaders import convert

    with pytest.raises(ValueError, match=r"RLDS records no control rate; pass fps=.*--fps on the command line"):
        convert(VERSION, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# -- the decoded-frame cache ----------------------------------------------------------------------------------

def test_epoch_2_reads_pictures_from_the_frame_cache_never_the_records(copy, tmp_path):
    """Epoch 1 fills the cache with each camera of each episode; epoch 2, through another opening of the dataset,
    gives the same pictures from it without reading a record: every shard's records are damaged in between (sizes
    and mtimes kept, so the cache's keys still hold) and nothing fails."""
    frames = tmp_path / "frames"
    spec = WindowSpec.from_delta_timestamps({IMAGE: [-0.1, 0.0], WRIST: [0.0]})
    first = open_dataset(copy, fps=10, cache=frames)
    uncached = open_dataset(VERSION, fps=10).windows(spec)
    view = first.windows(spec)
    epoch1 = [view[i] for i in range(len(view))]
    assert first._store.filled == 2 * len(first) and first._store.info().segments == 2 * len(first)
    for i in (0, 5, len(view) - 1):
        assert all(torch.equal(epoch1[i][f], uncached[i][f]) for f in (IMAGE, WRIST))
    for shard in copy.glob("*train.tfrecord*"):
        stat = shard.stat()
        data = bytearray(shard.read_bytes())
        offsets, lengths = records(shard)
        for offset, length in zip(offsets.tolist(), lengths.tolist()):
            data[offset + 12 + length // 2] ^= 0xFF  # the middle of every record's payload
        shard.write_bytes(bytes(data))
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = open_dataset(copy, fps=10, cache=frames)
    view2 = again.windows(spec)
    for i in range(len(view2)):
        assert all(torch.equal(view2[i][f], epoch1[i][f]) for f in (IMAGE, WRIST)), i
    assert again._store.filled == 0 and again._store.hits >= 2 * len(view2)
    with pytest.raises(SampleError, match="CRC"):  # an array still reads its record
        again.episode(0)
