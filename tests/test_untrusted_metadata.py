"""Metadata that disagrees with the data is refused when a dataset opens (or, under ``errors="skip"``, the episode
is left out and counted), on real files: LeRobot directories written by mmfeed.testing, a copy of a directory real
LeRobot wrote (tests/lerobot_corpus), and webdataset shards whose index parquet is rewritten.

Each case was believed before: episode 1's rows pointing at episode 0's read episode 0's rows under episode 1's
task and video; an index length of 10**12 on a 19-row episode planned 10**12 windows and never ended; a negative
length silently dropped steps; fps 0 or NaN gave windows from inf/NaN times; an episode length of 2e8 made
``mmfeed inspect`` take 2.9 GB and minutes; fps 0 in info.json was a ZeroDivisionError and ``features`` as a list
an AttributeError. Now each is one line naming the file and the episode (or field), and ``mmfeed inspect`` exits
with status 2 within seconds and well under 1 GB.
"""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmfeed import DataLoader
from mmfeed.loaders import ErrorPolicy, Packing, PlanConfig, SampleError, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.stores.index import INDEX_FILENAME
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

CORPUS = Path(__file__).parent / "lerobot_corpus"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
DATA = "data/chunk-000/file-000.parquet"
CAM = "observation.images.cam_high"
STATE = "observation.state"


@pytest.fixture(autouse=True)
def _own_index_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Three 8-step episodes of one camera, as LeRobot lays them out (one data file of 24 rows)."""
    root = tmp_path_factory.mktemp("lerobot") / "clean"
    eps = make_episodes(3, seed=45, min_length=8, max_length=8, cameras=("cam_high",), height=32, width=48,
                        state_dim=4, action_dim=4)
    write_lerobot(root, eps, codec="h264")
    return root


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    """Three 8-step episodes of an arm without cameras (no video segment bounds the lengths)."""
    root = tmp_path_factory.mktemp("arm") / "clean"
    write_lerobot(root, make_episodes(3, seed=47, min_length=8, max_length=8, cameras=(), state_dim=4, action_dim=4))
    return root


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three 19-step episodes in webdataset shards with their index."""
    root = tmp_path_factory.mktemp("shards") / "clean"
    eps = make_episodes(3, seed=46, min_length=19, max_length=19, cameras=("cam_high",), height=32, width=48,
                        state_dim=4, action_dim=4)
    write_webdataset(root, eps, episodes_per_shard=2)
    return root


def copy(src: Path, tmp_path: Path, name: str = "ds") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def edit_episodes(root: Path, relative: str = EPISODES, **rows: dict[int, object]) -> None:
    """Set ``column[row] = value`` in one meta/episodes file (``rows``: column -> {row: value})."""
    path = root / relative
    table = pq.read_table(path)
    for column, changes in rows.items():
        values = table[column].to_pylist()
        for row, value in changes.items():
            values[row] = value
        i = table.column_names.index(column)
        table = table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))
    pq.write_table(table, path)


def edit_info(root: Path, change) -> None:
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))


def same_episode(a: dict, b: dict) -> None:
    for key in (STATE, "action", CAM, "frame_index", "task_index"):
        assert np.array_equal(np.asarray(a[key]), np.asarray(b[key])), key
    assert a["task"] == b["task"]


# The peak is this process's own (VmHWM of its memory map): ru_maxrss would carry the high-water mark of the
# parent's memory from before the exec (a large test process's, with vfork).
WRAP = ("import atexit, resource, sys\n"
        "def report():\n"
        "    use = resource.getrusage(resource.RUSAGE_SELF)\n"
        "    hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
        "    open(sys.argv[1], 'w').write(f'{hwm} {use.ru_utime + use.ru_stime}')\n"
        "atexit.register(report)\n"
        "from mmfeed.cli import main\n"
        "sys.exit(main(sys.argv[2:]))\n")


