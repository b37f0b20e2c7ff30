"""Bad input: every failure names the file, the key or episode, the feature and what was wrong, or is skipped
and counted under an explicit policy."""

import io
import json
import re
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds

from mmfeed import DataLoader
from mmfeed.loaders import ErrorPolicy, Packing, PlanConfig, SampleError, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.loaders.stores.index import INDEX_FILENAME, build_index, write_index
from mmfeed.testing import frame_pattern, make_episodes, write_lerobot, write_video, write_webdataset

CAM, STATE, REWARD = "observation.images.cam_high", "observation.state", "next.reward"
MP4 = f"{CAM}.mp4"
WINDOW = WindowSpec.from_delta_timestamps({CAM: [-1 / 15, 0.0], STATE: [0.0], REWARD: [0.0],
                                           "action": [0.0, 1 / 30, 2 / 30]})
LAYOUT = TokenLayout(tokens_per_frame={CAM: 8})


def packing(errors=None, **plan):
    return Packing(layout=LAYOUT, window=WINDOW, plan=PlanConfig(capacity=96, rows_per_batch=2, **plan),
                   errors=errors or ErrorPolicy())


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    eps = make_episodes(4, seed=8, min_length=10, max_length=14, cameras=("cam_high",),
                        camera_fps={"cam_high": 15.0})
    write_webdataset(out, eps, episodes_per_shard=2)
    return out, eps


def members_of(tar_path):
    """{key: {member name after the key: bytes}} in tar order (v2 names keep their dots:
    ``observation.state.npy``)."""
    groups = {}
    with tarfile.open(tar_path) as tar:
        for info in tar:
            key, _, suffix = info.name.partition(".")
            groups.setdefault(key, {})[suffix] = tar.extractfile(info).read()
    return groups


def broken(clean, tmp_path, name, change, every=False):
    """Copies of the clean shards, through webdataset's TarWriter, where change(members) edits the first
    episode's members (every episode's with ``every``); returns the directory (not yet indexed) and the first
    episode's key."""
    clean_dir, _ = clean
    out = tmp_path / name
    out.mkdir()
    victim = None
    for tar_path in sorted(clean_dir.glob("*.tar")):
        with wds.TarWriter(str(out / tar_path.name), encoder=False) as sink:
            for key, members in members_of(tar_path).items():
                victim = victim or key
                sink.write({"__key__": key, **(change(dict(members)) if every or key == victim else members)})
    return out, victim


def index(directory):
    return write_index(sorted(str(p) for p in directory.glob("*.tar")))


def npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def undescribed(members, feature):
    """Members whose meta.json no longer describes ``feature`` (as a shard written by hand): the index then
    reads the member's own header instead."""
    meta = json.loads(members["meta.json"])
    meta["features"].pop(feature)
    return {**members, "meta.json": json.dumps(meta).encode()}


def steps_of(members):
    return json.loads(members["meta.json"])["length"]


def nan_at(members, feature, steps):
    values = np.load(io.BytesIO(members[f"{feature}.npy"])).copy()
    values[steps[:-1]] = np.nan
    values[steps[-1]] = np.inf
    return {**members, f"{feature}.npy": npy(values)}


def read_epoch(path, policy=None):
    loader = DataLoader(path, packing=packing(policy))
    return loader, list(loader)


