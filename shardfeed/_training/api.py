"""The Keras surface: `fit`, `evaluate` and `predict` over resident datasets.

Separation of concerns: this layer owns what a Keras user sees -- argument
checks, building the model's optimizer and metrics, callbacks, the progress
bar and the returned `History` / values. It hands the step loop to `Loop` and
the distribution to the engine, and takes the data's shape from the dataset.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Literal

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset
from shardfeed._data.plan import check_global_batch
from shardfeed._data.sources import columns_from_arrays
from shardfeed._distribute.engine import Engine, engine_for
from shardfeed._distribute.world import current_world
from shardfeed._training.loop import Loop
from shardfeed._training.options import FitOptions
from shardfeed._training.progress import Progress

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
    rows = columns_from_arrays(data, y, sample_weight).num_rows
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


# Datasets whose labels passed the sparse-label check, per model, with the
# compiled loss (its id) they were checked for: repeated fits and evaluations
# pay for the check once. Weak keys on both levels, so nothing is kept alive.
_LABELS_CHECKED: weakref.WeakKeyDictionary[
    ShardedResidentDataset, weakref.WeakKeyDictionary[keras.Model, int]
] = weakref.WeakKeyDictionary()


def _at(structure: Any, path: tuple[Any, ...], output_names: list[str]) -> Any:
    """`structure[path[0]][path[1]]...`, or None where the path does not lead
    anywhere. A name in a list of outputs stands for its position (Keras keys
    multi-output losses by output name)."""
    for key in path:
        if isinstance(structure, (list, tuple)) and isinstance(key, str):
            if key not in output_names:
                return None
            key = output_names.index(key)
        try:
            structure = structure[key]
        except (KeyError, IndexError, TypeError):
            return None
    return structure


def _sparse_label_columns(
    model: keras.Model, dataset: ShardedResidentDataset
) -> list[tuple[int, int, int | None]]:
    """`(y column, number of classes, ignore_class)` for each sparse categorical
    crossentropy in the model's compiled loss whose labels and output can be
    matched (single output, or outputs and labels keyed alike).

    Reads Keras' built `CompileLoss` (`_flat_losses`: path, resolved loss),
    which `_build` creates before the first trace; string losses resolve to
    the same function as the `SparseCategoricalCrossentropy` object.
    """
    flat_losses = getattr(getattr(model, "_compile_loss", None), "_flat_losses", None)
    y = dataset.columns.y
    if not flat_losses or y is None:
        return []
    found: list[tuple[int, int, int | None]] = []
    outputs = None
    for path, loss, *_ in flat_losses:
        # Keras' (private) LossFunctionWrapper keeps the function as `fn`.
        if getattr(loss, "fn", None) is not keras.losses.sparse_categorical_crossentropy:
            continue
        if outputs is None:
            x, _, _ = dataset.gather(dataset.stores[0].handles, tf.constant([0]), False)
            outputs = model.compute_output_spec(
                keras.tree.map_structure(
                    lambda t: keras.KerasTensor((None, *t.shape[1:]), t.dtype.name), x
                )
            )
        names = list(getattr(model, "output_names", None) or [])
        column, output = _at(y, path, names), _at(outputs, path, names)
        classes = getattr(output, "shape", (None,))[-1] if output is not None else None
        if isinstance(column, int) and classes is not None:
            kind = dataset.columns.columns[column].dtype.kind
            if kind in "biuf":
                ignore = getattr(loss, "_fn_kwargs", {}).get("ignore_class")
                found.append((column, int(classes), ignore))
    return found


def _label(value: float) -> int | float:
    return int(value) if np.isfinite(value) and float(value).is_integer() else float(value)


def _check_sparse_labels(model: keras.Model, dataset: ShardedResidentDataset, name: str) -> None:
    """Refuses labels a sparse categorical crossentropy cannot take, before the
    first step.

    Without the check, an out-of-range label stops Keras' non-XLA step with
    TensorFlow's "Received a label value of 7 which is outside the valid range
    of [0, 3)", but under XLA, and on GPUs (as TensorFlow documents for
    `sparse_softmax_cross_entropy_with_logits`), the loss silently becomes
    NaN; a fractional label is silently truncated. The labels are reduced to
    (min, max, fractional) on their devices once per dataset (cached there),
    gathered from every replica so every worker decides alike, and compared
    with the model's output size once per (dataset, model, compiled loss).
    """
    compile_loss = id(getattr(model, "_compile_loss", None))
    checked = _LABELS_CHECKED.setdefault(dataset, weakref.WeakKeyDictionary())
    if checked.get(model) == compile_loss:
        return
    engine = engine_for(dataset.world)
    for column, classes, ignore in _sparse_label_columns(model, dataset):
        stats = engine.all_gather([s.reshape(1, 3) for s in dataset.label_stats(column, ignore)])
        low, high, fractional = stats[:, 0].min(), stats[:, 1].max(), stats[:, 2].any()
        where = f"{dataset.columns.columns[column].name} of `{name}`"
        span = f"labels span {_label(low)} to {_label(high)}"
        if low < 0 or high >= classes:
            bad = _label(low if low < 0 else high)
            also = "" if ignore is None else f" (or ignore_class={ignore})"
            raise ValueError(
                _errors.message(
                    "Labels of a sparse categorical crossentropy must be class indices in "
                    f"the valid range of [0, {classes}){also}: the model's output has "
                    f"{classes} units.",
                    f"a label value of {bad} in {where} ({span})",
                    f"Number the classes from 0 to {classes - 1}, or give the output layer "
                    "one unit per class.",
                )
            )
        if fractional:
            raise ValueError(
                _errors.message(
                    "Labels of a sparse categorical crossentropy must be whole class "
                    "indices (Keras would silently truncate 1.5 to 1).",
                    f"fractional or NaN labels in {where} ({span})",
                    "Pass integer class ids (e.g. `y.astype('int32')`); for one-hot or "
                    "soft targets use `categorical_crossentropy`.",
                )
            )
    checked[model] = compile_loss


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


def _check_callbacks(callbacks: list[keras.callbacks.Callback] | None) -> None:
    """Refuses callbacks whose contract `fit` cannot keep.

    `BackupAndRestore(save_freq=<int>)` backs up mid-epoch and, on restart,
    Keras resumes from that step; `fit` resumes at epoch boundaries only, so
    it would restore mid-epoch weights and replay the whole epoch.
    """
    for callback in callbacks or ():
        if isinstance(callback, keras.callbacks.BackupAndRestore) and callback.save_freq not in (
            "epoch",
            False,
        ):
            raise ValueError(
                _errors.message(
                    "`shardfeed.fit` resumes at epoch boundaries only, so "
                    '`BackupAndRestore` must back up once per epoch (save_freq="epoch").',
                    f"save_freq={callback.save_freq!r}",
                    'Use `keras.callbacks.BackupAndRestore(backup_dir, save_freq="epoch")`.',
                )
            )


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
    # Training needs one full global batch; evaluation and prediction pad.
    plan = dataset.plan
    check_global_batch(plan.per_replica_batch_size, plan.num_replicas, plan.num_rows)
    if not (
        _errors.is_integer(epochs)
        and _errors.is_integer(initial_epoch)
        and 0 <= initial_epoch < epochs
    ):
        raise ValueError(
            _errors.message(
                "`epochs` must be larger than `initial_epoch` (both integers >= 0).",
                f"epochs={epochs!r}, initial_epoch={initial_epoch!r}",
                "Pass e.g. `epochs=10` (and `initial_epoch=k` to resume after epoch k).",
            )
        )
    if not (_errors.is_integer(validation_freq) and validation_freq >= 1):
        raise ValueError(
            _errors.message(
                "`validation_freq` must be an integer >= 1.",
                f"validation_freq={validation_freq!r}",
                "Pass e.g. `validation_freq=1` to validate after every epoch.",
            )
        )
    epochs, initial_epoch, validation_freq = int(epochs), int(initial_epoch), int(validation_freq)
    _check_callbacks(callbacks)
    # Arrays later given to evaluate/predict get this dataset's transform.
    _FIT_TRANSFORMS[model] = dataset.transform
    verbose = _resolve_verbose(verbose)
    options = options or FitOptions()
    loop = _loop_for(model, dataset, options)
    _check_sparse_labels(model, dataset, "dataset")
    val_loop = None
    if validation_data is not None:
        val_ds = _as_dataset(validation_data, None, None, None, model, dataset)
        _check_dataset(val_ds, needs_targets=True, name="validation_data")
        val_loop = _loop_for(model, val_ds, options)
        _check_sparse_labels(model, val_ds, "validation_data")
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
    _check_dataset(dataset, needs_targets=True, name="data")
    loop = _loop_for(model, dataset, options or FitOptions())
    _check_sparse_labels(model, dataset, "data")
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
    loop = _loop_for(model, dataset, options or FitOptions())
    out = loop.predict()
    return keras.tree.map_structure(np.asarray, out)
