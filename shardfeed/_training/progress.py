"""The progress bar (`Progress`): steps, loss/metrics and samples per second, on the chief,
fed the same global logs as every other callback."""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np


class _Rate(float):
    """A rate that prints as a whole number with thousands separators.

    Keras' `Progbar` prints every value with four decimals after dividing it
    by its count (1 for stateful values), which turns 1,128,627 samples/s
    into `1128627.0000`; this float keeps its own format through that
    division.
    """

    def __truediv__(self, other: float) -> _Rate:
        return _Rate(float(self) / other)

    def __format__(self, spec: str) -> str:
        return f"{round(self):,}"


class Progress(keras.callbacks.Callback):
    """Keras' `Progbar` plus a `samples/s` column.

    Args:
        verbose: 1 for a bar updated after every compiled call, 2 for one line
            per epoch.
    """

    def __init__(self, verbose: int = 1) -> None:
        super().__init__()
        self.verbose = verbose
        self._bar: keras.utils.Progbar | None = None
        self._start = 0.0
        self._mode = "train"

    def _open(self, target: int | None, mode: str) -> None:
        self._mode = mode
        self._bar = keras.utils.Progbar(
            target=target, verbose=self.verbose if mode == "train" else 1, unit_name="step"
        )
        self._start = time.perf_counter()

    def _values(self, steps_done: int, logs: dict | None) -> list[tuple[str, Any]]:
        rows_per_step = self.params.get("global_batch_size", 0)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        # An array result (`F1Score(average=None)`) stays an array: `Progbar`
        # shows its mean, as under `model.fit`.
        values: list[tuple[str, Any]] = [
            (k, v if isinstance(v, np.ndarray) else float(v)) for k, v in (logs or {}).items()
        ]
        values.append(("samples/s", _Rate(steps_done * rows_per_step / elapsed)))
        return values

    def _update(self, batch: int, logs: dict | None, finalize: bool = False) -> None:
        if self._bar is None:
            return
        # Hooks carry Keras' step counter, which a short last call overshoots.
        done = batch + 1 if self._bar.target is None else min(batch + 1, self._bar.target)
        values = self._values(done, logs)
        # Logs are already running means over the epoch: show them as they are.
        self._bar.stateful_metrics.update(name for name, _ in values)
        self._bar.update(done, values=values, finalize=finalize)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.verbose:
            print(f"Epoch {epoch + 1}/{self.params.get('epochs')}")
            self._open(self.params.get("steps"), "train")

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.verbose == 1:
            self._update(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self.verbose and self._bar is not None:
            self._update(self.params.get("steps", 1) - 1, logs, finalize=True)
            self._bar = None
