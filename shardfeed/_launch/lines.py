"""Tagging a worker's output: every line, and every progress-bar redraw, gets the rank prefix
(a lone carriage return ends a line too, so a redraw keeps its prefix)."""

from __future__ import annotations

import re
import threading
from typing import IO

_LINE_END = re.compile(rb"\r\n|\r|\n")
_READ_BYTES = 65536


def split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines of `data`, each with its end, and the unfinished rest.

    A `\\r` at the very end stays in the rest: it may be the first half of
    `\\r\\n`.

    Example:
        >>> split_lines(b"1/3\\r2/3\\r3/3\\ndone")
        ([b'1/3\\r', b'2/3\\r', b'3/3\\n'], b'done')
    """
    lines, start = [], 0
    for match in _LINE_END.finditer(data):
        if match.group() == b"\r" and match.end() == len(data):
            break
        lines.append(data[start : match.end()])
        start = match.end()
    return lines, data[start:]


def pump(source: IO[bytes], sink: IO[bytes], lock: threading.Lock, prefix: bytes) -> None:
    """Copies `source` to `sink` until end of file, `prefix` before every line.

    Reads whatever the pipe holds (`read1`), so a redraw ending in `\\r`
    appears at once rather than when its line finally ends. A last line
    without an end still gets its own line.
    """
    read = getattr(source, "read1", source.read)
    pending = b""
    while chunk := read(_READ_BYTES):
        lines, pending = split_lines(pending + chunk)
        if lines:
            with lock:
                sink.write(b"".join(prefix + line for line in lines))
                sink.flush()
    if pending:
        with lock:
            sink.write(prefix + pending + (b"" if pending.endswith(b"\n") else b"\n"))
            sink.flush()
