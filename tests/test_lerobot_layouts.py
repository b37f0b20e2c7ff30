"""meta/episodes in any parquet layout reads the same: files, row groups, list or large_list task columns, plain or
dictionary-encoded strings, episodes out of order across files (a hypothesis test), with the per-episode task ids
checked against a row-by-row reading in plain Python."""

import os
import shutil
import subprocess
import sys

from pathlib import Path

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


def written_layout(base, root, files: int, row_group: int, kind: str) -> None:
    """``base`` copied to ``root`` with meta/episodes rewritten in ``files`` files of ``row_group`` rows a group,
    its task lists of ``kind`` (:func:`task_column`)."""
    shutil.copytree(base, root)
    meta = root / "meta" / "episodes"
    table = pq.read_table(meta / "chunk-000" / "file-000.parquet")
    shutil.rmtree(meta)
    table = table.set_column(table.column_names.index("tasks"), "tasks",
                             task_column(table["tasks"].to_pylist(), kind))
    (meta / "chunk-000").mkdir(parents=True)
    for k, part in enumerate(np.array_split(np.arange(table.num_rows), files)):
        pq.write_table(table.take(pa.array(part)), meta / "chunk-000" / f"file-{k:03d}.parquet",
                       row_group_size=row_group)


def _forced(monkeypatch, reader: str, direct: bool):
    """Every later open reads meta/episodes as large files are read, however small: from their bytes
    (``direct``) or in child processes; returns the list of what each call of ``reader`` gave."""
    from mmfeed.loaders.formats.lerobot import source

    got = []
    read = getattr(source, reader)

    def spy(*args, **kwargs):
        got.append(read(*args, **kwargs))
        return got[-1]

    monkeypatch.setattr(source, "CHILDREN_MIN_BYTES", 0)
    monkeypatch.setattr(source, "direct_ready", lambda: direct)
    monkeypatch.setattr(source, reader, spy)
    return got


@pytest.fixture
def in_children(monkeypatch):
    """``start()`` makes every later open read meta/episodes in child processes, however small, and returns the list
    of what each open's read_columns gave (None: a child failed and the open read in process)."""
    return lambda: _forced(monkeypatch, "read_columns", direct=False)


@pytest.fixture
def from_bytes(monkeypatch):
    """``start()`` makes every later open read meta/episodes from their bytes (parquet_direct), however small, and
    returns the list of what each file's read_direct gave (None: the open read that file another way)."""
    return lambda: _forced(monkeypatch, "read_direct", direct=True)


@pytest.mark.parametrize("kind", ["list", "large_list", "dictionary"])
def test_meta_episodes_read_in_child_processes_read_the_same(base, tmp_path, in_children, kind):
    """Large local meta/episodes are read in child processes (forced here for a small one): the same columns and
    task ids as read in this process; where a child cannot read a file (task lists of dictionary strings over
    several row groups, which Arrow reads only row group by row group), this process reads it instead."""
    root = tmp_path / "ds"
    written_layout(base, root, files=3, row_group=2, kind=kind)
    here = LeRobotSource(root)
    got = in_children()
    ds = LeRobotSource(root)
    assert len(got) == 1 and (got[0] is None) == (kind == "dictionary")
    if got[0] is not None:
        assert [t.num_rows for t in got[0]] == [3, 2, 2]
    assert ds.lengths.tolist() == here.lengths.tolist()
    assert ds.episode_tasks.tolist() == here.episode_tasks.tolist()
    assert sorted(ds._meta) == sorted(here._meta)
    for column, values in here._meta.items():
        assert np.array_equal(ds._meta[column], values), column


def with_an_unknown_task(base, root, tasks_of) -> int:
    """Two files of meta/episodes, the second file's second episode listing ``tasks_of(its tasks)`` instead (a
    list holding "a task tasks.parquet does not list"): that episode's index."""
    written_layout(base, root, files=2, row_group=2, kind="list")
    path = root / "meta/episodes/chunk-000/file-001.parquet"
    table = pq.read_table(path)
    tasks = table["tasks"].to_pylist()
    tasks[1] = tasks_of(tasks[1])
    pq.write_table(table.set_column(table.column_names.index("tasks"), "tasks", pa.array(tasks)), path)
    return table["episode_index"][1].as_py()


def test_an_unknown_task_read_in_a_child_names_the_file_and_episode(base, tmp_path, in_children):
    root = tmp_path / "ds"
    episode = with_an_unknown_task(base, root, lambda tasks: ["a task tasks.parquet does not list"])
    got = in_children()
    with pytest.raises(ValueError, match=rf"file-001\.parquet episode {episode}: task 'a task tasks.parquet does"):
        LeRobotSource(root)
    assert len(got) == 1 and got[0] is not None  # read in the children, named here


