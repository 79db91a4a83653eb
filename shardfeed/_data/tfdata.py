"""Rows from a finite `tf.data.Dataset`, each worker draining only its shard.

Separation of concerns: this module turns a `tf.data.Dataset` of single rows
(`(x, y)`, `(x, y, sample_weight)`, a dict, or a bare `x`) into lazy leaves
that the dataset reads like any other source, in chunks, straight into
device storage. It owns the row order and which pipeline a worker drains;
the plan still decides which rows each replica holds.

Row order. With `W` workers, global rows are "shard-major": first the
elements of `dataset.shard(W, 0)`, then those of `dataset.shard(W, 1)`, and
so on (shard `w` holds `len(range(w, N, W))` rows). With one replica per
worker and `placement="shard"` the plan's row ranges are exactly these
blocks, so worker `w` drains `dataset.shard(W, w)` and nothing else. With
several replicas per worker a worker may also take a few rows of a
neighbour's block, and with `placement="replicate"` every worker drains
every shard: all correct, only more reading.

Each leaf keeps one cursor: the storage reads a column's rows in order,
chunk after chunk, so a pipeline runs once per column (`x`, `y`, ... each
drain it once; put expensive decoding before `.cache()` or use
`shardfeed.files.tfrecord`, which decodes only the column it reads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data.drain import Cursor
from shardfeed._data.formats.base import FileArray
from shardfeed._distribute.world import current_world


class _ShardedColumn(FileArray):
    """One leaf of a tf.data element, in shard-major row order."""

    agreement_rows = "none"  # a row of another worker's shard costs a pass through it

    _handles = ()

    def __init__(
        self, blocks: Callable[[int], Any], leaf: int, sizes: list[int], spec: Any, source: str
    ) -> None:
        self.shape = (sum(sizes), *spec.shape)
        self.dtype = np.dtype(spec.dtype.as_numpy_dtype)
        self.source = source
        self._starts = np.cumsum([0, *sizes]).tolist()
        row_bytes = int(np.prod(spec.shape, dtype=np.int64)) * self.dtype.itemsize

        def cursor(w: int) -> Cursor:
            def make(skip: int) -> Any:
                pick = lambda *e: keras.tree.flatten(e[0] if len(e) == 1 else e)[leaf]  # noqa: E731
                return blocks(w).skip(skip).map(pick)

            return Cursor(make, row_bytes, f"{source} shard {w}")

        self._cursors = [cursor(w) for w in range(len(sizes))]

    def close(self) -> None:
        for c in self._cursors:
            c.close()

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        for w, cursor in enumerate(self._cursors):
            lo, hi = max(start, self._starts[w]), min(stop, self._starts[w + 1])
            if lo < hi:
                first = self._starts[w]
                cursor.read(lo - first, hi - first, out[lo - start : hi - start])


def _unknown_size_error(cardinality: int) -> ValueError:
    what = "infinite" if cardinality == tf.data.INFINITE_CARDINALITY else "unknown"
    return ValueError(
        _errors.message(
            "A resident dataset needs to know its rows before allocating; a tf.data "
            "dataset must be finite with a known cardinality, or come with `num_rows`.",
            f"dataset.cardinality()={what}",
            "Pass `num_rows=<rows>` (an infinite dataset is cut there), or "
            "`dataset.apply(tf.data.experimental.assert_cardinality(rows))`.",
        )
    )


def _parts(spec: Any) -> tuple[Any, Any, Any]:
    """`(x, y, sample_weight)` specs of an element, as Keras reads a dataset."""
    if isinstance(spec, tuple) and 1 <= len(spec) <= 3:
        return (*spec, None, None)[:3]
    return spec, None, None


def from_tf_dataset(
    cls: Any,
    dataset: Any,
    *,
    num_rows: int | None = None,
    strategy: tf.distribute.Strategy | None = None,
    **kwargs: Any,
) -> Any:
    """Builds a `ShardedResidentDataset` from a finite `tf.data.Dataset`.

    Args:
        cls: The dataset class.
        dataset: A `tf.data.Dataset` of single rows -- `(x, y)`,
            `(x, y, sample_weight)`, a dict (all inputs) or a bare `x`, each
            leaf with a fully defined shape (e.g. `tfds.load(...,
            as_supervised=True)`) -- or a function `(shard_count, shard_index)
            -> tf.data.Dataset` giving a worker its own share, as
            `dataset.shard(shard_count, shard_index)` would (then `num_rows`,
            the total, is required).
        num_rows: Rows of the whole dataset; required when its cardinality is
            unknown or infinite (the dataset is cut there).
        strategy: As in `ShardedResidentDataset`.
        **kwargs: The other arguments of `ShardedResidentDataset`
            (`per_replica_batch_size`, `seed`, `augment`, ...).

    Returns:
        The resident dataset; this worker has drained only the shards holding
        its replicas' rows (see the module docs for the row order).

    Raises:
        ValueError: For an infinite or unknown cardinality without `num_rows`,
            batched elements or shapes not fully defined, or a shard that ends
            early.

    Example:
        >>> ds = ShardedResidentDataset.from_tf_dataset(
        ...     tfds.load("cifar10", split="train", as_supervised=True),
        ...     per_replica_batch_size=256, seed=0, augment=augment.flip_left_right())
    """
    world = current_world(strategy)
    shard_count = world.world_size
    if callable(dataset) and not isinstance(dataset, tf.data.Dataset):
        if num_rows is None:
            raise _unknown_size_error(tf.data.UNKNOWN_CARDINALITY)
        per_worker = dataset

        def blocks(w: int) -> Any:
            return per_worker(shard_count, w)

        spec = blocks(world.rank).element_spec
    else:
        cardinality = int(dataset.cardinality())
        if num_rows is None:
            if cardinality < 0:
                raise _unknown_size_error(cardinality)
            num_rows = cardinality
        else:
            dataset = dataset.take(num_rows)
        whole = dataset

        def blocks(w: int) -> Any:
            return whole.shard(shard_count, w)

        spec = dataset.element_spec
    for leaf in keras.tree.flatten(spec):
        if not leaf.shape.is_fully_defined():
            raise ValueError(
                _errors.message(
                    "A tf.data source must yield single rows with fully defined shapes.",
                    f"element_spec={spec}",
                    "Pass the dataset before `.batch(...)` (or call `.unbatch()`), and give "
                    "images one size (e.g. `.map(lambda x, y: (tf.image.resize(x, ...), y))`).",
                )
            )
    sizes = [len(range(w, num_rows, shard_count)) for w in range(shard_count)]
    parts = _parts(spec)
    leaves: list[Any] = []
    flat_index = 0
    for name, part in zip(("x", "y", "sample_weight"), parts, strict=True):
        if part is None:
            leaves.append(None)
            continue
        flat = keras.tree.flatten(part)
        columns = [
            _ShardedColumn(blocks, flat_index + j, sizes, s, f"tf.data {name}[{j}]")
            for j, s in enumerate(flat)
        ]
        flat_index += len(flat)
        leaves.append(keras.tree.pack_sequence_as(part, columns))
    return cls(*leaves, strategy=strategy, **kwargs)
