"""A real Ctrl-C (SIGINT) during `fit` on JAX leaves the model's state valid:
the state after the last call that ran, never the deleted arrays a donated
call leaves behind (`_jax/interrupts.py`)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import keras
import numpy as np
import pytest
from _helpers_fit import mlp, regression_data, replicas

from shardfeed import FitOptions, ShardedResidentDataset, fit, predict

ONE_STEP = FitOptions(steps_per_execution=1)  # the most calls, so the most windows


@pytest.fixture(autouse=True)
def pythons_own_sigint_handler():
    """Python's own handler, as a script started from a terminal has. A run
    started as a background job of a non-interactive shell (`.ci/run &`)
    starts every process with SIGINT ignored (POSIX), and `fit` rightly
    leaves an ignored SIGINT ignored: in such runs these tests saw no
    KeyboardInterrupt (`test_an_ignored_sigint_stays_ignored`)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _CtrlC(threading.Thread):
    """Sends this process SIGINT `delay_s` from now, then every 50 ms until
    `stop()`, as a user presses Ctrl-C again. One SIGINT alone can be lost
    under any Python program: a handler that runs inside a finalizer (a
    weakref callback, as JAX's caches have) raises into the unraisable hook,
    with Keras' own `fit` too."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(daemon=True)
        self.delay_s = delay_s
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # `stop()` returns with no send under way

    def run(self) -> None:
        wait_s = self.delay_s
        while not self._stopped.wait(wait_s):
            with self._lock:
                if self._stopped.is_set():
                    return
                os.kill(os.getpid(), signal.SIGINT)
            wait_s = 0.05

    def stop(self) -> None:
        """Stops sending; a SIGINT sent before lands here, and is dropped."""
        while True:
            try:
                with self._lock:
                    self._stopped.set()
                self.join()
                _check_signals()  # the last one's handler runs here, if still pending
                return
            except KeyboardInterrupt:
                continue


def _check_signals() -> None:
    # Pending Python signal handlers run when a Python function is entered.
    pass


class _Snapshots(keras.callbacks.Callback):
    """The model's weights after each call; with `interrupt_after`, starts
    a `_CtrlC` `delay_s` after that many calls (from a thread, so it lands
    wherever the loop is then, as a real Ctrl-C does)."""

    def __init__(self, interrupt_after: int | None = None, delay_s: float = 0.0) -> None:
        super().__init__()
        self.seen: list[list[np.ndarray]] = []
        self.interrupt_after, self.delay_s = interrupt_after, delay_s
        self.ctrl_c: _CtrlC | None = None

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen.append(self.model.get_weights())
        if len(self.seen) == self.interrupt_after:
            self.ctrl_c = _CtrlC(self.delay_s)
            self.ctrl_c.start()


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


def test_a_ctrl_c_during_fit_leaves_the_state_of_the_last_call():
    # Used to fail: `model.get_weights()` raised `Array has been deleted`
    # after most interrupts (the donated state was not written back).
    x, y = regression_data(400)
    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=0)
        reference = _Snapshots()
        fit(mlp(), ds, epochs=1, verbose=0, callbacks=[reference], options=ONE_STEP)
        for after, delay_s in [(1, 0.0), (2, 0.0005), (4, 0.001), (7, 0.003)]:
            model, snapshots = mlp(), _Snapshots(after, delay_s)
            with pytest.raises(KeyboardInterrupt):
                try:
                    # Far more epochs than the signal takes to arrive.
                    fit(model, ds, epochs=1000, verbose=0, callbacks=[snapshots],
                        options=ONE_STEP)
                finally:
                    if snapshots.ctrl_c is not None:
                        snapshots.ctrl_c.stop()
            assert snapshots.ctrl_c is not None
            weights = model.get_weights()
            ran = len(snapshots.seen)  # calls whose `on_train_batch_end` finished
            # The interrupt came before the next call or during it (then the
            # call finished first): the state after `ran` or `ran + 1` calls.
            assert _same(weights, reference.seen[ran - 1]) or _same(weights, reference.seen[ran])
            outputs = predict(model, x, per_replica_batch_size=4)
            np.testing.assert_allclose(outputs, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_a_users_sigint_handler_still_gets_every_signal():
    x, y = regression_data(400)
    received: list[int] = []

    class StopAfterTheSignal(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 2:
                os.kill(os.getpid(), signal.SIGINT)
            if received:
                self.model.stop_training = True

    def handler(signum: int, frame: Any) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with replicas(2):
            ds = ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=0)
            fit(mlp(), ds, epochs=1000, verbose=0, callbacks=[StopAfterTheSignal()],
                options=ONE_STEP)
        assert received == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is handler  # put back after `fit`
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_sigint_stays_ignored():
    # A process started with SIGINT ignored (a background job of a script)
    # is not made interruptible by `fit`: the signal stays ignored during and
    # after it, as under Keras' own `fit`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    x, y = regression_data(400)

    class SendCtrlC(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 2:
                os.kill(os.getpid(), signal.SIGINT)

    with replicas(2):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=0)
        history = fit(mlp(), ds, epochs=2, verbose=0, callbacks=[SendCtrlC()], options=ONE_STEP)
    assert len(history.history["loss"]) == 2
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_a_ctrl_c_a_finalizer_swallowed_is_raised_at_the_next_call(monkeypatch):
    """Python raises a SIGINT's KeyboardInterrupt wherever the main thread is;
    inside a finalizer (a weakref callback, as JAX's caches have) it goes to
    the unraisable hook and the Ctrl-C is lost (2 of 8 on JAX). Under `fit`
    the next call raises it again, before it takes the model's state out."""
    import sys
    import weakref

    from shardfeed._jax import interrupts

    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))

    class Cached:
        pass

    with interrupts.handled():
        entry = Cached()
        # The Ctrl-C's handler runs while the finalizer runs.
        weakref.finalize(entry, signal.getsignal(signal.SIGINT), signal.SIGINT, None)
        del entry
        assert swallowed == [KeyboardInterrupt]
        with pytest.raises(KeyboardInterrupt):
            with interrupts.CALL:
                pytest.fail("the call ran after a Ctrl-C")
        with interrupts.CALL:  # raised once, not again
            pass
