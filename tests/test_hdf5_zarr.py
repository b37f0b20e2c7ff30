"""HDF5 and Zarr demonstrations read as research code wrote them: robomimic's and LIBERO's files, ACT/ALOHA's
episode folders (raw and JPEG cameras) and diffusion_policy's Zarr ReplayBuffer (zarr formats 2 and 3).

The fixtures in ``tests/demo_fixtures/`` were written by h5py, zarr and cv2 (``make_fixtures.py`` writes them
again); each one's oracle (``<name>.npz``) holds the arrays written, episode by episode (for JPEG cameras, what
``cv2.imdecode`` gives back, as ACT's loader reads them). Every episode must equal its oracle; windows, packed
batches, a mixture with a LeRobot directory and a resumed loader must read the same rows; bad files fail in one
line naming the file and the key.
"""

import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")

from mmfeed import DataLoader  # noqa: E402
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset  # noqa: E402
from mmfeed.loaders.formats.hdf5 import Hdf5Source  # noqa: E402
from mmfeed.loaders.formats.hdf5.metadata import natural_key  # noqa: E402
from mmfeed.loaders.formats.hdf5.source import read_rows  # noqa: E402
from mmfeed.loaders.formats.zarr import ZarrSource  # noqa: E402
from mmfeed.loaders.sources.requests import EpisodeRequest  # noqa: E402
from mmfeed.loaders.transport.errors import SampleError  # noqa: E402
from mmfeed.testing import make_episodes, write_lerobot  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "demo_fixtures"
ZARR3 = int(zarr.__version__.split(".")[0]) >= 3  # zarr 2 (Python 3.10) reads format 2 stores only


def cases(*names):
    """``names`` as parameters, the zarr format 3 store skipped under zarr 2."""
    return [pytest.param(n, marks=pytest.mark.skipif(n == "replay_v3" and not ZARR3, reason="zarr 2 reads format 2 "
                                                     "stores only")) for n in names]


# name -> (path, source class, fps, the number of episodes)
DATASETS = {
    "robomimic": ("robomimic.hdf5", Hdf5Source, 20.0, 11),
    "libero": ("libero", Hdf5Source, 20.0, 4),
    "aloha_raw": ("aloha_raw", Hdf5Source, 50.0, 3),
    "aloha_jpeg": ("aloha_jpeg", Hdf5Source, 50.0, 3),
    "pusht": ("pusht.zarr", ZarrSource, 10.0, 5),
    "replay_v3": ("replay_v3.zarr", ZarrSource, 10.0, 3),
}
# the window each dataset is read through: a camera, a state and an action chunk
WINDOWS = {
    "robomimic": {"obs.agentview_rgb": [-0.05, 0.0], "obs.joint_states": [0.0], "actions": [0.0, 0.05, 0.1]},
    "libero": {"obs.eye_in_hand_rgb": [0.0], "obs.joint_states": [0.0], "actions": [0.0, 0.05, 0.1]},
    "aloha_raw": {"observations.images.cam_high": [0.0], "observations.qpos": [-0.02, 0.0],
                  "action": [0.0, 0.02, 0.04]},
    "aloha_jpeg": {"observations.images.cam_left_wrist": [0.0], "observations.qpos": [0.0],
                   "action": [0.0, 0.02, 0.04]},
    "pusht": {"img": [-0.1, 0.0], "state": [0.0], "action": [0.0, 0.1, 0.2, 0.3]},
    "replay_v3": {"img": [0.0], "keypoint": [0.0], "action": [0.0, 0.1, 0.2]},
}


def path_of(name: str) -> str:
    return str(FIXTURES / DATASETS[name][0])


def opened(name: str, **kwargs):
    return open_dataset(path_of(name), fps=DATASETS[name][2], **kwargs)


def oracle(name: str) -> dict:
    with np.load(FIXTURES / f"{name}.npz") as data:
        return {k: data[k] for k in data.files}


