"""File sources: lazy leaves that read row ranges of .npy, .npz, HDF5 and Parquet files.

Separation of concerns: this module owns *opening files and reading row
ranges out of them*. Each function returns a leaf -- an object with `shape`,
`dtype`, `ndim`, `len()` and `leaf[start:stop]` -- that `ShardedResidentDataset`
accepts wherever it accepts a NumPy array. The sources layer still decides
what a column is, the plan which rows a replica owns, and the storage how many
rows to read at once; a leaf only answers "rows `[start, stop)` of this file".

Why not `np.load(mmap_mode="r")`: pages of a memory map that the upload has
touched stay in the process' resident set until the kernel needs them back, so
loading a 100 GB shard through a memmap looks (and is accounted, e.g. by a
cgroup limit) like 100 GB of host memory. Reading each row range with one
`readinto` at the right offset keeps the process' own memory at one chunk;
the file's pages live only in the kernel's page cache.

What a leaf holds: the path and what its header says (shape, dtype, offsets),
never the data. Handles are opened on first read and dropped when pickled, so
a leaf built on the chief can be sent to workers. A leaf is not safe to read
from several threads at once (a compressed .npz member, an HDF5 or Parquet
file keep one open handle and a read position).
"""

from __future__ import annotations

import bisect
import importlib
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors

PathLike = str | os.PathLike

# Kinds NumPy uses for numbers: bool, signed/unsigned integers, floats, complex.
_NUMERIC_KINDS = "biufc"
# A compressed .npz member is decompressed in pieces of this size, so reading
# a chunk never holds the chunk twice.
_STREAM_PIECE_BYTES = 4 * 1024**2
_HDF5_SUFFIXES = (".h5", ".hdf5", ".he5")
_PARQUET_SUFFIXES = (".parquet", ".pq")


def _optional(module: str) -> Any:
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


# -- .npy and stored .npz members ----------------------------------------------------------


def _npy_header(fp: Any, source: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Reads a .npy header with NumPy's own helpers, refusing pickled data."""
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except ValueError as err:
        raise ValueError(
            _errors.message(
                "The file must be a .npy array (format version 1.0 or 2.0).",
                f"{source}: {err}",
                "Write it with `np.save(path, array)`.",
            )
        ) from err
    return tuple(int(d) for d in shape), bool(fortran_order), np.dtype(dtype)


def _check_layout(
    source: str, shape: tuple[int, ...], dtype: np.dtype, fortran_order: bool = False
) -> None:
    if dtype.hasobject:
        raise TypeError(
            _errors.message(
                "Object arrays cannot be read: their rows are pickled Python objects "
                "(shardfeed never unpickles, `allow_pickle` stays off) and could not "
                "be uploaded to a device anyway.",
                f"{source}.dtype={dtype}",
                "Convert the data to a numeric dtype and save it again, e.g. "
                "`np.save(path, np.stack(list_of_arrays).astype('float32'))`.",
            )
        )
    if dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(
            _errors.message(
                "Resident data must be numeric (bool, integer, float or complex).",
                f"{source}.dtype={dtype}",
                "Encode strings or records as numbers (e.g. a vocabulary lookup) "
                "and save those instead.",
            )
        )
    if not shape:
        raise ValueError(
            _errors.message(
                "Each array needs a leading row dimension.",
                f"{source}.shape=()",
                "Save one value per row, e.g. `np.full(num_rows, value)`.",
            )
        )
    if any(d < 0 for d in shape):
        raise ValueError(
            _errors.message(
                "Every dimension of an array must be >= 0.",
                f"{source}.shape={shape}",
                "The header is damaged; write the file again (e.g. `np.save`).",
            )
        )
    if fortran_order and len(shape) > 1:
        raise ValueError(
            _errors.message(
                "Rows must be contiguous in the file (C order) so a row range is one "
                "read; a Fortran-order file interleaves every row with all others.",
                f"{source} fortran_order=True, shape={shape}",
                "Save it in C order: `np.save(path, np.ascontiguousarray(array))`.",
            )
        )


def _check_size(source: str, expected: int, actual: int) -> None:
    if actual != expected:
        raise ValueError(
            _errors.message(
                "The file must hold exactly the bytes its header describes.",
                f"{source} expected_bytes={expected}, actual_bytes={actual}",
                "The file is truncated or was not written completely; write it "
                "again (e.g. `np.save`) and check the copy finished.",
            )
        )


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


def _byte_view(out: np.ndarray) -> memoryview:
    return memoryview(out.reshape(-1).view(np.uint8))


class _RawArray(FileArray):
    """Rows stored as raw C-order bytes from `offset` on (a .npy file or a stored
    .npz member). Each read opens the file, seeks and `readinto`s the output, so
    the leaf keeps no state and nothing is buffered twice."""

    def __init__(
        self, path: str, offset: int, shape: tuple[int, ...], file_dtype: np.dtype, source: str
    ) -> None:
        self.path = path
        self.offset = offset
        self.shape = shape
        self.dtype = _native(file_dtype)
        self.source = source
        self._swap = file_dtype != self.dtype
        self._row_bytes = math.prod(shape[1:]) * file_dtype.itemsize

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        view = _byte_view(out)
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.offset + start * self._row_bytes)
            filled = 0
            while filled < len(view):
                n = f.readinto(view[filled:])
                if not n:
                    _check_size(
                        self.source,
                        self.offset + stop * self._row_bytes,
                        self.offset + start * self._row_bytes + filled,
                    )
                filled += n
        if self._swap:
            out.byteswap(inplace=True)


