"""Opening a file that was checked: no link followed, the very file checked.

`open_checked` opens without following a final symlink or blocking (anything
but a regular file is refused) and compares device and inode with the checked
ones, so a file swapped after `lstat` is refused. Shard files and resume
backups are opened this way.
"""

from __future__ import annotations

import fcntl
import os
import stat

FileIdentity = tuple[int, int]


class NotTheCheckedFile(OSError):
    """The path could not be opened without following a link, or names
    another file than the one checked (the message says which)."""


def identity(status: os.stat_result) -> FileIdentity:
    """A file's (device, inode): what stays the same while its path may not."""
    return (status.st_dev, status.st_ino)


def kind(mode: int) -> str:
    """What a file is, for a message: "a FIFO (named pipe)", "a directory", ..."""
    kinds = (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def open_checked(path: str, expected: FileIdentity | None = None) -> int:
    """A read-only descriptor of the regular file at `path`, opened without
    following a final symlink and without waiting (a FIFO would block the
    open until some process writes to it).

    Args:
        path: The file.
        expected: The (device, inode) checked earlier (`identity(os.lstat(path))`);
            None: `path`'s own, taken now.

    Returns:
        An open, blocking file descriptor (the caller closes it).

    Raises:
        NotTheCheckedFile: For a missing file, a link, something other than a
            regular file (e.g. a FIFO), or another file than `expected`.
    """
    flags = (
        os.O_RDONLY
        | os.O_NONBLOCK
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode):
            raise NotTheCheckedFile(f"is {kind(status.st_mode)}, not a regular file")
        if expected is None:
            expected = identity(status)
        fd = os.open(path, flags)
    except NotTheCheckedFile:
        raise
    except OSError as err:
        raise NotTheCheckedFile(f"cannot be opened without following links ({err})") from err
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise NotTheCheckedFile(f"is {kind(status.st_mode)}, not a regular file")
    if identity(status) != expected:
        os.close(fd)
        raise NotTheCheckedFile(
            f"(device, inode)={identity(status)}, checked (device, inode)={expected}"
        )
    # Reads of a regular file never wait; blocking again all the same, as callers expect.
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd
