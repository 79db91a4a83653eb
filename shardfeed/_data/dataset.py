"""`ShardedResidentDataset`: rows resident on the replicas' devices, cut into steps.

Separation of concerns (after Keras' `epoch_iterator.py`): the dataset owns
sharding, shuffling and batching -- it builds the columns (sources), the plan
(which rows a replica holds, how many steps), the resident storage (device
variables), and each epoch's per-replica index matrix. The engine owns the
strategy, the compiled step loop and the allreduce; it asks the dataset for
an epoch's indices and for the batch at an index row, and never reaches into
the sources or the plan's arithmetic.

Shuffling follows the placement:
- `placement="shard"` (default): each replica holds its own rows and
  reshuffles them every epoch from `(seed, epoch, replica)`: "local" shuffling.
- `placement="replicate"`: every replica holds all rows; all draw the same
  epoch permutation from `(seed, epoch)` and take their own slice of each
  global batch: `DistributedSampler` semantics with no host traffic, and the
  global batches equal a single replica's with batch `global_batch_size`.
Permutations are drawn by `tf.random.experimental.stateless_shuffle` on the
worker's CPU (deterministic for a seed on every host and device) and copied
to each device once per epoch: 4 bytes per row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data import memory as _memory
from shardfeed._data import plan as _plan
from shardfeed._data import sources as _sources
from shardfeed._data import storage as _storage
from shardfeed._data import streaming as _streaming
from shardfeed._data.options import LoadOptions
from shardfeed._distribute.world import World, current_world

logger = logging.getLogger("shardfeed")

Batch = tuple[Any, Any, Any]

# Seeds are int64 in TensorFlow's stateless ops and non-negative in NumPy's
# `default_rng` (streamed epochs): [0, 2**63) works in both.
MAX_SEED = 2**63


class EpochOrder:
    """One resident epoch: index matrices already on the devices.

    Streaming epochs (`_streaming.StreamingOrder`) offer the same methods and
    also upload chunks in `prepare`.
    """

    call_bounds: list[int] | None = None  # any step may start a call

    def __init__(self, indices: list[tf.Tensor], stores: tuple[_storage.ReplicaStore, ...]):
        self._indices = indices
        self._stores = stores

    def prepare(self, start: int, stop: int) -> None:
        """Nothing to do: every row is resident."""

    def slice(self, start: int, stop: int) -> list[tf.Tensor]:
        return [idx[start:stop] for idx in self._indices]

    def rows(self, local: int) -> np.ndarray:
        """Global row numbers of local replica `local`'s slots, step by step."""
        return self._indices[local].numpy().reshape(-1) + self._stores[local].row_start

    def close(self) -> None:
        pass


