"""``mmfeed.lerobot.LeRobotDataset`` against real LeRobot 0.4.4's items and metadata on the corpus (recorded once by
``tests/lerobot_corpus/record_items.py`` into ``items.json`` and ``items.npz``; LeRobot is not needed here).

Every key of every recorded item must be there and no other, with LeRobot's type (tensor or str), dtype and shape;
arrays, pad flags, index columns and texts equal exactly; frames float32 in [0, 1] carrying the frame index LeRobot's
carried, PNG images within 1/255 of LeRobot's, video frames within a decoder's colour rounding of LeRobot's
torchcodec frames (mmfeed decodes them itself). ``len``, ``num_frames``, ``num_episodes``, ``fps``, ``features``
and ``meta`` (``info``, ``stats``, ``episodes``, ``tasks``, the key lists, ``robot_type``, the totals) as LeRobot's,
and a ``torch.utils.data.DataLoader`` batch of the same keys, dtypes and shapes.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mmfeed.bench.lerobot_compare import PIXEL_TOLERANCE
from mmfeed.lerobot import LeRobotDataset
from mmfeed.testing import read_index

CORPUS = Path(__file__).parent / "lerobot_corpus"
ORACLE = json.loads((CORPUS / "items.json").read_text())
NAMES = sorted(ORACLE["datasets"])
SETTINGS = ("plain", "delta", "episodes")
V21_RAW = CORPUS / "v21_raw"
"""The v2.1 directory LeRobot 0.3.3 wrote, before LeRobot 0.4.4 converted it into ``v21``: read directly, it gives
``v21``'s items."""


@pytest.fixture(scope="module")
def arrays():
    with np.load(CORPUS / "items.npz") as z:
        return {k: z[k] for k in z.files}


def dataset(name: str, setting: str, root: Path | None = None) -> LeRobotDataset:
    kwargs = ORACLE["datasets"][name][setting]["kwargs"]
    return LeRobotDataset(f"local/{name}", root=root or CORPUS / name, **kwargs)


def compare_item(name: str, setting: str, i: int, item: dict, expected: dict, arrays: dict,
                 ordered: bool = True) -> None:
    info = json.loads((CORPUS / name / "meta/info.json").read_text())["features"]
    where = f"{name} {setting} [{i}]"
    if ordered:
        assert list(item) == list(expected), f"{where}: keys {list(item)} != LeRobot's {list(expected)}"
    else:
        assert sorted(item) == sorted(expected), f"{where}: keys {sorted(item)} != LeRobot's {sorted(expected)}"
    for key, want in expected.items():
        value = item[key]
        if want["type"] == "str":
            assert value == want["value"], f"{where} {key}"
            continue
        assert isinstance(value, torch.Tensor), f"{where} {key}: {type(value).__name__}"
        assert str(value.dtype).removeprefix("torch.") == want["dtype"], f"{where} {key}: dtype {value.dtype}"
        assert list(value.shape) == want["shape"], f"{where} {key}: shape {list(value.shape)} != {want['shape']}"
        prefix = f"{name}/{setting}/{i}/{key}"
        if "stored" in want:  # a camera: float [0, 1] CHW
            assert 0.0 <= float(value.min()) and float(value.max()) <= 1.0, f"{where} {key}: outside [0, 1]"
            assert value.is_contiguous(), f"{where} {key}: not contiguous"
            frames = np.rint(value.numpy() * 255).astype(np.uint8)
            hwc = np.moveaxis(frames, -3, -1)
            drawn = read_index(hwc.reshape(-1, *hwc.shape[-3:])).reshape(hwc.shape[:-3])
            assert np.array_equal(drawn, arrays[f"{prefix}.pattern"]), f"{where} {key}: other frames than LeRobot's"
            if want["stored"] != "pattern":
                diff = np.abs(frames.astype(np.int16) - arrays[prefix].astype(np.int16))
                if info[key]["dtype"] == "image":
                    assert diff.max() <= 1, f"{where} {key}: PNG image differs from LeRobot's by {diff.max()}/255"
                else:
                    assert diff.mean() <= PIXEL_TOLERANCE, f"{where} {key}: mean pixel difference {diff.mean():.2f}"
        else:
            assert np.array_equal(value.numpy(), arrays[prefix]), f"{where} {key}: {value} != {arrays[prefix]}"


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", NAMES)
def test_items_equal_lerobots(name, setting, arrays):
    recorded = ORACLE["datasets"][name][setting]
    ds = dataset(name, setting)
    assert len(ds) == ds.num_frames == recorded["len"] == recorded["num_frames"]
    assert ds.num_episodes == recorded["num_episodes"]
    for i, expected in recorded["items"].items():
        compare_item(name, setting, int(i), ds[int(i)], expected, arrays)


