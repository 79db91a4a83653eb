"""`evaluate` and `predict` on TensorFlow, over resident datasets or arrays.

Argument checks (with `eval_args`), the test hooks, Keras' evaluation pass
(`evaluate_loop`, also `fit`'s validation) and the values returned; the calls
come from `Loop`.
"""

from __future__ import annotations

from typing import Any, Literal

import keras
import numpy as np

from shardfeed._distribute import progress as _progress
from shardfeed._tf.compiled import loop_for
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.engines.peers import naming_lost_peers
from shardfeed._tf.inputs import (
    Transform,
    as_dataset,
    check_dataset,
    check_model,
    check_sparse_labels,
    check_targets,
    resolve_transform,
    resolve_verbose,
)
from shardfeed._tf.loop import Loop
from shardfeed._tf.model_steps import ModelSteps
from shardfeed._tf.world import current_world, one_call_at_a_time
from shardfeed._training import eval_args
from shardfeed._training.callbacks import evaluation_callback_list
from shardfeed._training.fit_args import max_steps
from shardfeed._training.options import FitOptions, with_model_steps


def evaluate_loop(
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


@naming_lost_peers
@one_call_at_a_time
@_progress.in_api("evaluate")  # for `shardfeed launch`'s progress watch
def evaluate(
    model: keras.Model,
    data: Any = None,
    y: Any = None,
    sample_weight: Any = None,
    *positional: Any,
    per_replica_batch_size: int | None = None,
    transform: Transform | Literal["auto"] | None = "auto",
    callbacks: list[keras.callbacks.Callback] | None = None,
    verbose: int | str = 0,
    return_dict: bool = False,
    options: FitOptions | None = None,
    **keras_args: Any,
) -> float | list[float] | dict[str, float]:
    """Exact loss and metrics of a compiled model over every row.

    Each row counts exactly once: a partial last batch is evaluated on its
    real rows only, and (sum, count) pairs are reduced across replicas.

    Args:
        model: A compiled Keras 3 model.
        data: A `ShardedResidentDataset`, or inputs `x` (with `y`); a tuple
            is several inputs, as in Keras. Keras' keyword `x=` works too.
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
        callbacks: Keras callbacks (test hooks, once per compiled call).
        verbose: 0 (default: silent), "auto" or 1 (Keras' progress bar,
            updated once per compiled call), 2 (one line at the end);
            printed on rank 0 only.
        return_dict: Return `{name: value}` instead of a list.
        options: `FitOptions` (steps per call, XLA).
        **keras_args: `x=` (Keras' name for `data`); the other
            `model.evaluate` arguments (`batch_size`, `steps`) are refused,
            each with what to use instead (docs/keras.md has the table).

    Returns:
        The loss (a float) when the model has no metrics, else
        `[loss, *metrics]` in `model.metrics_names` order, or a dict.

    Raises:
        TypeError, ValueError: As for `fit`; also for a `transform` given
            with a `ShardedResidentDataset`, or a batch size below 1.

    Example:
        >>> loss, acc = shardfeed.evaluate(model, x_test, y_test)
    """
    data = eval_args.resolve("evaluate", data, positional, keras_args)
    check_model(model, needs_compile=True)
    verbose = resolve_verbose(verbose)
    check_targets(data, y, sample_weight, needs_targets=not ModelSteps.of(model).test)
    eval_args.start(
        "evaluate", model, data, options, ShardedResidentDataset,
        lambda: current_world(model.distribute_strategy),
    )
    transform = resolve_transform(model, data, transform)
    dataset = as_dataset(
        data, y, sample_weight, per_replica_batch_size, model, transform=transform
    )
    check_dataset(dataset, needs_targets=not ModelSteps.of(model).test, name="data")
    loop = loop_for(model, dataset, with_model_steps(options or FitOptions(), model))
    check_sparse_labels(model, dataset, "data")
    cbs = evaluation_callback_list(callbacks, model, verbose, dataset)
    logs = evaluate_loop(loop, cbs, max_steps(None))
    if return_dict:
        return logs
    # Keras' order, once per metric of `model.metrics`: a metric and a weighted
    # metric sharing a name are two values, as in Keras (one log entry).
    return model._flatten_metrics_in_order(logs)


@naming_lost_peers
@one_call_at_a_time
@_progress.in_api("predict")  # for `shardfeed launch`'s progress watch
def predict(
    model: keras.Model,
    data: Any = None,
    *positional: Any,
    per_replica_batch_size: int | None = None,
    transform: Transform | Literal["auto"] | None = "auto",
    options: FitOptions | None = None,
    **keras_args: Any,
) -> Any:
    """Predictions for every row, in the original row order.

    Args:
        model: A Keras 3 model (need not be compiled).
        data: A `ShardedResidentDataset` (its `x` is used) or inputs `x`; a
            tuple is several inputs, as in Keras. Keras' keyword `x=` works
            too.
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
        **keras_args: `x=` (Keras' name for `data`) and `verbose=0`; the
            other `model.predict` arguments (`batch_size`, `steps`,
            `callbacks`, a progress bar) are refused, each with what to use
            instead (docs/keras.md has the table).

    Returns:
        NumPy arrays shaped like the model's outputs, one row per input row.

    Raises:
        TypeError, ValueError: For a model that is not a Keras model, a
            `transform` given with a `ShardedResidentDataset`, or a batch
            size below 1.

    Example:
        >>> probs = shardfeed.predict(model, x_test)
    """
    data = eval_args.resolve("predict", data, positional, keras_args)
    check_model(model, needs_compile=False)
    eval_args.start(
        "predict", model, data, options, ShardedResidentDataset,
        lambda: current_world(model.distribute_strategy),
    )
    transform = resolve_transform(model, data, transform)
    dataset = as_dataset(data, None, None, per_replica_batch_size, model, transform=transform)
    loop = loop_for(model, dataset, with_model_steps(options or FitOptions(), model))
    # Nothing can set it during the call (no callbacks), but Keras resets it too.
    model.stop_predicting = False
    cap = max_steps(None)
    out = loop.predict()
    if cap:
        # Keras predicts the first `cap` batches; ours are global batches in row order.
        rows = cap * dataset.eval_plan.global_batch_size
        out = keras.tree.map_structure(lambda a: a[:rows], out)
    return keras.tree.map_structure(np.asarray, out)
