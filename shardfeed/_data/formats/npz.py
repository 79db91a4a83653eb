"""`.npz` archives: the reader `files.npz`, for stored members (read in place) and
compressed ones (a stream that remembers its position). What is verified: docs/data.md."""

from __future__ import annotations

import math
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import (
    FileArray,
    PathLike,
    RawArray,
    byte_view,
    check_size,
    existing,
    native,
)
from shardfeed._data.formats.npy import check_header, read_header

# A compressed .npz member is decompressed in pieces of this size, so reading
# a chunk never holds the chunk twice.
_STREAM_PIECE_BYTES = 4 * 1024**2


class _StoredNpzArray(RawArray):
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

    agreement_rows = "leading"  # a deflate stream is cheap to read only from its start

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
        self.dtype = native(file_dtype)
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
        view = byte_view(out)
        filled = 0
        while filled < len(view):
            piece = self._stream.read(min(_STREAM_PIECE_BYTES, len(view) - filled))
            if not piece:
                check_size(
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


# A zip local file header (APPNOTE 4.3.7; zipfile's private structFileHeader):
# signature, versions, flags, method, time, date, CRC, sizes, name and extra lengths.
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_MAGIC = b"PK\003\004"


def _member_data_offset(path: str, info: zipfile.ZipInfo) -> int:
    """Where a member's bytes start: after its local header, whose name and
    extra field lengths may differ from the central directory's."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        fields = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if fields[0] != _LOCAL_MAGIC:
        raise ValueError(
            _errors.message(
                "A .npz member must start with a zip local file header.",
                f"{path}['{info.filename}'] header_offset={info.header_offset}",
                "The archive is damaged; write it again with `np.savez`.",
            )
        )
    # Fields 10 and 11: file name length, extra field length.
    return info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]


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
    path = existing(path)
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
                shape, fortran_order, dtype = read_header(member, source)
                header_bytes = member.tell()
        except (zipfile.BadZipFile, zlib.error, EOFError) as err:
            raise ValueError(_damaged_member(source, info.filename, err)) from err
    check_header(source, shape, dtype, fortran_order)
    nbytes = math.prod(shape) * dtype.itemsize
    check_size(source, header_bytes + nbytes, info.file_size)
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