def normal(value):
    """JSON-like values with numpy arrays and tuples as the recorder wrote them."""
    if isinstance(value, dict):
        return {str(k): normal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normal(v) for v in value]
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    return value


@pytest.mark.parametrize("name", NAMES)
def test_meta_equals_lerobots(name):
    want = ORACLE["datasets"][name]["meta"]
    ds = dataset(name, "plain")
    meta = ds.meta
    assert ds.fps == meta.fps == want["fps"]
    assert normal(ds.features) == want["features"] and normal(meta.info) == want["info"]
    assert all(isinstance(ft["shape"], tuple) for ft in meta.info["features"].values())
    assert normal(meta.stats) == want["stats"]
    for column, values in want["episodes"].items():
        assert normal(meta.episodes[column]) == values, f"{name} meta.episodes[{column!r}]"
    assert meta.episodes.column_names == list(want["episodes"])
    assert list(meta.tasks.index) == want["tasks"]["index"]
    assert {c: meta.tasks[c].tolist() for c in meta.tasks.columns} == want["tasks"]["columns"]
    for attribute in ("camera_keys", "video_keys", "image_keys", "robot_type", "total_episodes", "total_frames",
                      "total_tasks"):
        assert getattr(meta, attribute) == want[attribute], f"{name} meta.{attribute}"


@pytest.mark.parametrize("name", ["edge", "images"])
def test_a_torch_dataloader_batches_like_lerobots(name):
    """The first batch of ``torch.utils.data.DataLoader(ds, batch_size=4)``: LeRobot's keys, dtypes and shapes;
    texts as lists of str."""
    want = ORACLE["datasets"][name]["delta"]["batch"]
    batch = next(iter(torch.utils.data.DataLoader(dataset(name, "delta"), batch_size=4, shuffle=False)))
    assert list(batch) == list(want)
    for key, spec in want.items():
        if spec["type"] == "list":
            assert batch[key] == spec["value"], key
        else:
            assert str(batch[key].dtype).removeprefix("torch.") == spec["dtype"], key
            assert list(batch[key].shape) == spec["shape"], key


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_v21_directory_read_directly_gives_the_items_of_its_v30_conversion(setting, arrays):
    """LeRobot 0.4.4 refuses v2.1 and asks for a conversion; mmfeed's class reads the unconverted directory and
    gives the items LeRobot gave of the converted one (every key), its meta the same tasks, episodes and stats."""
    recorded = ORACLE["datasets"]["v21"][setting]
    ds = dataset("v21", setting, root=V21_RAW)
    assert ds.meta.info["codebase_version"] == "v2.1"
    assert len(ds) == recorded["len"] and ds.num_episodes == recorded["num_episodes"]
    for i, expected in recorded["items"].items():
        compare_item("v21", setting, int(i), ds[int(i)], expected, arrays)
    if setting == "plain":
        want = ORACLE["datasets"]["v21"]["meta"]
        meta = ds.meta
        assert list(meta.tasks.index) == want["tasks"]["index"]
        assert meta.tasks["task_index"].tolist() == want["tasks"]["columns"]["task_index"]
        for column in ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"):
            assert normal(meta.episodes[column]) == want["episodes"][column], column
        for attribute in ("camera_keys", "video_keys", "image_keys", "total_episodes", "total_frames", "fps"):
            assert getattr(meta, attribute) == want[attribute if attribute != "fps" else "fps"], attribute
        for feature, stats in want["stats"].items():  # v2.1's episodes_stats.jsonl aggregated as LeRobot's converter
            for name in ("min", "max", "mean", "std", "count"):
                np.testing.assert_allclose(meta.stats[feature][name], stats[name]["ndarray"], rtol=1e-6,
                                           err_msg=f"{feature} {name}")


ORACLE_V21 = json.loads((CORPUS / "items_v21.json").read_text())
"""LeRobot 0.3.3's own items of the v2.1 directories it wrote (``record_items.py --v21``)."""