def packing(spec: WindowSpec, ds, seed: int = 3) -> Packing:
    cameras = {f: 2 for f in spec.features if ds.features[f].kind == "video"}
    return Packing(layout=TokenLayout(tokens_per_frame=cameras), window=spec,
                   plan=PlanConfig(capacity=64, rows_per_batch=1), seed=seed)


def batch_key(batch) -> tuple:
    return (tuple(batch.metadata["sample"].tolist()), tuple(batch.document_ids.flatten().tolist()),
            tuple((k, tuple(v.flatten().tolist())) for k, v in sorted(batch.data.items())))


@pytest.mark.parametrize("name", cases(*DATASETS))
def test_every_episode_equals_what_the_tool_wrote(name):
    _, cls, fps, episodes = DATASETS[name]
    ds = opened(name)
    want = oracle(name)
    assert type(ds) is cls and len(ds) == episodes
    features = sorted({k.split("/", 1)[1] for k in want if k.startswith("e0/")})
    assert sorted(ds.features) == features
    for e in range(len(ds)):
        got = ds.episode(e)
        assert got["fps"] == fps and got["task"] == str(want["tasks"][e])
        assert int(ds.lengths[e]) == len(want[f"e{e}/{features[0]}"])
        for f in features:
            expected = want[f"e{e}/{f}"]
            assert got[f].dtype == expected.dtype and np.array_equal(got[f], expected), (name, e, f)
    for f, feature in ds.features.items():  # pictures are video features, frames [H, W, 3]
        picture = f.endswith(("_rgb", "img")) or f.startswith("observations.images.")
        assert (feature.kind == "video") == picture and (not picture or feature.shape[-1] == 3), f
        assert feature.fps == fps


def test_jpeg_cameras_decode_as_cv2_does_and_near_the_recorded_pictures():
    ds = opened("aloha_jpeg")
    raw = oracle("aloha_jpeg_raw_pictures")
    for e in range(len(ds)):
        for camera in ("cam_high", "cam_left_wrist", "cam_right_wrist"):
            f = f"observations.images.{camera}"
            frames = ds.episode(e)[f]
            error = np.abs(frames.astype(int) - raw[f"e{e}/{f}"].astype(int))
            assert error.mean() < 4 and frames.shape == raw[f"e{e}/{f}"].shape  # JPEG at quality 50: close


def test_tasks_come_from_problem_info_one_per_file_in_a_libero_folder():
    ds = opened("libero")
    assert ds.tasks == ["open the top drawer of the cabinet", "turn on the stove"]
    assert [ds.task(e) for e in range(len(ds))] == ["open the top drawer of the cabinet"] * 2 + [
        "turn on the stove"] * 2
    assert opened("aloha_raw").task(0) == "" and opened("pusht").task(4) == ""


def test_demos_come_in_natural_order():
    ds = opened("robomimic")
    groups = [ds.describe(e).split()[-1] for e in range(len(ds))]
    assert groups == [f"data/demo_{k}" for k in range(11)]
    assert sorted(["demo_10", "demo_2", "demo_1"], key=natural_key) == ["demo_1", "demo_2", "demo_10"]
    assert [os.path.basename(opened("aloha_raw").describe(e).split()[0]) for e in range(3)] == \
        [f"episode_{k}.hdf5" for k in range(3)]


def test_split_reads_the_demos_of_a_robomimic_mask():
    want = oracle("robomimic")
    valid, train = opened("robomimic", split="valid"), opened("robomimic", split="train")
    assert [valid.describe(e).split()[-1] for e in range(len(valid))] == ["data/demo_0", "data/demo_4", "data/demo_8"]
    assert len(train) == 8 and "data/demo_4" not in {train.describe(e).split()[-1] for e in range(len(train))}
    assert np.array_equal(valid.episode(1)["actions"], want["e4/actions"])
    with pytest.raises(ValueError, match=r"robomimic.hdf5: no mask 'mask/test'.*\['train', 'valid'\]"):
        opened("robomimic", split="test")
    with pytest.raises(ValueError, match="aloha layout.*drop split="):
        opened("aloha_raw", split="train")