class _StoredNpzArray(_RawArray):
    """A stored (uncompressed) .npz member, read in place like a .npy file.

    With `verify`, the member's CRC-32 (recorded in the zip's central
    directory) is checked once, on the first read and before any row is
    returned: one sequential pass over the whole member, in pieces of
    `_STREAM_PIECE_BYTES`. A worker reading only its rows still reads the
    whole member once, because a CRC-32 covers the member as one unit.
    """

    def __init__(
        self,
        path: str,
        offset: int,
        shape: tuple[int, ...],
        file_dtype: np.dtype,
        source: str,
        member: str,
        member_offset: int,
        member_bytes: int,
        crc32: int,
        verify: bool,
    ) -> None:
        super().__init__(path, offset, shape, file_dtype, source)
        self.member = member
        self.member_offset = member_offset
        self.member_bytes = member_bytes
        self.crc32 = crc32
        self.verify = verify
        self._verified = False

    def __getstate__(self) -> dict[str, Any]:
        # The receiver may read another copy of the file: it checks again.
        return {**super().__getstate__(), "_verified": False}

    def _check_crc(self) -> None:
        crc, left = 0, self.member_bytes
        with open(self.path, "rb") as f:
            f.seek(self.member_offset)
            while left:
                piece = f.read(min(_STREAM_PIECE_BYTES, left))
                if not piece:
                    break  # truncated: the CRC below cannot match
                crc = zlib.crc32(piece, crc)
                left -= len(piece)
        if crc != self.crc32 or left:
            raise ValueError(
                _errors.message(
                    "A .npz member's bytes must match the CRC-32 its archive records.",
                    f"{self.source} (member {self.member!r}) crc32={crc:#010x}, "
                    f"recorded crc32={self.crc32:#010x}",
                    "The archive is damaged or was copied incompletely; write it again "
                    "with `np.savez` (or copy it again). Pass `verify=False` only to "
                    "skip the check.",
                )
            )
        self._verified = True

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self.verify and not self._verified:
            self._check_crc()
        super()._read_into(start, stop, out)


def npy(path: PathLike) -> FileArray:
    """A lazy leaf over a `.npy` file; each read is one positioned file read.

    Only the header is read here. Rows are read on demand, one range at a
    time, straight into the returned array: host memory stays at the rows
    asked for (no memmap pages left resident).

    Args:
        path: The `.npy` file (format version 1.0 or 2.0, C order, numeric).

    Returns:
        A `FileArray` with the file's shape and dtype (byte order made native).

    Raises:
        FileNotFoundError: If the file does not exist.
        TypeError: For object (pickled) or non-numeric dtypes.
        ValueError: For a file that is not .npy, Fortran order, no row
            dimension, or a size that disagrees with the header (truncated).

    Example:
        >>> x = shardfeed.files.npy("train_x.npy")
        >>> ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
    """
    path = _existing(path)
    with open(path, "rb") as f:
        shape, fortran_order, dtype = _npy_header(f, path)
        offset = f.tell()
        size = os.fstat(f.fileno()).st_size
    _check_layout(path, shape, dtype, fortran_order)
    # Python ints: a hostile header's shape product cannot wrap around (NumPy's
    # int64 product of (2**40, 2**40) is 0), so it is caught here as a size mismatch.
    _check_size(path, offset + math.prod(shape) * dtype.itemsize, size)
    return _RawArray(path, offset, shape, dtype, source=path)