@pytest.mark.parametrize("setting", ["plain", "delta"])
@pytest.mark.parametrize("name", sorted(ORACLE_V21["datasets"]))
def test_v21_directories_give_lerobot_033s_items(name, setting):
    """The v2.1 layouts LeRobot 0.3.3 writes (a video camera; a PNG image feature in the parquet beside it, the
    episodes over three chunks, tasks changing within episodes), read by mmfeed's class, give the items LeRobot
    0.3.3 itself gave (every key, dtype, shape and value; the keys in 0.4's order)."""
    recorded = ORACLE_V21["datasets"][name][setting]
    with np.load(CORPUS / "items_v21.npz") as z:
        arrays = {k: z[k] for k in z.files}
    ds = LeRobotDataset(f"local/{name}", root=CORPUS / name, **recorded["kwargs"])
    assert len(ds) == recorded["len"] and ds.num_episodes == recorded["num_episodes"]
    for i, expected in recorded["items"].items():
        compare_item(name, setting, int(i), ds[int(i)], expected, arrays, ordered=False)


def test_episode_selection_image_transforms_and_bad_input():
    ds = LeRobotDataset("local/edge", root=CORPUS / "edge", episodes=[7, 1],
                        image_transforms=lambda frames: 1.0 - frames)
    assert ds.num_episodes == 2 and [int(ds[k]["episode_index"]) for k in (0, len(ds) - 1)] == [1, 7]
    plain = LeRobotDataset("local/edge", root=CORPUS / "edge", episodes=[1, 7])
    assert torch.allclose(ds[3]["observation.images.top"], 1.0 - plain[3]["observation.images.top"])
    with pytest.raises(ValueError, match=r"episodes \[99\] are not in the dataset"):
        LeRobotDataset("local/edge", root=CORPUS / "edge", episodes=[1, 99])
    with pytest.raises(ValueError, match="not multiples of 1/fps"):
        LeRobotDataset("local/edge", root=CORPUS / "edge", delta_timestamps={"action": [0.0, 0.05]})
    with pytest.raises(ValueError, match="does not have"):
        LeRobotDataset("local/edge", root=CORPUS / "edge", delta_timestamps={"actions": [0.0]})
    with pytest.raises(IndexError):
        plain[len(plain)]
    with pytest.raises(TypeError, match="repo_id"):
        LeRobotDataset(CORPUS / "edge")


def test_a_hub_id_opens_lerobots_local_copy(tmp_path, monkeypatch):
    """Without ``root``, the Hub id is resolved as LeRobot resolves it: its local copy under $HF_LEROBOT_HOME (no
    network), the same items as the directory given by ``root``."""
    (tmp_path / "lerobot" / "local").mkdir(parents=True)
    (tmp_path / "lerobot" / "local" / "edge").symlink_to(CORPUS / "edge")
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot"))
    by_id = LeRobotDataset("local/edge", delta_timestamps={"action": [0.0, 0.1]})
    by_root = LeRobotDataset("local/edge", root=CORPUS / "edge", delta_timestamps={"action": [0.0, 0.1]})
    assert len(by_id) == len(by_root) and by_id.meta.camera_keys == by_root.meta.camera_keys
    for i in (0, 5, len(by_id) - 1):
        a, b = by_id[i], by_root[i]
        assert list(a) == list(b)
        assert all(a[k] == b[k] if isinstance(a[k], str) else torch.equal(a[k], b[k]) for k in a)


def test_a_mixture_of_a_v21_directory_and_its_conversion_reads_each_the_same(tmp_path):
    """The v2.1 directory read directly mixes with v3.0 datasets: in ``open_dataset([v21_raw, v21])`` each
    dataset's windows are those it gives alone, and both give the same."""
    from mmfeed.loaders import WindowSpec, open_dataset

    spec = WindowSpec.from_delta_timestamps({"observation.images.top": [-0.1, 0.0], "action": [0.0, 0.1, 0.2]})
    mix = open_dataset([V21_RAW, CORPUS / "v21"]).windows(spec)
    half = len(mix) // 2
    assert half == 36
    for i in (0, 7, 20, 35):
        a, b = mix[i], mix[half + i]
        assert (a["dataset"], b["dataset"]) == (0, 1) and a["task"] == b["task"]
        assert torch.equal(a["action"], b["action"]) and torch.equal(a["action_is_pad"], b["action_is_pad"])
        assert read_index(a["observation.images.top"].numpy()).tolist() == \
            read_index(b["observation.images.top"].numpy()).tolist()
