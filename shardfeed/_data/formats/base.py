"""File leaves: the `FileArray` type, the ranged-read machinery, `concat`, `READERS`.

A leaf (`shape`, `dtype`, `len()`, `leaf[start:stop]`) is accepted wherever an
array is, and holds the path and header, never the data. Why not
`np.load(mmap_mode="r")`: pages a memmap touched count as the process'
memory; one `readinto` per range (`RawArray`) keeps it to one chunk.
"""

from __future__ import annotations

import bisect
import importlib
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors

PathLike = str | os.PathLike

# The one suffix -> reader table (`files.directory` and the CLI's inputs): the
# module of this package and its function of the same name, imported on use
# because the readers import this module.
READERS: dict[str, str] = {
    ".npy": "npy",
    ".npz": "npz",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
    ".he5": "hdf5",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def optional(module: str) -> Any:
    """Imports an optional dependency (h5py, pyarrow), or says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            _errors.message(
                f"Reading and writing this format needs `{module.split('.')[0]}`.",
                f"import {module} failed ({err})",
                "Install it with `pip install shardfeed[files]`.",
            )
        ) from err


def reader_for(suffix: str) -> Callable[..., FileArray] | None:
    """The reader for files with `suffix` (e.g. `".npz"`, any case), or None.

    Example:
        >>> reader_for(".h5")("train.h5", "images")
    """
    name = READERS.get(suffix.lower())
    if name is None:
        return None
    return getattr(importlib.import_module(f"shardfeed._data.formats.{name}"), name)


class FileArray:
    """A lazy, read-only array of rows backed by files.

    Attributes:
        shape: Full shape; `shape[0]` is the number of rows.
        dtype: NumPy dtype of the rows (native byte order).
        source: Where the rows come from, for messages (e.g. `"a.npz['x']"`).

    Only contiguous row ranges can be read: `leaf[start:stop]` (negative and
    omitted bounds as in NumPy) returns a C-contiguous NumPy array of shape
    `(rows, *shape[1:])`. `np.asarray(leaf)` reads every row.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    source: str

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError(
                _errors.message(
                    f"{type(self).__name__} reads contiguous row ranges only "
                    "(`leaf[start:stop]`), so every read is one sequential file read.",
                    f"index={index!r} for {self.source}",
                    "Read the range first and index the NumPy array it returns, "
                    "e.g. `leaf[i:i + 1][0]` or `leaf[start:stop][:, 0]`.",
                )
            )
        start, stop, _ = index.indices(len(self))
        stop = max(start, stop)
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        if stop > start:
            self._read_into(start, stop, out)
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if copy is False:
            raise ValueError(
                _errors.message(
                    "A file-backed leaf cannot be viewed as an array without reading it.",
                    f"copy=False for {self.source}",
                    "Use `np.asarray(leaf)` (reads every row) or `leaf[start:stop]`.",
                )
            )
        rows = self[:]
        return rows if dtype is None else rows.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.source} shape={self.shape} dtype={self.dtype}>"

    def __getstate__(self) -> dict[str, Any]:
        # Open handles cannot cross processes; the receiver reopens on first read.
        state = dict(self.__dict__)
        for name in self._handles:
            state[name] = None
        return state

    # Attributes holding open handles, closed in reverse order (a stream before
    # the archive it reads from) and dropped when pickled.
    _handles: tuple[str, ...] = ()

    def close(self) -> None:
        """Closes handles kept open between reads (reopened on the next read)."""
        for name in reversed(self._handles):
            handle = getattr(self, name, None)
            if handle is not None:
                handle.close()
            setattr(self, name, None)

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        """Fills `out` (C-contiguous, `stop - start` rows) with rows `[start, stop)`."""
        raise NotImplementedError



def check_size(source: str, expected: int, actual: int) -> None:
    if actual != expected:
        raise ValueError(
            _errors.message(
                "The file must hold exactly the bytes its header describes.",
                f"{source} expected_bytes={expected}, actual_bytes={actual}",
                "The file is truncated or was not written completely; write it "
                "again (e.g. `np.save`) and check the copy finished.",
            )
        )


def native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


def byte_view(out: np.ndarray) -> memoryview:
    return memoryview(out.reshape(-1).view(np.uint8).data)