def test_layout_is_detected_and_forced_layouts_are_checked():
    assert opened("robomimic", layout="robomimic").layout == "robomimic"
    assert opened("aloha_jpeg").layout == "aloha"
    with pytest.raises(ValueError, match=r"robomimic.hdf5: dataset 'action' is missing"):
        opened("robomimic", layout="aloha")
    with pytest.raises(ValueError, match=r"episode_0.hdf5: no group 'data'"):
        opened("aloha_raw", layout="robomimic")
    with pytest.raises(ValueError, match=r"layout='zarr' is no HDF5 layout"):
        opened("aloha_raw", layout="zarr")
    assert len(opened("pusht", layout="replay_buffer")) == 5
    with pytest.raises(ValueError, match=r"layout='aloha' is no Zarr layout"):
        opened("pusht", layout="aloha")


@pytest.mark.parametrize("name", ["robomimic", "pusht"])
def test_fps_is_required_and_the_message_says_to_pass_it(name):
    with pytest.raises(ValueError, match=r"record[s]? no frame rate.*pass fps=") as err:
        open_dataset(path_of(name))
    assert "\n" not in str(err.value) and path_of(name) in str(err.value)
    if name == "robomimic":  # the control frequency robosuite ran at, as a hint
        assert "control_freq 20" in str(err.value)
    with pytest.raises(ValueError, match="fps must be the control rate in steps per second"):
        open_dataset(path_of(name), fps=0)


def test_rows_are_read_by_slice_or_row_by_row_when_far_apart():
    class Recorded:
        """A numpy array that records the keys it is read with (what read_rows asks the file for)."""

        def __init__(self, values):
            self.values, self.keys, self.shape, self.dtype = values, [], values.shape, values.dtype

        def __getitem__(self, key):
            self.keys.append(key)
            return self.values[key]

    values = np.arange(200).reshape(100, 2)
    near, far = Recorded(values), Recorded(values)
    assert np.array_equal(read_rows(near, 10, np.array([3, 5, 4, 3])), values[[13, 15, 14, 13]])
    assert near.keys == [slice(13, 16)]
    assert np.array_equal(read_rows(far, 0, np.array([90, 2, 90])), values[[90, 2, 90]])
    assert [list(k) for k in far.keys] == [[2, 90]]  # the two rows, not the 89 between them


def test_a_request_reads_the_asked_rows_with_the_asked_shape():
    for name, feature in (("robomimic", "obs.agentview_rgb"), ("aloha_jpeg", "observations.images.cam_high"),
                          ("pusht", "img")):
        ds = opened(name)
        want = oracle(name)[f"e2/{feature}"]
        idx = np.array([[0, 1], [len(want) - 1, 0]])
        [got] = ds.read_many([EpisodeRequest(2, {feature: idx})])
        assert got[feature].shape == (2, 2, *want.shape[1:]) and np.array_equal(got[feature], want[idx])


@pytest.mark.parametrize("name", cases(*DATASETS))
def test_windows_hold_the_oracle_rows(name):
    ds, want, fps = opened(name), oracle(name), DATASETS[name][2]
    spec = WindowSpec.from_delta_timestamps(WINDOWS[name])
    windows = ds.windows(spec)
    assert len(windows) == int(ds.lengths.sum())
    for i in range(0, len(windows), 3):
        sample = windows[i]
        e, t = int(sample["episode_index"]), int(sample["frame_index"])
        for f, deltas in WINDOWS[name].items():
            rows = want[f"e{e}/{f}"]
            idx = t + np.round(np.asarray(deltas) * fps).astype(int)
            pad = (idx < 0) | (idx >= len(rows))
            assert torch.equal(sample[f"{f}_is_pad"], torch.as_tensor(pad))
            assert np.array_equal(np.asarray(sample[f])[~pad], rows[idx[~pad]]), (name, i, f)


