"""The Keras surface: `fit`, `evaluate` and `predict` over resident datasets.

Separation of concerns: this layer owns what a Keras user sees -- argument
checks, building the model's optimizer and metrics, callbacks, the progress
bar and the returned `History` / values. It hands the step loop to `Loop` and
the distribution to the engine, and takes the data's shape from the dataset.
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed import _errors
from shardfeed._dataset import ShardedResidentDataset
from shardfeed._engine import Engine, engine_for
from shardfeed._loop import Loop
from shardfeed._options import FitOptions
from shardfeed._progress import Progress
from shardfeed._sources import columns_from_arrays
from shardfeed._world import current_world

DEFAULT_EVAL_BATCH_SIZE = 256


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


def _check_global_batch(dataset: ShardedResidentDataset) -> None:
    """Training needs at least one full global batch; evaluation and prediction
    pad, so only `fit` checks this."""
    plan = dataset.plan
    if plan.global_batch_size > plan.num_rows:
        raise ValueError(
            _errors.message(
                "The global batch (per_replica_batch_size x num_replicas_in_sync) "
                "must not be larger than the dataset.",
                f"per_replica_batch_size={plan.per_replica_batch_size}, "
                f"num_replicas_in_sync={plan.num_replicas}, num_rows={plan.num_rows}",
                "Lower `per_replica_batch_size` or use fewer replicas.",
            )
        )


def _as_dataset(
    data: Any,
    y: Any,
    sample_weight: Any,
    per_replica_batch_size: int | None,
    model: keras.Model,
    template: ShardedResidentDataset | None = None,
) -> ShardedResidentDataset:
    """Wraps arrays in an unshuffled dataset on the model's strategy, for
    evaluation or prediction.

    `template` (the training dataset, for `validation_data`) lends its
    placement, transform, batch size and load options.
    """
    if isinstance(data, ShardedResidentDataset):
        return data
    if isinstance(data, tuple) and y is None and sample_weight is None and 2 <= len(data) <= 3:
        data, y, sample_weight = (*data, None)[:3]
    rows = columns_from_arrays(data, y, sample_weight).num_rows
    world = current_world(model.distribute_strategy)
    batch = per_replica_batch_size or (
        template.per_replica_batch_size if template is not None else DEFAULT_EVAL_BATCH_SIZE
    )
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
        transform=template.transform if template is not None else None,
        load_options=template.load_options if template is not None else None,
        strategy=world.strategy,
    )


# Compiled loops per dataset, keyed per model and options so repeated
# fit/evaluate/predict calls do not retrace. Weak keys, and a `Loop` holds its
# dataset weakly: dropping the last reference to a dataset frees its device
# variables at once, and its loops with it.
_LOOPS: weakref.WeakKeyDictionary[ShardedResidentDataset, dict[Any, Loop]] = (
    weakref.WeakKeyDictionary()
)


def _loop_for(model: keras.Model, dataset: ShardedResidentDataset, options: FitOptions) -> Loop:
    loops = _LOOPS.setdefault(dataset, {})
    # A recompiled model has a new optimizer, loss and metrics: new traces.
    compiled = (id(getattr(model, "optimizer", None)), id(getattr(model, "_compile_loss", None)))
    key = (id(model), compiled, options)
    loop = loops.get(key)
    if loop is None or loop.model is not model:
        engine = engine_for(dataset.world)
        _check_strategy(model, dataset)
        _build(model, dataset, engine)
        loop = Loop(model, dataset, engine, options)
        loops[key] = loop
    return loop


def _check_strategy(model: keras.Model, dataset: ShardedResidentDataset) -> None:
    model_strategy = model.distribute_strategy
    if model_strategy is not dataset.world.strategy:
        raise ValueError(
            _errors.message(
                "The model and the dataset must use the same `tf.distribute` strategy.",
                f"model.distribute_strategy={type(model_strategy).__name__}, "
                f"dataset strategy={type(dataset.world.strategy).__name__}",
                "Build the model (and compile it) and the dataset inside the same "
                "`with strategy.scope():` block.",
            )
        )


def _build(model: keras.Model, dataset: ShardedResidentDataset, engine: Engine) -> None:
    """Builds the model, its compiled loss and metrics and its optimizer before
    tracing, so no variable is created inside the compiled loop.

    Uses Keras' own symbolic build (what `model.fit` does) on the shapes of
    one row: nothing runs and no metric state changes.
    """
    store = dataset.stores[0]
    with engine.scope():
        batch = dataset.gather(store.handles, tf.constant([0]))
        if getattr(model, "compiled", False) and batch[1] is not None:
            model._symbolic_build(data_batch=batch)
        else:
            model(batch[0], training=False)
    engine.prepare_model(model)


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


# Callbacks that write files or print: run on the chief (rank 0) only.
_CHIEF_ONLY_CALLBACKS = (
    keras.callbacks.ModelCheckpoint,
    keras.callbacks.CSVLogger,
    keras.callbacks.TensorBoard,
    keras.callbacks.ProgbarLogger,
    Progress,
)


def _callback_list(
    callbacks: list[keras.callbacks.Callback] | None,
    model: keras.Model,
    verbose: int,
    is_chief: bool,
    params: dict[str, Any],
) -> keras.callbacks.CallbackList:
    """Keras' `CallbackList` with our progress bar, minus the chief-only
    callbacks on other ranks (a callback with `shardfeed_all_ranks = True`
    runs everywhere). Every rank gets the same global logs, so callbacks that
    decide (EarlyStopping, ReduceLROnPlateau) decide alike on every rank."""
    callbacks = list(callbacks or [])
    if verbose and not any(isinstance(c, Progress) for c in callbacks):
        callbacks.append(Progress(verbose))
    if not is_chief:
        callbacks = [
            c
            for c in callbacks
            if getattr(c, "shardfeed_all_ranks", False) or not isinstance(c, _CHIEF_ONLY_CALLBACKS)
        ]
    return keras.callbacks.CallbackList(
        callbacks, add_history=True, add_progbar=False, model=model, **params
    )


def fit(
    model: keras.Model,
    dataset: ShardedResidentDataset,
    *,
    epochs: int = 1,
    initial_epoch: int = 0,
    validation_data: Any = None,
    validation_freq: int = 1,
    callbacks: list[keras.callbacks.Callback] | None = None,
    verbose: int | str = "auto",
    options: FitOptions | None = None,
) -> keras.callbacks.History:
    """Trains a compiled Keras model on a resident dataset.

    Like `model.fit`, but every batch is gathered on the device and many
    steps run per compiled call; only each call's logs come back to Python.

    Args:
        model: A compiled Keras 3 model (built in the dataset's strategy scope).
        dataset: A `ShardedResidentDataset` with targets.
        epochs: Index of the epoch to stop before (as in `model.fit`).
        initial_epoch: Epoch to start at (for resuming).
        validation_data: A `ShardedResidentDataset` or a tuple
            `(x, y[, sample_weight])`, evaluated at the end of epochs; its logs
            get a `val_` prefix.
        validation_freq: Validate every this many epochs.
        callbacks: Keras callbacks. Batch hooks fire once per compiled call.
        verbose: "auto" or 1 (progress bar), 2 (a line per epoch), 0 (silent).
        options: `FitOptions` (steps per call, XLA).

    Returns:
        The `keras.callbacks.History` (also `model.history`), with
        `history.params` holding the plan: steps, global batch, dropped rows.

    Raises:
        TypeError: If `model` or `dataset` has the wrong type.
        ValueError: If the model is not compiled, the dataset has no targets,
            or the epochs are inconsistent.

    Example:
        >>> ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
        >>> history = shardfeed.fit(model, ds, epochs=5, validation_data=(xv, yv))
        >>> history.history["val_loss"]
    """
    _check_model(model, needs_compile=True)
    _check_dataset(dataset, needs_targets=True)
    _check_global_batch(dataset)
    if not (
        isinstance(epochs, int) and isinstance(initial_epoch, int) and 0 <= initial_epoch < epochs
    ):
        raise ValueError(
            _errors.message(
                "`epochs` must be larger than `initial_epoch` (both integers >= 0).",
                f"epochs={epochs!r}, initial_epoch={initial_epoch!r}",
                "Pass e.g. `epochs=10` (and `initial_epoch=k` to resume after epoch k).",
            )
        )
    verbose = _resolve_verbose(verbose)
    options = options or FitOptions()
    loop = _loop_for(model, dataset, options)
    val_loop = None
    if validation_data is not None:
        val_ds = _as_dataset(validation_data, None, None, None, model, dataset)
        _check_dataset(val_ds, needs_targets=True, name="validation_data")
        val_loop = _loop_for(model, val_ds, options)
    plan = dataset.plan
    params = {
        "epochs": epochs,
        "steps": plan.steps_per_epoch,
        "verbose": verbose,
        "global_batch_size": plan.global_batch_size,
        "per_replica_batch_size": plan.per_replica_batch_size,
        "num_replicas_in_sync": plan.num_replicas,
        "samples": plan.used_rows_per_epoch,
        "dropped_rows_per_epoch": plan.dropped_rows_per_epoch,
        "steps_per_execution": loop._chunks(plan.full_steps_per_epoch)[0][1]
        if plan.full_steps_per_epoch
        else 1,
        "jit_compile": loop.jit_compile,
    }
    cbs = _callback_list(callbacks, model, verbose, dataset.world.is_chief, params)
    model.stop_training = False
    cbs.on_train_begin()
    # `BackupAndRestore` restores the weights in on_train_begin and says where
    # to resume through `model._initial_epoch`, as Keras' own fit reads it.
    initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch
    epoch_logs: dict[str, float] = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        cbs.on_epoch_begin(epoch)

        def on_end(step: int, logs: dict[str, float]) -> bool:
            cbs.on_train_batch_end(step, logs)
            return bool(model.stop_training)

        epoch_logs = dict(loop.run_epoch(epoch, True, cbs.on_train_batch_begin, on_end))
        if val_loop is not None and (epoch + 1) % validation_freq == 0:
            val_logs = _evaluate_loop(val_loop, cbs)
            epoch_logs.update({f"val_{k}": v for k, v in val_logs.items()})
        cbs.on_epoch_end(epoch, epoch_logs)
        if model.stop_training:
            break
    cbs.on_train_end(epoch_logs)
    return model.history


def _evaluate_loop(loop: Loop, cbs: keras.callbacks.CallbackList) -> dict[str, float]:
    loop.model.reset_metrics()
    cbs.on_test_begin()

    def on_end(step: int, logs: dict[str, float]) -> bool:
        cbs.on_test_batch_end(step, logs)
        return False

    logs = loop.run_epoch(0, False, cbs.on_test_batch_begin, on_end)
    cbs.on_test_end(logs)
    return logs


def evaluate(
    model: keras.Model,
    data: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    per_replica_batch_size: int | None = None,
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
        callbacks: Keras callbacks (test hooks).
        verbose: Unused beyond Keras compatibility (no progress bar).
        return_dict: Return `{name: value}` instead of a list.
        options: `FitOptions` (steps per call, XLA).

    Returns:
        The loss (a float) when the model has no metrics, else
        `[loss, *metrics]` in `model.metrics_names` order, or a dict.

    Raises:
        TypeError, ValueError: As for `fit`.

    Example:
        >>> loss, acc = shardfeed.evaluate(model, x_test, y_test)
    """
    _check_model(model, needs_compile=True)
    _resolve_verbose(verbose)
    dataset = _as_dataset(data, y, sample_weight, per_replica_batch_size, model)
    _check_dataset(dataset, needs_targets=True, name="data")
    loop = _loop_for(model, dataset, options or FitOptions())
    cbs = keras.callbacks.CallbackList(
        callbacks, model=model, verbose=0, epochs=1, steps=dataset.eval_plan.steps_per_epoch
    )
    logs = _evaluate_loop(loop, cbs)
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def predict(
    model: keras.Model,
    data: Any,
    *,
    per_replica_batch_size: int | None = None,
    options: FitOptions | None = None,
) -> Any:
    """Predictions for every row, in the original row order.

    Args:
        model: A Keras 3 model (need not be compiled).
        data: A `ShardedResidentDataset` (its `x` is used) or inputs `x`.
        per_replica_batch_size: Batch when `data` is arrays (default 256).
        options: `FitOptions` (steps per call, XLA).

    Returns:
        NumPy arrays shaped like the model's outputs, one row per input row.

    Example:
        >>> probs = shardfeed.predict(model, x_test)
    """
    _check_model(model, needs_compile=False)
    dataset = _as_dataset(data, None, None, per_replica_batch_size, model)
    loop = _loop_for(model, dataset, options or FitOptions())
    out = loop.predict()
    return keras.tree.map_structure(np.asarray, out)
