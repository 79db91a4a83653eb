"""Replicas hold the same weights: `check_in_sync` (fit's sync check) and `sync_model`.

Two integer checksums of each trainable variable's bits per replica (exact and
independent of the reduction order), gathered and compared: a step that skips
the gradient aggregation trains R different models whose loss looks fine.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._common.model_sync import Divergence
from shardfeed._distribute import progress as _progress

_INT_OF_SIZE = {1: tf.int8, 2: tf.int16, 4: tf.int32, 8: tf.int64}


def _checksum(value: tf.Tensor) -> tf.Tensor:
    """`[sum(bits), sum(bits * position)]` of a tensor, as int64 (wrapping)."""
    if value.dtype.is_floating:
        value = tf.bitcast(value, _INT_OF_SIZE[value.dtype.size])
    flat = tf.cast(tf.reshape(value, [-1]), tf.int64)
    positions = tf.range(1, tf.size(flat, out_type=tf.int64) + 1, dtype=tf.int64)
    return tf.stack([tf.reduce_sum(flat), tf.reduce_sum(flat * positions)])


def replica_checksums(model: keras.Model, engine: Any) -> np.ndarray:
    """Checksums of every replica: int64 `[num_replicas, num_variables, 2]`,
    identical on every rank (every rank must call it: it gathers)."""
    variables = model.trainable_variables
    per_local: list[list[np.ndarray]] = [[] for _ in engine.world.local_devices]
    for v in variables:
        for local, copy in enumerate(engine.local_results(v.value)):
            with tf.device(copy.device):
                per_local[local].append(_checksum(tf.convert_to_tensor(copy)).numpy())
    arrays = [np.stack(sums) if sums else np.zeros([0, 2], np.int64) for sums in per_local]
    gathered = engine.all_gather(arrays)
    return gathered.reshape(engine.num_replicas_in_sync, len(variables), 2)


def check_in_sync(model: keras.Model, engine: Any, epoch: int, step: int) -> None:
    """Raises if any replica's trainable variables differ from replica 0's.

    Args:
        model: The model being trained.
        engine: The loop's engine.
        epoch: The fit epoch (for the message).
        step: Steps of the epoch done (for the message).

    Raises:
        RuntimeError: Naming the first diverged variable and the replicas
            that differ from replica 0.

    Example:
        >>> check_in_sync(model, loop.engine, epoch=0, step=120)
    """
    with _progress.call("the sync check"):  # a collective: `shardfeed launch` watches it
        sums = replica_checksums(model, engine)
    # The one rule of every in-sync check, on each replica's two checksums per variable.
    divergence = Divergence.of([[tuple(v) for v in replica] for replica in sums.tolist()])
    if divergence is None:
        return
    variable = model.trainable_variables[divergence.variable]
    name = getattr(variable, "path", variable.name)
    raise RuntimeError(
        _errors.message(
            "Every replica must hold the same weights: data-parallel training applies "
            "the same aggregated gradients on every replica.",
            f"{divergence.received(name, 'replica', 'trainable variables')} after epoch "
            f"{epoch}, step {step}",
            "Gradients were not aggregated across replicas: a custom train step must "
            "all-reduce them, and `horovod.tensorflow.keras.DistributedOptimizer` does not "
            "average under Keras 3 (use `shardfeed.fit` under Horovod as it is). "
            "`FitOptions(sync_check=False)` turns this check off.",
        )
    )


def sync_model(model: keras.Model) -> int:
    """Gives every worker rank 0's weights, for a training loop of your own.

    `shardfeed.fit` starts every rank from rank 0's weights itself; a loop of
    your own never hands the model to shardfeed. On JAX an unseeded model
    starts from other random values on each process, and a step jitted over
    the global batch trains each process's own copy, so the ranks end with
    other weights. Call it on every worker after building the model (and its
    optimizer) and before reading the variables your loop steps. On
    TensorFlow, variables created in `world.scope()` are already identical
    (MultiWorkerMirroredStrategy copies them from the chief); it checks,
    and copies any that differ.

    Copies the model's trainable and non-trainable variables and, when the
    model is compiled and its optimizer built, the optimizer's. A collective:
    one small all-gather of fingerprints, and a second carrying rank 0's
    values only when some differ.

    Args:
        model: A built Keras model.

    Returns:
        How many variables differed and now hold rank 0's values (0 with one
        worker, or when all agreed).

    Raises:
        ValueError: When the workers' models have other variables (count,
            path, shape or dtype).

    Example:
        >>> model = make_model(); optimizer.build(model.trainable_variables)
        >>> shardfeed.sync_model(model)  # before `state = model.trainable_variables, ...`
        0
    """
    from shardfeed._common.model_sync import model_variables, sync_variables
    from shardfeed._tf.world import current_world, initialized_world

    world = initialized_world() or current_world()
    return sync_variables(world, model_variables(model))