class RawArray(FileArray):
    """Rows stored as raw C-order bytes from `offset` on (a .npy file or a stored
    .npz member). Each read opens the file, seeks and `readinto`s the output, so
    the leaf keeps no state and nothing is buffered twice -- unless a caller
    handed it an open file (`read_from`), which it then reads instead of the path."""

    _handles = ("_file",)
    _file: Any = None

    def read_from(self, file: Any) -> None:
        """Reads rows from `file` (opened and checked by the caller: a manifest's
        shard file, opened without following links) instead of opening the path."""
        self._file = file

    def __init__(
        self, path: str, offset: int, shape: tuple[int, ...], file_dtype: np.dtype, source: str
    ) -> None:
        self.path = path
        self.offset = offset
        self.shape = shape
        self.dtype = native(file_dtype)
        self.source = source
        self._swap = file_dtype != self.dtype
        self._row_bytes = math.prod(shape[1:]) * file_dtype.itemsize

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._file is not None:
            self._fill(self._file, start, stop, out)
        else:
            with open(self.path, "rb", buffering=0) as f:
                self._fill(f, start, stop, out)
        if self._swap:
            out.byteswap(inplace=True)

    def _fill(self, f: Any, start: int, stop: int, out: np.ndarray) -> None:
        view = byte_view(out)
        f.seek(self.offset + start * self._row_bytes)
        filled = 0
        while filled < len(view):
            n = f.readinto(view[filled:])
            if not n:
                check_size(
                    self.source,
                    self.offset + stop * self._row_bytes,
                    self.offset + start * self._row_bytes + filled,
                )
            filled += n



def existing(path: PathLike) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            _errors.message(
                "The data file must exist and be a regular file.",
                f"path={path!r}",
                f"Check the path (relative paths start at the current directory, {os.getcwd()!r}).",
            )
        )
    return path



# -- several files as one leaf ---------------------------------------------------------------


class _ConcatArray(FileArray):
    """Leaves concatenated along rows; a range spanning parts reads from each."""

    def __init__(self, parts: Sequence[Any], source: str) -> None:
        self.parts = tuple(parts)
        self.source = source
        self.shape = (sum(int(p.shape[0]) for p in self.parts), *self.parts[0].shape[1:])
        self.dtype = native(np.dtype(self.parts[0].dtype))
        starts = [0]
        for part in self.parts:
            starts.append(starts[-1] + int(part.shape[0]))
        self._starts = tuple(starts)

    def close(self) -> None:
        for part in self.parts:
            if hasattr(part, "close"):
                part.close()

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        index = bisect.bisect_right(self._starts, start) - 1
        pos = 0
        while start < stop:
            part, first = self.parts[index], self._starts[index]
            take = min(stop, self._starts[index + 1]) - start
            if take > 0:
                target = out[pos : pos + take]
                if isinstance(part, FileArray):
                    part._read_into(start - first, start - first + take, target)
                else:
                    target[...] = np.asarray(part[start - first : start - first + take])
                pos += take
                start += take
            index += 1


def _describe(leaf: Any) -> str:
    return getattr(leaf, "source", type(leaf).__name__)


def concat(leaves: Sequence[Any], source: str | None = None) -> FileArray:
    """Concatenates leaves along rows into one lazy leaf.

    Args:
        leaves: File leaves (or any arrays with row slicing), in row order.
        source: A name for messages; defaults to the first leaf's.

    Returns:
        A `FileArray` with `sum(len(leaf))` rows.

    Raises:
        ValueError: If `leaves` is empty or row shapes disagree.
        TypeError: If dtypes disagree.

    Example:
        >>> x = shardfeed.files.concat([files.npy("a.npy"), files.npy("b.npy")])
    """
    leaves = list(leaves)
    if not leaves:
        raise ValueError(
            _errors.message(
                "Concatenating needs at least one leaf.",
                "leaves=[]",
                "Pass the shards' leaves in row order.",
            )
        )
    first = leaves[0]
    for leaf in leaves[1:]:
        if native(np.dtype(leaf.dtype)) != native(np.dtype(first.dtype)):
            raise TypeError(
                _errors.message(
                    "All shards of one array must share a dtype (nothing is cast silently).",
                    f"{_describe(first)}.dtype={np.dtype(first.dtype)}, "
                    f"{_describe(leaf)}.dtype={np.dtype(leaf.dtype)}",
                    "Write every shard with the same dtype.",
                )
            )
        if tuple(leaf.shape[1:]) != tuple(first.shape[1:]) or not leaf.shape:
            raise ValueError(
                _errors.message(
                    "All shards of one array must share a row shape.",
                    f"{_describe(first)}.shape={tuple(first.shape)}, "
                    f"{_describe(leaf)}.shape={tuple(leaf.shape)}",
                    "Write every shard with the same shape after the row dimension.",
                )
            )
    return _ConcatArray(leaves, source or f"{_describe(first)} + {len(leaves) - 1} more")
