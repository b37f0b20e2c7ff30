"""Bad input and faults: every failure names what failed, or is skipped and counted under an explicit policy."""

import io
import json
import tarfile

import numpy as np
import pytest
import torch
import webdataset as wds

from mmfeed import DataLoader
from mmfeed.loaders import (ErrorPolicy, Packing, PackedEpisodeDataset, PlanConfig, SampleError, TokenLayout,
                            WindowSpec, open_dataset)
from mmfeed.loaders.index import INDEX_FILENAME, build_index, write_index
from mmfeed.testing import frame_pattern, make_episodes, write_lerobot, write_video, write_webdataset

WINDOW = WindowSpec(offsets={"frames.cam_high": (-1, 0), "proprio": (0,), "action": (0, 1, 2)})
LAYOUT = TokenLayout(tokens_per_frame={"cam_high": 8})


def packing(errors=None, **plan):
    return Packing(layout=LAYOUT, window=WINDOW, plan=PlanConfig(capacity=96, rows_per_batch=2, **plan),
                   errors=errors or ErrorPolicy())


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    eps = make_episodes(4, seed=8, min_length=10, max_length=14, cameras=("cam_high",))
    write_webdataset(out, eps, episodes_per_shard=2)
    return out, eps


def members_of(tar_path):
    """{key: {member suffix: bytes}} in tar order."""
    groups = {}
    with tarfile.open(tar_path) as tar:
        for info in tar:
            key, _, suffix = info.name.partition(".")
            groups.setdefault(key, {})[suffix] = tar.extractfile(info).read()
    return groups


def rewrite(clean_dir, out_dir, mutate):
    """Copy the clean shards into out_dir through webdataset's TarWriter, letting mutate(key, members) edit
    each episode's members; index the result."""
    out_dir.mkdir()
    shards = []
    for tar_path in sorted(clean_dir.glob("*.tar")):
        target = out_dir / tar_path.name
        with wds.TarWriter(str(target), encoder=False) as sink:
            for key, members in members_of(tar_path).items():
                members = mutate(key, dict(members))
                sink.write({"__key__": key, **members})
        shards.append(str(target))
    write_index(shards)
    return out_dir


def first_key(clean_dir):
    return next(iter(members_of(sorted(clean_dir.glob("*.tar"))[0])))


def broken(clean, tmp_path, name, change):
    """Shards where the first episode's members are changed by change(members)."""
    clean_dir, _ = clean
    victim = first_key(clean_dir)
    return rewrite(clean_dir, tmp_path / name, lambda k, m: change(m) if k == victim else m), victim


def npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def read_epoch(path, policy=None):
    loader = DataLoader(path, packing=packing(policy))
    return loader, list(loader)


