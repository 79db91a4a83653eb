"""File sources (`shardfeed.files`): round trips, error text, pickling, memory.

Data is tiny except in the one memory test, which measures a fresh process.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import zipfile

import h5py
import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardfeed
from shardfeed import files
from shardfeed._data import sources as _sources

ROWS = 23
# Row ranges: whole, interior, a single row, empty, the last row, and ones
# crossing the 6-row boundaries used for Parquet row groups and shards.
RANGES = [(0, ROWS), (3, 9), (7, 8), (5, 5), (ROWS - 1, ROWS), (5, 13), (11, 19)]


def _data(dtype: str = "float32", row_shape: tuple[int, ...] = (3,)) -> np.ndarray:
    size = ROWS * int(np.prod(row_shape, dtype=np.int64))
    return np.arange(size).astype(dtype).reshape((ROWS, *row_shape))


def _assert_ranges(leaf, expected: np.ndarray) -> None:
    assert leaf.shape == expected.shape
    assert leaf.ndim == expected.ndim and len(leaf) == len(expected)
    assert leaf.dtype == expected.dtype.newbyteorder("=")
    for start, stop in RANGES:
        rows = leaf[start:stop]
        assert rows.flags.c_contiguous
        np.testing.assert_array_equal(rows, expected[start:stop], err_msg=f"[{start}:{stop}]")
    np.testing.assert_array_equal(leaf[-4:], expected[-4:])
    np.testing.assert_array_equal(leaf[:], expected)
    np.testing.assert_array_equal(np.asarray(leaf), expected)


# -- .npy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, row_shape",
    [
        ("float32", (3,)),
        ("uint8", (2, 4)),  # images stay uint8
        ("bool", ()),  # 1-D
        (">f8", (3,)),  # big-endian file: read as native float64
        ("complex64", (2,)),
    ],
)
def test_npy_round_trip(tmp_path, dtype, row_shape):
    data = _data(dtype, row_shape)
    np.save(tmp_path / "a.npy", data)
    _assert_ranges(files.npy(tmp_path / "a.npy"), data)


def test_npy_leaf_pickles_and_reads(tmp_path):
    data = _data()
    np.save(tmp_path / "a.npy", data)
    leaf = pickle.loads(pickle.dumps(files.npy(tmp_path / "a.npy")))
    np.testing.assert_array_equal(leaf[4:10], data[4:10])


@pytest.mark.parametrize(
    "index",
    [
        3,  # an integer
        slice(0, 10, 2),  # a step
        (slice(0, 2), 0),  # a tuple
        np.array([0, 1]),  # fancy indexing
    ],
)
def test_getitem_refuses_anything_but_a_row_range(tmp_path, index):
    np.save(tmp_path / "a.npy", _data())
    leaf = files.npy(tmp_path / "a.npy")
    with pytest.raises(TypeError, match=r"reads contiguous row ranges only .* Received: index="):
        leaf[index]


def test_npy_refuses_object_dtype(tmp_path):
    np.save(tmp_path / "o.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(TypeError) as info:
        files.npy(tmp_path / "o.npy")
    assert str(info.value) == (
        "Object arrays cannot be read: their rows are pickled Python objects (shardfeed never "
        "unpickles, `allow_pickle` stays off) and could not be uploaded to a device anyway. "
        f"Received: {tmp_path / 'o.npy'}.dtype=object. Convert the data to a numeric dtype and "
        "save it again, e.g. `np.save(path, np.stack(list_of_arrays).astype('float32'))`."
    )


def test_npy_refuses_strings(tmp_path):
    np.save(tmp_path / "s.npy", np.array(["a", "bc"]))
    with pytest.raises(TypeError, match=r"must be numeric .* Received: .*s\.npy\.dtype=<U2\."):
        files.npy(tmp_path / "s.npy")


def test_npy_refuses_fortran_order(tmp_path):
    np.save(tmp_path / "f.npy", np.asfortranarray(_data()))
    with pytest.raises(ValueError) as info:
        files.npy(tmp_path / "f.npy")
    assert str(info.value) == (
        "Rows must be contiguous in the file (C order) so a row range is one read; a "
        "Fortran-order file interleaves every row with all others. Received: "
        f"{tmp_path / 'f.npy'} fortran_order=True, shape=(23, 3). Save it in C order: "
        "`np.save(path, np.ascontiguousarray(array))`."
    )


def test_npy_refuses_truncated_file(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, _data())  # 128-byte header + 23 * 3 * 4 bytes
    with open(path, "r+b") as f:
        f.truncate(128 + 100)
    with pytest.raises(ValueError) as info:
        files.npy(path)
    assert str(info.value) == (
        "The file must hold exactly the bytes its header describes. Received: "
        f"{path} expected_bytes=404, actual_bytes=228. The file is truncated or was not "
        "written completely; write it again (e.g. `np.save`) and check the copy finished."
    )


def test_npy_header_whose_shape_overflows_int64_is_refused(tmp_path):
    # A hand-written header: 2**40 x 2**40 float64 rows. The element count
    # (2**80) wraps to 0 in int64, so a NumPy product would call 0 bytes right.
    path = tmp_path / "hostile.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f8", "fortran_order": False, "shape": (2**40, 2**40)}
        )
    assert int(np.prod((2**40, 2**40), dtype=np.int64)) == 0
    with pytest.raises(ValueError) as info:
        files.npy(path)
    assert str(info.value) == (
        "The file must hold exactly the bytes its header describes. Received: "
        f"{path} expected_bytes={128 + 2**80 * 8}, actual_bytes=128. The file is truncated "
        "or was not written completely; write it again (e.g. `np.save`) and check the copy "
        "finished."
    )
    # Negative dimensions whose product is positive are refused too.
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f8", "fortran_order": False, "shape": (-2, -2)}
        )
        f.write(bytes(32))
    with pytest.raises(ValueError) as info:
        files.npy(path)
    assert str(info.value) == (
        "Every dimension of an array must be >= 0. Received: "
        f"{path}.shape=(-2, -2). The header is damaged; write the file again (e.g. `np.save`)."
    )


def test_npy_truncated_after_open_is_caught_on_read(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, _data())
    leaf = files.npy(path)
    with open(path, "r+b") as f:
        f.truncate(128 + 100)
    np.testing.assert_array_equal(leaf[0:8], _data()[0:8])  # rows still on disk
    with pytest.raises(ValueError, match=r"expected_bytes=404, actual_bytes=228\."):
        leaf[0:ROWS]


def test_npy_refuses_scalar_and_non_npy_and_missing(tmp_path):
    np.save(tmp_path / "scalar.npy", np.float32(1))
    with pytest.raises(
        ValueError, match=r"leading row dimension\. Received: .*scalar\.npy\.shape=\(\)"
    ):
        files.npy(tmp_path / "scalar.npy")
    (tmp_path / "text.npy").write_text("not an array")
    with pytest.raises(ValueError, match=r"must be a \.npy array .* Received: .*text\.npy: "):
        files.npy(tmp_path / "text.npy")
    with pytest.raises(FileNotFoundError, match=r"must exist .* Received: path='.*nope\.npy'"):
        files.npy(tmp_path / "nope.npy")


# -- .npz ------------------------------------------------------------------------------------


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
def test_npz_round_trip(tmp_path, save):
    data, labels = _data("float64", (2, 3)), np.arange(ROWS, dtype=">i4")
    save(tmp_path / "d.npz", x=data, y=labels)
    _assert_ranges(files.npz(tmp_path / "d.npz", "x"), data)
    _assert_ranges(files.npz(tmp_path / "d.npz", "y"), labels)


def test_npz_stored_member_is_read_in_place(tmp_path):
    np.savez(tmp_path / "d.npz", x=_data())
    assert type(files.npz(tmp_path / "d.npz", "x")).__name__ == "_StoredNpzArray"


def _flip_byte(path, needle: bytes) -> None:
    """Flips one bit of the first occurrence of `needle` in the file."""
    raw = bytearray(path.read_bytes())
    at = raw.index(needle)
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def test_npz_stored_member_is_checked_against_its_crc(tmp_path):
    path = tmp_path / "d.npz"
    # Large enough (24 KB) that reading the header does not reach the member's end.
    data = np.arange(6000, dtype="float32").reshape(2000, 3)
    np.savez(path, x=data)
    _flip_byte(path, data[1500].tobytes())  # a data byte of row 1500; the header stays valid
    with pytest.raises(zipfile.BadZipFile, match=r"Bad CRC-32 for file 'x\.npy'"):
        np.load(path)["x"]  # what NumPy does with the same file
    leaf = files.npz(path, "x")
    # Any read checks the whole member first, even of rows far from the damage.
    with pytest.raises(ValueError) as info:
        leaf[0:2]
    message = str(info.value)
    assert re.fullmatch(
        r"A \.npz member's bytes must match the CRC-32 its archive records\. Received: "
        + re.escape(f"{path}['x'] (member 'x.npy')")
        + r" crc32=0x[0-9a-f]{8}, recorded crc32=0x[0-9a-f]{8}\. The archive is damaged or "
        r"was copied incompletely; write it again with `np\.savez` \(or copy it again\)\. "
        r"Pass `verify=False` only to skip the check\.",
        message,
    ), message
    # verify=False reads the damaged bytes as they are; an undamaged file passes.
    assert not np.array_equal(files.npz(path, "x", verify=False)[:], data)
    np.savez(tmp_path / "ok.npz", x=data)
    np.testing.assert_array_equal(files.npz(tmp_path / "ok.npz", "x")[3:9], data[3:9])


def test_npz_deflated_member_damage_names_archive_and_member(tmp_path):
    path = tmp_path / "d.npz"
    np.savez_compressed(path, x=np.random.default_rng(0).random((2000, 8)))
    raw = bytearray(path.read_bytes())
    info = zipfile.ZipFile(path).getinfo("x.npy")
    # A byte in the middle of the deflate stream, past the .npy header.
    raw[info.header_offset + 30 + len("x.npy") + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    leaf = files.npz(path, "x")
    with pytest.raises(ValueError) as info_err:
        leaf[0:2]
    message = str(info_err.value)
    assert message.startswith(
        "A .npz member must read back whole: decompress (when compressed) and match the "
        f"CRC-32 its archive records. Received: {path}['x'] (member 'x.npy'): "
    ), message
    assert message.endswith(
        "The archive is damaged or was copied incompletely; write it again "
        "(`np.savez` or `np.savez_compressed`) or copy it again."
    )
    assert re.search(r"\(member 'x\.npy'\): (BadZipFile|error): ", message)


def test_npz_deflated_member_what_verify_false_checks(tmp_path):
    """docs/data.md's table: with `verify=False` a read reaching the member's
    end is CRC-checked; `verify=True` checks a partial read too (a flipped bit
    that still decodes changed 1 of the first half's 7,500 rows, silently)."""
    path = tmp_path / "d.npz"
    np.savez_compressed(path, x=np.random.default_rng(0).normal(size=(15000, 100)).astype("f4"))
    info = zipfile.ZipFile(path).getinfo("x.npy")
    raw = bytearray(path.read_bytes())
    raw[info.header_offset + 30 + len("x.npy") + info.compress_size // 3] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"must read back whole.*\(member 'x\.npy'\)"):
        files.npz(path, "x", verify=False)[7500:15000]
    with pytest.raises(ValueError, match=r"must read back whole.*\(member 'x\.npy'\)"):
        files.npz(path, "x", verify=True)[0:7500]


def test_npz_deflated_reads_sequentially_and_rewinds(tmp_path):
    data = _data()
    np.savez_compressed(tmp_path / "d.npz", x=data)
    leaf = files.npz(tmp_path / "d.npz", "x")
    # Chunks in increasing order continue the open stream...
    for start in range(0, ROWS, 5):
        np.testing.assert_array_equal(leaf[start : start + 5], data[start : start + 5])
        assert leaf._stream.tell() == 128 + min(ROWS, start + 5) * 12
    # ...a backwards jump restarts it, and a pickled copy reopens it.
    np.testing.assert_array_equal(leaf[2:4], data[2:4])
    copy = pickle.loads(pickle.dumps(leaf))
    assert copy._stream is None
    np.testing.assert_array_equal(copy[10:20], data[10:20])
    leaf.close()
    copy.close()


def test_npz_missing_key_lists_keys(tmp_path):
    np.savez(tmp_path / "d.npz", x=_data(), y=_data())
    with pytest.raises(ValueError) as info:
        files.npz(tmp_path / "d.npz", "z")
    assert str(info.value) == (
        "`key` must name an array in the .npz file. Received: key='z' for "
        f"{tmp_path / 'd.npz'}, which holds ['x', 'y']. Pass one of the listed keys."
    )


def test_npz_refuses_object_member_and_broken_zip(tmp_path):
    np.savez(tmp_path / "o.npz", o=np.array([None, 1], dtype=object))
    with pytest.raises(
        TypeError, match=r"Object arrays .* Received: .*o\.npz\['o'\]\.dtype=object"
    ):
        files.npz(tmp_path / "o.npz", "o")
    np.savez(tmp_path / "b.npz", x=_data())
    with open(tmp_path / "b.npz", "r+b") as f:
        f.truncate(200)  # cuts off the zip's central directory
    with pytest.raises(ValueError, match=r"complete zip archive\. Received: path='.*b\.npz'"):
        files.npz(tmp_path / "b.npz", "x")


def test_npz_refuses_truncated_member(tmp_path):
    # A member whose header promises more rows than it holds.
    short = _data()[:10]
    header = {"descr": "<f4", "fortran_order": False, "shape": (ROWS, 3)}
    with zipfile.ZipFile(tmp_path / "t.npz", "w") as archive, archive.open("x.npy", "w") as m:
        np.lib.format.write_array_header_1_0(m, header)
        m.write(short.tobytes())
    with pytest.raises(
        ValueError, match=r"Received: .*t\.npz\['x'\] expected_bytes=404, actual_bytes=248\."
    ):
        files.npz(tmp_path / "t.npz", "x")


# -- HDF5 ------------------------------------------------------------------------------------


def test_hdf5_round_trip_and_pickles_before_opening(tmp_path):
    data = _data("int16", (2, 2))
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("train/x", data=data, chunks=(4, 2, 2))  # chunk edges inside ranges
        f["big_endian"] = data.astype(">f8")
    leaf = files.hdf5(tmp_path / "d.h5", "train/x")
    assert leaf._file is None  # nothing opened until the first read
    _assert_ranges(pickle.loads(pickle.dumps(leaf)), data)
    _assert_ranges(files.hdf5(tmp_path / "d.h5", "big_endian"), data.astype("f8"))
    assert pickle.loads(pickle.dumps(leaf))._file is None  # an opened leaf still pickles
    leaf.close()


def test_hdf5_missing_dataset_lists_names(tmp_path):
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["train/x"] = _data()
        f["y"] = np.arange(ROWS)
    with pytest.raises(ValueError) as info:
        files.hdf5(tmp_path / "d.h5", "train")  # a group, not a dataset
    assert str(info.value) == (
        "`dataset` must name a dataset in the HDF5 file. Received: dataset='train' for "
        f"{tmp_path / 'd.h5'}, which holds datasets ['train/x', 'y']. Pass one of the "
        "listed names (groups are separated by '/')."
    )


def test_hdf5_refuses_strings_and_non_hdf5(tmp_path):
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["names"] = np.array([b"a", b"b"])
    with pytest.raises(
        TypeError, match=r"must be numeric .* Received: .*d\.h5\['names'\]\.dtype=\|S1"
    ):
        files.hdf5(tmp_path / "d.h5", "names")
    np.save(tmp_path / "a.npy", _data())
    with pytest.raises(OSError, match=r"HDF5 file h5py can open\. Received: path='.*a\.npy'"):
        files.hdf5(tmp_path / "a.npy", "x")


# -- Parquet ---------------------------------------------------------------------------------


def _parquet_file(path, **columns) -> None:
    # Row groups of 6 rows, so RANGES cross row-group boundaries.
    pq.write_table(pa.table(columns), path, row_group_size=6)


def test_parquet_round_trip_reads_only_overlapping_row_groups(tmp_path):
    data = _data("float32", (3,))
    cube = _data("int64", (2, 2))
    path = tmp_path / "d.parquet"
    _parquet_file(
        path,
        scalar=np.arange(ROWS, dtype="int32"),
        fixed=pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), 3),
        nested=pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.array(cube.reshape(-1)), 2), 2
        ),
        lists=pa.array([list(row) for row in data]),  # variable-length type, equal lengths
        flag=pa.array(np.arange(ROWS) % 3 == 0),
        text=[str(i) for i in range(ROWS)],
    )
    leaves = files.parquet_columns(path, ["scalar", "fixed", "nested", "lists", "flag"])
    _assert_ranges(leaves["scalar"], np.arange(ROWS, dtype="int32"))
    _assert_ranges(leaves["fixed"], data)
    _assert_ranges(leaves["nested"], cube)
    _assert_ranges(leaves["lists"], data)
    _assert_ranges(leaves["flag"], np.arange(ROWS) % 3 == 0)
    _assert_ranges(pickle.loads(pickle.dumps(files.parquet(path, "fixed"))), data)

    read_groups = []
    leaf = leaves["fixed"]
    original = leaf._file.read_row_group
    leaf._file.read_row_group = lambda i, columns: (
        read_groups.append((i, columns)) or original(i, columns=columns)
    )
    leaf[7:13]  # rows 7..12 lie in row groups 1 (6..11) and 2 (12..17)
    assert read_groups == [(1, ["fixed"]), (2, ["fixed"])]