class ShardedResidentDataset:
    """A dataset held in device memory, sharded across replicas.

    Each worker reads only the rows its replicas own and uploads them in
    chunks into device variables; batches are then gathered on the device,
    inside the compiled training step.

    Args:
        x: Inputs: an array, or a list/tuple/dict of arrays (multi-input).
            Arrays may be NumPy arrays, tensors, `np.memmap`s or HDF5
            datasets; dtypes are kept (uint8 images stay uint8 on the device).
        y: Targets, same forms as `x` (multi-output), or None.
        sample_weight: One weight per row (or a structure matching `y`), or
            None.
        per_replica_batch_size: Rows each replica takes per step. The global
            batch is `per_replica_batch_size * num_replicas_in_sync`.
        shuffle: Reshuffle every epoch (see the module docs for local vs
            global shuffling).
        seed: Seed of the epoch permutations, an integer in `[0, 2**63)`;
            required when shuffling so every replica and every rerun draws
            the same order.
        drop_remainder: Drop the partial last step of a training epoch
            (counted and reported) instead of running it on the real rows.
        placement: `"shard"`: each replica holds `1/num_replicas` of the rows.
            `"replicate"`: each replica holds all rows.
        transform: A function applied to each batch's `x` inside the
            compiled step, e.g. `lambda x: tf.cast(x, "float32") / 255`.
        load_options: Chunk size, memory headroom and checks for the upload.
        strategy: The `tf.distribute` strategy whose devices hold the rows;
            defaults to the strategy in scope.

    Raises:
        ValueError: For inconsistent data, a missing seed, bad sizes.
        TypeError: For non-numeric or object data.
        MemoryError: If the rows do not fit on a device (before allocating).

    Example:
        >>> ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
        >>> history = shardfeed.fit(model, ds, epochs=3)
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        per_replica_batch_size: int,
        shuffle: bool = True,
        seed: int | None = None,
        drop_remainder: bool = False,
        placement: _plan.Placement = "shard",
        transform: Callable[[Any], Any] | None = None,
        load_options: LoadOptions | None = None,
        strategy: tf.distribute.Strategy | None = None,
    ) -> None:
        if shuffle and seed is None:
            raise ValueError(
                _errors.message(
                    "Shuffling requires a seed, so that every replica and every "
                    "rerun draws the same epoch order.",
                    "shuffle=True, seed=None",
                    "Pass `seed=<int>`, or `shuffle=False` to keep the rows in order.",
                )
            )
        if seed is not None and not (_errors.is_integer(seed) and 0 <= seed < MAX_SEED):
            raise ValueError(
                _errors.message(
                    "`seed` must be an integer in [0, 2**63) (TensorFlow's stateless "
                    "shuffle takes it as an int64; NumPy's generator needs it non-negative).",
                    f"seed={seed!r}",
                    "Pass e.g. `seed=0`, or `seed=None` with `shuffle=False`.",
                )
            )
        if transform is not None and not callable(transform):
            raise TypeError(
                _errors.message(
                    "`transform` must be a function of a batch's `x`.",
                    f"type(transform)={type(transform).__name__}",
                    "Pass e.g. `transform=lambda x: tf.cast(x, 'float32') / 255`.",
                )
            )
        self._label_stats: dict[tuple[int, int | None], list[np.ndarray]] = {}
        self.columns = _sources.columns_from_arrays(x, y, sample_weight)
        self.world: World = current_world(strategy)
        self.shuffle = bool(shuffle)
        self.seed = None if seed is None else int(seed)
        self.transform = transform
        self.load_options = load_options or LoadOptions()
        self.eval_plan = _plan.plan_shards(
            self.columns.num_rows,
            self.world.num_replicas_in_sync,
            per_replica_batch_size,
            placement,
            training=False,
        )
        # A dataset only evaluated or predicted on may admit no training epoch
        # (fewer rows than replicas): that is an error only once `fit` asks.
        self._train_plan: _plan.ShardPlan | None = None
        self._train_plan_error: ValueError | None = None
        try:
            self._train_plan = _plan.plan_shards(
                self.columns.num_rows,
                self.world.num_replicas_in_sync,
                per_replica_batch_size,
                placement,
                drop_remainder,
                training=True,
            )
        except ValueError as err:
            self._train_plan_error = err
        needed = _storage.needed_bytes(self.columns, self.eval_plan, self.world)
        opts = self.load_options
        self.memory_reports = _memory.memory_reports(
            needed, opts.memory_fraction, opts.device_memory_bytes
        )
        misfit = next((r for r in self.memory_reports if not r.fits), None)
        self.stream: _streaming.StreamPlan | None = None
        if opts.streaming is True or (misfit is not None and opts.streaming == "auto"):
            self.stream = _streaming.plan_stream(
                self.eval_plan, self.columns.row_bytes, self._usable_per_replica(), opts
            )
            self.stores = _streaming.allocate_rings(
                self.columns,
                self.eval_plan,
                self.stream,
                self.world.global_replica_ids,
                self.world.local_devices,
            )
            if misfit is not None and self.world.is_chief:
                logger.warning(
                    "shardfeed: the shard does not fit (%s); streaming it in chunks of "
                    "%d rows through two slots per replica.",
                    misfit.numbers(),
                    self.stream.chunk_rows,
                )
        elif misfit is not None:
            raise MemoryError(_memory.fit_error(misfit, opts.memory_fraction))
        else:
            self.stores = _storage.upload(self.columns, self.eval_plan, self.world, opts)
        train_plan = self._train_plan
        if train_plan is not None and train_plan.dropped_rows_per_epoch and self.world.is_chief:
            logger.warning(
                "shardfeed: %d of %d rows are left out of each training epoch so "
                "every replica runs %d equal steps (%s).",
                train_plan.dropped_rows_per_epoch,
                train_plan.num_rows,
                train_plan.steps_per_epoch,
                "drop_remainder=True"
                if train_plan.drop_remainder
                else "a replica would have no row in the last step",
            )

    # -- what it holds -------------------------------------------------------

    @property
    def plan(self) -> _plan.ShardPlan:
        """The training plan (steps per epoch, partial last step, drops).

        Raises:
            ValueError: If these rows admit no training epoch on these replicas.
        """
        if self._train_plan is None:
            raise self._train_plan_error  # type: ignore[misc]
        return self._train_plan

    @property
    def num_rows(self) -> int:
        return self.columns.num_rows

    @property
    def per_replica_batch_size(self) -> int:
        return self.eval_plan.per_replica_batch_size

    @property
    def global_batch_size(self) -> int:
        return self.eval_plan.global_batch_size

    @property
    def has_targets(self) -> bool:
        return self.columns.y is not None

    @property
    def nbytes_on_device(self) -> int:
        """Bytes this process holds on its devices (shared copies once).

        Taken from the variables' shapes: reading a variable's value (even for
        `tf.size`) would copy all its rows to the host.
        """
        seen = {id(v): v for s in self.stores for v in s.variables}
        return sum(v.shape.num_elements() * v.dtype.size for v in seen.values())

    def describe(self) -> str:
        plan = self._train_plan or self.eval_plan
        held = ", ".join(
            f"replica {s.replica} on {s.device}: rows [{s.row_start}, {s.row_stop})"
            for s in self.stores
        )
        return (
            f"ShardedResidentDataset: {plan.num_rows:,} rows ({self.columns.describe()}), "
            f"{self.nbytes_on_device / 2**20:,.1f} MiB on this worker's devices; "
            f"placement={plan.placement!r}, {plan.num_replicas} replica(s) x "
            f"{plan.per_replica_batch_size} rows = global batch {plan.global_batch_size}; "
            f"{plan.steps_per_epoch} steps/epoch, {plan.dropped_rows_per_epoch} rows "
            f"dropped/epoch{'' if self._train_plan else ' (evaluation only)'}"
            f"{'; streaming' if self.stream else ''}; {held}"
        )

    def __repr__(self) -> str:
        return self.describe()

    def _usable_per_replica(self) -> int | None:
        """Usable bytes per local replica (replicas on one host share its RAM)."""
        usable = [r.usable_bytes for r in self.memory_reports if r.usable_bytes is not None]
        if not usable:
            return None
        shared = 1 if len(self.memory_reports) > 1 else self.world.replicas_in_process
        return min(usable) // shared

    @property
    def is_streaming(self) -> bool:
        return self.stream is not None

    # -- label ranges (checked by the Keras surface) -----------------------------

    def label_stats(self, column: int, ignore: int | None = None) -> list[np.ndarray]:
        """Smallest and largest value of a column, and whether any is fractional.

        Computed once per `(column, ignore)` and cached: resident rows are
        reduced on their device (a few scalars come back, never the column);
        streamed rows are read in chunks. Values equal to `ignore` count as 0.

        Args:
            column: Index into `self.columns.columns` (e.g. a leaf of `y`).
            ignore: A value to leave out of the range (a loss's `ignore_class`).

        Returns:
            Per local replica, `np.array([min, max, fractional])` (float64;
            `fractional` is 1.0 if some value is not a whole number or NaN) over
            the rows that replica holds; `[inf, -inf, 0]` if it holds none.
        """
        key = (column, ignore)
        if key not in self._label_stats:
            self._label_stats[key] = [
                self._store_label_stats(store, column, ignore) for store in self.stores
            ]
        return self._label_stats[key]

    def _store_label_stats(
        self, store: _storage.ReplicaStore, column: int, ignore: int | None
    ) -> np.ndarray:
        if store.num_rows == 0:
            return np.array([np.inf, -np.inf, 0.0])
        if self.stream is not None:
            col = self.columns.columns[column]
            rows = max(1, self.load_options.chunk_bytes // max(1, col.row_bytes))
            parts = [
                _value_stats(col.read(start, min(store.row_stop, start + rows)), ignore)
                for start in range(store.row_start, store.row_stop, rows)
            ]
            lows, highs, fractional = zip(*parts, strict=True)
            return np.array([min(lows), max(highs), float(any(fractional))])
        variable = store.variables[column]
        with tf.device(store.device):
            # A replica without rows holds one zero row; others hold exactly theirs.
            values = variable if variable.shape[0] == store.num_rows else variable[: store.num_rows]
            return np.array([float(v) for v in _value_stats(values, ignore)])

    # -- per-epoch order (used by the engine) ---------------------------------

    def epoch_order(self, epoch: int, training: bool) -> EpochOrder | _streaming.StreamingOrder:
        """The epoch's per-replica `[steps_per_epoch, per_replica_batch_size]`
        index matrices, and what must happen before each call.

        Padding slots of a partial last step come after the real ones; the
        plan's `last_step_rows` says how many are real.
        """
        plan = self.plan if training else self.eval_plan
        if self.stream is not None:
            return _streaming.StreamingOrder(
                self.columns,
                self.stores,
                plan,
                self.stream,
                self.seed if self.shuffle and training else None,
                epoch,
                self.load_options,
            )
        return EpochOrder(self.epoch_indices(epoch, training), self.stores)

    def epoch_indices(self, epoch: int, training: bool) -> list[tf.Tensor]:
        """Per local replica, the index matrix of a resident epoch (see
        `epoch_order`)."""
        plan = self.plan if training else self.eval_plan
        shuffle = self.shuffle and training
        b, steps = plan.per_replica_batch_size, plan.steps_per_epoch
        full = plan.full_steps_per_epoch
        out = []
        for store in self.stores:
            r = store.replica
            if plan.placement == "shard":
                order = self._permutation(store.num_rows, epoch, r if shuffle else None, shuffle)
                rows = [order[: full * b]]
                if plan.has_partial_step:
                    rows.append(order[full * b : full * b + plan.last_step_rows[r]])
            else:
                order = self._permutation(plan.num_rows, epoch, None, shuffle)
                g = plan.global_batch_size
                body = tf.reshape(order[: full * g], [full, plan.num_replicas, b])[:, r, :]
                rows = [tf.reshape(body, [-1])]
                if plan.has_partial_step:
                    offset = full * g + sum(plan.last_step_rows[:r])
                    rows.append(order[offset : offset + plan.last_step_rows[r]])
            with tf.device(store.device):
                flat = tf.concat(rows, axis=0)
                flat = tf.pad(flat, [[0, steps * b - int(flat.shape[0])]])
                out.append(tf.reshape(flat, [steps, b]))
        return out

    def _permutation(self, n: int, epoch: int, replica: int | None, shuffle: bool) -> tf.Tensor:
        dtype = tf.int32 if n < 2**31 else tf.int64
        with tf.device("/CPU:0"):
            if not shuffle:
                return tf.range(n, dtype=dtype)
            seed = tf.constant([self.seed, epoch], dtype=tf.int64)
            if replica is not None:
                seed = tf.random.experimental.stateless_fold_in(seed, replica)
            return tf.random.experimental.stateless_shuffle(tf.range(n, dtype=dtype), seed=seed)

    # -- batches (called inside the compiled step) ----------------------------

    def gather(
        self, handles: tuple[tf.Tensor, ...], indices: tf.Tensor, with_targets: bool = True
    ) -> Batch:
        """Gathers one batch `(x, y, sample_weight)` on the device.

        Args:
            handles: One replica's column handles (`ReplicaStore.handles`).
                Compiled functions take handles, not variables: a trace keeps
                the variables passed to it alive, and Keras' optimizer keeps
                every training trace for the life of the process (see
                `_loop.py`), so passing variables would keep the rows too.
            indices: Row positions in the replica's variables.
            with_targets: Also gather `y` and `sample_weight`.

        Returns:
            `(x, y, sample_weight)`, `transform` applied to `x`; `y` and
            `sample_weight` are None when the dataset has none or
            `with_targets` is False.
        """
        cols = self.columns
        dtypes = [tf.as_dtype(column.dtype) for column in cols.columns]

        def gather_column(i: int) -> tf.Tensor:
            # The op `tf.gather(variable, indices)` runs, on the handle.
            return tf.raw_ops.ResourceGather(resource=handles[i], indices=indices, dtype=dtypes[i])

        def take(structure: Any) -> Any:
            if structure is None:
                return None
            return keras.tree.map_structure(gather_column, structure)

        x = take(cols.x)
        if self.transform is not None:
            x = self.transform(x)
        if not with_targets:
            return x, None, None
        return x, take(cols.y), take(cols.sample_weight)


def _value_stats(values: Any, ignore: int | None) -> tuple[Any, Any, Any]:
    """`(min, max, any fractional or NaN)` of a NumPy array or a tensor (reduced
    where it lives)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "b":
            values = values.astype(np.int8)
        if ignore is not None and np.can_cast(np.min_scalar_type(ignore), values.dtype):
            values = np.where(values == ignore, 0, values)
        fractional = values.dtype.kind in "fc" and bool(np.any(values != np.floor(values)))
        return float(values.min()), float(values.max()), fractional
    values = tf.convert_to_tensor(values)
    if values.dtype == tf.bool:
        values = tf.cast(values, tf.int8)
    if ignore is not None and values.dtype.min <= ignore <= values.dtype.max:
        values = tf.where(values == tf.cast(ignore, values.dtype), tf.zeros_like(values), values)
    if values.dtype.is_floating:
        fractional = tf.reduce_any(values != tf.floor(values))
    else:
        fractional = tf.constant(False)
    return tf.reduce_min(values), tf.reduce_max(values), fractional

