"""`fit`'s epochs on JAX (`FitRun`): a plain loop over epochs and the loop's calls,
with the cursor `BackupAndRestore` saves and resumes at; the steps run in `loop.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras

from shardfeed._jax import inputs as _inputs
from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.epoch import ResidentEpoch
from shardfeed._jax.loop import Loop, python_logs, to_host
from shardfeed._training import fit_args
from shardfeed._training import resume as _resume
from shardfeed._training.resume_state import Cursor, ResumeState, epoch_span


class FitRun(_resume.FitPosition):
    """One `fit` call's epochs and position (`FitPosition`): which steps of
    which pass over the data each fit epoch takes (`epoch_span`, as Keras'
    epoch iterator on finite data), and the state a `BackupAndRestore` saves
    (`capture`) and a restarted fit resumes from (`resume`).

    The epoch's running loss and metrics are Keras' metric variables (the
    loss tracker among them): the resume state's `metrics` carry them whole,
    and its `loss_sum`/`loss_rows` the loss tracker's, as TensorFlow's loop
    writes them (a state resumes inside its epoch on either backend).
    """

    def __init__(
        self,
        model: keras.Model,
        dataset: ShardedResidentDataset,
        loop: Loop,
        initial_epoch: int,
        initial_step: int,
        steps_per_epoch: int | None,
    ) -> None:
        super().__init__(dataset, initial_epoch, initial_step, steps_per_epoch)
        self.model, self.loop = model, loop
        self._open: ResidentEpoch | None = None

    def capture(self) -> ResumeState:
        """The state to save now: the cursor and the metric variables'
        values (replicated: this process's copy, no collective), and the
        epoch's running loss as TensorFlow's loop keeps it (`loss_sum` over
        `loss_rows` rows), from Keras' loss tracker, so that either backend
        resumes the state inside its epoch."""
        model = self.model
        metrics = [to_host(v.value).tolist() for v in _resume.metric_variables(model)]
        totals = (0.0, 0)
        tracker = getattr(model, "_loss_tracker", None)
        if self.cursor.step and tracker is not None and float(to_host(tracker.count.value)):
            # The rows counted from the plan: the tracker's float32 count is
            # inexact past 2**24 rows.
            totals = (float(to_host(tracker.total.value)), self._rows_done())
        return _resume.capture(
            self.cursor, totals, self.dataset, self.plan, self.steps_per_epoch, metrics
        )

    def _rows_done(self) -> int:
        """Real rows of the steps of the current fit epoch done so far."""
        plan, cursor = self.plan, self.cursor
        rows = cursor.step * plan.global_batch_size
        if plan.has_partial_step and cursor.data_step == plan.steps_per_epoch and cursor.step:
            rows -= plan.global_batch_size - sum(plan.last_step_rows)
        return rows

    def _restore_loss(self, state: ResumeState) -> None:
        """Keras' loss tracker from the state's running loss (TensorFlow
        writes it beside the metric variables, whose loss tracker it leaves
        at 0); a state without one keeps the tracker's restored values."""
        tracker = getattr(self.model, "_loss_tracker", None)
        if tracker is not None and state.loss_rows:
            tracker.total.assign(state.loss_sum)
            tracker.count.assign(float(state.loss_rows))

    def _data_epoch(self, number: int) -> ResidentEpoch:
        """Pass `number` over the data, opened once for the fit epochs it spans."""
        if self._open is not None and self._open.epoch == number:
            return self._open
        self._close()
        augment = self.dataset.augment is not None
        self._open = self.dataset.epoch(number, augment=augment, plan=self.plan)
        return self._open

    def _close(self) -> None:
        if self._open is not None:
            self._open.close()
            self._open = None

    def train(
        self,
        cbs: keras.callbacks.CallbackList,
        epochs: int,
        validate: Callable[[int, keras.callbacks.CallbackList], dict[str, Any]],
    ) -> dict[str, Any] | None:
        """Runs fit epochs from the cursor to `epochs`; returns the last
        epoch's logs (None when no epoch ran, as Keras)."""
        model, loop = self.model, self.loop
        initial = getattr(model, "_initial_epoch", None)
        if self.state is None and initial:
            # A callback that restores an epoch-boundary checkpoint the Keras way.
            self.cursor = self._cursor(initial, 0)
        epoch_logs: dict[str, Any] | None = None
        first = True
        try:
            for epoch in range(self.cursor.epoch, epochs):
                model.reset_metrics()
                cbs.on_epoch_begin(epoch)
                number, start, stop = epoch_span(
                    epoch, self.steps_per_epoch, self.plan.steps_per_epoch
                )
                data = self._data_epoch(number)
                if first:
                    spec = loop.build(data, "train")
                    _inputs.check_sparse_labels(model, self.dataset, "dataset", spec)
                    loop.broadcast_from_chief()
                    first = False
                logs: dict[str, Any] = {}
                if self.state is not None and self.cursor.step > 0:
                    # Resumed inside the epoch: its metrics so far (the metric
                    # variables exist once `build` ran).
                    _resume.restore_metrics(model, self.state.metrics, self.state.source)
                    self._restore_loss(self.state)
                    logs = python_logs(model.get_metrics_result())
                self.state = None
                for call in loop.calls(data, start + self.cursor.step, stop, start):
                    cbs.on_train_batch_begin(call.begin_step)
                    for a, b in call.pieces:
                        logs = python_logs(loop.run("train", data, a, b))
                    self.steps_run += call.stop - call.start
                    self.cursor = Cursor(epoch, call.stop - start, number, call.stop)
                    cbs.on_train_batch_end(call.end_step, logs)
                    if model.stop_training:
                        break
                fit_args.warn_if_ran_out(self.steps_per_epoch, stop - start, model.stop_training)
                # As Keras: the metrics' results when the logs name them.
                epoch_logs = python_logs(model._get_metrics_result_or_logs(logs))
                epoch_logs.update(validate(epoch, cbs))
                # Before `on_epoch_end`, so an epoch-end backup resumes at the next epoch.
                self.cursor = self._cursor(epoch + 1, 0)
                cbs.on_epoch_end(epoch, epoch_logs)
                if model.stop_training:
                    break
        finally:
            self._close()
        return epoch_logs
