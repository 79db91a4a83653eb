"""`shardfeed split`: write a dataset as per-rank shard files plus a manifest.

Separation of concerns: this module owns the *on-disk layout* of a split
dataset -- which rows go into which shard file (`_plan.split_rows`, the same
balanced contiguous ranges the plan gives replicas), the manifest that
records them, and the reader that maps global row ranges back to files. It
reads its inputs through row slicing and its outputs through `_files`; it
knows nothing of devices or strategies (TensorFlow is not imported here).

Why split at all: `ShardedResidentDataset` already reads only the rows a
worker owns, from any file. Splitting makes "the rows a worker owns" one
file per array, so each host can be given only its own files, and a
checksum per file catches a bad copy before it trains on it.

Manifest (`manifest.json`, format version 1)::

    {"format": "shardfeed.split", "format_version": 1, "file_format": "npy",
     "num_rows": 1000, "num_shards": 4,
     "arrays": {"x": {"dtype": "<f4", "row_shape": [32]}, ...},
     "shards": [{"shard_index": 0, "row_start": 0, "row_stop": 250, "num_rows": 250,
                 "files": {"x": {"path": "x-00000-of-00004.npy", "bytes": 32128,
                                 "sha256": "..."}, ...}}, ...]}

File paths are relative to the manifest, so a split directory can be moved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data import files as _files
from shardfeed._data.plan import split_rows

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "shardfeed.split"
FORMAT_VERSION = 1
FILE_FORMATS = ("npy", "parquet")
DEFAULT_CHUNK_BYTES = 64 * 1024**2
# Array names become file names and Parquet column names.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_NUMERIC_KINDS = "biufc"


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
        _files._optional("pyarrow.parquet")
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
        if dtype.kind not in _NUMERIC_KINDS or not array.shape:
            raise TypeError(
                _errors.message(
                    "Each array must be numeric with a leading row dimension.",
                    f"arrays[{name!r}].dtype={dtype}, shape={tuple(array.shape)}",
                    "Convert it to numbers, one row per example, before splitting.",
                )
            )
        if file_format == "parquet" and dtype.kind == "c":
            raise TypeError(
                _errors.message(
                    "Parquet has no complex type.",
                    f"arrays[{name!r}].dtype={dtype}",
                    'Use format="npy", or store real and imaginary parts as two arrays.',
                )
            )
        dtypes[name] = dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
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
        ValueError: For bad names, sizes, format, lengths that disagree, or
            more shards than rows.
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


# -- reading ---------------------------------------------------------------------------------


class _ShardFile(_files.FileArray):
    """One shard file as the manifest describes it, checked on first read.

    Shape and dtype come from the manifest, so building the leaf opens no
    file; the first read opens the file, compares its header with the
    manifest and (with `verify`) its sha256. A worker therefore checks only
    the files holding the rows it reads.
    """

    _handles = ("_inner",)

    def __init__(
        self,
        path: str,
        file_format: str,
        column: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        sha256: str,
        verify: bool,
    ) -> None:
        self.path = path
        self.file_format = file_format
        self.column = column
        self.shape = shape
        self.dtype = dtype
        self.sha256 = sha256
        self.verify = verify
        self.source = path if file_format == "npy" else f"{path}[{column!r}]"
        self._inner: _files.FileArray | None = None

    def _open(self) -> _files.FileArray:
        if self.verify:
            with open(self.path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != self.sha256:
                raise ValueError(
                    _errors.message(
                        "A shard file's sha256 must match the manifest.",
                        f"{self.path} sha256={digest}, manifest sha256={self.sha256}",
                        "The file changed or was copied incompletely; copy it again "
                        "(or split again). Pass `verify=False` only to skip the check.",
                    )
                )
        if self.file_format == "npy":
            inner = _files.npy(self.path)
        else:
            inner = _files.parquet(self.path, self.column)
        if inner.shape != self.shape or inner.dtype != self.dtype:
            raise ValueError(
                _errors.message(
                    "A shard file must hold the rows, dtype and row shape the manifest says.",
                    f"{inner.source} shape={inner.shape} dtype={inner.dtype}, manifest "
                    f"shape={self.shape} dtype={self.dtype}",
                    "The file does not belong to this manifest; split the data again.",
                )
            )
        return inner

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._inner is None:
            self._inner = self._open()
        self._inner._read_into(start, stop, out)


def _manifest_error(path: Path, problem: str) -> ValueError:
    return ValueError(
        _errors.message(
            f"The manifest must be one written by `shardfeed split` (format "
            f"{FORMAT_NAME!r}, version {FORMAT_VERSION}).",
            f"{path}: {problem}",
            "Split the data again with `shardfeed split`, or pass the manifest's path.",
        )
    )


_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def _check_entry(path: Path, where: str, entry: Any) -> None:
    """Refuses a shard file entry that is not `{"path": str, "bytes": int, "sha256": hex}`."""
    if not isinstance(entry, dict):
        problem = f"{where} is a {type(entry).__name__}, not an object"
    elif not isinstance(entry.get("path"), str) or not entry["path"]:
        problem = f"{where}.path={entry.get('path')!r} (needs a non-empty string)"
    elif isinstance(entry.get("bytes"), bool) or not isinstance(entry.get("bytes"), int):
        problem = f"{where}.bytes={entry.get('bytes')!r} (needs an integer)"
    elif entry["bytes"] < 0:
        problem = f"{where}.bytes={entry['bytes']!r} (needs an integer >= 0)"
    elif not isinstance(entry.get("sha256"), str) or not _SHA256_RE.fullmatch(entry["sha256"]):
        problem = f"{where}.sha256={entry.get('sha256')!r} (needs 64 lowercase hex digits)"
    else:
        return
    raise _manifest_error(path, problem)


def _confined(path: Path, root: str, where: str, name: str) -> Path:
    """The shard file `name` under the manifest's directory `root` (a realpath),
    refusing absolute paths and any that resolve (`..`, symlinks) outside it."""
    resolved = os.path.realpath(os.path.join(root, name))
    if os.path.isabs(name) or os.path.commonpath([root, resolved]) != root:
        raise ValueError(
            _errors.message(
                "A manifest's shard files must lie inside the manifest's directory: "
                "relative paths that stay inside it after `..` and symlinks are resolved.",
                f"{path} {where}.path={name!r}",
                "Copy the shard files into the manifest's directory and list them by "
                "name, or split the data again with `shardfeed split`.",
            )
        )
    return path.parent / name


def manifest(path: str | os.PathLike, verify: bool = True) -> dict[str, _files.FileArray]:
    """Lazy leaves over a split dataset, one per array, in global row order.

    Only `manifest.json` is read here, and each shard file's size is checked
    (a stat, no read). Shard file paths must be relative and stay inside the
    manifest's directory once `..` and symlinks are resolved; any other path
    is refused before that file is looked at. A shard file is opened on the first read of one of its
    rows; its header is compared with the manifest and, with `verify`, its
    sha256 is checked first (one extra pass over that file). Workers reading
    only their rows thus open and verify only their own files.

    Args:
        path: The `manifest.json`, or the directory holding it.
        verify: Check each shard file's sha256 before its first read.

    Returns:
        `{name: FileArray}` with `shape == (num_rows, *row_shape)`.

    Raises:
        FileNotFoundError: If the manifest or a shard file is missing.
        ValueError: For a manifest of another format or version, rows that
            do not add up, a malformed file entry (naming the shard index and
            array), a path outside the manifest's directory, a shard file of
            the wrong size; on read, a
            checksum or header mismatch (naming the file).

    Example:
        >>> leaves = shardfeed.files.manifest("train_split/")
        >>> ds = shardfeed.ShardedResidentDataset(leaves["x"], leaves["y"], ...)
    """
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(
            _errors.message(
                "The split dataset's manifest must exist.",
                f"path={os.fspath(path)!r}",
                "Pass the directory `shardfeed split --out` wrote, or its manifest.json.",
            )
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise _manifest_error(path, f"not JSON ({err})") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise _manifest_error(path, "format is not 'shardfeed.split'")
    if data.get("format_version") != FORMAT_VERSION:
        raise _manifest_error(
            path, f"format_version={data.get('format_version')!r} (this reader: {FORMAT_VERSION})"
        )
    try:
        file_format = data["file_format"]
        num_rows = int(data["num_rows"])
        arrays = {
            name: (np.dtype(spec["dtype"]), tuple(int(d) for d in spec["row_shape"]))
            for name, spec in data["arrays"].items()
        }
        shards = [(int(s["row_start"]), int(s["row_stop"]), s["files"]) for s in data["shards"]]
    except (KeyError, TypeError, ValueError) as err:
        raise _manifest_error(path, f"missing or malformed field {err}") from err
    if file_format not in FILE_FORMATS:
        raise _manifest_error(path, f"file_format={file_format!r}")
    for name, (dtype, row_shape) in arrays.items():
        if dtype.kind not in _NUMERIC_KINDS or any(d < 0 for d in row_shape):
            raise _manifest_error(
                path, f"arrays[{name!r}] dtype={dtype.str}, row_shape={list(row_shape)}"
            )
    expected_start = 0
    for start, stop, _ in shards:
        if start != expected_start or stop < start:
            raise _manifest_error(
                path, f"shard rows [{start}, {stop}) do not follow row {expected_start}"
            )
        expected_start = stop
    if expected_start != num_rows:
        raise _manifest_error(path, f"shards hold {expected_start} rows, num_rows={num_rows}")
    root = os.path.realpath(path.parent)
    leaves = {}
    for name, (dtype, row_shape) in arrays.items():
        parts = []
        for index, (start, stop, files) in enumerate(shards):
            entry = files.get(name) if isinstance(files, dict) else None
            if entry is None:
                raise _manifest_error(
                    path, f"shard rows [{start}, {stop}) list no file for {name!r}"
                )
            where = f"shards[{index}].files[{name!r}]"
            _check_entry(path, where, entry)
            # Checked before the file is looked at, so a manifest cannot make
            # shardfeed open, hash or even stat a file outside its directory.
            file_path = _confined(path, root, where, entry["path"])
            if not file_path.is_file():
                raise FileNotFoundError(
                    _errors.message(
                        "Every shard file the manifest lists must exist.",
                        f"{file_path} (array {name!r}, rows [{start}, {stop}))",
                        "Copy the whole split directory, or split the data again.",
                    )
                )
            # An .npy shard holds at least its rows' bytes: a row_shape that
            # claims more is refused here, before any memory is planned for it.
            data_bytes = (stop - start) * math.prod(row_shape) * dtype.itemsize
            if file_format == "npy" and entry["bytes"] < data_bytes:
                raise _manifest_error(
                    path,
                    f"{where}.bytes={entry['bytes']} is less than its {stop - start} rows of "
                    f"{dtype.str}{list(row_shape)} take ({data_bytes} bytes)",
                )
            size = file_path.stat().st_size
            if size != entry["bytes"]:
                raise ValueError(
                    _errors.message(
                        "A shard file must have the size the manifest records.",
                        f"{file_path} expected_bytes={entry['bytes']}, actual_bytes={size}",
                        "The file is truncated or was replaced; copy it again.",
                    )
                )
            parts.append(
                _ShardFile(
                    os.fspath(file_path),
                    file_format,
                    name,
                    (stop - start, *row_shape),
                    dtype,
                    entry["sha256"],
                    verify,
                )
            )
        leaves[name] = _files.concat(parts, source=f"{path}[{name!r}]")
    return leaves


# -- command line ----------------------------------------------------------------------------


def _open_input(spec: str) -> tuple[str, Any]:
    """Parses `name=path.npy` (or `name=file.npz:key`, `.h5:dataset`,
    `.parquet:column`) into a name and a lazy leaf."""
    name, sep, location = spec.partition("=")
    if not sep or not name or not location:
        raise ValueError(
            _errors.message(
                "Each input must be written `name=path`.",
                f"input={spec!r}",
                "Write e.g. `x=train_x.npy y=train_y.npy`.",
            )
        )
    if location.lower().endswith(".npy"):
        return name, _files.npy(location)
    file_path, sep, field = location.rpartition(":")
    suffix = Path(file_path).suffix.lower()
    openers = {".npz": _files.npz, ".parquet": _files.parquet, ".pq": _files.parquet}
    openers.update(dict.fromkeys(_files._HDF5_SUFFIXES, _files.hdf5))
    if not sep or suffix not in openers or not field:
        raise ValueError(
            _errors.message(
                "An input must be a .npy file, or `file.npz:key`, `file.h5:dataset` or "
                "`file.parquet:column`.",
                f"input={spec!r}",
                "Name the array inside .npz, HDF5 and Parquet files after a colon.",
            )
        )
    return name, openers[suffix](file_path, field)


def open_inputs(
    specs: Sequence[str], open_one: Callable[[str], tuple[str, Any]] | None = None
) -> dict[str, Any]:
    """Opens `name=...` input specs (the CLI's positional arguments) by name.

    Args:
        specs: The specs, e.g. `x=x.npy`, `y=data.npz:labels`.
        open_one: Parses one spec into `(name, leaf)`; default `_open_input`.

    Returns:
        `{name: leaf}` in the order given.

    Raises:
        ValueError: If a name is given twice, or as `open_one` raises.
    """
    open_one = open_one or _open_input
    arrays: dict[str, Any] = {}
    for spec in specs:
        name, leaf = open_one(spec)
        if name in arrays:
            raise ValueError(
                _errors.message(
                    "Each input needs its own name.",
                    f"name={name!r} given twice",
                    "Rename one of the inputs.",
                )
            )
        arrays[name] = leaf
    return arrays


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds `shardfeed split`'s arguments to `parser`."""
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="NAME=PATH",
        help="arrays to split: name=file.npy, name=file.npz:key, name=file.h5:dataset or "
        "name=file.parquet:column (all with the same number of rows)",
    )
    parser.add_argument(
        "--num-shards", type=int, required=True, help="shards per array (usually the workers)"
    )
    parser.add_argument("--out", required=True, help="directory to write the shards into")
    parser.add_argument("--format", choices=FILE_FORMATS, default="npy", help="shard file format")
    parser.add_argument(
        "--chunk-mib",
        type=int,
        default=DEFAULT_CHUNK_BYTES // 1024**2,
        help="MiB of one array read at a time (bounds host memory; default 64)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing split")


def run(args: argparse.Namespace) -> int:
    """Runs `shardfeed split`; returns the exit status (0 on success, 2 on bad input)."""
    try:
        arrays = open_inputs(args.inputs)
        path = split(
            arrays,
            args.out,
            args.num_shards,
            args.format,
            chunk_bytes=args.chunk_mib * 1024**2,
            overwrite=args.overwrite,
        )
    except (ValueError, TypeError, OSError) as err:
        print(f"shardfeed split: error: {err}", file=sys.stderr)
        return 2
    summary = json.loads(path.read_text())
    print(
        f"shardfeed split: wrote {summary['num_rows']} rows of {', '.join(arrays)} as "
        f"{args.num_shards} shard(s) of {args.format} files; manifest: {path}"
    )
    return 0
