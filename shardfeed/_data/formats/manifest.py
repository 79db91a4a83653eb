"""Split manifests: the reader `files.manifest` and the manifest format (version 1).

`manifest.json` maps global row ranges to shard files (paths relative to it,
confined to its directory, with sizes and sha256); each array reads back as
one leaf over its shards. Written by `_data/split.py`; what is verified:
docs/data.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed._common import checked_open as _checked_open
from shardfeed._common import errors as _errors
from shardfeed._data.formats import npy as _npy
from shardfeed._data.formats import parquet as _parquet
from shardfeed._data.formats.base import FileArray, concat
from shardfeed._data.validate import is_numeric

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "shardfeed.split"
FORMAT_VERSION = 1
FILE_FORMATS = ("npy", "parquet")


class _ShardFile(FileArray):
    """One shard file as the manifest describes it, checked on first read.

    Shape and dtype come from the manifest, so building the leaf opens no
    file; the first read opens the file, compares its header with the
    manifest and (with `verify`) its sha256. A worker therefore checks only
    the files holding the rows it reads.
    """

    _handles = ("_file", "_inner")

    def __init__(
        self,
        path: str,
        file_format: str,
        column: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        sha256: str,
        verify: bool,
        resolved: str,
        identity: tuple[int, int] | None,
    ) -> None:
        self.path = path
        self.file_format = file_format
        self.column = column
        self.shape = shape
        self.dtype = dtype
        self.sha256 = sha256
        self.verify = verify
        self.resolved = resolved
        self.identity = identity
        self.source = path if file_format == "npy" else f"{path}[{column!r}]"
        self._file: Any = None
        self._inner: FileArray | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Another process may read another copy of the directory: it takes
        # the file's identity again, when it first opens it.
        return {**super().__getstate__(), "identity": None}

    def _open_checked(self) -> Any:
        """The shard file, opened without following links, and the very file
        (device and inode) that was checked when the manifest was read: a
        file swapped afterwards (for a symlink, or another file) is refused."""
        try:
            fd = _checked_open.open_checked(self.resolved, self.identity)
        except _checked_open.NotTheCheckedFile as err:
            raise _replaced(self.path, str(err)) from err
        return _ShardHandle(fd, "rb")

    def _open(self) -> FileArray:
        f = self._file = self._open_checked()
        if self.verify:
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
        # Rows are read from this open file, never by path again.
        if self.file_format == "npy":
            inner: Any = _npy.from_file(f, self.path)
            inner.read_from(f)
        else:
            inner = _parquet.parquet(self.path, self.column)
            f.seek(0)
            inner._file = _parquet.open_parquet(f)
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


class _ShardHandle(io.FileIO):
    """An open shard file that a leaf keeps between reads."""

    def __del__(self) -> None:
        # A leaf dropped without `close()` closes its file with it, quietly
        # (leaves are dropped like arrays, not closed like files).
        self.close()


def _replaced(path: str, problem: str) -> ValueError:
    return ValueError(
        _errors.message(
            "A shard file must be the file `files.manifest()` checked: it is opened "
            "without following links, and must be the same file (device and inode).",
            f"{path} {problem}",
            "The split directory changed after the manifest was read (a file was "
            "replaced, or swapped for a symlink); copy it again, then call "
            "`files.manifest()` again.",
        )
    )


def _manifest_error(path: Path, problem: str) -> ValueError:
    return ValueError(
        _errors.message(
            f"The manifest must be one written by `shardfeed split` (format "
            f"{FORMAT_NAME!r}, version {FORMAT_VERSION}).",
            f"{path}: {problem}",
            "Split the data again with `shardfeed split`, or pass the manifest's path.",
        )
    )


class _NotInteger(Exception):
    """A manifest count that is not a JSON integer (becomes `_manifest_error`)."""


def _integer(path: Path, where: str, value: Any) -> int:
    """A count from the manifest: a JSON integer (int() would accept 1000.9 and `true`)."""
    if not _errors.is_integer(value):
        raise _NotInteger(f"{where}={value!r} (needs an integer)")
    return int(value)


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


def _confined(path: Path, root: str, where: str, name: str) -> tuple[Path, str]:
    """The shard file `name` under the manifest's directory `root` (a realpath)
    and its resolved path, refusing absolute paths and any that resolve (`..`,
    symlinks) outside it."""
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
    return path.parent / name, resolved


def manifest(path: str | os.PathLike, verify: bool = True) -> dict[str, FileArray]:
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
            array), a path outside the manifest's directory, a manifest or
            shard file that is not a regular file (a FIFO would block the read
            forever), a shard file of the wrong size; on read, a
            checksum or header mismatch (naming the file).

    Example:
        >>> leaves = shardfeed.files.manifest("train_split/")
        >>> ds = shardfeed.ShardedResidentDataset(leaves["x"], leaves["y"], ...)
    """
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if path.exists() and not path.is_file():
        # A FIFO would block `read_text` forever.
        raise ValueError(
            _errors.message(
                "The split dataset's manifest must be a regular file.",
                f"{os.fspath(path)} is {_checked_open.kind(path.stat().st_mode)}",
                "Pass the manifest.json `shardfeed split --out` wrote (copy the split "
                "directory again).",
            )
        )
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
        num_rows = _integer(path, "num_rows", data["num_rows"])
        arrays = {
            name: (
                np.dtype(spec["dtype"]),
                tuple(
                    _integer(path, f"arrays[{name!r}].row_shape[{i}]", d)
                    for i, d in enumerate(spec["row_shape"])
                ),
            )
            for name, spec in data["arrays"].items()
        }
        shards = [
            (
                _integer(path, f"shards[{i}].row_start", s["row_start"]),
                _integer(path, f"shards[{i}].row_stop", s["row_stop"]),
                s["files"],
            )
            for i, s in enumerate(data["shards"])
        ]
    except _NotInteger as err:
        raise _manifest_error(path, str(err)) from None
    except (KeyError, TypeError, ValueError) as err:
        raise _manifest_error(path, f"missing or malformed field {err}") from err
    if file_format not in FILE_FORMATS:
        raise _manifest_error(path, f"file_format={file_format!r}")
    for name, (dtype, row_shape) in arrays.items():
        if not is_numeric(dtype) or any(d < 0 for d in row_shape):
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
            file_path, resolved = _confined(path, root, where, entry["path"])
            try:
                status = os.lstat(resolved)  # links resolved: the file itself
            except OSError:
                status = None
            if status is not None and not stat.S_ISREG(status.st_mode):
                # A FIFO would block the first read forever (`checked_open`).
                raise ValueError(
                    _errors.message(
                        "Every shard file the manifest lists must be a regular file.",
                        f"{file_path} is {_checked_open.kind(status.st_mode)} (array "
                        f"{name!r}, rows [{start}, {stop}))",
                        "Put the file `shardfeed split` wrote in its place (copy the whole "
                        "split directory again), or split the data again.",
                    )
                )
            if status is None:
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
            size = status.st_size
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
                    resolved,
                    _checked_open.identity(status),
                )
            )
        leaves[name] = concat(parts, source=f"{path}[{name!r}]")
    return leaves