def test_windows_through_the_dataloader_with_two_workers():
    """The sources cross into worker processes (h5py handles and zarr arrays opened again there)."""
    for name in ("aloha_jpeg", "pusht"):
        ds = opened(name)
        windows = ds.windows(WindowSpec.from_delta_timestamps(WINDOWS[name]))
        camera = next(f for f in WINDOWS[name] if ds.features[f].kind == "video")
        batches = list(DataLoader(windows, batch_size=4, num_workers=2))
        got = torch.cat([b[camera] for b in batches])
        assert torch.equal(got, torch.stack([windows[i][camera] for i in range(len(windows))]))


@pytest.mark.parametrize("name", cases("libero", "aloha_jpeg", "replay_v3"))
def test_packed_batches_anchor_every_window_once(name):
    ds = opened(name)
    spec = WindowSpec.from_delta_timestamps(WINDOWS[name])
    batches = list(DataLoader(ds, packing=packing(spec, ds)))
    anchors = sorted((int(e), int(t)) for b in batches for e, t in zip(b.metadata["episode"],
                                                                       b.metadata["start_step"]))
    assert anchors == sorted((e, t) for e in range(len(ds)) for t in range(int(ds.lengths[e])))
    for f in WINDOWS[name]:
        assert batches[0].data[f].dtype == torch.as_tensor(np.zeros(0, ds.features[f].dtype)).dtype


