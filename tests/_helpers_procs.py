"""Whether worker processes are gone: shared by the tests that kill or stop workers,
on both backends (the standard library only)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path


def is_gone(pid: int) -> bool:
    """True when `pid` no longer runs (missing, or a zombie: killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def assert_all_gone(
    folder: Path, patterns: Iterable[str], *, within_s: float, poll_s: float
) -> None:
    """The processes whose ids the workers wrote to `folder` (files matching `patterns`)
    are all gone within `within_s`; there is at least one."""
    pids = [int(p.read_text()) for pattern in patterns for p in folder.glob(pattern)]
    assert pids
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(is_gone(pid) for pid in pids):
        time.sleep(poll_s)
    assert [pid for pid in pids if not is_gone(pid)] == []