CASES = {
    "truncated mp4": (lambda m: {**m, "cam_high.mp4": m["cam_high.mp4"][: len(m["cam_high.mp4"]) // 2]},
                      r"stream 'cam_high'"),
    "corrupted mp4": (lambda m: {**m, "cam_high.mp4": bytes(64) + m["cam_high.mp4"][64:]}, r"stream 'cam_high'"),
    "zero-byte mp4": (lambda m: {**m, "cam_high.mp4": b""}, r"stream 'cam_high'"),
    "missing modality": (lambda m: {k: v for k, v in m.items() if k != "action.npy"}, r"no member 'action.npy'"),
    "wrong dtype": (lambda m: {**m, "proprio.npy": npy(np.zeros((10, 14), np.float64))}, r"proprio.npy.*float"),
    "wrong shape": (lambda m: {**m, "action.npy": npy(np.zeros((3, 14), np.float32))}, r"action.npy.*shape"),
    "nan in proprio": (lambda m: {**m, "proprio.npy": npy(np.full((len(np.load(io.BytesIO(m["proprio.npy"]))), 14),
                                                                  np.nan, np.float32))},
                       r"'proprio': NaN or inf"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_strict_mode_names_shard_key_and_what_was_wrong(clean, tmp_path, case):
    change, pattern = CASES[case]
    path, victim = broken(clean, tmp_path, case.replace(" ", "_"), change)
    with pytest.raises(ValueError) as info:
        read_epoch(path)
    message = str(info.value)
    assert victim in message and "shard-" in message, message
    assert __import__("re").search(pattern, message), message


@pytest.mark.parametrize("case", ["truncated mp4", "missing modality", "nan in proprio"])
def test_skip_policy_keeps_the_step_count_and_lists_every_skip(clean, tmp_path, case):
    """Skipped samples leave their batches, which still go out: same steps as a clean run; each skip listed."""
    change, _ = CASES[case]
    path, victim = broken(clean, tmp_path, case.replace(" ", "_"), change)
    _, clean_batches = read_epoch(clean[0])
    loader, batches = read_epoch(path, ErrorPolicy(on_error="skip", max_consecutive_errors=1000))
    assert len(batches) == len(clean_batches)
    victim_samples = int(np.sum(loader.dataset.table.episode == 0))  # the first episode is the victim
    assert loader.stats["skipped_samples"] == victim_samples - int(np.isin(
        np.flatnonzero(loader.dataset.table.episode == 0), loader.dataset.plan(0).dropped).sum())
    for record in loader.stats["errors"]:
        assert record["episode"] == 0 and record["source"] == loader.dataset.source.name and record["reason"]
    delivered = {int(s) for b in batches for s in b.metadata["sample"]}
    assert not delivered & {r["sample"] for r in loader.stats["errors"]}


def test_too_many_consecutive_failures_raise(clean, tmp_path):
    path, _ = broken(clean, tmp_path, "trunc", CASES["truncated mp4"][0])
    with pytest.raises(SampleError, match="in a row failed"):
        read_epoch(path, ErrorPolicy(on_error="warn", max_consecutive_errors=2))


def test_nan_can_be_masked_instead(clean, tmp_path):
    path, _ = broken(clean, tmp_path, "nan", CASES["nan in proprio"][0])
    loader, batches = read_epoch(path, ErrorPolicy(nonfinite="mask"))
    masked = 0
    for b in batches:
        assert torch.isfinite(b.data["proprio"]).all()
        pad = b.data["proprio_is_pad"]
        episodes = b.metadata["episode"]
        masked += int(pad[episodes == 0].sum())
        assert not pad[episodes != 0].any()
    assert masked > 0 and loader.stats["skipped_samples"] == 0


def test_video_shorter_than_its_metadata_is_named(clean, tmp_path):
    short = write_video(tmp_path / "short.mp4", frame_pattern(4, height=48, width=64))
    data = open(short, "rb").read()
    path, victim = broken(clean, tmp_path, "short", lambda m: {**m, "cam_high.mp4": data})
    with pytest.raises(SampleError, match=rf"{victim}.*'cam_high': the video has 4 frames but meta.json promises"):
        read_epoch(path)


def test_unsupported_codec_for_the_chosen_backend_is_named(tmp_path):
    out = tmp_path / "av1"
    write_webdataset(out, make_episodes(1, seed=1, min_length=6, max_length=6, cameras=("cam_high",)), codec="av1",
                     gop=2)
    ds = PackedEpisodeDataset(open_dataset(out, backend="decord"), layout=LAYOUT, window=WINDOW, capacity=96)
    with pytest.raises(ValueError, match=r"(?i)stream 'cam_high'.*(decord|av1)"):
        ds[0, 0]


def test_truncated_tar_is_named_with_or_without_an_index(clean, tmp_path):
    copy = tmp_path / "cut"
    copy.mkdir()
    tar = sorted(clean[0].glob("*.tar"))[0]
    data = tar.read_bytes()
    (copy / tar.name).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{tar.name}.*truncated"):
        build_index([str(copy / tar.name)])
    (copy / INDEX_FILENAME).write_bytes((clean[0] / INDEX_FILENAME).read_bytes())
    with pytest.raises(ValueError, match="out of date"):
        open_dataset(copy)


def test_empty_and_missing_inputs_are_named(tmp_path):
    with pytest.raises(ValueError, match="shards is empty"):
        open_dataset([])
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        open_dataset(tmp_path / "no_such_dir")


def test_lerobot_missing_files_and_malformed_info_are_named(tmp_path):
    root = write_lerobot(tmp_path / "lr", make_episodes(2, seed=4, min_length=8, max_length=8,
                                                        cameras=("cam_high",)), codec="h264", gop=2)
    layout_window = dict(layout=LAYOUT, window=WINDOW, capacity=96)
    data = next((tmp_path / "lr" / "data").rglob("*.parquet"))
    video = next((tmp_path / "lr" / "videos").rglob("*.mp4"))
    saved = data.read_bytes()
    data.unlink()
    with pytest.raises(FileNotFoundError, match=str(data.name)):
        PackedEpisodeDataset(open_dataset(root), **layout_window)[0, 0]
    data.write_bytes(saved)
    video.unlink()
    with pytest.raises(ValueError, match=rf"stream 'cam_high'.*{video.name}"):
        PackedEpisodeDataset(open_dataset(root), **layout_window)[0, 0]
    info = tmp_path / "lr" / "meta" / "info.json"
    info.write_text("{not json")
    with pytest.raises(ValueError, match="info.json: malformed JSON"):
        open_dataset(root)
    info.write_text(json.dumps({"codebase_version": "v3.0"}))
    with pytest.raises(ValueError, match="info.json: missing field 'fps'"):
        open_dataset(root)


def test_long_episodes_are_split_to_fit_or_truncated_and_counted():
    from mmfeed.loaders import ArraySource

    src = ArraySource([{"proprio": np.zeros((n, 2), np.float32), "action": np.zeros((n, 2), np.float32),
                        "task": "t"} for n in (5, 40, 90)])
    layout = TokenLayout()  # 2 tokens per step (proprio + action), plus one text token
    split = PackedEpisodeDataset(src, layout=layout, capacity=41)
    assert split.table.tokens.max() <= 41 and split.stats["split_episodes"] == 2
    assert sorted(split.table.length[split.table.episode == 2].tolist()) == [10, 20, 20, 20, 20]
    cut = PackedEpisodeDataset(src, layout=layout, capacity=41, long_episodes="truncate")
    assert cut.table.length.tolist() == [5, 20, 20] and cut.stats["truncated_steps"] == 20 + 70
    with pytest.raises(ValueError, match="long_episodes"):
        PackedEpisodeDataset(src, layout=layout, capacity=41, long_episodes="crop")