@pytest.mark.parametrize("name", ["robomimic", "pusht"])
def test_a_packed_loader_resumes_exactly(name):
    ds = opened(name)
    spec = WindowSpec.from_delta_timestamps(WINDOWS[name])
    full = [batch_key(b) for b in DataLoader(ds, packing=packing(spec, ds))]
    assert len(full) >= 3
    for cut in (1, len(full) // 2):
        first = DataLoader(ds, packing=packing(spec, ds))
        it = iter(first)
        head = [batch_key(next(it)) for _ in range(cut)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        fresh = DataLoader(opened(name), packing=packing(spec, ds))
        fresh.load_state_dict(state)
        assert head + [batch_key(b) for b in fresh] == full


@pytest.fixture(scope="module")
def lerobot_dir(tmp_path_factory):
    episodes = make_episodes(3, seed=4, cameras=("cam_high",), height=16, width=32, min_length=6, max_length=9,
                             state_dim=6, action_dim=6)
    return write_lerobot(tmp_path_factory.mktemp("lerobot") / "arm", episodes, codec="h264")


def test_a_mixture_with_a_lerobot_directory_pads_packs_and_resumes(lerobot_dir):
    paths = {"arm": lerobot_dir, "aloha": path_of("aloha_raw"), "pusht": path_of("pusht")}
    rename = {"aloha": {"observations.qpos": "observation.state"}, "pusht": {"state": "observation.state"}}
    mix = open_dataset(paths, fps=50, pad_to={"action": 16, "observation.state": 16}, rename=rename)
    assert [len(s) for s in mix.sources] == [3, 3, 5]
    assert [float(s.fps[0]) for s in mix.sources] == [30.0, 50.0, 50.0]  # fps= reaches the formats that take it
    spec = WindowSpec.from_delta_timestamps({"observation.state": [0.0], "action": [0.0, 0.02]})
    windows = mix.windows(spec)
    want = oracle("aloha_raw")
    sample = windows[int(mix.sources[0].lengths.sum()) + 2]  # aloha's episode 0, step 2
    assert sample["dataset"] == 1 and sample["frame_index"] == 2
    assert torch.equal(sample["action"][0, :14], torch.as_tensor(want["e0/action"][2]))
    assert not sample["action"][:, 14:].any() and sample["action_dim_mask"][:14].all()
    assert not sample["action_dim_mask"][14:].any()
    plan = Packing(layout=TokenLayout(), window=spec, plan=PlanConfig(capacity=64, rows_per_batch=1), seed=2)
    full = [batch_key(b) for b in DataLoader(mix, packing=plan, num_workers=2)]
    batches = list(DataLoader(mix, packing=plan))
    assert [batch_key(b) for b in batches] == full
    assert {int(d) for b in batches for d in b.metadata["dataset"]} == {0, 1, 2}
    assert all(b.data["action"].shape[-1] == 16 for b in batches)
    first = DataLoader(mix, packing=plan)
    it = iter(first)
    head = [batch_key(next(it)) for _ in range(3)]
    fresh = DataLoader(open_dataset(paths, fps=50, pad_to={"action": 16, "observation.state": 16}, rename=rename),
                       packing=plan)
    fresh.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
    assert head + [batch_key(b) for b in fresh] == full


def test_options_of_these_formats_are_refused_where_none_takes_them(lerobot_dir):
    with pytest.raises(ValueError,
                       match="option 'fps' applies to RLDS, HDF5 demonstrations and Zarr ReplayBuffer only"):
        open_dataset(lerobot_dir, fps=30)
    with pytest.raises(ValueError, match="option 'split' applies to RLDS and HDF5 demonstrations only"):
        open_dataset(path_of("pusht"), fps=10, split="train")


@pytest.mark.parametrize("name", cases("aloha_jpeg", "replay_v3"))
def test_a_source_pickles_and_reads_the_same(name):
    ds = opened(name)
    copy = pickle.loads(pickle.dumps(ds))
    for f in ds.features:
        assert np.array_equal(copy.episode(1)[f], ds.episode(1)[f])


# -- bad input: one line, naming the file and the key -------------------------------------------------------------

def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_a_missing_dataset_inside_an_hdf5_file(tmp_path):
    path = tmp_path / "demo.hdf5"
    shutil.copy(path_of("robomimic"), path)
    with h5py.File(path, "a") as f:
        del f["data/demo_3/obs/agentview_rgb"]
    with pytest.raises(ValueError) as err:
        open_dataset(path, fps=20)
    assert f"{path}: dataset 'data/demo_3/obs/agentview_rgb' is missing" in one_line(err)


def test_a_json_attribute_nested_too_deep_is_refused_not_parsed(tmp_path):
    path = tmp_path / "demo.hdf5"
    shutil.copy(path_of("robomimic"), path)
    with h5py.File(path, "a") as f:
        f["data"].attrs["env_args"] = "[" * 200_000 + "]" * 200_000  # json.loads: a RecursionError
    with pytest.raises(ValueError) as err:
        open_dataset(path, fps=20)
    assert f"{path}: attribute 'env_args' of 'data': JSON nested 200000 levels deep, more than the 100" in one_line(err)


def test_an_hdf5_dataset_with_rows_the_episode_does_not_have(tmp_path):
    folder = tmp_path / "aloha"
    shutil.copytree(path_of("aloha_raw"), folder)
    with h5py.File(folder / "episode_1.hdf5", "a") as f:
        qpos = f["observations/qpos"][()]
        del f["observations/qpos"]
        f["observations/qpos"] = qpos[:-1]
    with pytest.raises(ValueError) as err:
        open_dataset(folder, fps=50)
    assert "episode_1.hdf5: dataset 'observations/qpos' has" in one_line(err) and "steps" in one_line(err)


def test_a_truncated_hdf5_file(tmp_path):
    path = tmp_path / "demo.hdf5"
    data = Path(path_of("robomimic")).read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        open_dataset(path, fps=20)
    assert one_line(err).startswith(f"{path}: not a readable HDF5 file (") and "truncated" in one_line(err)


def test_a_broken_jpeg_picture_names_the_file_and_the_row(tmp_path):
    folder = tmp_path / "aloha"
    shutil.copytree(path_of("aloha_jpeg"), folder)
    with h5py.File(folder / "episode_2.hdf5", "a") as f:
        f["observations/images/cam_high"][3] = 7
    ds = open_dataset(folder, fps=50)
    with pytest.raises(SampleError) as err:
        ds.episode(2)
    assert "episode_2.hdf5 / dataset 'observations/images/cam_high' row 3: not a JPEG picture" in one_line(err)


def rewritten_ends(tmp_path, change) -> Path:
    store = tmp_path / "pusht.zarr"
    shutil.copytree(path_of("pusht"), store)
    ends = zarr.open_group(str(store), mode="r+")["meta/episode_ends"]
    ends[...] = change(ends[...])
    return store


def test_zarr_episode_ends_past_the_data(tmp_path):
    store = rewritten_ends(tmp_path, lambda ends: ends + np.where(np.arange(len(ends)) == len(ends) - 1, 5, 0))
    with pytest.raises(ValueError) as err:
        open_dataset(store, fps=10)
    message = one_line(err)
    assert message.startswith(f"{store}: meta/episode_ends ends at row") and "past the" in message
    assert "rows of data/action" in message


def test_zarr_episode_ends_that_go_back(tmp_path):
    store = rewritten_ends(tmp_path, lambda ends: ends[[0, 2, 1, 3, 4]])
    with pytest.raises(ValueError) as err:
        open_dataset(store, fps=10)
    assert one_line(err).startswith(f"{store}: meta/episode_ends[2] = ")


@pytest.mark.skipif(not ZARR3, reason="zarr 2 reads format 2 stores only")
def test_a_truncated_zarr_chunk_names_the_store_and_the_array(tmp_path):
    """A zstd chunk (zarr 3's default codec) cut short. (Blosc, zarr 2's default, decodes a cut chunk without
    complaint, so pusht.zarr's chunks cannot be checked this way.)"""
    store = tmp_path / "replay_v3.zarr"
    shutil.copytree(path_of("replay_v3"), store)
    chunk = store / "data" / "img" / "c" / "0" / "0" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:40])
    ds = open_dataset(store, fps=10)
    with pytest.raises(SampleError) as err:
        ds.episode(0)
    assert one_line(err).startswith(f"{store}: array data/img rows 0..")


