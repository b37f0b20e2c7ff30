"""meta/episodes in any parquet layout reads the same: files, row groups, list or large_list task columns, plain or
dictionary-encoded strings, episodes out of order across files (a hypothesis test), with the per-episode task ids
checked against a row-by-row reading in plain Python."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfeed.loaders.formats.lerobot.source import LeRobotSource
from mmfeed.testing import make_episodes, write_lerobot

EPISODES = 7


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A LeRobot directory (arrays only, no video: the metadata is what varies) whose episodes have one task or
    change task midway."""
    root = tmp_path_factory.mktemp("layouts") / "base"
    episodes = make_episodes(EPISODES, seed=3, min_length=1, max_length=6, cameras=())
    return write_lerobot(root, episodes, task_switch=True, use_videos=False)


def naive_task_ids(table: pa.Table, tasks: list[str]) -> dict[int, int]:
    """episode_index -> its task id when it lists exactly one task, else -1, row by row in plain Python."""
    out = {}
    for row in table.select(["episode_index", "tasks"]).to_pylist():
        listed = row["tasks"] or []
        out[row["episode_index"]] = tasks.index(listed[0]) if len(listed) == 1 else -1
    return out


def task_column(values: list[list[str]], kind: str) -> pa.Array:
    if kind == "list":
        return pa.array(values, type=pa.list_(pa.string()))
    if kind == "large_list":
        return pa.array(values, type=pa.large_list(pa.large_string()))
    flat = pa.array([t for v in values for t in v], type=pa.string()).dictionary_encode()
    offsets = pa.array(np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, flat)  # list<dictionary<int32, string>>


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.integers(1, 4), row_group=st.integers(1, EPISODES), kind=st.sampled_from(["list", "large_list",
       "dictionary"]), dictionary_pages=st.booleans(), shuffle=st.booleans(), seed=st.integers(0, 2**16))
def test_any_layout_of_meta_episodes_reads_the_same(base, tmp_path_factory, files, row_group, kind,
                                                    dictionary_pages, shuffle, seed):
    """Whatever the files, row groups, list type, string type and encoding, and order of rows across files: the
    same lengths, row ranges and per-episode task ids as the base directory (and as a plain-Python reading), and
    the same rows read for a sample."""
    reference = LeRobotSource(base)
    original = pq.read_table(f"{base}/meta/episodes/chunk-000/file-000.parquet")
    root = tmp_path_factory.mktemp("layout") / "ds"
    shutil.copytree(base, root)
    meta = root / "meta" / "episodes"
    shutil.rmtree(meta)
    rows = np.arange(original.num_rows)
    if shuffle:
        np.random.default_rng(seed).shuffle(rows)
    table = original.take(pa.array(rows))
    table = table.set_column(table.column_names.index("tasks"), "tasks",
                             task_column(table["tasks"].to_pylist(), kind))
    per_chunk = 2  # LeRobot's file order: file after file of a chunk, then the next chunk
    for k, part in enumerate(np.array_split(np.arange(table.num_rows), files)):
        folder = meta / f"chunk-{k // per_chunk:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.take(pa.array(part)), folder / f"file-{k % per_chunk:03d}.parquet",
                       row_group_size=row_group, use_dictionary=dictionary_pages)
    ds = LeRobotSource(root)
    assert ds.lengths.tolist() == reference.lengths.tolist()
    assert ds.episode_tasks.tolist() == reference.episode_tasks.tolist()
    naive = naive_task_ids(original, reference.tasks)
    assert ds.episode_tasks.tolist() == [naive[e] for e in sorted(naive)]
    for column in ("episode_index", "dataset_from_index", "data/file_index"):
        assert ds._meta[column].tolist() == reference._meta[column].tolist()
    e = int(seed % EPISODES)
    assert ds.step_tasks(e).tolist() == reference.step_tasks(e).tolist()
    assert np.array_equal(ds.episode(e)["observation.state"], reference.episode(e)["observation.state"])


def test_an_unknown_task_in_a_later_row_group_names_the_file_and_episode(base, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(base, root)
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    tasks = table["tasks"].to_pylist()
    tasks[5] = ["a task tasks.parquet does not list"]
    table = table.set_column(table.column_names.index("tasks"), "tasks", pa.array(tasks))
    pq.write_table(table, path, row_group_size=2)
    with pytest.raises(ValueError, match=r"file-000\.parquet episode 5: task 'a task tasks.parquet does not list'"):
        LeRobotSource(root)


def test_opening_a_dataset_imports_no_pandas(base, tmp_path):
    """pyarrow's to_numpy, pa.array of strings and the scalars of compute functions import pandas, a quarter to
    half a second of every first open; the open reads meta/episodes' buffers instead (in a fresh process, with a
    fresh cache: the first open on a node)."""
    code = ("import sys; from mmfeed.loaders import open_dataset; ds = open_dataset(sys.argv[1]); "
            "print(len(ds), 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(base)], capture_output=True, text=True, check=True,
                         env={**os.environ, "MMFEED_CACHE": str(tmp_path / "cache")})
    assert out.stdout.split() == [str(len(LeRobotSource(base))), "False"], out.stderr[-2000:]