def _existing(path: PathLike) -> str:
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


# -- .npz ------------------------------------------------------------------------------------


class _DeflatedNpzArray(FileArray):
    """Rows of a compressed .npz member, read by streaming through it.

    A deflate stream cannot be entered in the middle, so the member stays open
    between reads and remembers its position: reading chunks in increasing
    order decompresses the member once. Reading an earlier row restarts the
    stream from the member's start (`ZipExtFile.seek` rewinds and re-reads).

    With `verify`, the first read decompresses the whole member once so that
    zipfile checks its CRC-32 (it does so only when a read reaches the end),
    then rewinds. Any damage -- a broken deflate stream or a CRC mismatch --
    is a `ValueError` naming the archive and the member.
    """

    _handles = ("_zip", "_stream")

    def __init__(
        self,
        path: str,
        member: str,
        header_bytes: int,
        shape: tuple[int, ...],
        file_dtype: np.dtype,
        source: str,
        verify: bool = True,
    ) -> None:
        self.path = path
        self.member = member
        self.header_bytes = header_bytes
        self.shape = shape
        self.dtype = _native(file_dtype)
        self.source = source
        self._swap = file_dtype != self.dtype
        self._row_bytes = math.prod(shape[1:]) * file_dtype.itemsize
        self.verify = verify
        self._verified = False
        self._zip: zipfile.ZipFile | None = None
        self._stream: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_verified": False}

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        try:
            self._read_stream(start, stop, out)
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:
            # A damaged deflate stream, or zipfile's CRC-32 check at the member's end.
            self.close()
            raise ValueError(_damaged_member(self.source, self.member, err)) from err

    def _read_stream(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._stream is None:
            self._zip = zipfile.ZipFile(self.path)
            self._stream = self._zip.open(self.member)
        if self.verify and not self._verified:
            # zipfile checks the CRC-32 when a read reaches the member's end:
            # decompress it all once, then rewind for the rows asked for.
            while self._stream.read(_STREAM_PIECE_BYTES):
                pass
            self._verified = True
        self._stream.seek(self.header_bytes + start * self._row_bytes)
        view = _byte_view(out)
        filled = 0
        while filled < len(view):
            piece = self._stream.read(min(_STREAM_PIECE_BYTES, len(view) - filled))
            if not piece:
                _check_size(
                    self.source,
                    self.header_bytes + stop * self._row_bytes,
                    self.header_bytes + start * self._row_bytes + filled,
                )
            view[filled : filled + len(piece)] = piece
            filled += len(piece)
        if self._swap:
            out.byteswap(inplace=True)


def _damaged_member(source: str, member: str, err: BaseException) -> str:
    return _errors.message(
        "A .npz member must read back whole: decompress (when compressed) and match the "
        "CRC-32 its archive records.",
        f"{source} (member {member!r}): {type(err).__name__}: {err}",
        "The archive is damaged or was copied incompletely; write it again "
        "(`np.savez` or `np.savez_compressed`) or copy it again.",
    )


def _member_data_offset(path: str, info: zipfile.ZipInfo) -> int:
    """Where a member's bytes start: after its local header, whose name and
    extra field lengths may differ from the central directory's."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        fields = struct.unpack(zipfile.structFileHeader, f.read(zipfile.sizeFileHeader))
    if fields[0] != zipfile.stringFileHeader:
        raise ValueError(
            _errors.message(
                "A .npz member must start with a zip local file header.",
                f"{path}['{info.filename}'] header_offset={info.header_offset}",
                "The archive is damaged; write it again with `np.savez`.",
            )
        )
    # Fields 10 and 11: file name length, extra field length.
    return info.header_offset + zipfile.sizeFileHeader + fields[10] + fields[11]


def npz(path: PathLike, key: str, verify: bool = True) -> FileArray:
    """A lazy leaf over one array of a `.npz` archive.

    A stored member (`np.savez`) is plain .npy bytes inside the zip and is read
    like a .npy file: one positioned read per range. A compressed member
    (`np.savez_compressed`) is decompressed as a stream: reads in increasing
    row order cost one pass over the member in total, but random access costs
    a re-read from the member's start for every backwards jump. Prefer
    `np.savez` (or .npy files) for data loaded by many workers.

    With `verify` (the default), the member's CRC-32 from the zip's central
    directory is checked on the first read, before any row is returned -- as
    `np.load` does. It costs one extra sequential pass over the whole member
    per process (a compressed member: one extra full decompression), even
    when the process reads only some rows: a CRC-32 covers the member whole.

    Args:
        path: The `.npz` file.
        key: The array's name in the archive (as passed to `np.savez`).
        verify: Check the member's CRC-32 before its first read. With False a
            damaged stored member reads as wrong numbers, undetected.

    Returns:
        A `FileArray` with the member's shape and dtype.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If the file is not a zip archive, `key` is not in it, or
            the member is damaged, Fortran-ordered or truncated; on the first
            read, if the member does not match its CRC-32 or does not
            decompress (naming the archive and the member).
        TypeError: For object (pickled) or non-numeric members.

    Example:
        >>> data = shardfeed.files.npz("mnist.npz", "x_train")
    """
    path = _existing(path)
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as err:
        raise ValueError(
            _errors.message(
                "A .npz file must be a complete zip archive.",
                f"path={path!r} ({err})",
                "The file is damaged or truncated; write it again with `np.savez`.",
            )
        ) from err
    with archive:
        members = {n.removesuffix(".npy"): n for n in archive.namelist()}
        if key not in members:
            raise ValueError(
                _errors.message(
                    "`key` must name an array in the .npz file.",
                    f"key={key!r} for {path}, which holds {sorted(members)}",
                    "Pass one of the listed keys.",
                )
            )
        info = archive.getinfo(members[key])
        source = f"{path}[{key!r}]"
        try:
            with archive.open(info) as member:
                shape, fortran_order, dtype = _npy_header(member, source)
                header_bytes = member.tell()
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:
            raise ValueError(_damaged_member(source, info.filename, err)) from err
    _check_layout(source, shape, dtype, fortran_order)
    nbytes = math.prod(shape) * dtype.itemsize
    _check_size(source, header_bytes + nbytes, info.file_size)
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        member_offset = _member_data_offset(path, info)
        return _StoredNpzArray(
            path,
            member_offset + header_bytes,
            shape,
            dtype,
            source,
            member=info.filename,
            member_offset=member_offset,
            member_bytes=info.file_size,
            crc32=info.CRC,
            verify=verify,
        )
    return _DeflatedNpzArray(path, info.filename, header_bytes, shape, dtype, source, verify)


# -- HDF5 ------------------------------------------------------------------------------------


class _Hdf5Array(FileArray):
    """An HDF5 dataset; the file is opened on first read so the leaf pickles."""

    _handles = ("_file",)

    def __init__(self, path: str, dataset: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.path = path
        self.dataset = dataset
        self.shape = shape
        self.dtype = dtype
        self.source = f"{path}[{dataset!r}]"
        self._file: Any = None

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._file is None:
            self._file = _open_hdf5(self.path)
        # read_direct writes into `out` (converting byte order) with no temporary.
        self._file[self.dataset].read_direct(out, source_sel=np.s_[start:stop])


def _open_hdf5(path: str) -> Any:
    import h5py  # optional dependency: `pip install shardfeed[files]`

    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise OSError(
            _errors.message(
                "The file must be an HDF5 file h5py can open.",
                f"path={path!r} ({err})",
                "Check that the file is HDF5 (not .npz or Parquet) and was written completely.",
            )
        ) from err


def hdf5(path: PathLike, dataset: str) -> FileArray:
    """A lazy leaf over an HDF5 dataset, read by row ranges through h5py.

    The file is opened here only to read the dataset's shape and dtype, then
    closed; it is reopened on the first read, so the leaf can be pickled and
    sent to other processes before it reads anything.

    Args:
        path: The HDF5 file.
        dataset: The dataset's path in the file, e.g. `"train/images"`.

    Returns:
        A `FileArray` with the dataset's shape and dtype.

    Raises:
        FileNotFoundError: If the file does not exist.
        OSError: If h5py cannot open the file.
        ValueError: If `dataset` is not a dataset in the file, or is scalar.
        TypeError: For non-numeric datasets (strings, compound types).

    Example:
        >>> images = shardfeed.files.hdf5("train.h5", "images")
    """
    path = _existing(path)
    h5py = _optional("h5py")
    with _open_hdf5(path) as f:
        node = f.get(dataset)
        if not isinstance(node, h5py.Dataset):
            names: list[str] = []
            f.visititems(
                lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None
            )
            raise ValueError(
                _errors.message(
                    "`dataset` must name a dataset in the HDF5 file.",
                    f"dataset={dataset!r} for {path}, which holds datasets {names}",
                    "Pass one of the listed names (groups are separated by '/').",
                )
            )
        shape = tuple(int(d) for d in node.shape) if node.shape is not None else ()
        dtype = np.dtype(node.dtype)
    source = f"{path}[{dataset!r}]"
    _check_layout(source, shape, dtype)
    return _Hdf5Array(path, dataset, shape, _native(dtype))


# -- Parquet ---------------------------------------------------------------------------------


class _ParquetArray(FileArray):
    """One Parquet column, read row group by row group.

    Only the row groups overlapping a range are decoded, one at a time, and
    only this column, so a read holds at most one row group of one column
    beside the output.
    """

    _handles = ("_file",)

    def __init__(
        self,
        path: str,
        column: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        fixed: tuple[bool, ...],
        group_starts: tuple[int, ...],
    ) -> None:
        self.path = path
        self.column = column
        self.shape = shape
        self.dtype = dtype
        self.source = f"{path}[{column!r}]"
        self._fixed = fixed  # per nesting level: fixed_size_list (True) or list
        self._group_starts = group_starts  # first row of each row group, then num_rows
        self._file: Any = None

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        if self._file is None:
            self._file = _open_parquet(self.path)
        group = bisect.bisect_right(self._group_starts, start) - 1
        row, pos = start, 0
        while row < stop:
            group_start, group_stop = self._group_starts[group], self._group_starts[group + 1]
            take = min(stop, group_stop) - row
            if take > 0:
                table = self._read_group(group)
                for chunk in table.column(0).slice(row - group_start, take).chunks:
                    out[pos : pos + len(chunk)] = self._to_numpy(chunk, row)
                    pos += len(chunk)
                    row += len(chunk)
            group += 1

    def _read_group(self, group: int) -> Any:
        import pyarrow as pa

        try:
            return self._file.read_row_group(group, columns=[self.column])
        except (pa.ArrowException, OSError) as err:
            # OSError: a page whose CRC-32 does not match; ArrowException: a
            # page that does not decode (or decompress).
            raise ValueError(_damaged_page(self.source, group, err)) from err

    def _to_numpy(self, array: Any, first_row: int) -> np.ndarray:
        import pyarrow.compute as pc

        rows = len(array)
        for level, fixed in enumerate(self._fixed):
            width = self.shape[1 + level]
            if array.null_count:
                self._refuse_nulls(array, first_row)
            if not fixed:
                lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
                bad = np.flatnonzero(lengths != width)
                if len(bad):
                    # At nesting level L each row holds prod(shape[1:1+L]) lists.
                    per_row = math.prod(self.shape[1 : 1 + level])
                    row = first_row + int(bad[0]) // max(1, per_row)
                    raise ValueError(
                        _errors.message(
                            "A list column is read as a 2-D array, so every row's list "
                            "must have the same length (the first row's).",
                            f"{self.source} row {row} has length {int(lengths[bad[0]])}, "
                            f"expected {width}",
                            "Pad or trim the lists to one length, or store them as a "
                            "fixed-size list.",
                        )
                    )
            array = array.flatten()
        if array.null_count:
            self._refuse_nulls(array, first_row)
        values = array.to_numpy(zero_copy_only=False)
        return values.reshape((rows, *self.shape[1:]))

    def _refuse_nulls(self, array: Any, first_row: int) -> None:
        raise ValueError(
            _errors.message(
                "Resident data cannot hold nulls: every row needs a number.",
                f"{self.source} has {array.null_count} null value(s) in rows "
                f"starting at {first_row}",
                "Fill or drop the null rows before building the dataset.",
            )
        )


def _parquet_layout(source: str, arrow_type: Any, first: Any) -> tuple[np.dtype, tuple, tuple]:
    """Maps a column type to (dtype, row shape, fixed per level); list widths
    come from the first row (`first`, a one-row array) and are checked on read."""
    import pyarrow as pa

    dims: list[int] = []
    fixed: list[bool] = []
    value = first
    while True:
        if pa.types.is_fixed_size_list(arrow_type):
            dims.append(arrow_type.list_size)
            fixed.append(True)
        elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
            width = None
            if value is not None and len(value) and value.null_count == 0:
                offsets = value.offsets.to_numpy()
                width = int(offsets[1] - offsets[0])
            dims.append(0 if width is None else width)
            fixed.append(False)
        else:
            break
        arrow_type = arrow_type.value_type
        # The first element of this level, to read the next level's width from.
        value = value.flatten()[:1] if value is not None and len(value) else None
    if not (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    ):
        raise TypeError(
            _errors.message(
                "A Parquet column must hold numbers (integers, floats or booleans), "
                "or fixed-size/equal-length lists of them.",
                f"{source} type={arrow_type}",
                "Encode strings, dates or decimals as numbers before writing the file, "
                "or pick a numeric column.",
            )
        )
    return np.dtype(arrow_type.to_pandas_dtype()), tuple(dims), tuple(fixed)


def _damaged_page(source: str, group: int, err: BaseException) -> str:
    return _errors.message(
        "Every page of a Parquet column must decode and match its page checksum (when "
        "the writer stored one).",
        f"{source} row group {group}: {type(err).__name__}: {err}",
        "The file is damaged or was copied incompletely; copy or write it again.",
    )


def _open_parquet(path: str) -> Any:
    import pyarrow.parquet as pq

    # Pages written with a CRC-32 (`write_page_checksum=True`, as `shardfeed
    # split` writes them) are checked as they are read; pages without one are not.
    return pq.ParquetFile(path, page_checksum_verification=True)


def parquet(path: PathLike, column: str) -> FileArray:
    """A lazy leaf over one column of a Parquet file.

    A read decodes only the row groups that overlap the requested rows, and
    only `column`. Numeric columns become 1-D arrays; fixed-size lists become
    2-D (nested ones N-D); variable lists become 2-D when every row has the
    first row's length (checked as rows are read). Pages the writer stored a
    CRC-32 for (`write_page_checksum=True`, as `shardfeed split` does) are
    verified as they are read; pages without one cannot be.

    Args:
        path: The Parquet file.
        column: A top-level column name.

    Returns:
        A `FileArray` with shape `(num_rows, *list_lengths)`.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If `column` is missing; on read, for nulls, unequal list
            lengths, or a page that does not decode or match its checksum.
        TypeError: For non-numeric columns.

    Example:
        >>> y = shardfeed.files.parquet("labels.parquet", "label")
    """
    return parquet_columns(path, [column])[column]


def parquet_columns(path: PathLike, columns: Sequence[str]) -> dict[str, FileArray]:
    """Lazy leaves over several columns of one Parquet file.

    Args:
        path: The Parquet file.
        columns: Top-level column names.

    Returns:
        `{column: FileArray}` in the order given; each reads only its column.

    Raises:
        FileNotFoundError: If the file does not exist.
        ValueError: If `columns` is empty or names a missing column.
        TypeError: For non-numeric columns.

    Example:
        >>> cols = shardfeed.files.parquet_columns("train.parquet", ["features", "label"])
        >>> ds = shardfeed.ShardedResidentDataset(cols["features"], cols["label"], ...)
    """
    pa = _optional("pyarrow")
    _optional("pyarrow.parquet")
    path = _existing(path)
    if isinstance(columns, str) or not columns:
        raise ValueError(
            _errors.message(
                "`columns` must be a non-empty list of column names.",
                f"columns={columns!r}",
                "Pass e.g. `['features', 'label']`, or use `files.parquet(path, column)`.",
            )
        )
    try:
        file = _open_parquet(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(
            _errors.message(
                "The file must be a complete Parquet file.",
                f"path={path!r} ({err})",
                "Check that the file is Parquet and was written completely.",
            )
        ) from err
    with file:
        schema = file.schema_arrow
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise ValueError(
                _errors.message(
                    "Each column must be in the Parquet file.",
                    f"columns={missing!r} for {path}, which holds {schema.names}",
                    "Pass column names from the list.",
                )
            )
        meta = file.metadata
        starts = [0]
        for group in range(meta.num_row_groups):
            starts.append(starts[-1] + meta.row_group(group).num_rows)
        leaves = {}
        for column in columns:
            arrow_type = schema.field(column).type
            first = None
            if starts[-1] and _has_variable_list(arrow_type):
                try:
                    batch = next(file.iter_batches(batch_size=1, columns=[column]))
                except (pa.ArrowException, OSError) as err:
                    raise ValueError(_damaged_page(f"{path}[{column!r}]", 0, err)) from err
                first = batch.column(0)
            dtype, dims, fixed = _parquet_layout(f"{path}[{column!r}]", arrow_type, first)
            leaves[column] = _ParquetArray(
                path, column, (starts[-1], *dims), dtype, fixed, tuple(starts)
            )
    return leaves


def _has_variable_list(arrow_type: Any) -> bool:
    import pyarrow as pa

    while pa.types.is_fixed_size_list(arrow_type):
        arrow_type = arrow_type.value_type
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)


# -- several files as one leaf ---------------------------------------------------------------


class _ConcatArray(FileArray):
    """Leaves concatenated along rows; a range spanning parts reads from each."""

    def __init__(self, parts: Sequence[Any], source: str) -> None:
        self.parts = tuple(parts)
        self.source = source
        self.shape = (sum(int(p.shape[0]) for p in self.parts), *self.parts[0].shape[1:])
        self.dtype = _native(np.dtype(self.parts[0].dtype))
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
        if _native(np.dtype(leaf.dtype)) != _native(np.dtype(first.dtype)):
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


def directory(path: PathLike, pattern: str = "*.npy", *, field: str | None = None) -> FileArray:
    """Shard files in a directory, sorted by name, as one lazy leaf.

    The format follows the files' suffix: `.npy`; `.npz` (`field` is the
    key); `.h5`/`.hdf5` (`field` is the dataset); `.parquet` (`field` is
    the column). Only headers are read here; a row range that spans two
    shards reads from both.

    Args:
        path: The directory.
        pattern: A glob for the shard files, e.g. `"train-*.npy"`. Names are
            sorted as strings, so number shards with leading zeros.
        field: The key, dataset or column inside each shard (not for .npy).

    Returns:
        A `FileArray` over all shards, in name order.

    Raises:
        FileNotFoundError: If no file matches.
        ValueError: For mixed suffixes, a missing or unexpected `field`, or
            row shapes that disagree.
        TypeError: For dtypes that disagree.

    Example:
        >>> x = shardfeed.files.directory("train/", "x-*.npy")
    """
    root = Path(path)
    files = sorted(p for p in root.glob(pattern) if p.is_file())
    if not files:
        raise FileNotFoundError(
            _errors.message(
                "The directory must hold at least one file matching `pattern`.",
                f"path={os.fspath(path)!r}, pattern={pattern!r}",
                "Check the directory and the glob (e.g. `'x-*.npy'`).",
            )
        )
    suffixes = sorted({p.suffix.lower() for p in files})
    if len(suffixes) > 1:
        raise ValueError(
            _errors.message(
                "All shard files must have one format.",
                f"suffixes={suffixes} in {os.fspath(path)!r} for pattern={pattern!r}",
                "Narrow `pattern` to one suffix, e.g. `'*.npy'`.",
            )
        )
    suffix = suffixes[0]
    openers: Mapping[str, Any] = {".npy": npy, ".npz": npz}
    opener = openers.get(suffix)
    if suffix in _HDF5_SUFFIXES:
        opener = hdf5
    elif suffix in _PARQUET_SUFFIXES:
        opener = parquet
    if opener is None:
        raise ValueError(
            _errors.message(
                "Shard files must be .npy, .npz, HDF5 (.h5, .hdf5) or Parquet (.parquet).",
                f"suffix={suffix!r} in {os.fspath(path)!r}",
                "Convert the shards, or narrow `pattern` to supported files.",
            )
        )
    if (opener is npy) != (field is None):
        needs = (
            "must not be given for .npy files"
            if opener is npy
            else (f"is required for {suffix} files (the key, dataset or column to read)")
        )
        raise ValueError(
            _errors.message(
                f"`field` {needs}.",
                f"field={field!r}, pattern={pattern!r}",
                "Pass `field=` only for .npz, HDF5 and Parquet shards.",
            )
        )
    leaves = [opener(p) if field is None else opener(p, field) for p in files]
    name = os.fspath(root / pattern) + ("" if field is None else f"[{field!r}]")
    return concat(leaves, source=f"{name} ({len(files)} files)")