def test_parquet_missing_column_lists_columns(tmp_path):
    _parquet_file(tmp_path / "d.parquet", a=np.arange(ROWS), b=np.arange(ROWS))
    with pytest.raises(ValueError) as info:
        files.parquet_columns(tmp_path / "d.parquet", ["a", "c", "d"])
    assert str(info.value) == (
        "Each column must be in the Parquet file. Received: columns=['c', 'd'] for "
        f"{tmp_path / 'd.parquet'}, which holds ['a', 'b']. Pass column names from the list."
    )


def test_parquet_refuses_non_numeric_column(tmp_path):
    _parquet_file(tmp_path / "d.parquet", name=[str(i) for i in range(ROWS)])
    with pytest.raises(TypeError) as info:
        files.parquet(tmp_path / "d.parquet", "name")
    assert str(info.value) == (
        "A Parquet column must hold numbers (integers, floats or booleans), or "
        "fixed-size/equal-length lists of them. Received: "
        f"{tmp_path / 'd.parquet'}['name'] type=string. Encode strings, dates or decimals "
        "as numbers before writing the file, or pick a numeric column."
    )


def test_parquet_refuses_unequal_lists_and_nulls_on_read(tmp_path):
    lists = [[1.0, 2.0]] * 14 + [[1.0]] + [[3.0, 4.0]] * (ROWS - 15)
    values = [1.0] * 9 + [None] + [1.0] * (ROWS - 10)
    _parquet_file(tmp_path / "d.parquet", lists=pa.array(lists), values=pa.array(values))
    leaves = files.parquet_columns(tmp_path / "d.parquet", ["lists", "values"])
    assert leaves["lists"].shape == (ROWS, 2)
    np.testing.assert_array_equal(leaves["lists"][0:14], np.array(lists[:14]))
    with pytest.raises(
        ValueError,
        match=r"same length .* Received: .*\['lists'\] row 14 has length 1, expected 2\.",
    ):
        leaves["lists"][10:20]
    np.testing.assert_array_equal(leaves["values"][0:9], np.ones(9))
    with pytest.raises(
        ValueError, match=r"cannot hold nulls.* Received: .*\['values'\] has 1 null"
    ):
        leaves["values"][0:ROWS]


