"""How a step's gradients cross the replicas of a `tf.distribute` strategy.

One exchange per step instead of Keras' per-gradient `all_reduce`: the dense
gradients in one batched all-reduce, every `IndexedSlices` all-gathered as it
is (values and indices packed); TensorFlow's own sparse all-reduce costs about
ten collectives per step for two embedding towers (shardfeed/_commands/bench/NOTES.md).
`sparse_as_dense` densifies them first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf


def dense(grad: Any) -> Any:
    """`grad` as a dense tensor when it is an `IndexedSlices` (duplicate rows summed)."""
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _packable(grad: tf.IndexedSlices, variable: Any) -> bool:
    rows = variable.shape[0]
    return (
        grad.values.dtype == tf.float32  # indices ride as float32 words
        and variable.shape[1:].is_fully_defined()
        and rows is not None
        and rows < 2**31  # the indices travel as int32
    )


def summed(
    ctx: tf.distribute.ReplicaContext,
    grads: Sequence[Any],
    variables: Sequence[Any],
) -> list[Any]:
    """The sum over every replica of each gradient, in replica context.

    Args:
        ctx: The replica context of the step.
        grads: This replica's gradients (None, dense, or `tf.IndexedSlices`).
        variables: Their variables (the shape of an `IndexedSlices`' rows).
            (`sparse_as_dense` densifies before this: `step_optimizers`.)

    Returns:
        The summed gradients, None where `grads` has None; an
        `IndexedSlices` stays one (every replica's rows, replica order).
    """
    out = list(grads)
    plain = [i for i, g in enumerate(out) if g is not None and not isinstance(g, tf.IndexedSlices)]
    sparse = [i for i, g in enumerate(out) if isinstance(g, tf.IndexedSlices)]
    packed = [i for i in sparse if _packable(out[i], variables[i])]
    # Everything not packed goes through TensorFlow's own all-reduce, batched.
    rest = plain + [i for i in sparse if i not in packed]
    if rest:
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM, [out[i] for i in rest])
        for i, g in zip(rest, reduced, strict=True):
            out[i] = g
    if packed:
        gathered = _gathered_slices(ctx, [out[i] for i in packed], [variables[i] for i in packed])
        for i, g in zip(packed, gathered, strict=True):
            out[i] = g
    return out


def _gathered_slices(
    ctx: tf.distribute.ReplicaContext, grads: list[tf.IndexedSlices], variables: list[Any]
) -> list[tf.IndexedSlices]:
    """Every replica's rows of each gradient, from one all-gather.

    Each replica sends one float32 vector: a header of its row count per
    gradient, then per gradient its values and its indices (int32, bitcast).
    Replicas may touch different numbers of rows (a partial last step):
    `all_gather` concatenates vectors of any lengths (it gathers their
    lengths first), and each replica's header says where its vector ends.
    """
    count = len(grads)
    rows = tf.stack([tf.size(g.indices, out_type=tf.int32) for g in grads])
    parts = [tf.bitcast(rows, tf.float32)]
    for grad in grads:
        parts += [
            tf.reshape(grad.values, [-1]),
            tf.bitcast(tf.reshape(tf.cast(grad.indices, tf.int32), [-1]), tf.float32),
        ]
    gathered = ctx.all_gather(tf.concat(parts, axis=0), axis=0)
    widths = [int(v.shape[1:].num_elements()) for v in variables]
    values: list[list[tf.Tensor]] = [[] for _ in grads]
    indices: list[list[tf.Tensor]] = [[] for _ in grads]
    start = tf.constant(0, tf.int32)
    for _ in range(ctx.num_replicas_in_sync):  # replica order: the order of the sum
        replica_rows = tf.bitcast(gathered[start : start + count], tf.int32)
        offset = start + count
        for k in range(count):
            size = replica_rows[k] * widths[k]
            values[k].append(gathered[offset : offset + size])
            offset += size
            indices[k].append(tf.bitcast(gathered[offset : offset + replica_rows[k]], tf.int32))
            offset += replica_rows[k]
        start = offset
    return [
        tf.IndexedSlices(
            tf.reshape(tf.concat(values[k], 0), [-1, *variable.shape[1:]]),
            tf.cast(tf.concat(indices[k], 0), grad.indices.dtype),
            grad.dense_shape,
        )
        for k, (grad, variable) in enumerate(zip(grads, variables, strict=True))
    ]
