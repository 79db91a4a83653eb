"""`fit`'s epochs on TensorFlow (`FitRun`): a plain loop over epochs and `Loop.epoch`'s calls.

Which steps of which pass each fit epoch takes, where a resumed fit starts, the
running loss and metric state, the replica sync check, and `capture` for the
backup callback; the base `FitPosition` is `_training/resume.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._tf import sync as _sync
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.loop import Loop
from shardfeed._training import fit_args as _fit_args
from shardfeed._training import resume as _resume
from shardfeed._training.options import FitOptions

__all__ = ["FitRun"]


def read_metrics(model: keras.Model, engine: Any) -> list[Any]:
    """The metric variables' global values (every rank must call it: under
    MultiWorkerMirroredStrategy reading a sync-on-read variable is a
    collective; under Horovod each rank holds its own part, summed here)."""
    values = []
    for v in _resume.metric_variables(model):
        if not engine.uses_strategy:
            value = tf.convert_to_tensor(v.value)
            if getattr(v, "aggregation", "sum") == "sum":
                value = engine.sum_across_replicas(value)
            values.append(np.asarray(value).tolist())
        else:
            values.append(np.asarray(v.numpy()).tolist())
    return values


class FitRun(_resume.FitPosition):
    """One `fit` call's position (`FitPosition`) and running totals.

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
        super().__init__(dataset, initial_epoch, initial_step, steps_per_epoch)
        self.model = model
        self.totals: tuple[float, int] = (0.0, 0)  # the epoch's (loss sum, rows)
        self.loop: Loop | None = None

    def capture(self) -> _resume.ResumeState:
        """The state to save now. Every rank must call it (metric reads may be
        collectives)."""
        assert self.loop is not None
        metrics = read_metrics(self.model, self.loop.engine)
        return _resume.capture(
            self.cursor, self.totals, self.dataset, self.plan, self.steps_per_epoch, metrics
        )

    def train(
        self,
        loop: Loop,
        cbs: keras.callbacks.CallbackList,
        epochs: int,
        validate: Callable[[int], dict[str, float] | None],
        options: FitOptions,
    ) -> dict[str, float] | None:
        """Runs fit epochs from the cursor to `epochs`; returns the last
        epoch's logs (None when no epoch ran, as Keras); `options` says when
        the replicas' weights are compared (`sync_check`)."""
        self.loop = loop
        model = self.model
        initial = getattr(model, "_initial_epoch", None)
        if self.state is None and initial:
            # A callback that restores an epoch-boundary checkpoint the Keras way.
            self.cursor = self._cursor(initial, 0)
        replicas = loop.engine.num_replicas_in_sync > 1
        check_each_epoch = replicas and options.sync_check_each_epoch
        check_every_calls = options.sync_check_every_calls if replicas else None
        calls = 0
        epoch_logs: dict[str, float] | None = None
        for epoch in range(self.cursor.epoch, epochs):
            model.reset_metrics()
            self.totals = (0.0, 0)
            if self.state is not None and self.cursor.step > 0:
                engine = loop.engine
                _resume.restore_metrics(
                    model,
                    self.state.metrics,
                    self.state.source,
                    zero_sums=not engine.uses_strategy and engine.world.rank != 0,
                )
                self.totals = (self.state.loss_sum, self.state.loss_rows)
            self.state = None
            cbs.on_epoch_begin(epoch)
            data_epoch, start, stop = _resume.epoch_span(
                epoch, self.steps_per_epoch, self.plan.steps_per_epoch
            )
            steps = (start + self.cursor.step, stop)
            logs: dict[str, Any] = {}
            with loop.epoch(
                data_epoch, True, self.plan, steps, step_offset=start, totals=self.totals
            ) as it:
                if self.totals[1]:
                    logs = it.logs()  # resumed: the restored epoch's logs so far
                for call in it:
                    cbs.on_train_batch_begin(call.begin_step)
                    logs = it.run(call)
                    self.totals = it.totals
                    self.steps_run += call.stop - start - self.cursor.step
                    self.cursor = _resume.Cursor(epoch, call.stop - start, data_epoch, call.stop)
                    calls += 1
                    if check_every_calls and calls % check_every_calls == 0:
                        _sync.check_in_sync(model, loop.engine, epoch, self.cursor.step)
                    cbs.on_train_batch_end(call.end_step, logs)
                    if model.stop_training:
                        break
            _fit_args.warn_if_ran_out(self.steps_per_epoch, stop - start, model.stop_training)
            epoch_logs = dict(logs)
            if check_each_epoch:
                _sync.check_in_sync(model, loop.engine, epoch, self.cursor.step)
            epoch_logs.update(validate(epoch) or {})
            # Before `on_epoch_end`, so an epoch-end backup resumes at the next epoch.
            self.cursor = self._cursor(epoch + 1, 0)
            cbs.on_epoch_end(epoch, epoch_logs)
            if model.stop_training:
                break
        return epoch_logs
