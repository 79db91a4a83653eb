"""The chief writes a file every rank waits for, and every rank learns how it went.

Owns `write_on_chief` and `ChiefWriteError`, for any world with `world_size`,
`is_chief` and `all_gather_bytes`: both backends' `save_model` and
`BackupAndRestore` under `fit` write through it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from shardfeed._common.world import WorldLike


class ChiefWriteError(RuntimeError):
    """The chief (rank 0) could not write a file every rank waits for.

    Raised on every rank by `save_model` and by `BackupAndRestore` under
    `shardfeed.fit` when several workers run; on the chief, the original
    error is its `__cause__`.
    """


def write_on_chief(
    world: WorldLike, path: str | os.PathLike[str], write: Callable[[], None]
) -> None:
    """Runs `write` on the chief, then tells every rank how it went.

    A collective: every rank calls it at the same point, and it returns only
    when the chief's write is done (it is the barrier after the write). With
    one worker, `write`'s own error is raised unchanged.

    Raises:
        ChiefWriteError: On every rank, when the chief's `write` raised
            (e.g. "rank 0 could not write PATH: NotADirectoryError: ...").
    """
    if world.world_size == 1:
        write()
        return
    failure: BaseException | None = None
    status = b""
    if world.is_chief:
        try:
            write()
        except Exception as err:  # shared with every rank, re-raised below
            failure = err
            status = f"{type(err).__name__}: {err}".encode()
    chief_status = world.all_gather_bytes(status)[0].decode(errors="replace")
    if chief_status:
        raise ChiefWriteError(
            f"rank 0 could not write {os.fspath(path)}: {chief_status}. Every rank stops "
            "here; fix the path on the chief (it must be writable there, and on a "
            "filesystem every worker sees when they read it back)."
        ) from failure
