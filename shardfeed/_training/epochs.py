"""`fit`'s epochs: the cursor moving through the data, call by call.

Separation of concerns: `api.fit` checks arguments and builds the callbacks;
this module runs the epochs -- which steps of which pass over the data each
fit epoch takes (`resume.segments`), where a resumed fit starts, the running
loss and metric state, and the replica sync check. The loop (`loop.py`) runs
the steps; the backup callback (`backup.py`) saves what `capture` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset
from shardfeed._training import resume as _resume
from shardfeed._training import sync as _sync
from shardfeed._training.loop import Loop


class FitRun:
    """One `fit` call's position and running totals.

    Args:
        model: The model being trained.
        dataset: The training dataset.
        initial_epoch: Fit epoch to start at.
        initial_step: Steps of `initial_epoch` already done (a resume from a
            mid-epoch `ModelCheckpoint`).
        steps_per_epoch: Steps per fit epoch (None: one pass over the data).
    """

    def __init__(
        self,
        model: keras.Model,
        dataset: ShardedResidentDataset,
        initial_epoch: int,
        initial_step: int,
        steps_per_epoch: int | None,
    ) -> None:
        self.model = model
        self.dataset = dataset
        self.steps_per_epoch = steps_per_epoch
        self._initial = (initial_epoch, initial_step)
        self.cursor = _resume.start_cursor(
            initial_epoch, initial_step, steps_per_epoch, dataset.plan.steps_per_epoch
        )
        self.totals: list[float] = [0.0, 0]
        self.steps_run = 0  # steps run by this fit call, for save frequencies
        self.state: _resume.ResumeState | None = None
        self.loop: Loop | None = None

    @property
    def epoch_steps(self) -> int:
        return self.steps_per_epoch or self.dataset.plan.steps_per_epoch

    def resume(self, state: _resume.ResumeState) -> None:
        """Continues from `state` (a backup's): checks it fits this dataset and
        world, keeps its global batch, and starts at its cursor."""
        _resume.adapt(state, self.dataset)
        self.state = state
        self.steps_per_epoch = state.steps_per_epoch
        self.cursor = state.cursor

    def capture(self) -> _resume.ResumeState:
        """The state to save now. Every rank must call it (metric reads may be
        collectives)."""
        assert self.loop is not None
        metrics = _resume.read_metrics(self.model, self.loop.engine)
        return _resume.capture(
            self.cursor, self.totals, self.dataset, self.steps_per_epoch, metrics
        )

    def train(
        self,
        loop: Loop,
        cbs: keras.callbacks.CallbackList,
        epochs: int,
        validate: Callable[[int], dict[str, float] | None],
        sync_check: bool | int,
    ) -> dict[str, float]:
        """Runs fit epochs from the cursor to `epochs`; returns the last logs."""
        self.loop = loop
        model = self.model
        initial = getattr(model, "_initial_epoch", None)
        if self.state is None and initial:
            # A callback that restores an epoch-boundary checkpoint the Keras way.
            self.cursor = _resume.start_cursor(
                initial, 0, self.steps_per_epoch, self.dataset.plan.steps_per_epoch
            )
        check_every = sync_check if loop.engine.num_replicas_in_sync > 1 else False
        calls = 0
        epoch_logs: dict[str, float] = {}
        for epoch in range(self.cursor.epoch, epochs):
            model.reset_metrics()
            self.totals = [0.0, 0]
            if self.state is not None and self.cursor.step > 0:
                _resume.restore_metrics(model, self.state.metrics, loop.engine)
                self.totals = [self.state.loss_sum, self.state.loss_rows]
            self.state = None
            cbs.on_epoch_begin(epoch)
            data_steps = self.dataset.plan.steps_per_epoch
            epoch_logs = {}
            for data_epoch, start, stop in _resume.segments(
                self.cursor, self.epoch_steps, data_steps
            ):
                offset = self.cursor.step - start

                def on_begin(step: int, offset: int = offset) -> None:
                    cbs.on_train_batch_begin(step + offset)

                def on_end(
                    step: int,
                    logs: dict[str, float],
                    offset: int = offset,
                    data_epoch: int = data_epoch,
                ) -> bool:
                    nonlocal calls
                    cursor = self.cursor
                    self.steps_run += step + offset + 1 - cursor.step
                    cursor.step, cursor.data_epoch, cursor.data_step = (
                        step + offset + 1,
                        data_epoch,
                        step + 1,
                    )
                    calls += 1
                    if check_every is not True and check_every and calls % check_every == 0:
                        _sync.check_in_sync(model, loop.engine, cursor.epoch, cursor.step)
                    cbs.on_train_batch_end(step + offset, logs)
                    return bool(model.stop_training)

                epoch_logs = loop.run_epoch(
                    data_epoch, True, on_begin, on_end, (start, stop), self.totals
                )
                if model.stop_training:
                    break
            if not epoch_logs and self.totals[1]:
                # Resumed after the epoch's last step: its logs, restored.
                epoch_logs = loop.logs(self.totals[0] / self.totals[1])
            epoch_logs = dict(epoch_logs)
            if check_every:
                _sync.check_in_sync(model, loop.engine, epoch, self.cursor.step)
            epoch_logs.update(validate(epoch) or {})
            self._next_epoch(epoch)
            cbs.on_epoch_end(epoch, epoch_logs)
            if model.stop_training:
                break
        return epoch_logs

    def _next_epoch(self, epoch: int) -> None:
        """Moves the cursor to the start of fit epoch `epoch + 1` (before
        `on_epoch_end`, so an epoch-end backup resumes at the next epoch)."""
        c = self.cursor
        if self.steps_per_epoch is None:
            c.data_epoch, c.data_step = epoch + 1, 0
        elif c.data_step >= self.dataset.plan.steps_per_epoch:
            c.data_epoch, c.data_step = c.data_epoch + 1, 0
        c.epoch, c.step = epoch + 1, 0


def check_steps(initial_step: Any, steps_per_epoch: Any, data_steps: int) -> None:
    """Checks `fit`'s `initial_step` and `steps_per_epoch` (`data_steps`: one pass).

    Raises:
        ValueError: For a `steps_per_epoch` below 1 or an `initial_step`
            outside the first epoch.
    """
    if steps_per_epoch is not None and not (
        _errors.is_integer(steps_per_epoch) and steps_per_epoch >= 1
    ):
        raise ValueError(
            _errors.message(
                "`steps_per_epoch` must be None (one pass over the data) or an integer >= 1.",
                f"steps_per_epoch={steps_per_epoch!r}",
                f"Pass e.g. `steps_per_epoch={data_steps}` (one pass), or leave it out.",
            )
        )
    epoch_steps = steps_per_epoch or data_steps
    if not (_errors.is_integer(initial_step) and 0 <= initial_step < epoch_steps):
        raise ValueError(
            _errors.message(
                f"`initial_step` must be an integer in [0, {epoch_steps}) (the steps of "
                "`initial_epoch` already done).",
                f"initial_step={initial_step!r}",
                "Pass the `{batch}` of a `ModelCheckpoint(save_freq=N)` file name, or 0.",
            )
        )
