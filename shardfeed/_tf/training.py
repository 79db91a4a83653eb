"""`fit` on TensorFlow: the Keras surface over the compiled loop.

Its own checks, then `fit_args.begin`, the loop (`compiled.loop_for`), the
callbacks and `History`; the epochs run in `epochs.FitRun`, the steps in `Loop`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras

from shardfeed._distribute import progress as _progress
from shardfeed._tf.compiled import loop_for
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.engines.peers import naming_lost_peers
from shardfeed._tf.epochs import FitRun
from shardfeed._tf.evaluation import evaluate_loop
from shardfeed._tf.inputs import (
    FIT_TRANSFORMS,
    as_dataset,
    check_dataset,
    check_model,
    check_sparse_labels,
    resolve_verbose,
)
from shardfeed._tf.model_steps import ModelSteps
from shardfeed._tf.world import one_call_at_a_time
from shardfeed._training import backup as _backup
from shardfeed._training import fit_args
from shardfeed._training.callbacks import callback_list, fit_params
from shardfeed._training.class_weights import class_weights
from shardfeed._training.options import FitOptions, with_model_steps


@naming_lost_peers
@one_call_at_a_time
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
    """Trains a compiled Keras model on a resident dataset.

    Like `model.fit`, but every batch is gathered on the device and many
    steps run per compiled call; only each call's logs come back to Python.

    Args:
        model: A compiled Keras 3 model (built in the dataset's strategy scope).
        dataset: A `ShardedResidentDataset` with targets.
        epochs: Index of the epoch to stop before (as in `model.fit`; none
            to run returns an empty `History`).
        initial_epoch: Epoch to start at (for resuming).
        initial_step: Steps of `initial_epoch` already done: resumes inside
            an epoch (e.g. from `ModelCheckpoint(save_freq=N)`: its `{epoch}`
            is `initial_epoch + 1` and its `{batch}` is `initial_step`) with
            the same remaining batches in the same order. The first epoch's
            logs then cover only its remaining steps; a `BackupAndRestore`
            resumes by itself, with logs over the whole epoch.
        steps_per_epoch: Steps per epoch (None: one pass over the data). As
            Keras on finite data, an epoch ends early (with Keras' warning)
            when the pass over the data runs out, and the next starts a new
            pass; each pass uses every row once.
        validation_data: A `ShardedResidentDataset` or a tuple
            `(x, y[, sample_weight])`, evaluated at the end of epochs; its logs
            get a `val_` prefix.
        validation_split: Validate on the last fraction of the dataset's rows
            and train on the rest (as Keras: split before sharding; both
            parts are built from the dataset's sources).
        validation_freq: Validate every this many epochs, or after the
            epochs (from 1) in a list.
        class_weight: `{class: weight}`: each training row weighs its class's
            weight (1 if absent), as in Keras.
        callbacks: Keras callbacks. Batch hooks fire once per compiled call.
            A `keras.callbacks.BackupAndRestore` (also with an integer
            `save_freq`) resumes a killed fit at its last backup, on this or
            another number of replicas (docs/resume.md).
        verbose: "auto" or 1 (progress bar), 2 (a line per epoch), 0 (silent).
        options: `FitOptions` (steps per call, XLA). Its "auto" steps per
            call take the model's `compile(steps_per_execution=k)` when `k > 1`.
        **unsupported: Other `model.fit` arguments are refused, each with what
            to use instead (docs/keras.md has the table).

    Returns:
        The `keras.callbacks.History` (also `model.history`), with
        `history.params` holding the plan: steps, global batch, dropped rows.

    Raises:
        TypeError: If `model` or `dataset` has the wrong type, for arrays
            (`fit(model, x, y)`, `x=`/`y=`) and for refused `model.fit`
            arguments, each with the fix.
        ValueError: If the model is not compiled, the dataset has no targets,
            the epochs are not integers >= 0, or `FitOptions.steps_per_execution`
            disagrees with the model's compiled one.

    Example:
        >>> ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
        >>> history = shardfeed.fit(model, ds, epochs=5, validation_data=(xv, yv))
        >>> history.history["val_loss"]
    """
    fit_args.refuse(unsupported, dataset)
    fit_args.check_positional(dataset, positional, ShardedResidentDataset)
    check_model(model, needs_compile=True)
    # A model's own step may train on `x` alone, as under Keras.
    steps = ModelSteps.of(model)
    dataset = check_dataset(dataset, needs_targets=not steps.train)
    # Before any other collective (a split or validation data builds datasets).
    given = fit_args.FitArguments(  # in the signature's order
        epochs, initial_epoch, initial_step, steps_per_epoch, validation_data,
        validation_split, validation_freq, class_weight, callbacks, options,
    )
    call = fit_args.begin(model, dataset, given)
    dataset, validation_data = call.dataset, call.validation_data
    # A batch larger than the data trains one short step, as Keras
    # (`plan_shards` refuses only a step with no row on some replica).
    run = FitRun(model, dataset, call.initial_epoch, call.initial_step, call.steps_per_epoch)
    callbacks, backed_up = _backup.wrap(callbacks, run, dataset.world)
    if backed_up is not None:
        run.resume(backed_up)  # checked against this dataset, world and steps
    plan = run.plan  # a resume on other replicas keeps the checkpoint's global batch
    # Arrays later given to evaluate/predict get this dataset's transform.
    FIT_TRANSFORMS[model] = dataset.transform
    verbose = resolve_verbose(verbose)
    options = with_model_steps(options or FitOptions(), model)
    loop = loop_for(model, dataset, options, class_weights(class_weight, dataset))
    check_sparse_labels(model, dataset, "dataset")
    val_loop = None
    if validation_data is not None:
        val_ds = as_dataset(*fit_args.validation_arrays(validation_data), None, model, dataset)
        check_dataset(val_ds, needs_targets=not steps.test, name="validation_data")
        val_loop = loop_for(model, val_ds, options)
        check_sparse_labels(model, val_ds, "validation_data")
    params = fit_params(
        plan,
        epochs=call.epochs,
        steps=run.epoch_steps,
        verbose=verbose,
        steps_per_call=loop.steps_per_call,
        jit_compile=loop.jit_compile,
    )
    cbs = callback_list(callbacks, model, verbose, dataset.world.is_chief, params)
    model.stop_training = False
    cbs.on_train_begin()

    val_max_steps = fit_args.max_steps(None) if val_loop is not None else None

    def validate(epoch: int) -> dict[str, float] | None:
        if val_loop is None or not call.should_validate(epoch):
            return None
        logs = evaluate_loop(val_loop, cbs, val_max_steps)
        return {f"val_{k}": v for k, v in logs.items()}

    # The cursor (and a backup's state) says where to start; a callback that
    # restores the Keras way sets `model._initial_epoch`, which `train` reads.
    epoch_logs = run.train(loop, cbs, call.epochs, validate, options)
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and call.epochs > 0:
        # As Keras' `fit`: e.g. `use_ema=True` puts the moving averages in the model.
        with loop.engine.scope():
            model.optimizer.finalize_variable_values(model.trainable_weights)
    cbs.on_train_end(epoch_logs)
    return model.history
