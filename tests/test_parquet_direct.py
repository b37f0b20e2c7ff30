"""parquet_direct reads what pyarrow reads, for every writer option pyarrow has that it claims to read, and gives
None (never a crash, never other values) for what it does not: other codecs, nulls, unsigned and timestamp
columns, broken files. pyarrow's own reading of the same file is the oracle."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfeed.loaders.stores.parquet_direct import read_direct

pytestmark = pytest.mark.kernels

INTS = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64()}
FLOATS = {"float32": pa.float32(), "float64": pa.float64()}


def texts_of(column: pa.ChunkedArray) -> tuple[list[int], list[str]]:
    rows = column.to_pylist()
    return [len(r or []) for r in rows], [t for r in rows for t in (r or [])]


def assert_reads_as_pyarrow(path, numbers, lists) -> None:
    read = read_direct(path, numbers, lists)
    assert read is not None
    table = pq.read_table(path)
    assert read.rows == table.num_rows
    for name in numbers:
        expected = table[name].to_numpy()
        assert read.numbers[name].dtype == expected.dtype, name
        assert np.array_equal(read.numbers[name], expected), name
    for name in lists:
        counts, texts = texts_of(table[name])
        assert read.lists[name].counts.tolist() == counts
        assert read.lists[name].texts() == texts


@st.composite
def tables(draw):
    n = draw(st.integers(1, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    columns, numbers = {}, []
    for name, kind in {**INTS, **FLOATS}.items():
        if draw(st.booleans()):
            if name in INTS:
                info = np.iinfo(kind.to_pandas_dtype())
                few = draw(st.booleans())  # a few distinct values: dictionary pages stay dictionary
                values = rng.integers(info.min, info.max, n, endpoint=True) if not few else rng.integers(0, 3, n)
            else:
                values = rng.normal(size=n) * 10.0 ** rng.integers(-5, 5)
            columns[name] = pa.array(np.asarray(values).astype(kind.to_pandas_dtype()), kind)
            numbers.append(name)
    vocabulary = ["pick up the cube", "", "ünïcode tâsk", "x" * 300]
    lists = []
    if draw(st.booleans()):
        rows = [[vocabulary[k] for k in rng.integers(0, len(vocabulary), rng.integers(0, 4))] for _ in range(n)]
        if draw(st.booleans()):
            rows = [None if rng.random() < 0.2 else r for r in rows]  # null lists read as empty
        kind = draw(st.sampled_from([pa.list_(pa.string()), pa.large_list(pa.string()),
                                     pa.list_(pa.large_string())]))
        columns["tasks"] = pa.array(rows, kind)
        lists.append("tasks")
    if not columns:
        columns["int64"] = pa.array(np.arange(n), pa.int64())
        numbers.append("int64")
    required = draw(st.booleans())
    table = pa.table(columns)
    if required:  # not null in the schema: no definition levels for the flat columns
        table = table.cast(pa.schema([f.with_nullable(f.name in lists) for f in table.schema]))
    options = {"row_group_size": draw(st.integers(1, 64)), "compression": draw(st.sampled_from(["snappy", "none"])),
               "use_dictionary": draw(st.booleans()), "data_page_version": draw(st.sampled_from(["1.0", "2.0"])),
               "data_page_size": draw(st.sampled_from([None, 64])), "write_statistics": draw(st.booleans())}
    return table, numbers, lists, options


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=tables())
def test_reads_what_pyarrow_reads_for_every_writer_option(tmp_path, case):
    table, numbers, lists, options = case
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, **options)
    assert_reads_as_pyarrow(path, numbers, lists)


def test_columns_the_file_lacks_are_left_out_and_others_not_read(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": [3.0, 4.0], "t": [["x"], ["y"]]}), path)
    read = read_direct(path, ["a", "missing"], ["no lists"])
    assert list(read.numbers) == ["a"] and read.lists == {}


@pytest.mark.parametrize("case", ["zstd", "null", "uint64", "timestamp", "null text", "string column",
                                  "struct", "text list asked as number"])
def test_what_it_does_not_read_gives_none(tmp_path, case):
    path = tmp_path / "t.parquet"
    columns, numbers, lists, options = {"a": pa.array([1, 2, 3])}, ["a"], [], {}
    if case == "zstd":
        options["compression"] = "zstd"
    elif case == "null":
        columns["a"] = pa.array([1, None, 3])
    elif case == "uint64":
        columns["a"] = pa.array([1, 2, 3], pa.uint64())
    elif case == "timestamp":
        columns["a"] = pa.array([1, 2, 3], pa.timestamp("ms"))
    elif case == "null text":
        columns["t"], lists = pa.array([["a"], [None], []]), ["t"]
    elif case == "string column":
        columns["t"], lists = pa.array(["a", "b", "c"]), ["t"]
    elif case == "struct":
        columns["a"] = pa.array([{"x": 1}, {"x": 2}, {"x": 3}])
    else:
        columns["t"], numbers = pa.array([["a"], ["b"], []]), ["t"]
    pq.write_table(pa.table(columns), path, **options)
    assert read_direct(path, numbers, lists) is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), cut=st.booleans())
def test_a_broken_file_gives_none_or_values_never_a_crash(tmp_path, seed, cut):
    """Flipped bytes (footer, headers, pages) or a cut file: None, or values of the right length (a flipped
    value byte is a different value: parquet has no checksum pyarrow writes by default), never a crash, a
    read outside the file or an endless loop."""
    rng = np.random.default_rng(seed)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": np.arange(40) % 7, "t": [["x", "y"][: k % 3] for k in range(40)]}), path,
                   row_group_size=9)
    data = bytearray(path.read_bytes())
    if cut:
        data = data[:int(rng.integers(0, len(data)))]
    else:
        for at in rng.integers(0, len(data), int(rng.integers(1, 4))):
            data[at] = int(rng.integers(0, 256))
    path.write_bytes(bytes(data))
    read = read_direct(path, ["a"], ["t"])
    if read is not None:
        assert len(read.numbers["a"]) == read.rows == len(read.lists["t"].counts)


def test_no_file_or_not_parquet_gives_none(tmp_path):
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "text.parquet").write_bytes(b"PAR1 not a parquet file PAR1")
    assert read_direct(tmp_path / "missing.parquet", ["a"]) is None
    assert read_direct(tmp_path / "empty.parquet", ["a"]) is None
    assert read_direct(tmp_path / "text.parquet", ["a"]) is None


@pytest.mark.slow
def test_kernels_not_compiled_are_compiled_in_the_background_for_the_next_open(tmp_path):
    """With an empty numba cache direct_ready says no (the open reads another way) and starts one low-priority
    child that compiles the kernels; once it is done, a new process finds them ready."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "NUMBA_DISABLE_JIT": "0",
           "TMPDIR": str(tmp_path)}  # the machine's mark of a compile started, fresh
    ask = [sys.executable, "-c", "from mmfeed.loaders.stores.parquet_direct import direct_ready; print(direct_ready())"]
    assert subprocess.run(ask, env=env, capture_output=True, text=True, check=True).stdout.split() == ["False"]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not all(list((tmp_path / "numba").rglob(f"*{name}-*.nbi"))
                                                  for name in ("_footer", "_numbers", "_text_lists")):
        time.sleep(1)
    check = [sys.executable, "-c",
             "import mmfeed.loaders.stores.parquet_direct as d; print(d.direct_ready(), d._started)"]
    assert subprocess.run(check, env=env, capture_output=True, text=True, check=True).stdout.split() == ["True",
                                                                                                         "False"]


