"""The epoch timer: the one Keras callback that times epochs for bench, demo and engines.

An epoch runs from `on_epoch_begin` to `on_epoch_end`, its loss read back
first so its work is done; an optional time budget stops the run.
"""

from __future__ import annotations

import time
from typing import Any


def epoch_timer(budget_s: float | None = None) -> Any:
    """A callback that times each epoch and records its loss.

    With `budget_s`, it stops training once a batch ends more than `budget_s`
    after `on_train_begin` (and records when, in `stopped_after_s`).

    Args:
        budget_s: Seconds after which training stops; None never stops.

    Returns:
        A `keras.callbacks.Callback` with `seconds` (one per epoch),
        `losses` (one per epoch; NaN when the logs hold no loss) and
        `stopped_after_s` (None unless the budget stopped training).

    Example:
        >>> timer = epoch_timer()
        >>> model.fit(x, y, epochs=2, callbacks=[timer]); len(timer.seconds)
        2
    """
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self.losses: list[float] = []
            self.stopped_after_s: float | None = None
            self._start = self._epoch_start = 0.0

        def on_train_begin(self, logs: dict | None = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self._epoch_start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            elapsed = time.perf_counter() - self._start
            if budget_s is not None and elapsed > budget_s:
                self.stopped_after_s = elapsed
                self.model.stop_training = True

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            loss = float((logs or {}).get("loss", float("nan")))  # waits for the work
            self.seconds.append(time.perf_counter() - self._epoch_start)
            self.losses.append(loss)

    return EpochTimer()
