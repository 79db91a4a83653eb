"""Ctrl-C during a JAX loop: the compiled call running finishes first.

Owns when a SIGINT becomes a `KeyboardInterrupt` inside `fit`, `evaluate`
and `predict` on JAX: never while a call's state is out of the model. A
training call donates the state (the model's variables' arrays) to XLA, so
an interrupt between the call and the write-back left the variables holding
deleted arrays (`Array has been deleted`; 10 of 18 real Ctrl-Cs at one step
per call). The handler is installed once per `fit`/`evaluate`/`predict`
(`handled`); each call only counts itself in and out (`CALL`): installing a
handler around every call cost ~45 us a call on the 2-core VM, not donating
would copy the state every call.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

_inside = 0  # calls whose state is out of the model's variables now
_pending = False  # a SIGINT came while `_inside`: raised when the last one ends


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
        global _pending
        if _inside:
            _pending = True
        else:
            previous(signum, frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Call:
    """`with CALL:` around taking the state out of the model, the compiled
    call and writing its result back."""

    def __enter__(self) -> None:
        global _inside
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
