"""`files.split`: write a dataset as per-rank shard files plus a manifest.

Which rows go into which shard (`plan.split_rows`: the ranges the plan gives
replicas), the files (.npy or Parquet with page checksums), their sha256 and
the manifest (`formats/manifest.py`). Why: each host can be given only its own
files, and a checksum per file catches a bad copy before it trains.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import native, optional
from shardfeed._data.formats.manifest import (
    FILE_FORMATS,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
)
from shardfeed._data.plan import split_rows
from shardfeed._data.validate import check_array

DEFAULT_CHUNK_BYTES = 64 * 1024**2
# Array names become file names and Parquet column names.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class _HashingWriter:
    """A write-only binary file that hashes what passes through it, so the
    checksum costs no second read of the shard."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.bytes_written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._raw.write(view)
        self.sha256.update(view)
        self.bytes_written += len(view)
        return len(view)

    def tell(self) -> int:
        return self.bytes_written

    def flush(self) -> None:
        self._raw.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _shard_file_name(name: str, index: int, num_shards: int, file_format: str) -> str:
    return f"{name}-{index:05d}-of-{num_shards:05d}.{file_format}"


def _chunks(start: int, stop: int, row_bytes: int, chunk_bytes: int):
    rows = max(1, chunk_bytes // max(1, row_bytes))
    for chunk_start in range(start, stop, rows):
        yield chunk_start, min(stop, chunk_start + rows)


def _read_rows(array: Any, start: int, stop: int, dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array[start:stop]), dtype=dtype)


def _write_npy(
    out: _HashingWriter, array: Any, start: int, stop: int, dtype: np.dtype, chunk_bytes: int
) -> None:
    row_shape = tuple(array.shape[1:])
    header = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": (stop - start, *row_shape),
    }
    try:
        np.lib.format.write_array_header_1_0(out, header)
    except ValueError:  # header longer than 64 KiB: only version 2.0 can hold it
        np.lib.format.write_array_header_2_0(out, header)
    row_bytes = math.prod(row_shape) * dtype.itemsize
    for a, b in _chunks(start, stop, row_bytes, chunk_bytes):
        out.write(_read_rows(array, a, b, dtype).reshape(-1).view(np.uint8))


def _arrow_type(dtype: np.dtype, row_shape: tuple[int, ...]) -> Any:
    import pyarrow as pa

    arrow_type = pa.from_numpy_dtype(dtype)
    for width in reversed(row_shape):
        arrow_type = pa.list_(arrow_type, width)
    return arrow_type


