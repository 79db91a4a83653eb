"""`fit` on JAX: the TensorFlow surface's arguments, callbacks, progress and `History`
(the shared `_training` modules), and a plain loop over epochs and calls with the
cursor `BackupAndRestore` saves and resumes at; the steps run in `loop.py`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras

from shardfeed._distribute import progress as _progress
from shardfeed._jax import inputs as _inputs
from shardfeed._jax import interrupts as _interrupts
from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.epoch import ResidentEpoch
from shardfeed._jax.evaluation import evaluate_loop
from shardfeed._jax.loop import Loop, loop_for, python_logs, to_host
from shardfeed._training import backup as _backup
from shardfeed._training import fit_args
from shardfeed._training import resume as _resume
from shardfeed._training.arguments import FIT_TRANSFORMS, check_model, resolve_verbose
from shardfeed._training.callbacks import callback_list, fit_params
from shardfeed._training.class_weights import class_weights
from shardfeed._training.options import FitOptions
from shardfeed._training.resume_state import Cursor, ResumeState, epoch_span


@_progress.in_api("fit")  # for `shardfeed launch`'s progress watch
def fit(
    model: keras.Model,
    dataset: ShardedResidentDataset | None = None,
    *positional: Any,
    epochs: int = 1,
    initial_epoch: int = 0,
    initial_step: int = 0,
    steps_per_epoch: int | None = None,
    validation_data: Any = None,
    validation_split: float = 0.0,
    validation_freq: int | list[int] = 1,
    class_weight: Mapping[int, float] | None = None,
    callbacks: list[keras.callbacks.Callback] | None = None,
    verbose: int | str = "auto",
    options: FitOptions | None = None,
    **unsupported: Any,
) -> keras.callbacks.History:
    """Trains a compiled Keras model on a resident dataset, on JAX.

    The same arguments, results and errors as the TensorFlow backend's
    `shardfeed.fit` (see its documentation), `class_weight` and
    `BackupAndRestore` (mid-epoch) included. Each compiled call runs
    `steps_per_execution` of the model's own `train_step` in one `jax.jit`
    (un-jitted, step by step, with `FitOptions(jit_compile=False)` or
    `run_eagerly=True`); batch hooks fire once per call, with the weights
    already in the model.
    """
    fit_args.refuse(unsupported, dataset)
    fit_args.check_positional(dataset, positional, ShardedResidentDataset)
    check_model(model, needs_compile=True)
    needs_targets = not _inputs.overrides(model, "train_step")
    dataset = _inputs.check_dataset(dataset, needs_targets=needs_targets)
    # Before any other collective (a split or validation data builds datasets).
    given = fit_args.FitArguments(  # in the signature's order
        epochs, initial_epoch, initial_step, steps_per_epoch, validation_data,
        validation_split, validation_freq, class_weight, callbacks, options,
    )
    call = fit_args.begin(model, dataset, given)
    dataset = call.dataset
    # Arrays later given to evaluate/predict get this dataset's transform.
    FIT_TRANSFORMS[model] = dataset.transform
    verbose = resolve_verbose(verbose)
    loop = loop_for(
        model, dataset.world, options or FitOptions(), class_weights(class_weight, dataset)
    )
    validate = _validation(model, dataset, call.validation_data, loop, call.should_validate)
    run = _Run(
        model, dataset, loop, call.initial_epoch, call.initial_step, call.steps_per_epoch
    )
    callbacks, backed_up = _backup.wrap(callbacks, run, dataset.world)
    if backed_up is not None:
        run.resume(backed_up)  # checked against this dataset, world and steps
    plan = run.plan  # a resume on other replicas keeps the checkpoint's global batch
    params = fit_params(
        plan,
        epochs=call.epochs,
        steps=run.epoch_steps,
        verbose=verbose,
        steps_per_call=loop.steps_per_call,
        jit_compile=loop.jit,
    )
    cbs = callback_list(callbacks, model, verbose, dataset.world.is_chief, params)
    model.stop_training = False
    cbs.on_train_begin()
    # The cursor (and a backup's state) says where to start; a callback that
    # restores the Keras way sets `model._initial_epoch`, which `train` reads.
    with _interrupts.handled():  # a Ctrl-C leaves the model valid
        epoch_logs = run.train(cbs, call.epochs, validate)
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and call.epochs > 0:
        # As Keras' `fit`: e.g. `use_ema=True` puts the moving averages in the model.
        model.optimizer.finalize_variable_values(model.trainable_weights)
    cbs.on_train_end(epoch_logs)
    return model.history


def _validation(
    model: keras.Model,
    dataset: ShardedResidentDataset,
    validation_data: Any,
    loop: Loop,
    should_validate: Callable[[int], bool],
) -> Callable[[int, keras.callbacks.CallbackList], dict[str, Any]]:
    """`validate(epoch, cbs)`: the `val_` logs after `epoch` (empty when
    there is no validation data or `validation_freq` skips the epoch).

    The validation labels are checked here, before the first step, as on
    TensorFlow: checked only by the first evaluation pass, bad labels were
    refused after a whole epoch had trained."""
    if validation_data is None:
        return lambda epoch, cbs: {}
    val_ds = _inputs.as_dataset(
        *fit_args.validation_arrays(validation_data), None, template=dataset
    )
    _inputs.check_dataset(
        val_ds, needs_targets=not _inputs.overrides(model, "test_step"), name="validation_data"
    )
    epoch = val_ds.epoch(0, training=False)
    try:
        _inputs.check_sparse_labels(model, val_ds, "validation_data", loop.build(epoch, "test"))
    finally:
        epoch.close()
    cap = fit_args.max_steps(None)

    def validate(epoch: int, cbs: keras.callbacks.CallbackList) -> dict[str, Any]:
        if not should_validate(epoch):
            return {}
        logs = evaluate_loop(loop, val_ds, cbs, cap, "validation_data")
        return {f"val_{k}": v for k, v in logs.items()}

    return validate


class _Run(_resume.FitPosition):
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
