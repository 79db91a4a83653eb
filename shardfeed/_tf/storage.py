"""Resident storage on TensorFlow: one variable per column on each local replica's device
(`ReplicaStore`), filled in bounded chunks; the dataset checks the fit first.

Why variables: a graph constant hits the 2 GB limit, and
`tf.convert_to_tensor` keeps a second host copy. Why `ResourceVariable`
directly: `tf.Variable` in a strategy scope mirrors all rows on every device.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from shardfeed._data.options import LoadOptions
from shardfeed._data.plan import ShardPlan
from shardfeed._data.sources import Columns
from shardfeed._tf.world import World


@dataclasses.dataclass(frozen=True)
class ReplicaStore:
    """One local replica's resident rows.

    Attributes:
        replica: Global replica index.
        device: Device holding the variables.
        row_start: First global row held (rows `[row_start, row_stop)`).
        row_stop: One past the last global row held.
        variables: One variable per column, shape `(rows, *row_shape)`.
    """

    replica: int
    device: str
    row_start: int
    row_stop: int
    variables: tuple[tf.Variable, ...]

    @property
    def num_rows(self) -> int:
        return self.row_stop - self.row_start

    @property
    def handles(self) -> tuple[tf.Tensor, ...]:
        """The variables' resource handles: what compiled functions take (see
        `ShardedResidentDataset.gather`)."""
        return tuple(v.handle for v in self.variables)


def allocate(shape: tuple[int, ...], dtype: np.dtype, device: str) -> tf.Variable:
    with tf.device(device):
        # A callable initial value lets the zeros be created on the device and
        # handed to the variable without a second live copy.
        return resource_variable_ops.ResourceVariable(
            initial_value=lambda: tf.zeros(shape, dtype=dtype),
            trainable=False,
            dtype=dtype,
            shape=shape,
        )


def upload(
    columns: Columns, plan: ShardPlan, world: World, options: LoadOptions
) -> tuple[ReplicaStore, ...]:
    """Uploads each local replica's rows in chunks (the caller checked the fit).

    Args:
        columns: The data to read.
        plan: Which global rows each replica holds.
        world: Which replicas are local and on which devices.
        options: Chunk size and checks.

    Returns:
        The local `ReplicaStore`s, in local replica order.
    """
    # Replicas holding the same rows on the same device (replicated data on
    # logical devices of one GPU) share one copy.
    uploaded: dict[tuple[str, int, int], tuple[tf.Variable, ...]] = {}
    stores = []
    for replica, device in zip(world.global_replica_ids, world.local_devices, strict=True):
        start, stop = plan.shards[replica]
        key = (device, start, stop)
        if key not in uploaded:
            uploaded[key] = _upload_columns(columns, start, stop, device, options)
        stores.append(ReplicaStore(replica, device, start, stop, uploaded[key]))
    return tuple(stores)


def _upload_columns(
    columns: Columns, start: int, stop: int, device: str, options: LoadOptions
) -> tuple[tf.Variable, ...]:
    # A replica with no rows (fewer rows than replicas) still gets one zero
    # row: its evaluation steps are all padding, and padding gathers row 0.
    variables = tuple(
        allocate((max(1, stop - start), *c.row_shape), c.dtype, device) for c in columns.columns
    )
    # Row range by row range, every column of a range before the next: a
    # source of whole elements (a tf.data pipeline) is then drained once, each
    # column taking its leaf of the same elements, with about one chunk held.
    # `chunk_bytes` stays a bound per column: the widest column sets the rows.
    row_bytes = max(c.row_bytes for c in columns.columns)
    rows_per_chunk = max(1, options.chunk_bytes // max(1, row_bytes))
    for chunk_start in range(start, stop, rows_per_chunk):
        chunk_stop = min(stop, chunk_start + rows_per_chunk)
        for column, variable in zip(columns.columns, variables, strict=True):
            offset = chunk_start - start
            write_rows(column, chunk_start, chunk_stop, variable, offset, device, options)
    return variables


def write_rows(
    column,
    start: int,
    stop: int,
    variable: tf.Variable,
    offset: int,
    device: str,
    options: LoadOptions,
) -> None:
    """Copies rows `[start, stop)` of `column` into `variable[offset:]`, one
    chunk of at most `options.chunk_bytes` at a time."""
    rows_per_chunk = max(1, options.chunk_bytes // max(1, column.row_bytes))
    with tf.device(device):
        for chunk_start in range(start, stop, rows_per_chunk):
            chunk_stop = min(stop, chunk_start + rows_per_chunk)
            rows = column.read(chunk_start, chunk_stop, options.check_finite)
            # The raw op writes in place without first reading the slice back.
            tf.raw_ops.ResourceStridedSliceAssign(
                ref=variable.handle,
                begin=[offset + chunk_start - start],
                end=[offset + chunk_stop - start],
                strides=[1],
                value=tf.convert_to_tensor(rows),
            )