def _write_parquet(
    out: _HashingWriter,
    name: str,
    array: Any,
    start: int,
    stop: int,
    dtype: np.dtype,
    chunk_bytes: int,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    row_shape = tuple(array.shape[1:])
    schema = pa.schema([pa.field(name, _arrow_type(dtype, row_shape), nullable=False)])
    row_bytes = math.prod(row_shape) * dtype.itemsize
    # Page checksums let readers (`files.parquet`) detect a damaged page.
    with pq.ParquetWriter(out, schema, write_page_checksum=True) as writer:
        # One row group per chunk: a reader then decodes at most one chunk of
        # one column at a time.
        for a, b in _chunks(start, stop, row_bytes, chunk_bytes):
            values = pa.array(_read_rows(array, a, b, dtype).reshape(-1))
            for width in reversed(row_shape):
                values = pa.FixedSizeListArray.from_arrays(values, width)
            writer.write_batch(pa.record_batch([values], schema=schema))


def _validate(
    arrays: Mapping[str, Any], num_shards: int, file_format: str, chunk_bytes: int
) -> tuple[int, dict[str, np.dtype]]:
    if file_format not in FILE_FORMATS:
        raise ValueError(
            _errors.message(
                f"`format` must be one of {FILE_FORMATS}.",
                f"format={file_format!r}",
                'Use "npy" (fastest to read) or "parquet" (compressed, columnar).',
            )
        )
    if file_format == "parquet":
        optional("pyarrow.parquet")
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(
            _errors.message(
                "`chunk_bytes` must be a positive integer.",
                f"chunk_bytes={chunk_bytes!r}",
                "Use e.g. 64 * 1024**2 (64 MiB).",
            )
        )
    if not isinstance(arrays, Mapping) or not arrays:
        raise ValueError(
            _errors.message(
                "`arrays` must be a non-empty dict of name -> array.",
                f"arrays={type(arrays).__name__}",
                "Pass e.g. `{'x': x, 'y': y}`.",
            )
        )
    dtypes = {}
    for name, array in arrays.items():
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ValueError(
                _errors.message(
                    "Array names become file names: letters, digits, '_', '-' and '.', "
                    "not starting with '.' or '-'.",
                    f"name={name!r}",
                    "Rename the array, e.g. `'x_train'`.",
                )
            )
        if not all(hasattr(array, a) for a in ("shape", "dtype", "__getitem__")):
            raise TypeError(
                _errors.message(
                    "Each array must have a `shape`, a `dtype` and row slicing.",
                    f"type(arrays[{name!r}])={type(array).__name__}",
                    "Pass a NumPy array, a `shardfeed.files` leaf or an h5py dataset.",
                )
            )
        dtype = np.dtype(array.dtype)
        check_array(f"arrays[{name!r}]", tuple(array.shape), dtype, "split")
        if file_format == "parquet" and dtype.kind == "c":
            raise TypeError(
                _errors.message(
                    "Parquet has no complex type.",
                    f"arrays[{name!r}].dtype={dtype}",
                    'Use format="npy", or store real and imaginary parts as two arrays.',
                )
            )
        dtypes[name] = native(dtype)
    lengths = {name: int(array.shape[0]) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(
            _errors.message(
                "All arrays must have the same number of rows.",
                listed,
                "Trim or align the arrays so row i of each belongs to one example.",
            )
        )
    num_rows = next(iter(lengths.values()))
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(
            _errors.message(
                "`num_shards` must be an integer >= 1.",
                f"num_shards={num_shards!r}",
                "Use the number of workers (ranks) that will read the data.",
            )
        )
    if num_shards > num_rows:
        raise ValueError(
            _errors.message(
                "Every shard needs at least one row.",
                f"num_shards={num_shards}, num_rows={num_rows}",
                "Use at most as many shards as rows.",
            )
        )
    return num_rows, dtypes


def split(
    arrays: Mapping[str, Any],
    out_dir: str | os.PathLike,
    num_shards: int,
    format: str = "npy",
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    overwrite: bool = False,
) -> Path:
    """Writes arrays as `num_shards` contiguous shard files each, plus a manifest.

    Rows are split with the plan's `split_rows` (balanced, contiguous: the
    first `num_rows % num_shards` shards get one row more). Each array is
    streamed from its source `chunk_bytes` at a time, so host memory stays at
    about one chunk whatever the data size. Each file's sha256 is computed
    while it is written. The manifest is written last, under a temporary
    name then renamed, so a directory with a manifest is always complete.

    Args:
        arrays: `{name: array}`; NumPy arrays, `shardfeed.files` leaves or
            anything with `shape`, `dtype` and row slicing. All need the same
            number of rows. Names become file names and Parquet columns.
        out_dir: Directory to write into (created if missing).
        num_shards: Number of shards, usually the number of workers.
        format: `"npy"` or `"parquet"` (one column per file; rows of shape
            `(d1, d2, ...)` become nested fixed-size lists, one row group per
            chunk).
        chunk_bytes: Most bytes of one array read from its source at a time.
        overwrite: Replace an existing split in `out_dir` (its manifest is
            removed first; files of the old split with other names are left).

    Returns:
        The path of the written `manifest.json`.

    Raises:
        ValueError: For bad names, sizes, format, lengths that disagree, an
            array without a row dimension, or more shards than rows.
        TypeError: For non-array or non-numeric inputs.
        FileExistsError: If `out_dir` already holds a manifest and
            `overwrite` is False.

    Example:
        >>> path = shardfeed.files.split({"x": x, "y": y}, "train_split", num_shards=4)
        >>> leaves = shardfeed.files.manifest(path)
        >>> ds = shardfeed.ShardedResidentDataset(leaves["x"], leaves["y"], ...)
    """
    num_rows, dtypes = _validate(arrays, num_shards, format, chunk_bytes)
    out = Path(out_dir)
    manifest_path = out / MANIFEST_NAME
    if manifest_path.exists() and not overwrite:
        raise FileExistsError(
            _errors.message(
                "`out_dir` already holds a split dataset.",
                f"out_dir={os.fspath(out_dir)!r} with {MANIFEST_NAME}",
                "Choose an empty directory, or pass `overwrite=True` (`--overwrite`).",
            )
        )
    out.mkdir(parents=True, exist_ok=True)
    if manifest_path.exists():
        # Readers must never see the old manifest next to half-written shards.
        manifest_path.unlink()
    shards = []
    for index, (start, stop) in enumerate(split_rows(num_rows, num_shards)):
        files = {}
        for name, array in arrays.items():
            file_name = _shard_file_name(name, index, num_shards, format)
            with open(out / file_name, "wb") as raw:
                writer = _HashingWriter(raw)
                if format == "npy":
                    _write_npy(writer, array, start, stop, dtypes[name], chunk_bytes)
                else:
                    _write_parquet(writer, name, array, start, stop, dtypes[name], chunk_bytes)
            files[name] = {
                "path": file_name,
                "bytes": writer.bytes_written,
                "sha256": writer.sha256.hexdigest(),
            }
        shards.append(
            {
                "shard_index": index,
                "row_start": start,
                "row_stop": stop,
                "num_rows": stop - start,
                "files": files,
            }
        )
    manifest_data = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "file_format": format,
        "num_rows": num_rows,
        "num_shards": num_shards,
        "arrays": {
            name: {"dtype": dtypes[name].str, "row_shape": [int(d) for d in a.shape[1:]]}
            for name, a in arrays.items()
        },
        "shards": shards,
    }
    tmp = out / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest_data, indent=1) + "\n")
    os.replace(tmp, manifest_path)
    return manifest_path
