"""The Keras surface: `fit`, `evaluate` and `predict` over resident datasets.

Separation of concerns: this layer owns what a Keras user sees -- argument
checks, building the model's optimizer and metrics, callbacks, the progress
bar and the returned `History` / values. It hands the step loop to `Loop` and
the distribution to the engine, and takes the data's shape from the dataset.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal

import keras
import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset, num_rows_of
from shardfeed._distribute.world import current_world
from shardfeed._training import backup as _backup
from shardfeed._training import fit_args
from shardfeed._training.callbacks import callback_list
from shardfeed._training.class_weights import class_weights
from shardfeed._training.compiled import loop_for
from shardfeed._training.epochs import FitRun, check_steps
from shardfeed._training.labels import check_sparse_labels
from shardfeed._training.loop import Loop
from shardfeed._training.model_steps import ModelSteps
from shardfeed._training.options import FitOptions, with_model_steps

DEFAULT_EVAL_BATCH_SIZE = 256

Transform = Callable[[Any], Any]

# The `transform` of the dataset each model was last fit on, for arrays given
# to `evaluate`/`predict` with `transform="auto"`. Weak keys: an entry lives as
# long as its model, and the model itself carries nothing new (it saves,
# clones and pickles as before).
_FIT_TRANSFORMS: weakref.WeakKeyDictionary[keras.Model, Transform | None] = (
    weakref.WeakKeyDictionary()
)


def _check_model(model: Any, needs_compile: bool) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            _errors.message(
                "shardfeed trains Keras 3 models (`keras.Model`).",
                f"type(model)={type(model).__name__}",
                "Build the model with `keras.Sequential`, the functional API or a "
                "`keras.Model` subclass.",
            )
        )
    if needs_compile and (
        not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None
    ):
        raise ValueError(
            _errors.message(
                "The model must be compiled with an optimizer and a loss first.",
                f"model.compiled={getattr(model, 'compiled', False)}",
                "Call `model.compile(optimizer=..., loss=..., metrics=[...])` "
                "before `shardfeed.fit` or `shardfeed.evaluate`.",
            )
        )


def _check_dataset(dataset: Any, needs_targets: bool, name: str = "dataset") -> None:
    if not isinstance(dataset, ShardedResidentDataset):
        raise TypeError(
            _errors.message(
                f"`{name}` must be a `ShardedResidentDataset`.",
                f"type({name})={type(dataset).__name__}",
                "Build one with `ShardedResidentDataset(x, y, per_replica_batch_size=...)`.",
            )
        )
    if needs_targets and not dataset.has_targets:
        raise ValueError(
            _errors.message(
                "Training and evaluation need targets.",
                f"{name} built with y=None",
                "Pass `y` when building the dataset.",
            )
        )


def _as_dataset(
    data: Any,
    y: Any,
    sample_weight: Any,
    per_replica_batch_size: int | None,
    model: keras.Model,
    template: ShardedResidentDataset | None = None,
    transform: Transform | None = None,
) -> ShardedResidentDataset:
    """Wraps arrays in an unshuffled dataset on the model's strategy, for
    evaluation or prediction, applying `transform` to their `x`.

    `template` (the training dataset, for `validation_data`) lends its
    placement, transform, batch size and load options.
    """
    if per_replica_batch_size is not None and not (
        _errors.is_integer(per_replica_batch_size) and per_replica_batch_size >= 1
    ):
        raise ValueError(
            _errors.message(
                "`per_replica_batch_size` must be None (the default batch) or an integer >= 1.",
                f"per_replica_batch_size={per_replica_batch_size!r}",
                f"Pass e.g. 256, or leave it as None for {DEFAULT_EVAL_BATCH_SIZE}.",
            )
        )
    if isinstance(data, ShardedResidentDataset):
        return data
    if isinstance(data, tuple) and y is None and sample_weight is None and 2 <= len(data) <= 3:
        data, y, sample_weight = (*data, None)[:3]
    rows = num_rows_of(data, y, sample_weight)
    world = current_world(model.distribute_strategy)
    if per_replica_batch_size is not None:
        batch = int(per_replica_batch_size)
    elif template is not None:
        batch = template.per_replica_batch_size
    else:
        batch = DEFAULT_EVAL_BATCH_SIZE
    # Small arrays: shrink the batch so a step holds a real row on most replicas
    # (evaluation pads the rest).
    batch = max(1, min(batch, rows // world.num_replicas_in_sync))
    return ShardedResidentDataset(
        data,
        y,
        sample_weight,
        per_replica_batch_size=batch,
        shuffle=False,
        placement=template.plan.placement if template is not None else "shard",
        transform=template.transform if template is not None else transform,
        load_options=template.load_options if template is not None else None,
        strategy=world.strategy,
    )


def _resolve_transform(
    model: keras.Model, data: Any, transform: Transform | Literal["auto"] | None
) -> Transform | None:
    """The transform `evaluate`/`predict` apply to arrays (see their docs)."""
    auto = isinstance(transform, str) and transform == "auto"
    if isinstance(data, ShardedResidentDataset):
        if not auto:
            raise ValueError(
                _errors.message(
                    "`transform` applies to arrays; a `ShardedResidentDataset` applies "
                    "the `transform` it was built with.",
                    f"transform={transform!r} with a ShardedResidentDataset",
                    "Leave `transform` out, or build the dataset with the transform.",
                )
            )
        return data.transform
    if auto:
        return _FIT_TRANSFORMS.get(model)
    if transform is not None and not callable(transform):
        raise TypeError(
            _errors.message(
                '`transform` must be "auto", None or a function of a batch\'s `x`.',
                f"transform={transform!r}",
                'Pass e.g. `transform=lambda x: tf.cast(x, "float32") / 255`.',
            )
        )
    return transform


def _resolve_verbose(verbose: int | str) -> int:
    if verbose == "auto":
        return 1
    if verbose not in (0, 1, 2):
        raise ValueError(
            _errors.message(
                '`verbose` must be "auto", 0, 1 or 2.',
                f"verbose={verbose!r}",
                "Use 0 (silent), 1 (progress bar) or 2 (one line per epoch).",
            )
        )
    return int(verbose)


def fit(
    model: keras.Model,
    dataset: ShardedResidentDataset,
    *,
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
        TypeError: If `model` or `dataset` has the wrong type.
        ValueError: If the model is not compiled, the dataset has no targets,
            the epochs are not integers >= 0, or `FitOptions.steps_per_execution`
            disagrees with the model's compiled one.

    Example:
        >>> ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
        >>> history = shardfeed.fit(model, ds, epochs=5, validation_data=(xv, yv))
        >>> history.history["val_loss"]
    """
    fit_args.refuse(unsupported, dataset)
    _check_model(model, needs_compile=True)
    # A model's own step may train on `x` alone, as under Keras.
    steps = ModelSteps.of(model)
    _check_dataset(dataset, needs_targets=not steps.train)
    if validation_split:
        dataset, validation_data = fit_args.split_validation(
            dataset, validation_split, validation_data
        )
    # A batch larger than the data trains one short step, as Keras
    # (`plan_shards` refuses only a step with no row on some replica).
    plan = dataset.plan
    if not (
        _errors.is_integer(epochs)
        and _errors.is_integer(initial_epoch)
        and epochs >= 0
        and initial_epoch >= 0
    ):
        raise ValueError(
            _errors.message(
                "`epochs` and `initial_epoch` must be integers >= 0.",
                f"epochs={epochs!r}, initial_epoch={initial_epoch!r}",
                "Pass e.g. `epochs=10` (and `initial_epoch=k` to resume after epoch k).",
            )
        )
    should_validate = fit_args.validation_schedule(validation_freq)
    epochs, initial_epoch = int(epochs), int(initial_epoch)
    # Keras' debugging caps (`keras.config.set_max_epochs`/`set_max_steps_per_epoch`),
    # with Keras' warnings.
    max_epochs = keras.config.max_epochs()
    if max_epochs and max_epochs < epochs:
        warnings.warn(f"Limiting epochs to {max_epochs}", stacklevel=2)
        epochs = max_epochs
    steps_per_epoch = _max_steps(steps_per_epoch)
    check_steps(initial_step, steps_per_epoch, plan.steps_per_epoch)
    run = FitRun(
        model,
        dataset,
        initial_epoch,
        int(initial_step),
        None if steps_per_epoch is None else int(steps_per_epoch),
    )
    callbacks = _backup.wrap(callbacks, run, dataset.world.is_chief)
    plan = run.plan  # a resume on other replicas keeps the checkpoint's global batch
    # Arrays later given to evaluate/predict get this dataset's transform.
    _FIT_TRANSFORMS[model] = dataset.transform
    verbose = _resolve_verbose(verbose)
    options = with_model_steps(options or FitOptions(), model)
    loop = loop_for(model, dataset, options, class_weights(class_weight, dataset))
    check_sparse_labels(model, dataset, "dataset")
    val_loop = None
    if validation_data is not None:
        val_ds = _as_dataset(validation_data, None, None, None, model, dataset)
        _check_dataset(val_ds, needs_targets=not steps.test, name="validation_data")
        val_loop = loop_for(model, val_ds, options)
        check_sparse_labels(model, val_ds, "validation_data")
    params = {
        "epochs": epochs,
        "steps": run.epoch_steps,
        "verbose": verbose,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "num_replicas_in_sync": plan.num_replicas,
        "samples": plan.used_rows_per_epoch,
        "dropped_rows_per_epoch": plan.dropped_rows_per_epoch,
        "steps_per_execution": loop.steps_per_call(plan.full_steps_per_epoch)
        if plan.full_steps_per_epoch
        else 1,
        "jit_compile": loop.jit_compile,
    }
    cbs = callback_list(callbacks, model, verbose, dataset.world.is_chief, params)
    model.stop_training = False
    cbs.on_train_begin()

    val_max_steps = _max_steps(None) if val_loop is not None else None

    def validate(epoch: int) -> dict[str, float] | None:
        if val_loop is None or not should_validate(epoch):
            return None
        logs = _evaluate_loop(val_loop, cbs, val_max_steps)
        return {f"val_{k}": v for k, v in logs.items()}

    # The cursor (and a backup's state) says where to start; a callback that
    # restores the Keras way sets `model._initial_epoch`, which `train` reads.
    epoch_logs = run.train(loop, cbs, epochs, validate, options.sync_check)
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        # As Keras' `fit`: e.g. `use_ema=True` puts the moving averages in the model.
        with loop.engine.scope():
            model.optimizer.finalize_variable_values(model.trainable_weights)
    cbs.on_train_end(epoch_logs)
    return model.history