def inspect_cli(path: Path, tmp_path: Path) -> tuple[int, str, float, int]:
    """``mmfeed inspect PATH`` in a fresh process: exit status, stderr, CPU seconds (imports included; wall time
    on a shared machine says more of its neighbours) and peak RSS in bytes."""
    usage = tmp_path / "usage.txt"
    done = subprocess.run([sys.executable, "-c", WRAP, str(usage), "inspect", str(path)], capture_output=True,
                          text=True, timeout=600)
    rss, seconds = usage.read_text().split()
    return done.returncode, done.stderr, float(seconds), int(rss) * 1024


def assert_one_line_refusal(path: Path, tmp_path: Path, *needles: str) -> None:
    code, err, seconds, rss = inspect_cli(path, tmp_path)
    assert code == 2, err
    assert err.startswith("mmfeed: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert seconds < 15 and rss < 2**30, (seconds, rss)


# -- LeRobot: meta/episodes against the data ------------------------------------------------------------------

def test_an_episode_pointing_at_another_episodes_rows_is_refused_or_skipped(written, tmp_path):
    """The case to beat: episode 1's dataset_from_index/dataset_to_index are episode 0's (length unchanged); it
    read episode 0's rows under episode 1's task and video."""
    root = copy(written, tmp_path)
    edit_episodes(root, dataset_from_index={1: 0}, dataset_to_index={1: 8})
    start = time.process_time()
    with pytest.raises(ValueError) as err:
        open_dataset(root)
    assert time.process_time() - start < 2
    message = str(err.value)
    assert message.startswith(f"{root / EPISODES} episode 1: rows 0..8 (dataset_from_index..dataset_to_index) "
                              "overlap the rows before it: episode 0's rows end at row 8"), message
    assert str(root / DATA) in message and "\n" not in message

    clean = open_dataset(written)
    ds = open_dataset(root, errors="skip")
    assert len(ds) == 2 and ds.lengths.tolist() == [8, 8]
    assert [(s["episode"], s["source"]) for s in ds.skipped] == [(1, str(root / EPISODES))]
    assert "overlap" in ds.skipped[0]["reason"]
    same_episode(ds.episode(0), clean.episode(0))
    kept = ds.episode(1)
    assert kept["episode_index"].tolist() == [2] * 8
    same_episode(kept, clean.episode(2))

    assert_one_line_refusal(root, tmp_path, str(root / EPISODES), "episode 1: rows 0..8", "episode 0's rows")


def test_a_real_lerobot_dataset_edited_to_reuse_rows_is_refused_or_skipped(tmp_path):
    """A directory real LeRobot wrote (data over seven files in four chunks), episode 4 (5 steps, data file
    chunk-001/file-000) edited to name episode 1's rows and data file (also 5 steps)."""
    root = copy(CORPUS / "chunked", tmp_path)
    episodes = "meta/episodes/chunk-000/file-001.parquet"  # episodes 3, 4, 5
    edit_episodes(root, episodes, dataset_from_index={1: 6}, dataset_to_index={1: 11},
                  **{"data/chunk_index": {1: 0}, "data/file_index": {1: 0}})
    with pytest.raises(ValueError, match=rf"^{root / episodes} episode 4: rows 6\.\.11 \(dataset_from_index\.\."
                                         r"dataset_to_index\) overlap the rows before it: episode 3's rows end at "
                                         r"row 20.*chunk-000/file-000\.parquet"):
        open_dataset(root)
    clean = open_dataset(CORPUS / "chunked")
    ds = open_dataset(root, errors="skip")
    assert len(ds) == 11 and [s["episode"] for s in ds.skipped] == [4]
    for e in range(11):
        got, want = ds.episode(e), clean.episode(e if e < 4 else e + 1)
        for key in clean.features:
            assert np.array_equal(np.asarray(got[key]), np.asarray(want[key])), (e, key)
    assert_one_line_refusal(root, tmp_path, "episode 4: rows 6..11")


@pytest.mark.parametrize("case, rows, message", [
    ("length 0", {"length": {1: 0}, "dataset_to_index": {1: 8}}, "episode 1: length 0; an episode holds at least"),
    ("length beside the range", {"length": {1: 9}}, r"episode 1: length 9, but rows 8\.\.16 .* hold 8"),
    ("listed twice", {"episode_index": {2: 1}}, "episode 1: episode_index 1 is listed twice"),
    ("rows past the file", {"length": {2: 200_000_000}, "dataset_to_index": {2: 200_000_016}},
     r"episode 2: rows 16\.\.200000016 .* lie outside its data file .*file-000\.parquet, which holds rows 0\.\.24 "
     r"\(24 rows, by its parquet footer\)"),
    ("negative rows", {"dataset_from_index": {0: -8}, "dataset_to_index": {0: 0}},
     r"episode 0: rows -8\.\.0 .*outside"),
    ("segment time NaN", {f"videos/{CAM}/from_timestamp": {1: float("nan")}},
     rf"episode 1: camera '{CAM}' segment times \{{'from_timestamp': nan, 'to_timestamp': 0\.5333\d*\}} are not "
     r"finite times >= 0 s, from before to"),
    ("segment on another episode's frames", {f"videos/{CAM}/from_timestamp": {2: 0.0}},
     rf"episode 2: camera '{CAM}' segment starts at 0 s of .*videos/{CAM}/chunk-000/file-000\.mp4, before episode "
     r"1's ends at 0\.533333 s: it would read that episode's frames"),
    ("segment on another episode's frames, files interleaved",
     {f"videos/{CAM}/file_index": {1: 1}, f"videos/{CAM}/from_timestamp": {2: 0.0}},
     rf"episode 2: camera '{CAM}' segment starts at 0 s of .*chunk-000/file-000\.mp4, before episode 0's ends at "
     r"0\.266667 s"),
])
def test_meta_episodes_that_disagree_with_the_data_name_the_file_and_the_episode(written, tmp_path, case, rows,
                                                                                 message):
    root = copy(written, tmp_path)
    edit_episodes(root, **rows)
    with pytest.raises(ValueError, match=rf"^{root / EPISODES} {message}"):
        open_dataset(root)
    ds = open_dataset(root, errors="skip")
    assert len(ds) == 2 and len(ds.skipped) == 1 and ds.lengths.tolist() == [8, 8]


def test_an_episode_length_of_2e8_is_refused_by_mmfeed_inspect_in_seconds(arm, tmp_path):
    """The last episode's length and range 2e8 steps long: mmfeed inspect planned 2e8 windows (2.2 GB and still
    going after 150 s here; 2.9 GB at 120 s as reported)."""
    root = copy(arm, tmp_path)
    edit_episodes(root, length={2: 200_000_000}, dataset_to_index={2: 200_000_016})
    assert_one_line_refusal(root, tmp_path, str(root / EPISODES), "episode 2: rows 16..200000016", str(root / DATA))


def test_a_gap_between_episodes_is_refused_and_under_skip_the_episode_after_it_stays(written, tmp_path):
    """Rows between two episodes that belong to neither: LeRobot writes none, so it is refused; under skip no row
    is read twice, so the episodes around it stay and their rows are checked as they are read."""
    root = copy(written, tmp_path)
    edit_episodes(root, length={1: 7}, dataset_to_index={1: 15})  # row 15 is no episode's
    with pytest.raises(ValueError, match=r"episode 2: rows 16\.\.24 .* start at row 16, but episode 1's rows end at "
                                         r"row 15: rows 15\.\.16 belong to no episode"):
        open_dataset(root)
    ds = open_dataset(root, errors="skip")
    assert len(ds) == 3 and ds.skipped == []
    assert ds.episode(1)["frame_index"].tolist() == list(range(7))


def test_rows_carrying_another_episode_index_fail_their_samples_which_the_policy_skips(written, tmp_path):
    """meta/episodes is consistent, but the data file says episode 1's rows are episode 0's: found as the file is
    read (the rows are read anyway), a SampleError naming the data file, the episode and both values, for that
    episode's samples only; ErrorPolicy(on_error="skip") leaves them out and counts them."""
    root = copy(written, tmp_path)
    table = pq.read_table(root / DATA)
    column = table["episode_index"].to_numpy().copy()
    column[8:16] = 0
    table = table.set_column(table.column_names.index("episode_index"), "episode_index", pa.array(column))
    pq.write_table(table, root / DATA)
    ds = open_dataset(root)
    with pytest.raises(SampleError, match=rf"episode 1 feature '[\w.]+': data file {root / DATA}: 8 of the rows "
                                          r"8\.\.16 of episode 1 carry episode_index 0, not 1 \(first: row 8\)"):
        ds.episode(1)
    clean = open_dataset(written)
    same_episode(ds.episode(0), clean.episode(0))
    same_episode(ds.episode(2), clean.episode(2))

    window = WindowSpec.from_delta_timestamps({STATE: [0.0], "action": [0.0, 1 / 30]})
    packing = Packing(layout=TokenLayout(), window=window, plan=PlanConfig(capacity=64, rows_per_batch=2),
                      errors=ErrorPolicy(on_error="skip", max_consecutive_errors=100))
    loader = DataLoader(ds, packing=packing)
    batches = list(loader)
    assert loader.stats["skipped_samples"] == 8 and {r["episode"] for r in loader.stats["errors"]} == {1}
    assert all("carry episode_index 0, not 1" in r["reason"] for r in loader.stats["errors"])
    assert sum(len(b.metadata["sample"]) for b in batches) == 16


def test_stored_widths_other_than_the_declared_shape_name_the_file_episode_and_both(written, tmp_path):
    """A data-file column's values per row against info.json's shape, checked when the file is first read: a
    column whose rows all differ fails every read of it; a row that differs fails its episode only."""
    root = copy(written, tmp_path)
    edit_info(root, lambda info: info["features"]["action"].update(shape=[3]))
    with pytest.raises(ValueError, match=rf"episode 0 feature 'action': cannot read column 'action' of data file "
                                         rf"{root / DATA}: 96 values in 24 rows \(4 per row\), but meta/info.json "
                                         r"declares shape \[3\] \(3 values\)"):
        open_dataset(root).episode(0)

    root = copy(written, tmp_path, "ragged")
    table = pq.read_table(root / DATA)
    rows = table["action"].to_pylist()
    rows[10] = rows[10][:3]  # episode 1's step 2
    table = table.set_column(table.column_names.index("action"), "action", pa.array(rows, pa.list_(pa.float32())))
    pq.write_table(table, root / DATA)
    ds = open_dataset(root)
    with pytest.raises(SampleError, match=rf"episode 1 feature 'action': data file {root / DATA}: column 'action' "
                                          r"holds 3 values in row 10 of episode 1, but meta/info.json declares shape "
                                          r"\[4\] \(4 values\)"):
        ds.episode(1)
    same_episode(ds.episode(0), open_dataset(written).episode(0))


# -- LeRobot: info.json types ------------------------------------------------------------------------------------

INFO_CASES = {
    "fps 0": (lambda i: i.update(fps=0), "field 'fps' must be a finite number > 0 (frames per second), got 0"),
    "fps negative": (lambda i: i.update(fps=-30), "field 'fps' must be a finite number > 0 (frames per second), "
                                                  "got -30"),
    "fps a string": (lambda i: i.update(fps="30"), "field 'fps' must be a finite number > 0 (frames per second), "
                                                   "got '30'"),
    "fps true": (lambda i: i.update(fps=True), "field 'fps' must be a finite number > 0 (frames per second), got True"),
    "features a list": (lambda i: i.update(features=list(i["features"])),
                        "field 'features' must be an object {name: {dtype, shape, ...}}, got a list of 11 items"),
    "a feature a number": (lambda i: i["features"].update(action=3),
                           "field features['action'] must be an object {dtype, shape, ...}, got 3"),
    "shape a string": (lambda i: i["features"]["action"].update(shape="four"),
                       "field features['action'].shape must be a list of integers >= 1, got 'four'"),
    "shape of zero": (lambda i: i["features"]["action"].update(shape=[0]),
                      "field features['action'].shape must be a list of integers >= 1, got [0]"),
    "dtype missing": (lambda i: i["features"]["action"].pop("dtype"),
                      "field features['action'].dtype must be a string such as 'float32' or 'video', got None"),
    "names a number": (lambda i: i["features"]["action"].update(names=4),
                       "field features['action'].names must be a list, an object or null, got 4"),
    "video info a list": (lambda i: i["features"][CAM].update(info=[]),
                          f"field features['{CAM}'].info must be an object, got a list of 0 items"),
    "video fps 0": (lambda i: i["features"][CAM]["info"].update({"video.fps": 0}),
                    f"field features['{CAM}'].info['video.fps'] must be a finite number > 0, got 0"),
    "feature fps NaN": (lambda i: i["features"]["action"].update(fps=float("nan")),
                        "field features['action'].fps must be a finite number > 0, got nan"),
    "data_path a number": (lambda i: i.update(data_path=7), "field 'data_path' must be a path template (a string)"),
    "chunks_size a string": (lambda i: i.update(chunks_size="1000"),
                             "field 'chunks_size' must be an integer >= 1, got '1000'"),
}


@pytest.mark.parametrize("case", list(INFO_CASES))
def test_info_json_fields_of_the_wrong_type_are_one_line_naming_the_field(written, tmp_path, case):
    """fps 0 was a ZeroDivisionError, features as a list an AttributeError, a shape of letters int()'s message."""
    change, message = INFO_CASES[case]
    root = copy(written, tmp_path)
    edit_info(root, change)
    with pytest.raises(ValueError) as err:
        open_dataset(root)
    assert str(err.value) == f"{root / 'meta' / 'info.json'}: {message}" or \
        str(err.value).startswith(f"{root / 'meta' / 'info.json'}: {message}"), str(err.value)


@pytest.mark.parametrize("case", ["fps 0", "features a list"])
def test_info_json_of_the_wrong_type_is_one_line_from_mmfeed_inspect(written, tmp_path, case):
    change, message = INFO_CASES[case]
    root = copy(written, tmp_path)
    edit_info(root, change)
    assert_one_line_refusal(root, tmp_path, f"{root / 'meta' / 'info.json'}: {message}")


def test_info_json_that_is_no_object_and_stats_that_are_no_numbers_are_named(written, tmp_path):
    root = copy(written, tmp_path)
    (root / "meta" / "info.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"info\.json: must be a JSON object of fields .*got a list of 2 items"):
        open_dataset(root)
    root = copy(written, tmp_path, "stats")
    stats = json.loads((root / "meta" / "stats.json").read_text())
    stats["action"]["mean"] = ["a", "b"]
    (root / "meta" / "stats.json").write_text(json.dumps(stats))
    with pytest.raises(ValueError, match=r"stats\.json: feature 'action' statistic 'mean' is not numbers"):
        open_dataset(root)


# -- webdataset shards: the index against the members -----------------------------------------------------------

def edit_index(root: Path, episode: int, **values) -> None:
    """Set ``column[episode] = value`` in the index parquet (a callable value edits the row's value)."""
    path = root / INDEX_FILENAME
    table = pq.read_table(path)
    for column, value in values.items():
        i = table.column_names.index(column)
        rows = table[column].to_pylist()
        rows[episode] = value(rows[episode]) if callable(value) else value
        table = table.set_column(i, table.schema.field(i), pa.array(rows, table.schema.field(i).type))
    pq.write_table(table, path)


def with_rate(rate):
    def change(features):
        return [{**f, "fps": rate} if f["name"] == STATE else f for f in features]
    return change


def test_an_index_length_of_10_to_the_12_on_a_19_row_episode_is_refused_or_skipped(shards, tmp_path):
    """It planned 10**12 windows: the loader never ended."""
    root = copy(shards, tmp_path)
    edit_index(root, 1, length=10**12)
    key = pq.read_table(root / INDEX_FILENAME)["episode_id"][1].as_py()
    start = time.process_time()
    with pytest.raises(ValueError) as err:
        open_dataset(root)
    assert time.process_time() - start < 2
    message = str(err.value)
    assert message.startswith(f"{root / INDEX_FILENAME}: {root / 'shard-000000.tar'} key {key!r} feature "), message
    assert ": 19 frames, but 1000000000000 steps at 30 fps need 1000000000000" in message
    assert message.endswith("(length 1000000000000 in the index)") and "\n" not in message

    clean = open_dataset(shards)
    ds = open_dataset(root, errors="skip")
    assert len(ds) == 2 and [(s["episode"], s["source"]) for s in ds.skipped] == [
        (key, str(root / "shard-000000.tar"))]
    for e, c in ((0, 0), (1, 2)):
        got, want = ds.episode(e), clean.episode(c)
        assert got["episode_id"] == want["episode_id"]
        for feature in clean.features:
            assert np.array_equal(got[feature], want[feature]), feature
    assert_one_line_refusal(root, tmp_path, str(root / INDEX_FILENAME), f"key {key!r}", "1000000000000 steps")


@pytest.mark.parametrize("case, values, message", [
    ("negative length", {"length": -5}, "length -5 is negative; an episode has 0 steps or more"),
    ("fps 0", {"fps": 0.0}, "fps 0.0 must be a finite number > 0"),
    ("fps NaN", {"fps": float("nan")}, "fps nan must be a finite number > 0"),
    ("fps negative", {"fps": -30.0}, "fps -30.0 must be a finite number > 0"),
    ("rate NaN", {"features": with_rate(float("nan"))}, f"feature '{STATE}' has rate nan; a rate is a finite number"),
    ("rate inf", {"features": with_rate(float("inf"))}, f"feature '{STATE}' has rate inf; a rate is a finite number"),
    ("rate too fast", {"features": with_rate(1000.0)},
     f"feature '{STATE}': 19 frames, but 19 steps at 30 fps need 601 at its rate 1000 fps"),
])
def test_index_lengths_and_rates_that_cannot_be_are_refused(shards, tmp_path, case, values, message):
    """A negative length silently dropped steps; fps 0, NaN or negative gave windows at inf/NaN times."""
    root = copy(shards, tmp_path)
    edit_index(root, 2, **values)
    key = pq.read_table(root / INDEX_FILENAME)["episode_id"][2].as_py()
    with pytest.raises(ValueError) as err:
        open_dataset(root)
    text = str(err.value)
    assert text.startswith(f"{root / INDEX_FILENAME}: {root / 'shard-000001.tar'} key {key!r}"), text
    assert message in text, text
    ds = open_dataset(root, errors="skip")
    assert len(ds) == 2 and [s["episode"] for s in ds.skipped] == [key]


def test_an_index_fps_of_zero_is_one_line_from_mmfeed_inspect(shards, tmp_path):
    root = copy(shards, tmp_path)
    edit_index(root, 0, fps=0.0)
    assert_one_line_refusal(root, tmp_path, str(root / INDEX_FILENAME), "fps 0.0 must be a finite number > 0")


def test_frame_counts_beyond_what_the_members_bytes_hold_are_refused(shards, tmp_path):
    """A length of 10**12 with every feature's frame count raised to match: the members' bytes bound them."""
    root = copy(shards, tmp_path)
    edit_index(root, 1, length=10**12, features=lambda fs: [{**f, "frames": 10**12} for f in fs])
    with pytest.raises(ValueError, match=r"key 'episode_000001': feature 'action' claims 1000000000000 frames of "
                                         r"float32 \[4\] \(16 bytes each\), but its \.npy member has \d+ bytes$"):
        open_dataset(root)
    root = copy(shards, tmp_path, "video")
    edit_index(root, 0, features=lambda fs: [{**f, "frames": 10**9} if f["name"] == CAM else f for f in fs])
    with pytest.raises(ValueError, match=rf"{CAM}' claims 1000000000 frames, but its video member has \d+ bytes$"):
        open_dataset(root)
    assert len(open_dataset(root, errors="skip")) == 2