def test_parquet_page_checksums_are_verified(tmp_path):
    path = tmp_path / "d.parquet"
    data = np.arange(1000, dtype="float64") + 0.5
    # Plain, uncompressed pages, so the flipped byte is a value's byte.
    table = pa.table({"x": data})
    pq.write_table(table, path, compression="none", use_dictionary=False, write_page_checksum=True)
    raw = bytearray(path.read_bytes())
    raw[raw.index(data[600].tobytes())] ^= 0x01
    path.write_bytes(bytes(raw))
    leaf = files.parquet(path, "x")
    with pytest.raises(ValueError) as info:
        leaf[0:10]
    assert str(info.value) == (
        "Every page of a Parquet column must decode and match its page checksum (when the "
        f"writer stored one). Received: {path}['x'] row group 0: OSError: could not verify "
        "page integrity, CRC checksum verification failed for page_ordinal 0. The file is "
        "damaged or was copied incompletely; copy or write it again."
    )
    # Without checksums in the file the same damage cannot be seen: a wrong value.
    pq.write_table(table, path, compression="none", use_dictionary=False)
    raw = bytearray(path.read_bytes())
    raw[raw.index(data[600].tobytes())] ^= 0x01
    path.write_bytes(bytes(raw))
    assert files.parquet(path, "x")[600:601][0] != data[600]


