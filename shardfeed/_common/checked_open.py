"""Opening a file that was checked: no link followed, the very file checked.

A path checked with `lstat` and opened later can name another file by then
(swapped for a symlink, or replaced). `open_checked` opens it without
following a final symlink and compares the open file's device and inode with
the checked ones, so what is read is what was checked. Shard files
(`_data/formats/manifest.py`) and resume backups (`_training/backup.py`) are
opened this way.
"""

from __future__ import annotations

import os
import stat

FileIdentity = tuple[int, int]


class NotTheCheckedFile(OSError):
    """The path could not be opened without following a link, or names
    another file than the one checked (the message says which)."""


def identity(status: os.stat_result) -> FileIdentity:
    """A file's (device, inode): what stays the same while its path may not."""
    return (status.st_dev, status.st_ino)


def open_checked(path: str, expected: FileIdentity | None = None) -> int:
    """A read-only descriptor of the regular file at `path`, opened without
    following a final symlink.

    Args:
        path: The file.
        expected: The (device, inode) checked earlier (`identity(os.lstat(path))`);
            None: `path`'s own, taken now.

    Returns:
        An open file descriptor (the caller closes it).

    Raises:
        NotTheCheckedFile: For a missing file, a link, something other than a
            regular file, or another file than `expected`.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        if expected is None:
            expected = identity(os.lstat(path))
        fd = os.open(path, flags)
    except OSError as err:
        raise NotTheCheckedFile(f"cannot be opened without following links ({err})") from err
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or identity(status) != expected:
        os.close(fd)
        raise NotTheCheckedFile(
            f"(device, inode)={identity(status)}, checked (device, inode)={expected}"
        )
    return fd
