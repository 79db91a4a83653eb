"""Ctrl-C during a JAX loop: a SIGINT waits until the running compiled call's state is
back in the model.

Why: a training call donates the model's variables' arrays, so an interrupt
between the call and the write-back left deleted arrays (10 of 18 real Ctrl-Cs).
The handler is installed once per `fit`/`evaluate`/`predict` (`handled`); each
call only counts itself in and out (`CALL`): a handler per call cost ~45 us a call.
A KeyboardInterrupt raised outside a call may land in a finalizer, which
swallows it (2 of 8 Ctrl-Cs): the next call raises it again.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

_inside = 0  # calls whose state is out of the model's variables now
_pending = False  # a SIGINT came while `_inside`: raised when the last one ends
_retry = False  # a KeyboardInterrupt raised outside a call, perhaps swallowed there


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Holds a SIGINT that comes during a `CALL` until it ends, then hands
    it to the handler that was in place (Python's: `KeyboardInterrupt`; a
    user's own handler runs as it would have). Nothing changes off the main
    thread (it gets no signals) or without a Python SIGINT handler."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        global _pending, _retry
        if _inside:
            _pending = True
            return
        if previous is signal.default_int_handler:
            # Raised here, the KeyboardInterrupt may land in a finalizer (a
            # weakref callback of JAX's caches), which swallows it: 2 of 8
            # Ctrl-Cs were lost so. The next call raises it again.
            _retry = True
        previous(signum, frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        global _retry
        _retry = False


class _Call:
    """`with CALL:` around taking the state out of the model, the compiled
    call and writing its result back."""

    def __enter__(self) -> None:
        global _inside, _retry
        if not _inside and _retry:
            # A Ctrl-C perhaps swallowed where it was raised (see `handled`):
            # raised again before the next call takes the state out of the model.
            _retry = False
            raise KeyboardInterrupt
        _inside += 1

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        global _inside, _pending
        _inside -= 1
        if not _inside and _pending:
            _pending = False
            # The held Ctrl-C, now that the model holds valid state: the
            # handler runs (and raises) before this returns.
            signal.raise_signal(signal.SIGINT)


CALL = _Call()