# -- directories of shards -------------------------------------------------------------------


def _shards(tmp_path, data, bounds, suffix=".npy", **kwargs):
    for i, (start, stop) in enumerate(bounds):
        path = tmp_path / f"part-{i:03d}{suffix}"
        if suffix == ".npy":
            np.save(path, data[start:stop])
        elif suffix == ".npz":
            np.savez(path, x=data[start:stop])
        else:
            _parquet_file(
                path, x=pa.FixedSizeListArray.from_arrays(pa.array(data[start:stop].reshape(-1)), 3)
            )


@pytest.mark.parametrize("suffix, field", [(".npy", None), (".npz", "x"), (".parquet", "x")])
def test_directory_concatenates_shards_in_name_order(tmp_path, suffix, field):
    data = _data()
    # Uneven shards, one of a single row; RANGES cross every boundary.
    _shards(tmp_path, data, [(0, 6), (6, 7), (7, 12), (12, ROWS)], suffix)
    leaf = files.directory(tmp_path, f"part-*{suffix}", field=field)
    _assert_ranges(leaf, data)
    _assert_ranges(pickle.loads(pickle.dumps(leaf)), data)


def test_directory_refuses_mismatched_shards(tmp_path):
    np.save(tmp_path / "a-0.npy", _data())
    np.save(tmp_path / "a-1.npy", _data("float64"))
    with pytest.raises(TypeError) as info:
        files.directory(tmp_path, "a-*.npy")
    assert str(info.value) == (
        "All shards of one array must share a dtype (nothing is cast silently). Received: "
        f"{tmp_path / 'a-0.npy'}.dtype=float32, {tmp_path / 'a-1.npy'}.dtype=float64. "
        "Write every shard with the same dtype."
    )
    np.save(tmp_path / "b-0.npy", _data())
    np.save(tmp_path / "b-1.npy", _data("float32", (4,)))
    with pytest.raises(
        ValueError,
        match=r"share a row shape\. Received: .*b-0\.npy\.shape=\(23, 3\), "
        r".*b-1\.npy\.shape=\(23, 4\)\.",
    ):
        files.directory(tmp_path, "b-*.npy")