def test_one_background_compile_a_machine_at_a_time(tmp_path, monkeypatch):
    """The ranks of a node open the same dataset at once: the first to ask marks the machine and starts the
    compile; the others (other processes: the per-process flag cleared here) start none while the mark is
    fresh, and one starts again once it is stale (a compile that never finished)."""
    import os
    import subprocess
    import tempfile
    import time

    from mmfeed.loaders.stores import parquet_direct

    started = []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kwargs: started.append(argv))
    for _ in range(3):
        monkeypatch.setattr(parquet_direct, "_started", False)
        parquet_direct._warm_up()
    assert len(started) == 1 and started[0][1:] == ["-m", "mmfeed.loaders.stores.parquet_direct", "--nice"]
    (mark,) = tmp_path.glob("mmfeed-parquet-kernels-*")
    old = time.time() - parquet_direct._MACHINE_LOCK_S - 1
    os.utime(mark, (old, old))
    monkeypatch.setattr(parquet_direct, "_started", False)
    parquet_direct._warm_up()
    assert len(started) == 2


def test_a_v2_page_whose_null_count_disagrees_with_its_levels_gives_none(tmp_path):
    """A v2 data page says how many of its levels hold no value (num_nulls): a count the levels do not bear out
    (here one more than pyarrow wrote) means the page is not what its header says, and is not read."""
    rows = [None if k % 5 == 0 else ["x", "y"][: k % 3] for k in range(20)]
    n = sum(max(len(r or []), 1) for r in rows)  # one level for each text, and for each empty or null list
    nulls = n - sum(len(r or []) for r in rows)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"t": pa.array(rows, pa.list_(pa.string()))}), path, data_page_version="2.0",
                   use_dictionary=False, compression="none")
    assert_reads_as_pyarrow(path, [], ["t"])
    # the page header's DataPageHeaderV2 (field 8, a struct: 0x5C), compact-encoded: num_values, num_nulls and
    # num_rows, each field 0x15 (an i32) and its zigzag varint (one byte each below 64)
    data = path.read_bytes()
    header = bytes([0x5C, 0x15, 2 * n, 0x15, 2 * nulls, 0x15, 2 * len(rows)])
    assert data.count(header) == 1
    at = data.index(header) + 4
    path.write_bytes(data[:at] + bytes([2 * (nulls + 1)]) + data[at + 1:])
    assert read_direct(path, [], ["t"]) is None