def _max_steps(steps: int | None) -> int | None:
    """`steps` capped by `keras.config.max_steps_per_epoch()`, with Keras' warning."""
    cap = keras.config.max_steps_per_epoch()
    if cap and (not steps or cap < steps):
        warnings.warn(f"Limiting steps_per_epoch to {cap}", stacklevel=3)
        return int(cap)
    return steps


def _evaluate_loop(
    loop: Loop, cbs: keras.callbacks.CallbackList, max_steps: int | None = None
) -> dict[str, float]:
    """One evaluation pass, as Keras' `evaluate`: test hooks per call, the
    model's `stop_evaluating` checked after each, at most `max_steps` steps."""
    model = loop.model
    model.reset_metrics()
    model.stop_evaluating = False
    cbs.on_test_begin()
    logs: dict[str, Any] = {}
    steps = (0, min(max_steps, loop.dataset.eval_plan.steps_per_epoch)) if max_steps else None
    with loop.epoch(0, False, steps=steps) as it:
        for call in it:
            cbs.on_test_batch_begin(call.begin_step)
            logs = it.run(call)
            cbs.on_test_batch_end(call.end_step, logs)
            if model.stop_evaluating:
                break
    cbs.on_test_end(logs)
    return logs


def evaluate(
    model: keras.Model,
    data: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    per_replica_batch_size: int | None = None,
    transform: Transform | Literal["auto"] | None = "auto",
    callbacks: list[keras.callbacks.Callback] | None = None,
    verbose: int | str = 0,
    return_dict: bool = False,
    options: FitOptions | None = None,
) -> float | list[float] | dict[str, float]:
    """Exact loss and metrics of a compiled model over every row.

    Each row counts exactly once: a partial last batch is evaluated on its
    real rows only, and (sum, count) pairs are reduced across replicas.

    Args:
        model: A compiled Keras 3 model.
        data: A `ShardedResidentDataset`, or inputs `x` (with `y`).
        y: Targets when `data` is `x`.
        sample_weight: Weights when `data` is `x`.
        per_replica_batch_size: Batch when `data` is arrays (default 256).
        transform: What to apply to each batch of `x` when `data` is arrays:
            `"auto"` (default) applies the `transform` of the dataset the
            model was last trained on with `shardfeed.fit` (none if it was
            never fit by shardfeed or that dataset had none), so arrays in
            the training data's raw form (e.g. uint8 images) are scaled as in
            training; None applies nothing (arrays already in the model's
            input form); or a function. A `ShardedResidentDataset` always
            uses its own transform.
        callbacks: Keras callbacks (test hooks).
        verbose: Unused beyond Keras compatibility (no progress bar).
        return_dict: Return `{name: value}` instead of a list.
        options: `FitOptions` (steps per call, XLA).

    Returns:
        The loss (a float) when the model has no metrics, else
        `[loss, *metrics]` in `model.metrics_names` order, or a dict.

    Raises:
        TypeError, ValueError: As for `fit`; also for a `transform` given
            with a `ShardedResidentDataset`, or a batch size below 1.

    Example:
        >>> loss, acc = shardfeed.evaluate(model, x_test, y_test)
    """
    _check_model(model, needs_compile=True)
    _resolve_verbose(verbose)
    transform = _resolve_transform(model, data, transform)
    dataset = _as_dataset(
        data, y, sample_weight, per_replica_batch_size, model, transform=transform
    )
    _check_dataset(dataset, needs_targets=not ModelSteps.of(model).test, name="data")
    loop = loop_for(model, dataset, with_model_steps(options or FitOptions(), model))
    check_sparse_labels(model, dataset, "data")
    cbs = keras.callbacks.CallbackList(
        callbacks, model=model, verbose=0, epochs=1, steps=dataset.eval_plan.steps_per_epoch
    )
    logs = _evaluate_loop(loop, cbs, _max_steps(None))
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def predict(
    model: keras.Model,
    data: Any,
    *,
    per_replica_batch_size: int | None = None,
    transform: Transform | Literal["auto"] | None = "auto",
    options: FitOptions | None = None,
) -> Any:
    """Predictions for every row, in the original row order.

    Args:
        model: A Keras 3 model (need not be compiled).
        data: A `ShardedResidentDataset` (its `x` is used) or inputs `x`.
        per_replica_batch_size: Batch when `data` is arrays (default 256).
        transform: What to apply to each batch of `x` when `data` is arrays:
            `"auto"` (default) applies the `transform` of the dataset the
            model was last trained on with `shardfeed.fit` (none if it was
            never fit by shardfeed or that dataset had none), so arrays in
            the training data's raw form (e.g. uint8 images) are scaled as in
            training; None applies nothing (arrays already in the model's
            input form); or a function. A `ShardedResidentDataset` always
            uses its own transform.
        options: `FitOptions` (steps per call, XLA).

    Returns:
        NumPy arrays shaped like the model's outputs, one row per input row.

    Raises:
        TypeError, ValueError: For a model that is not a Keras model, a
            `transform` given with a `ShardedResidentDataset`, or a batch
            size below 1.

    Example:
        >>> probs = shardfeed.predict(model, x_test)
    """
    _check_model(model, needs_compile=False)
    transform = _resolve_transform(model, data, transform)
    dataset = _as_dataset(data, None, None, per_replica_batch_size, model, transform=transform)
    loop = loop_for(model, dataset, with_model_steps(options or FitOptions(), model))
    # Nothing can set it during the call (no callbacks), but Keras resets it too.
    model.stop_predicting = False
    cap = _max_steps(None)
    out = loop.predict()
    if cap:
        # Keras predicts the first `cap` batches; ours are global batches in row order.
        rows = cap * dataset.eval_plan.global_batch_size
        out = keras.tree.map_structure(lambda a: a[:rows], out)
    return keras.tree.map_structure(np.asarray, out)