def test_directory_refuses_no_files_mixed_formats_and_missing_field(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"at least one file matching `pattern`\. Received: path="
    ):
        files.directory(tmp_path, "*.npy")
    np.save(tmp_path / "a.npy", _data())
    np.savez(tmp_path / "b.npz", x=_data())
    with pytest.raises(ValueError, match=r"one format\. Received: suffixes=\['\.npy', '\.npz'\]"):
        files.directory(tmp_path, "*")
    with pytest.raises(ValueError, match=r"`field` is required for \.npz files"):
        files.directory(tmp_path, "*.npz")
    with pytest.raises(ValueError, match=r"`field` must not be given for \.npy files"):
        files.directory(tmp_path, "*.npy", field="x")


# -- with the dataset ------------------------------------------------------------------------


def test_mismatched_lengths_across_x_and_y_name_the_leaves(tmp_path):
    np.save(tmp_path / "x.npy", _data())
    np.save(tmp_path / "y.npy", np.arange(ROWS - 1))
    with pytest.raises(ValueError) as info:
        _sources.columns_from_arrays(
            {"image": files.npy(tmp_path / "x.npy")}, files.npy(tmp_path / "y.npy")
        )
    # The optional parts name the files, if `_sources` appends a leaf's `source`.
    assert re.fullmatch(
        r"All arrays must have the same number of rows\. Received: "
        r"x\['image'\] has 23( \(.*x\.npy\))?, y has 22( \(.*y\.npy\))?\. "
        r"Trim or align the arrays so each row of x has its y \(and sample_weight\)\.",
        str(info.value),
    )