def test_child_processes_read_parquet_columns_and_give_up_on_a_broken_file(base, tmp_path, monkeypatch):
    """read_columns: each file's columns that it has (a missing one left out, for the caller to name), files
    dealt to fewer processes than files; None when a child fails (a file that is no parquet) or cannot start."""
    from mmfeed.loaders.stores.parquet_children import read_columns

    root = tmp_path / "ds"
    written_layout(base, root, files=3, row_group=2, kind="list")
    paths = [str(p) for p in sorted((root / "meta/episodes/chunk-000").glob("*.parquet"))]
    tables = read_columns(paths, ["episode_index", "length", "no such column"], processes=2)
    assert [t.column_names for t in tables] == [["episode_index", "length"]] * 3
    for path, table in zip(paths, tables):
        assert table.equals(pq.read_table(path, columns=["episode_index", "length"]).combine_chunks())
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not a parquet file")
    assert read_columns([paths[0], str(broken)], ["episode_index"]) is None
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    assert read_columns(paths, ["episode_index"]) is None


@pytest.mark.parametrize("name", ["chunked", "rowgroups", "v21"])
def test_meta_episodes_real_lerobot_wrote_read_the_same_in_child_processes(name, in_children):
    """The corpus LeRobot itself wrote (tests/lerobot_corpus: meta/episodes over several files and chunks, in row
    groups): the same columns read in child processes as in this process."""
    from pathlib import Path

    root = Path(__file__).parent / "lerobot_corpus" / name
    here = LeRobotSource(root)
    got = in_children()
    ds = LeRobotSource(root)
    assert len(got) == 1 and got[0] is not None
    assert ds.episode_tasks.tolist() == here.episode_tasks.tolist()
    assert sorted(ds._meta) == sorted(here._meta)
    for column, values in here._meta.items():
        assert np.array_equal(ds._meta[column], values), column


@pytest.mark.parametrize("kind", ["list", "large_list", "dictionary"])
def test_meta_episodes_read_from_their_bytes_read_the_same(base, tmp_path, from_bytes, kind):
    """Large local meta/episodes are read from their bytes (forced here for a small one), file by file: the same
    columns and task ids as pyarrow reads in this process, whatever the task lists' types and encoding."""
    root = tmp_path / "ds"
    written_layout(base, root, files=3, row_group=2, kind=kind)
    here = LeRobotSource(root)
    got = from_bytes()
    ds = LeRobotSource(root)
    assert len(got) == 3 and all(g is not None for g in got)
    assert sorted(g.rows for g in got) == [2, 2, 3]  # read in threads: in any order
    assert ds.lengths.tolist() == here.lengths.tolist()
    assert ds.episode_tasks.tolist() == here.episode_tasks.tolist()
    assert sorted(ds._meta) == sorted(here._meta)
    for column, values in here._meta.items():
        assert np.array_equal(ds._meta[column], values) and ds._meta[column].dtype == values.dtype, column


def test_an_unknown_task_read_from_the_bytes_names_the_file_and_episode(base, tmp_path, from_bytes):
    root = tmp_path / "ds"
    # in a row of two: still checked
    episode = with_an_unknown_task(base, root, lambda tasks: [tasks[0], "a task tasks.parquet does not list"])
    got = from_bytes()
    with pytest.raises(ValueError, match=rf"file-001\.parquet episode {episode}: task 'a task tasks.parquet does"):
        LeRobotSource(root)
    assert len(got) == 2 and all(g is not None for g in got)


def test_a_file_the_byte_reader_does_not_read_is_read_by_pyarrow(base, tmp_path, from_bytes, monkeypatch):
    """zstd pages are outside what parquet_direct reads: the open reads that file alone with pyarrow (in child
    processes, as a large file is), the other from its bytes, and gives the same columns."""
    from mmfeed.loaders.formats.lerobot import source

    root = tmp_path / "ds"
    written_layout(base, root, files=3, row_group=2, kind="list")
    path = root / "meta/episodes/chunk-000/file-001.parquet"
    pq.write_table(pq.read_table(path), path, compression="zstd", row_group_size=2)
    here = LeRobotSource(root)
    got = from_bytes()
    by_pyarrow = []
    read_columns = source.read_columns
    monkeypatch.setattr(source, "read_columns", lambda paths, *a, **k: by_pyarrow.append(paths) or
                        read_columns(paths, *a, **k))
    ds = LeRobotSource(root)
    assert sorted(g is None for g in got) == [False, False, True]  # read side by side: in any order
    assert [[Path(p).name for p in paths] for paths in by_pyarrow] == [["file-001.parquet"]]
    assert ds.episode_tasks.tolist() == here.episode_tasks.tolist()
    for column, values in here._meta.items():
        assert np.array_equal(ds._meta[column], values), column


@pytest.mark.parametrize("name", ["chunked", "rowgroups", "v21"])
def test_meta_episodes_real_lerobot_wrote_read_the_same_from_their_bytes(name, from_bytes):
    """The corpus LeRobot itself wrote: the same columns read from the parquet bytes as pyarrow reads."""
    from pathlib import Path

    root = Path(__file__).parent / "lerobot_corpus" / name
    here = LeRobotSource(root)
    got = from_bytes()
    ds = LeRobotSource(root)
    assert got and all(g is not None for g in got)
    assert ds.episode_tasks.tolist() == here.episode_tasks.tolist()
    assert sorted(ds._meta) == sorted(here._meta)
    for column, values in here._meta.items():
        assert np.array_equal(ds._meta[column], values) and ds._meta[column].dtype == values.dtype, column
