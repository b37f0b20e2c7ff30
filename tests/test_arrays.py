"""npy/npz bytes and parquet list columns become numpy arrays without extra copies, checked against promises."""

import io
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.codecs import DecodeError, check_array, column_to_numpy, load_npy, load_npz


def npy_bytes(array, **kw):
    buf = io.BytesIO()
    np.save(buf, array, **kw)
    return buf.getvalue()


@settings(max_examples=40)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3),
    dtype=st.sampled_from(["float32", "float64", "int8", "int64", "uint16", ">i4", "bool", "complex64"]),
    fortran=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_npy_round_trips_every_dtype_shape_and_order_as_a_view(shape, dtype, fortran, seed):
    """load_npy gives back the saved array exactly, and its memory lies inside the given bytes."""
    rng = np.random.default_rng(seed)
    array = (rng.standard_normal(shape) * 50).astype(dtype)
    if fortran:
        array = np.asfortranarray(array)
    data = npy_bytes(array)
    got = load_npy(data)
    assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)
    if array.size:
        assert np.shares_memory(got, np.frombuffer(data, dtype=np.uint8))
        assert not got.flags.writeable
    owned = load_npy(data, copy=True)
    assert owned.flags.writeable and owned.flags.c_contiguous and np.array_equal(owned, array)


def test_npy_from_bytearray_and_memoryview_slices_stays_zero_copy():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    blob = bytearray(b"xx" + npy_bytes(array) + b"yy")
    got = load_npy(memoryview(blob)[2:-2])
    assert np.array_equal(got, array) and np.shares_memory(got, np.frombuffer(blob, np.uint8))


def test_npy_bad_bytes_raise_decode_errors_naming_the_key():
    data = npy_bytes(np.arange(10, dtype=np.int64))
    with pytest.raises(DecodeError, match="ep3.action.npy: not .npy bytes"):
        load_npy(b"hello world", key="ep3.action.npy")
    with pytest.raises(DecodeError, match=r"ep3.action.npy: truncated .npy: header promises \(10,\) int64"):
        load_npy(data[:-8], key="ep3.action.npy")
    with pytest.raises(DecodeError, match="object arrays need pickle"):
        load_npy(npy_bytes(np.array([{"a": 1}], dtype=object), allow_pickle=True), key="k")


@settings(max_examples=60)
@given(
    dtype=st.sampled_from(["<f4", ">f8", "|b1", "<U7", "|S3", "<c16", "<M8[ns]", "<m8[s]", [("a", "<i4"), ("b", ">f8")],
                           [("xyz", "<u2", (2, 3)), ("w", [("inner", "|u1")])], ("<f4", (2,))]),
    shape=st.lists(st.integers(0, 3), min_size=0, max_size=4),
    fortran=st.booleans(),
    version=st.sampled_from([(1, 0), (2, 0), (3, 0)]),
)
def test_npy_header_is_read_as_numpy_reads_it(dtype, shape, fortran, version):
    """Every header numpy writes (structured and sub-array dtypes, every format version) gives numpy's own dtype,
    shape and order, read without ast or compile."""
    array = np.zeros(shape, dtype=np.dtype(dtype))
    array = np.asfortranarray(array) if fortran else array
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version)
    data = buf.getvalue()
    buf.seek(0)
    want = np.lib.format.read_array(buf)
    got = load_npy(data)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert got.flags.f_contiguous == want.flags.f_contiguous


def npy_with_header(header: str, payload: bytes = b"") -> bytes:
    raw = header.encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + payload


@pytest.mark.parametrize("header, match", [
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (__import__('os').getpid(),), }", "unexpected text"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", "exactly 'descr'"),
    ("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "True or False"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "non-negative"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2**40,)}", "unexpected text"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * 40 + ")" * 40 + "}", "nested deeper than 32"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}", "holds 7.92e\\+28"),
    ("[1, 2", "unexpected text|expected"),
])
def test_malformed_npy_headers_are_refused_in_one_short_line(header, match):
    """Calls, unknown keys, wrong types, negative or overflowing shapes and deep nesting are refused by name;
    the message stays short whatever the header holds."""
    with pytest.raises(DecodeError, match=match) as err:
        load_npy(npy_with_header(header), key="ep0.action.npy")
    assert str(err.value).startswith("ep0.action.npy: malformed .npy header") and len(str(err.value)) < 400
    assert "\n" not in str(err.value)


def test_npy_header_longer_than_numpys_limit_is_refused_before_it_is_read():
    """A 30 MB header (numpy caps headers at 10,000 bytes) is refused from its length field alone."""
    data = b"\x93NUMPY\x02\x00" + (30_000_000).to_bytes(4, "little") + b"{"
    with pytest.raises(DecodeError, match=r"ep0.action.npy: .npy header of 30000000 bytes is longer than 10000"):
        load_npy(data, key="ep0.action.npy")
    with pytest.raises(DecodeError, match=r"truncated .npy: the header needs 118 bytes, 50 follow"):
        load_npy(npy_bytes(np.zeros(3))[:60], key="k")


