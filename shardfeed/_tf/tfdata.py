"""Rows from a finite `tf.data.Dataset`, each worker draining only its shard (`from_tf_dataset`).

Global rows are shard-major (`dataset.shard(W, 0)`'s, then `shard(W, 1)`'s...),
so with one replica per worker and `placement="shard"` worker `w` drains only
its shard. Every leaf of an element comes from the same pass; a second pass of a
reshuffling pipeline, and an unseeded `shuffle` on several workers, are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import FileArray
from shardfeed._tf.drain import Cursor
from shardfeed._tf.world import current_world


class _ShardedColumn(FileArray):
    """One leaf of a tf.data element, in shard-major row order.

    `cursors[w]` drains block `w` (all leaves of each element in one pass,
    shared by every column), so `x` and `y` come from the same elements.
    """

    agreement_rows = "none"  # a row of another worker's shard costs a pass through it

    _handles = ()

    def __init__(
        self, cursors: list[Cursor], leaf: int, sizes: list[int], spec: Any, source: str
    ) -> None:
        self.shape = (sum(sizes), *spec.shape)
        self.dtype = np.dtype(spec.dtype.as_numpy_dtype)
        self.source = source
        self._starts = np.cumsum([0, *sizes]).tolist()
        self._cursors = cursors
        self._leaf = leaf

    def close(self) -> None:
        for c in self._cursors:
            c.close()

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        for w, cursor in enumerate(self._cursors):
            lo, hi = max(start, self._starts[w]), min(stop, self._starts[w + 1])
            if lo < hi:
                first = self._starts[w]
                cursor.read(lo - first, hi - first, out[lo - start : hi - start], self._leaf)


def block_cursors(
    blocks: Callable[[int], Any], sizes: list[int], spec: Any, source: str,
    on_pass: Callable[[], None] | None = None,
) -> list[Cursor]:
    """One cursor per block `w` over `blocks(w)`, yielding every leaf of `spec`."""
    leaves = keras.tree.flatten(spec)
    row_bytes = sum(
        math.prod(s.shape) * np.dtype(s.dtype.as_numpy_dtype).itemsize for s in leaves
    )

    def cursor(w: int) -> Cursor:
        def make(skip: int) -> Any:
            flat = lambda *e: tuple(keras.tree.flatten(e[0] if len(e) == 1 else e))  # noqa: E731
            rows = blocks(w).skip(skip).map(flat)
            return rows.map(lambda *e: e[0]) if len(leaves) == 1 else rows

        return Cursor(make, row_bytes, f"{source} shard {w}", len(leaves), on_pass)

    return [cursor(w) for w in range(len(sizes))]


# Fixes for a pipeline whose order is not the same on every pass or process.
_ORDER_FIX = (
    "Give the shuffle a seed and `reshuffle_each_iteration=False` (e.g. "
    "`ds.shuffle(n, seed=1, reshuffle_each_iteration=False)`), or drop it: "
    "`ShardedResidentDataset` shuffles the resident rows itself every epoch (`seed=`)."
)


def _order_hazards(dataset: Any) -> tuple[list[str], list[str]]:
    """Steps of the pipeline that change its row order.

    Walks the pipeline's Python objects (its input datasets), not its
    serialized graph: `from_tensor_slices` of a large array embeds the array
    in the graph (serializing 100 MB took 7 s). Not reached: pipelines built
    inside `interleave`/`flat_map` functions, and `interleave(...,
    deterministic=False)` (TF keeps that only in the graph).

    Returns:
        `(per_pass, per_process)`: descriptions of steps whose order changes
        on every pass (`shuffle` with `reshuffle_each_iteration=True`, a
        parallel `map` or the options with `deterministic=False`), and of
        steps whose order may differ between processes (an unseeded
        `shuffle` with no global seed, and the same `deterministic=False`).
    """
    per_pass: list[str] = []
    per_process: list[str] = []
    if dataset.options().deterministic is False:
        per_pass.append("options(deterministic=False)")
        per_process.append("options(deterministic=False)")
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        name = type(node).__name__.lstrip("_")
        if getattr(node, "_deterministic", None) == "false":
            per_pass.append(f"{name}(deterministic=False)")
            per_process.append(f"{name}(deterministic=False)")
        if hasattr(node, "_reshuffle_each_iteration"):
            if node._reshuffle_each_iteration:
                per_pass.append(f"{name}(reshuffle_each_iteration=True)")
            seeds = [int(getattr(node, a, -1)) for a in ("_seed", "_seed2")]
            if seeds == [0, 0]:  # TF draws a random seed per process
                per_process.append(f"{name}(seed=None)")
        stack.extend(node._inputs())
    return per_pass, per_process


class _Passes:
    """Counts passes over one pipeline in this process; refuses a second one
    when the pipeline reshuffles (its blocks would hold other rows)."""

    def __init__(self, per_pass: list[str]) -> None:
        self._per_pass = per_pass
        self._count = 0

    def __call__(self) -> None:
        self._count += 1
        if self._count > 1 and self._per_pass:
            raise ValueError(
                _errors.message(
                    "A tf.data source read more than once in a process (several replicas "
                    "holding the same rows, `placement=\"replicate\"`, or rows of a "
                    "neighbour worker's shard) must give the same order on every pass.",
                    f"the pipeline has {', '.join(sorted(set(self._per_pass)))}",
                    _ORDER_FIX,
                )
            )


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
    if num_rows is not None and not (_errors.is_integer(num_rows) and num_rows >= 1):
        raise ValueError(
            _errors.message(
                "`num_rows` must be a positive integer: the rows of the whole dataset.",
                f"num_rows={num_rows!r}",
                "Pass the dataset's row count, or leave `num_rows` out for a dataset "
                "of known cardinality.",
            )
        )
    world = current_world(strategy)
    shard_count = world.world_size
    per_pass: list[str] = []
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
        per_pass, per_process = _order_hazards(dataset)
        if shard_count > 1 and per_process:
            raise ValueError(
                _errors.message(
                    "On several workers every worker drains its shard of the same "
                    "pipeline, so the pipeline's row order must be the same in every "
                    "process; an unseeded shuffle (or an op with `deterministic=False`) "
                    "gives each worker its own order, and rows would be held twice or "
                    "never.",
                    f"the pipeline has {', '.join(sorted(set(per_process)))}, "
                    f"workers={shard_count}",
                    "Seed the shuffle (`ds.shuffle(n, seed=1)`, or `tf.random.set_seed` "
                    "in every worker), or drop it: `ShardedResidentDataset` shuffles the "
                    "resident rows itself every epoch (`seed=`).",
                )
            )

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
    cursors = block_cursors(blocks, sizes, spec, "tf.data", _Passes(per_pass))
    parts = _parts(spec)
    leaves: list[Any] = []
    flat_index = 0
    for name, part in zip(("x", "y", "sample_weight"), parts, strict=True):
        if part is None:
            leaves.append(None)
            continue
        flat = keras.tree.flatten(part)
        columns = [
            _ShardedColumn(cursors, flat_index + j, sizes, s, f"tf.data {name}[{j}]")
            for j, s in enumerate(flat)
        ]
        flat_index += len(flat)
        leaves.append(keras.tree.pack_sequence_as(part, columns))
    return cls(*leaves, strategy=strategy, **kwargs)