# case -> (what changes in the first episode, the feature named, what the message says besides the shard and
# key, where it is caught: by the index, from tar headers, npy headers and meta.json, or by the read)
CASES = {
    "truncated mp4": (lambda m: {**m, MP4: m[MP4][: len(m[MP4]) // 2]}, CAM, "not a readable video", "read"),
    "corrupted mp4": (lambda m: {**m, MP4: bytes(64) + m[MP4][64:]}, CAM, "not a readable video", "read"),
    "zero-byte mp4": (lambda m: {**m, MP4: b""}, CAM, "video bytes are empty", "read"),
    "missing member": (lambda m: {k: v for k, v in m.items() if k != "action.npy"}, "action",
                       r"names features \['action'\] that have no member", "index"),
    "missing feature": (lambda m: undescribed({k: v for k, v in m.items() if k != "action.npy"}, "action"),
                        "action", "does not have feature 'action'", "index"),
    "not npy": (lambda m: {**m, f"{REWARD}.npy": b"garbage"}, REWARD, "not .npy bytes", "index"),
    "truncated npy": (lambda m: {**m, f"{STATE}.npy": m[f"{STATE}.npy"][:-8]}, STATE, "truncated .npy", "read"),
    "dtype against meta.json": (lambda m: {**m, f"{STATE}.npy": npy(np.zeros((steps_of(m), 14)))}, STATE,
                                r"describes \['array', 'float32'.*holds \['array', 'float64'", "index"),
    "dtype against other episodes": (lambda m: undescribed({**m, f"{STATE}.npy": npy(np.zeros((steps_of(m), 14)))},
                                                           STATE), STATE, "is array float64 .* but array float32",
                                     "index"),
    "rows against length": (lambda m: undescribed({**m, "action.npy": npy(np.zeros((3, 14), np.float32))},
                                                  "action"), "action", "3 rows, but meta.json length is", "index"),
    "step shape": (lambda m: undescribed({**m, "action.npy": npy(np.zeros((steps_of(m), 7), np.float32))},
                                         "action"), "action", r"float32 \[7\] .* but array float32 \[14\]", "index"),
    "nan in state": (lambda m: nan_at(m, STATE, [1, 4]), STATE, r"NaN or inf at frames \[[14]\]", "read"),
    "inf in reward": (lambda m: nan_at(m, REWARD, [0, 2]), REWARD, r"NaN or inf at frames \[[02]\]", "read"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_strict_mode_names_shard_key_feature_and_what_was_wrong(clean, tmp_path, case):
    change, feature, pattern, where = CASES[case]
    path, victim = broken(clean, tmp_path, case.replace(" ", "_"), change)
    if where == "index":
        with pytest.raises(ValueError) as info:
            index(path)
    else:
        index(path)
        with pytest.raises(ValueError) as info:  # SampleError and DecodeError are ValueErrors
            read_epoch(path)
    message = str(info.value)
    assert str(path / "shard-000000.tar") in message and f"{victim}" in message, message
    assert feature in message and re.search(pattern, message), message


@pytest.mark.parametrize("case", ["truncated mp4", "truncated npy", "nan in state"])
def test_skip_policy_keeps_the_step_count_and_lists_every_skip(clean, tmp_path, case):
    """Skipped samples leave their batches, which still go out: same steps as a clean run; each skip listed."""
    path, victim = broken(clean, tmp_path, case.replace(" ", "_"), CASES[case][0])
    index(path)
    _, clean_batches = read_epoch(clean[0])
    loader, batches = read_epoch(path, ErrorPolicy(on_error="skip", max_consecutive_errors=1000))
    assert len(batches) == len(clean_batches)
    table = loader.dataset.items.table
    planned = np.setdiff1d(np.flatnonzero(table.groups == 0), loader.dataset.plan(0).dropped)
    if case == "nan in state":  # only the samples that read a bad step fail
        planned = planned[np.isin(table.locate(planned)[1], [1, 4])]
    assert loader.stats["skipped_samples"] == len(planned) > 0
    assert sorted(r["sample"] for r in loader.stats["errors"]) == planned.tolist()
    for record in loader.stats["errors"]:
        assert record["episode"] == 0 and victim in record["source"] and CASES[case][1] in record["reason"]
    delivered = {int(s) for b in batches for s in b.metadata["sample"]}
    assert not delivered & set(planned.tolist())
    assert len(delivered) == sum(len(b.metadata["sample"]) for b in clean_batches) - len(planned)


def test_too_many_consecutive_failures_raise(clean, tmp_path):
    # every episode broken, so failures come in a row whatever order the plan puts the samples in
    path, _ = broken(clean, tmp_path, "trunc", CASES["truncated mp4"][0], every=True)
    index(path)
    with pytest.raises(SampleError, match="in a row failed"):
        read_epoch(path, ErrorPolicy(on_error="warn", max_consecutive_errors=2))


@pytest.mark.parametrize("feature", [STATE, REWARD])
def test_nan_and_inf_in_any_float_feature_can_be_masked_instead(clean, tmp_path, feature):
    bad = [2, 5, 7]
    path, _ = broken(clean, tmp_path, "nan", lambda m: nan_at(m, feature, bad))
    index(path)
    truth = clean[1][0].arrays()[feature]
    loader, batches = read_epoch(path, ErrorPolicy(nonfinite="mask"))
    masked = 0
    for b in batches:
        values, pad = b.data[feature], b.data[f"{feature}_is_pad"]
        assert torch.isfinite(values).all()
        for d, (e, t) in enumerate(zip(b.metadata["episode"].tolist(), b.metadata["start_step"].tolist())):
            # the window reads one step of the feature per document: the document's d-th item
            assert bool(pad[d]) == (e == 0 and t in bad), (e, t)
            if e == 0:
                want = np.zeros_like(truth[t]) if t in bad else truth[t]
                np.testing.assert_array_equal(values[d].numpy(), want)
            masked += bool(pad[d])
    assert masked > 0 and loader.stats["skipped_samples"] == 0


def test_video_shorter_than_its_index_is_named(clean, tmp_path):
    data = open(write_video(tmp_path / "short.mp4", frame_pattern(4, height=48, width=64), fps=15.0), "rb").read()
    path, victim = broken(clean, tmp_path, "short", lambda m: {**m, MP4: data})
    index(path)
    with pytest.raises(SampleError, match=rf"{victim}' feature '{CAM}': the video holds 4 frames .* promises"):
        read_epoch(path)


def test_unsupported_codec_for_the_chosen_backend_is_named(tmp_path):
    out = tmp_path / "av1"
    write_webdataset(out, make_episodes(1, seed=1, min_length=6, max_length=6, cameras=("cam_high",)), codec="av1",
                     gop=2)
    ds = packing().dataset(open_dataset(out, backend="decord"))
    with pytest.raises(ValueError, match=rf"episode_000000' feature '{CAM}'.*decord cannot open AV1"):
        ds[0, 0]


def test_truncated_tar_is_named_with_or_without_an_index(clean, tmp_path):
    copy = tmp_path / "cut"
    copy.mkdir()
    tar = sorted(clean[0].glob("*.tar"))[0]
    data = tar.read_bytes()
    (copy / tar.name).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{tar.name}' is truncated: member 'episode_\d+\.[\w.]+' needs bytes"):
        build_index([str(copy / tar.name)])
    (copy / INDEX_FILENAME).write_bytes((clean[0] / INDEX_FILENAME).read_bytes())
    with pytest.raises(ValueError, match=rf"out of date .*{tar.name}"):
        open_dataset(copy)


def test_empty_and_missing_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="empty list"):
        open_dataset([])
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        open_dataset(tmp_path / "no_such_dir")


def test_lerobot_missing_files_and_malformed_info_are_named(tmp_path):
    root = write_lerobot(tmp_path / "lr", make_episodes(2, seed=4, min_length=8, max_length=8,
                                                        cameras=("cam_high",)), codec="h264", gop=2)
    data = next((tmp_path / "lr" / "data").rglob("*.parquet"))
    video = next((tmp_path / "lr" / "videos").rglob("*.mp4"))
    saved = data.read_bytes()
    data.unlink()
    with pytest.raises(FileNotFoundError, match=rf"lr episode \d feature '[\w.]+': data file .*{data.name}"):
        packing().dataset(open_dataset(root))[0, 0]
    data.write_bytes(saved)
    video.unlink()
    with pytest.raises(ValueError, match=rf"lr episode \d feature '{CAM}' \(.*{video.name}\).*no such video file"):
        packing().dataset(open_dataset(root))[0, 0]
    info = tmp_path / "lr" / "meta" / "info.json"
    info.write_text("{not json")
    with pytest.raises(ValueError, match="info.json: malformed JSON"):
        open_dataset(root)
    info.write_text(json.dumps({"codebase_version": "v3.0"}))
    with pytest.raises(ValueError, match="info.json: missing field 'fps'"):
        open_dataset(root)


def test_long_episodes_are_split_to_fit_or_truncated_and_counted():
    src = ArraySource([{STATE: np.zeros((n, 2), np.float32), "action": np.zeros((n, 2), np.float32),
                        "task": "t"} for n in (5, 40, 90)])
    layout = TokenLayout(tokens_per_frame={STATE: 1, "action": 1})  # 2 tokens per step, plus one text token

    def chunks(**kwargs):
        return Packing(layout=layout, plan=PlanConfig(capacity=41), **kwargs).dataset(src).items.table

    def columns(table):  # (episode, start, length) of every chunk
        ids = np.arange(len(table))
        return (*table.locate(ids), table.lengths(ids))

    split = chunks()
    episode, _, length = columns(split)
    assert split.tokens.max() <= 41 and split.stats["split_episodes"] == 2
    assert sorted(length[episode == 2].tolist()) == [10, 20, 20, 20, 20]
    assert np.bincount(episode, weights=length).tolist() == [5, 40, 90]  # every step in one chunk
    cut = chunks(long_episodes="truncate")
    _, start, length = columns(cut)
    assert length.tolist() == [5, 20, 20] and start.tolist() == [0, 0, 0]
    assert cut.stats["truncated_steps"] == 20 + 70 and cut.stats["split_episodes"] == 0
    with pytest.raises(ValueError, match="long_episodes"):
        chunks(long_episodes="crop")
    with pytest.raises(ValueError, match="cannot hold one step"):
        Packing(layout=layout, plan=PlanConfig(capacity=2)).dataset(src)
