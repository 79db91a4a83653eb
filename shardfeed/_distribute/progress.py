"""Where a worker stands, for `shardfeed launch`'s progress watch (the worker's side).

Each worker under `shardfeed launch` keeps one small file,
`SHARDFEED_READY_DIR/progress<rank>`: how many shardfeed calls it started
(`report_progress`) and where it stands now (`Position.where`): inside one of
those calls (`call`), in `fit`/`evaluate`/`predict` between them (`in_api`), in
a Keras callback hook that shardfeed runs (`in_callback`), or in its own code.
Each change is one `pwrite` of 84 bytes at offset 0. On SIGUSR2 the worker
writes its Python stacks to `stacks<rank>` (`faulthandler`, which works while
the main thread is blocked in native code). The launcher reads both
(`shardfeed._launch.process`); nothing here runs outside `shardfeed launch`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, NamedTuple, TypeVar

from shardfeed._distribute.launch_env import READY_DIR_VARIABLE

PROGRESS = "progress"
STACKS = "stacks"
# The signal that asks a worker for its Python stacks (nothing in TensorFlow,
# JAX or Keras uses it).
STACKS_SIGNAL = signal.SIGUSR2

# Where a worker stands (one byte in the file).
OWN_CODE = "-"  # outside shardfeed: the script's own code, or done
IN_API = "A"  # in `fit`/`evaluate`/`predict`, between its counted calls
IN_CALL = "C"  # inside a counted call: a compiled call, a collective
IN_CALLBACK = "B"  # in a Keras callback hook run by `fit`/`evaluate`
_F = TypeVar("_F", bound=Callable[..., Any])
_LABEL_BYTES = 40
# calls, where, label, the call count when `fit` was told to stop (0: not):
# 84 bytes, each write replaces the last.
_RECORD = b"%20d %s %-40s %20d"


class Position(NamedTuple):
    """What a worker's progress file says.

    Attributes:
        calls: Shardfeed calls started (0 before the first).
        where: `OWN_CODE`, `IN_API`, `IN_CALL` or `IN_CALLBACK`.
        label: What it is in: the call (e.g. "fit's train call"), the API
            ("fit") or the callback hook ("on_epoch_end"); "" in its own code.
        stopped_at: `calls` when a callback of its latest `fit` set
            `model.stop_training` (0: none did).
    """

    calls: int
    where: str = OWN_CODE
    label: str = ""
    stopped_at: int = 0


# This process's file ([descriptor, calls reported]); [None, 0] before the
# first write, [-1, n] where there is none.
_progress: list[int | None] = [None, 0]
# Where this process stands now: [where, label].
_where: list[str] = [OWN_CODE, ""]
_stopped_at: list[int] = [0]  # see `Position.stopped_at`


def _descriptor(environ: Mapping[str, str] | None) -> int:
    fd = _progress[0]
    if fd is None:
        environ = os.environ if environ is None else environ
        ready_dir, rank = environ.get(READY_DIR_VARIABLE), environ.get("SHARDFEED_RANK", "")
        fd = -1
        if ready_dir and rank.isdigit():
            try:
                path = os.path.join(ready_dir, f"{PROGRESS}{int(rank)}")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            except OSError:
                fd = -1  # not our launch's directory any more: nobody watches
        _progress[0] = fd
    return fd


def _write(environ: Mapping[str, str] | None = None) -> None:
    fd = _descriptor(environ)
    if fd < 0:
        return
    label = _where[1].encode("ascii", "replace")[:_LABEL_BYTES]
    try:
        record = _RECORD % (_progress[1], _where[0].encode(), label, _stopped_at[0])
        os.pwrite(fd, record, 0)
    except OSError:
        _progress[0] = -1


def report_progress(environ: Mapping[str, str] | None = None) -> None:
    """Tells `shardfeed launch` that this worker starts one more shardfeed call.

    The start of each `fit`, `evaluate` and `predict` (their ranks'
    agreement on the arguments), each of their compiled calls, the sync
    check and every batch a custom loop takes count here. Each such call is
    a collective across the ranks, so in a healthy job the counts move
    together: ranks whose count stays behind the others' for the launcher's
    `--progress-timeout-s` are stuck outside the collective the others wait
    in. One `pwrite` of 84 bytes; nothing outside `shardfeed launch`.

    Args:
        environ: Environment to read on the first report (default: `os.environ`).
    """
    _progress[1] = _progress[1] + 1  # type: ignore[operator]
    _write(environ)


@contextlib.contextmanager
def _standing(where: str, label: str) -> Iterator[None]:
    previous = list(_where)
    _where[:] = [where, label]
    _write()
    try:
        yield
    finally:
        _where[:] = previous
        _write()


@contextlib.contextmanager
def call(label: str) -> Iterator[None]:
    """Counts one shardfeed call (`report_progress`) and marks this worker
    inside it until the block ends: a rank inside a call longer than
    `--progress-timeout-s`, while the others are too, or while others are
    past it, is stuck in it (a `py_function`/`io_callback` that never
    returns, a collective that never completes)."""
    _progress[1] = _progress[1] + 1  # type: ignore[operator]
    with _standing(IN_CALL, label):
        yield


def in_api(name: str) -> Callable[[_F], _F]:
    """Decorates shardfeed's `name` ("fit", "evaluate", "predict"): marks
    this worker in it while it runs, where between its counted calls it may
    wait in collectives that are not counted (opening an epoch, reading
    metrics)."""

    def decorate(function: _F) -> _F:
        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with _standing(IN_API, name):
                return function(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate


def in_callback(hook: str) -> contextlib.AbstractContextManager[None]:
    """Marks this worker in the Keras callback hook `hook` until the block ends."""
    return _standing(IN_CALLBACK, hook)


def record_stop(stopped: bool) -> None:
    """Records that a callback set `model.stop_training` in this `fit` (at
    the current call count), or clears it (`stopped=False`, as `fit`
    starts). A rank that stops alone leaves the others in collectives it
    never joins: the launcher names it from this."""
    value = int(_progress[1]) if stopped else 0  # type: ignore[arg-type]
    if value != _stopped_at[0]:
        _stopped_at[0] = value
        _write()


def read_position(path: str) -> Position | None:
    """The `Position` in a progress file, or None if unreadable (a file
    holding only a count, as older workers wrote, stands in its own code)."""
    try:
        with open(path, "rb") as progress_file:
            data = progress_file.read(96)
        count = int(data[:20])
        stopped_at = int(data[64:84] or 0)
    except (OSError, ValueError):
        return None
    where = data[21:22].decode("ascii", "replace") or OWN_CODE
    label = data[23:63].decode("ascii", "replace").strip()
    return Position(count, where, label, stopped_at)


_stacks_file: list[IO[str]] = []  # kept open: faulthandler writes to its descriptor


def dump_stacks_on_request(environ: Mapping[str, str] | None = None) -> None:
    """Under `shardfeed launch`, writes this worker's Python stacks (every
    thread's) to `stacks<rank>` when `STACKS_SIGNAL` arrives, so a launcher
    that stops a stuck job can say where each rank stood. `faulthandler`
    writes from the signal handler itself: it works while the main thread
    is blocked in native code (a collective, a compiled call). Installed
    once, by `shardfeed.init()`."""
    environ = os.environ if environ is None else environ
    ready_dir, rank = environ.get(READY_DIR_VARIABLE), environ.get("SHARDFEED_RANK", "")
    if not ready_dir or not rank.isdigit() or _stacks_file:
        return
    try:
        stacks = open(os.path.join(ready_dir, f"{STACKS}{int(rank)}"), "w")
    except OSError:
        return  # not our launch's directory any more: nobody asks
    _stacks_file.append(stacks)
    faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True, chain=False)
