"""`evaluate` and `predict` on JAX, over resident datasets or arrays.

The same arguments, checks and results as on TensorFlow; one evaluation pass
(`evaluate_loop`, also `fit`'s validation), Keras' metric variables updated
over the global batch, and `predict`'s rows back in their original order.
"""

from __future__ import annotations

from typing import Any, Literal

import keras
import numpy as np

from shardfeed._common.model_sync import check_in_sync
from shardfeed._distribute import progress as _progress
from shardfeed._jax import inputs as _inputs
from shardfeed._jax import interrupts as _interrupts
from shardfeed._jax.compiled import loop_for
from shardfeed._jax.dataset import ShardedResidentDataset
from shardfeed._jax.loop import Loop, python_logs
from shardfeed._jax.predictions import in_row_order
from shardfeed._jax.world import current_world
from shardfeed._training import eval_args
from shardfeed._training.arguments import Transform, check_model, resolve_verbose
from shardfeed._training.callbacks import evaluation_callback_list
from shardfeed._training.fit_args import max_steps
from shardfeed._training.options import FitOptions


def evaluate_loop(
    loop: Loop,
    dataset: ShardedResidentDataset,
    cbs: keras.callbacks.CallbackList,
    max_steps: int | None = None,
    name: str = "data",
    check_weights: bool = False,
) -> dict[str, Any]:
    """One evaluation pass, as Keras' `evaluate`: test hooks per call, the
    model's `stop_evaluating` checked after each, at most `max_steps` steps
    (`name`: the argument that held `dataset`, for the label check;
    `check_weights`: `check_same_weights` once the model is built)."""
    model = loop.model
    epoch = dataset.epoch(0, training=False)
    try:
        _inputs.check_sparse_labels(model, dataset, name, loop.build(epoch, "test"))
        if check_weights:
            check_same_weights(loop, "evaluate")
        model.reset_metrics()
        model.stop_evaluating = False
        cbs.on_test_begin()
        logs: dict[str, Any] = {}
        stop = min(max_steps, epoch.steps) if max_steps else None
        for call in loop.calls(epoch, 0, stop):
            cbs.on_test_batch_begin(call.begin_step)
            for a, b in call.pieces:
                logs = python_logs(loop.run("test", epoch, a, b))
            cbs.on_test_batch_end(call.end_step, logs)
            if model.stop_evaluating:
                break
    finally:
        epoch.close()
    # As Keras: the metrics' results when the logs name them (an overridden
    # step's other logs as they are).
    logs = python_logs(model._get_metrics_result_or_logs(logs))
    cbs.on_test_end(logs)
    return logs


def check_same_weights(loop: Loop, action: str) -> None:
    """Refuses, on every process, a model whose weights differ between the
    processes (one small all-gather of fingerprints; nothing with one).

    A loop of the user's that never called `sync_model` on an unseeded model
    leaves each process its own weights, and a compiled call takes each
    process's copy as its part of one replicated value: the results would
    blend them. `fit` gives every process rank 0's weights first, so its
    validation needs no check. Optimizer, metric and seed states may differ:
    `evaluate` and `predict` read none of them.
    """
    check_in_sync(loop.world, loop.model.weights, action)


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
) -> float | list[float] | dict[str, Any]:
    """Exact loss and metrics of a compiled model over every row, on JAX.

    The same arguments, results and errors as the TensorFlow backend's
    `shardfeed.evaluate` (see its documentation): a partial last batch is
    evaluated on its real rows only, and Keras' metrics accumulate over the
    global batch of every step.
    """
    data = eval_args.resolve("evaluate", data, positional, keras_args)
    check_model(model, needs_compile=True)
    verbose = resolve_verbose(verbose)
    needs_targets = not _inputs.overrides(model, "test_step")
    _inputs.check_targets(data, y, sample_weight, needs_targets=needs_targets)
    eval_args.start("evaluate", model, data, options, ShardedResidentDataset, current_world)
    transform = _inputs.resolve_transform(model, data, transform)
    cap = max_steps(None)
    dataset = _inputs.as_dataset(
        data, y, sample_weight, per_replica_batch_size, transform=transform, max_steps=cap
    )
    _inputs.check_dataset(dataset, needs_targets=needs_targets, name="data")
    loop = loop_for(model, dataset.world, options or FitOptions())
    cbs = evaluation_callback_list(callbacks, model, verbose, dataset)
    with _interrupts.handled():  # a Ctrl-C leaves the model valid
        logs = evaluate_loop(loop, dataset, cbs, cap, check_weights=True)
    if return_dict:
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


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
    """Predictions for every row, in the original row order, on JAX.

    The same arguments, results and errors as the TensorFlow backend's
    `shardfeed.predict` (see its documentation). Every process gets every
    row's outputs.
    """
    data = eval_args.resolve("predict", data, positional, keras_args)
    check_model(model, needs_compile=False)
    eval_args.start("predict", model, data, options, ShardedResidentDataset, current_world)
    transform = _inputs.resolve_transform(model, data, transform)
    cap = max_steps(None)
    dataset = _inputs.as_dataset(
        data, None, None, per_replica_batch_size, transform=transform, max_steps=cap
    )
    loop = loop_for(model, dataset.world, options or FitOptions())
    # Nothing can set it during the call (no callbacks), but Keras resets it too.
    model.stop_predicting = False
    epoch = dataset.epoch(0, training=False)
    try:
        loop.build(epoch, "predict")
        check_same_weights(loop, "predict")
        with _interrupts.handled():  # a Ctrl-C leaves the model valid
            results = list(loop.iterate("predict", epoch))
        outputs = in_row_order(results, epoch.slot_rows())
    finally:
        epoch.close()
    if cap:
        # Keras predicts the first `cap` batches; ours are global batches in row order.
        rows = cap * dataset.eval_plan.global_batch_size
        outputs = keras.tree.map_structure(lambda a: a[:rows], outputs)
    return keras.tree.map_structure(np.asarray, outputs)