def test_a_zarr_store_without_episode_ends(tmp_path):
    store = tmp_path / "pusht.zarr"
    shutil.copytree(path_of("pusht"), store)
    shutil.rmtree(store / "meta" / "episode_ends")
    with pytest.raises((ValueError, FileNotFoundError)):
        open_dataset(store, fps=10)  # no longer a ReplayBuffer: not detected as one
    with pytest.raises(ValueError) as err:
        ZarrSource(store, fps=10)
    assert f"{store}: array 'episode_ends' is missing" in one_line(err)


def test_a_zip_store_and_a_url_read_the_same(tmp_path):
    import zipfile

    import fsspec

    want = oracle("pusht")
    archive = tmp_path / "pusht.zarr.zip"
    with zipfile.ZipFile(archive, "w") as z:  # UMI's layout: the store's keys at the root of the zip
        for file in sorted(Path(path_of("pusht")).rglob("*")):
            if file.is_file():
                z.write(file, file.relative_to(path_of("pusht")).as_posix())
    fs = fsspec.filesystem("memory")
    fs.put(path_of("pusht"), "/hdf5-zarr-test/pusht.zarr", recursive=True)
    try:
        for where in (archive, "memory://hdf5-zarr-test/pusht.zarr"):
            ds = open_dataset(where, fps=10)
            assert isinstance(ds, ZarrSource) and np.array_equal(ds.episode(3)["img"], want["e3/img"])
    finally:
        fs.rm("/hdf5-zarr-test", recursive=True)