def test_dataset_from_npy_files_predicts_like_the_arrays(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 5)).astype("float32")
    y = rng.integers(0, 2, size=(37, 1)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    dataset = shardfeed.ShardedResidentDataset(
        x=files.npy(tmp_path / "x.npy"),
        y=files.npy(tmp_path / "y.npy"),
        per_replica_batch_size=8,  # 37 rows: a partial last step
        shuffle=False,
        load_options=shardfeed.LoadOptions(chunk_bytes=64),  # 3 rows of x per chunk
    )
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    np.testing.assert_allclose(shardfeed.predict(model, dataset), model(x).numpy(), atol=1e-6)


# -- host memory -----------------------------------------------------------------------------

_MEMORY_PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np

    def status():
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

    path, source = sys.argv[1], sys.argv[2]
    import shardfeed
    from shardfeed import files

    options = shardfeed.LoadOptions(chunk_bytes=8 * 1024**2)
    # Warm up TensorFlow (kernels, thread pools, allocator) on a small array
    # through the same code path, so the measurement is about the data.
    shardfeed.ShardedResidentDataset(
        np.zeros((4096, 64), np.float32), per_replica_batch_size=8, shuffle=False,
        load_options=options)
    leaf = files.npy(path) if source == "files.npy" else np.load(path, mmap_mode="r")
    before = status()["VmRSS"]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current VmRSS
    dataset = shardfeed.ShardedResidentDataset(
        leaf, per_replica_batch_size=1024, shuffle=False, load_options=options)
    peak = status()["VmHWM"]
    last = np.asarray(dataset.stores[0].variables[0][-1])
    print(json.dumps({"before": before, "peak": peak,
                      "resident": dataset.nbytes_on_device,
                      "last_row_ok": bool((last == np.asarray(leaf[-1:])[0]).all())}))
    """
)


@pytest.mark.skipif(
    not os.access("/proc/self/clear_refs", os.W_OK),
    reason="needs Linux /proc/self/clear_refs to reset the peak-RSS counter (VmHWM)",
)
@pytest.mark.slow
def test_loading_a_npy_file_keeps_host_memory_near_one_chunk(tmp_path):
    """Loading a ~200 MB .npy file with 8 MiB chunks adds far less than the file.

    What is measured, in a fresh process per source (so nothing earlier in
    pytest counts): VmHWM (peak resident set) during `ShardedResidentDataset`
    construction, after resetting it to the current VmRSS, minus VmRSS
    before. TensorFlow is warmed up first on a small array through the same
    code path, so one-off runtime allocations are not charged to the data.

    What is subtracted: on CPU the "device" is host memory, so the resident
    copy (`nbytes_on_device`, the whole file's rows) is necessarily part of
    the peak. The rest -- `transient = peak - before - resident` -- is what
    loading costs on top of holding the data; on a GPU it is all the host
    would pay. Page cache is not part of RSS, which is the point of reading
    with `readinto` instead of through a memmap.

    Control: the same load from `np.load(mmap_mode="r")`. Its touched file
    pages join the RSS, so its transient is about the file size; the test
    asserts that the control sees that, which shows the measurement can see
    the cost it guards against.

    Measured once when written (Linux, 2 shared cores, TF 2.21 CPU, NumPy
    2.4, one run each): files.npy transient 40 MiB (the storage layer's own
    floor, from an in-memory NumPy array, was 32 MiB: about four 8 MiB
    chunks while converting and assigning; the leaf adds its one output
    chunk), memmap transient 231 MiB (the 200 MiB file plus its chunks).
    """
    rows, width = 200 * 1024**2 // (64 * 4), 64
    path = tmp_path / "big.npy"
    header = {"descr": "<f4", "fortran_order": False, "shape": (rows, width)}
    with open(path, "wb") as f:  # written in 8 MiB pieces: this process stays small too
        np.lib.format.write_array_header_1_0(f, header)
        step = 8 * 1024**2 // (width * 4)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            np.arange(start * width, stop * width, dtype=np.float32).tofile(f)
    file_bytes = os.path.getsize(path)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    probes = {
        source: subprocess.Popen(
            [sys.executable, "-c", _MEMORY_PROBE, str(path), source],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for source in ("files.npy", "memmap")
    }
    transient = {}
    for source, probe in probes.items():
        out, err = probe.communicate(timeout=120)
        assert probe.returncode == 0, err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        assert result["last_row_ok"]
        assert result["resident"] == rows * width * 4
        transient[source] = result["peak"] - result["before"] - result["resident"]
        print(
            f"{source}: file {file_bytes / 2**20:.1f} MiB, RSS before "
            f"{result['before'] / 2**20:.1f} MiB, peak {result['peak'] / 2**20:.1f} MiB, "
            f"resident copy {result['resident'] / 2**20:.1f} MiB, transient "
            f"{transient[source] / 2**20:.1f} MiB ({transient[source] / file_bytes:.1%} of file)"
        )
    assert transient["files.npy"] < 0.25 * file_bytes
    assert transient["memmap"] > 0.75 * file_bytes, "control: the measurement must see memmap pages"