def test_npy_read_from_many_threads_at_once():
    """Threads that read arrays at once (worker_mode="thread" does) each get their own array back exactly;
    headers are all distinct, so none is served from the parse cache."""
    from concurrent.futures import ThreadPoolExecutor

    blobs = [npy_bytes(np.arange(i % 97 + 1, dtype=np.float64).reshape(-1, 1) * i) for i in range(4000)]
    blobs += [npy_bytes(np.zeros((2,) * (i % 5 + 1), np.dtype([("f%d" % i, "<i4")]))) for i in range(4000)]

    # numpy's reader is the oracle, run here in one thread: it parses headers with ast, which CPython 3.11 does not
    # keep safe across threads ("AST constructor recursion depth mismatch"), the reason load_npy has its own parser
    want = [np.lib.format.read_array(io.BytesIO(b)) for b in blobs]

    def read(i):
        return np.array_equal(load_npy(blobs[i]), want[i])

    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(read, range(len(blobs)), chunksize=8))


def test_expected_dtype_and_shape_with_wildcards():
    array = np.zeros((5, 7), np.float32)
    data = npy_bytes(array)
    assert load_npy(data, expect_dtype=np.float32, expect_shape=(None, 7)).shape == (5, 7)
    with pytest.raises(DecodeError, match=r"ep1.observation.state.npy: dtype is float32, expected float64"):
        load_npy(data, key="ep1.observation.state.npy", expect_dtype="float64")
    with pytest.raises(DecodeError, match=r"ep1.observation.state.npy: shape is \(5, 7\), expected \(\*, 6\)"):
        load_npy(data, key="ep1.observation.state.npy", expect_shape=(None, 6))
    with pytest.raises(DecodeError, match=r"expected \(5,\)"):
        check_array(array, key="x", expect_shape=(5,))


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_members_load_and_stored_ones_are_views(compressed):
    arrays = {"observation.state": np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32),
              "ids": np.arange(4)}
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    data = buf.getvalue()
    got = load_npz(data, key="ep.npz")
    assert sorted(got) == ["ids", "observation.state"]
    for name, array in arrays.items():
        assert np.array_equal(got[name], array) and got[name].dtype == array.dtype
        assert np.shares_memory(got[name], np.frombuffer(data, np.uint8)) == (not compressed)
    with pytest.raises(DecodeError, match="ep.npz: not .npz bytes"):
        load_npz(b"not a zip", key="ep.npz")


def test_fixed_size_list_column_is_a_zero_copy_2d_view():
    values = np.arange(20, dtype=np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(values), 4)
    got = column_to_numpy(column, key="action", expect_dtype=np.float32, expect_shape=(None, 4))
    assert got.shape == (5, 4) and np.array_equal(got, values.reshape(5, 4))
    assert np.shares_memory(got, column.values.to_numpy())
    sliced = column_to_numpy(column.slice(1, 3))  # a slice keeps its offset into the same buffer
    assert np.array_equal(sliced, values.reshape(5, 4)[1:4])


def test_list_columns_nested_lists_and_parquet_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    state = rng.standard_normal((6, 2, 3)).astype(np.float32)
    table = pa.table(
        {
            "state": pa.array(state.tolist(), type=pa.list_(pa.list_(pa.float32(), 3), 2)),
            "action": pa.array(state.reshape(6, 6).tolist(), type=pa.list_(pa.float32())),
            "index": pa.array(np.arange(6)),
        }
    )
    pq.write_table(table, tmp_path / "data.parquet", row_group_size=4)  # two row groups -> two chunks
    back = pq.read_table(tmp_path / "data.parquet")
    assert back["state"].num_chunks == 2
    assert np.array_equal(column_to_numpy(back["state"], expect_shape=(6, 2, 3)), state)
    assert np.array_equal(column_to_numpy(back["action"], expect_shape=(None, 6)), state.reshape(6, 6))
    assert column_to_numpy(back["index"]).tolist() == list(range(6))


def test_ragged_lists_nulls_and_wrong_types_raise_naming_the_key():
    with pytest.raises(DecodeError, match=r"observation.state: rows hold lists of different lengths \(1..3\)"):
        column_to_numpy(pa.array([[1.0], [1.0, 2.0, 3.0]]), key="observation.state")
    with pytest.raises(DecodeError, match="action: holds 1 null values"):
        column_to_numpy(pa.array([[1.0, 2.0], None]), key="action")
    with pytest.raises(TypeError, match="pyarrow Array or ChunkedArray"):
        column_to_numpy([1, 2, 3], key="action")
    with pytest.raises(DecodeError, match=r"action: dtype is float64, expected float32"):
        column_to_numpy(pa.array([[1.0, 2.0]]), key="action", expect_dtype=np.float32)


def test_no_read_path_parses_python_source():
    """ast, compile, eval and exec are neither thread-safe nor bounded on hostile input: the library uses none."""
    root = __import__("pathlib").Path(__file__).resolve().parent.parent
    found = []
    for folder in ("mmfeed", "packing", "loaders", "codecs"):
        for path in (root / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if re.search(r"\bimport ast\b|\bliteral_eval\(|(?<![.\w])(eval|exec|compile)\(", code):
                    found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert not found, found