@pytest.mark.parametrize("module, extra", [("h5py", "hdf5"), ("zarr", "zarr")])
def test_a_missing_library_names_the_extra(monkeypatch, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # what an environment without it imports
    with pytest.raises(ImportError, match=rf"pip install 'mmfeed\[{extra}\]'"):
        opened("aloha_raw" if module == "h5py" else "pusht")


# -- the commands and passes over whole datasets --------------------------------------------------------------------

def test_stats_of_an_opened_source_are_the_oracle_s():
    from mmfeed.loaders.conversion.statistics import compute_stats

    for name, feature in (("robomimic", "actions"), ("pusht", "keypoint")):
        want = oracle(name)
        values = np.concatenate([want[f"e{e}/{feature}"] for e in range(DATASETS[name][3])]).astype(np.float64)
        stats = compute_stats(opened(name)).stats_of(0)[feature]
        assert np.allclose(stats["mean"], values.mean(0)) and np.allclose(stats["std"], values.std(0))
        assert np.array_equal(stats["min"], values.min(0)) and np.array_equal(stats["max"], values.max(0))


def test_convert_to_shards_reads_with_fps_and_split(tmp_path, lerobot_dir):
    from mmfeed.loaders import convert

    summary = convert(path_of("robomimic"), tmp_path / "valid", fps=20, split="valid", codec="h264", progress=False)
    shards = open_dataset(tmp_path / "valid")
    want = oracle("robomimic")
    assert summary.episodes == 3 and len(shards) == 3 and shards.features["actions"].fps == 20.0
    for e, demo in enumerate((0, 4, 8)):
        got = shards.episode(e)
        assert np.array_equal(got["actions"], want[f"e{demo}/actions"]) and got["task"] == str(want["tasks"][demo])
        assert got["obs.agentview_rgb"].shape == want[f"e{demo}/obs.agentview_rgb"].shape
    with pytest.raises(ValueError, match="records no frame rate.*--fps on the command line"):
        convert(path_of("pusht"), tmp_path / "pusht", progress=False)
    assert not (tmp_path / "pusht").exists()  # the source is opened before anything is written
    with pytest.raises(ValueError, match=r"\['fps'\] are read options of HDF5 and Zarr.*LeRobot directory"):
        convert(lerobot_dir, tmp_path / "arm", fps=30, progress=False)


def test_mmfeed_convert_takes_fps_and_resizes_pictures(tmp_path):
    from mmfeed.cli import main

    assert main(["convert", path_of("pusht"), str(tmp_path / "out"), "--fps", "10", "--frame-size", "16x8",
                 "--no-progress"]) == 0
    shards = open_dataset(tmp_path / "out")
    assert len(shards) == 5 and shards.features["img"].shape == (8, 16, 3)
    assert np.array_equal(shards.episode(4)["keypoint"], oracle("pusht")["e4/keypoint"])


def test_mmfeed_inspect_takes_fps(capsys):
    from mmfeed.cli import main

    assert main(["inspect", path_of("libero"), "--fps", "20", "--capacity", "512"]) == 0
    out = capsys.readouterr().out
    assert "Hdf5Source): 4 episodes" in out and "obs.agentview_rgb" in out and "turn on the stove" in out
    assert main(["inspect", path_of("pusht")]) == 2
    assert "pass fps=" in capsys.readouterr().err


def test_a_dataset_that_is_not_per_step_in_the_first_episode_is_left_out(tmp_path, caplog):
    path = tmp_path / "demo.hdf5"
    shutil.copy(path_of("robomimic"), path)
    with h5py.File(path, "a") as f:
        for k in range(11):
            f[f"data/demo_{k}/init_state"] = np.zeros(50)  # a flat simulator state, not one row per step
    with caplog.at_level("INFO", logger="mmfeed.loaders.formats.hdf5.metadata"):
        ds = open_dataset(path, fps=20)
    assert "init_state" not in ds.features and len(ds.features) == len(opened("robomimic").features)
    assert "'data/demo_0/init_state' has 50 rows, not one per step" in caplog.text


def test_mmfeed_stats_takes_fps_for_the_datasets_that_need_it(lerobot_dir, capsys):
    from mmfeed.cli import main

    assert main(["stats", path_of("pusht"), str(lerobot_dir), "--fps", "10", "--no-progress"]) == 0
    out = capsys.readouterr().out
    want = oracle("pusht")
    mean = np.concatenate([want[f"e{e}/action"] for e in range(5)]).astype(np.float64).mean(0)
    assert f"{path_of('pusht')}:\n  action: count 36 mean [{mean[0]:.4g}, {mean[1]:.4g}]" in out
    assert f"{lerobot_dir}:\n" in out and "2 dataset(s)" in out
    assert main(["stats", str(lerobot_dir), "--fps", "10", "--no-progress"]) == 2  # no dataset takes fps
    assert "option 'fps' applies to" in capsys.readouterr().err
