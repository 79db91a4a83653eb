"""`fit` on JAX: the TensorFlow surface's arguments, callbacks, progress and `History`
(the shared `_training` modules) and validation; the epochs run in `epochs.py`
(`FitRun`), the steps in `loop.py`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras

from shardfeed._distribute import progress as _progress
from shardfeed._jax import inputs as _inputs
from shardfeed._jax import interrupts as _interrupts
from shardfeed._jax.compiled import loop_for
from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.epochs import FitRun
from shardfeed._jax.evaluation import evaluate_loop
from shardfeed._jax.loop import Loop
from shardfeed._training import backup as _backup
from shardfeed._training import fit_args
from shardfeed._training.arguments import FIT_TRANSFORMS, check_model, resolve_verbose
from shardfeed._training.callbacks import callback_list, fit_params
from shardfeed._training.class_weights import class_weights
from shardfeed._training.options import FitOptions


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
    run = FitRun(
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
