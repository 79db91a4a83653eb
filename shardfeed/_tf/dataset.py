"""`ShardedResidentDataset` on TensorFlow: rows resident on the replicas' devices, cut into steps.

`DatasetBase`'s construction and checks, then the memory check and the
residency mode, chosen once: resident (`order.ResidentRows`), streamed
(`streaming.StreamedRows`) or sharded with the per-epoch exchange
(`exchange.GlobalShuffle`); epochs (`epoch.ResidentEpoch`), `iterator`, label
ranges, and the gather the compiled loop calls. `tests/_tf/test_layers.py` pins
what the training layer may read of it.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data import dataset_args as _args
from shardfeed._data import exchange as _exchange
from shardfeed._data import memory as _memory
from shardfeed._data import order as _data_order
from shardfeed._data import plan as _plan
from shardfeed._data.options import LoadOptions
from shardfeed._tf import epoch as _epoch
from shardfeed._tf import exchange as _global_order
from shardfeed._tf import iterator as _iterator
from shardfeed._tf import labels as _labels
from shardfeed._tf import order as _order
from shardfeed._tf import storage as _storage
from shardfeed._tf import streaming as _streaming
from shardfeed._tf import tfdata as _tfdata
from shardfeed._tf.engines.engine import Engine, engine_for
from shardfeed._tf.epoch import Batch
from shardfeed._tf.world import World, current_world, initialized_world

logger = logging.getLogger("shardfeed")


class _Held(NamedTuple):
    """What a dataset holds on its devices: its stores and their residency."""

    stores: tuple[_storage.ReplicaStore, ...]
    residency: _order.Residency
    exchange: _global_order.GlobalShuffle | None


class ShardedResidentDataset(_args.DatasetBase[World]):
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
        shuffle: True (default): the global order -- one permutation of all
            rows per epoch from `(seed, epoch)`, each global step a slice of
            it, as one replica with batch `global_batch_size` would see;
            sharded rows move between replicas once per epoch to follow it
            (`LoadOptions.exchange_buffer_bytes`, `exchange_fraction`).
            `"local"`: with `placement="shard"`, each replica shuffles its
            own rows (no exchange). False: rows in order. See docs/data.md.
        seed: Seed of the epoch permutations, an integer in `[0, 2**63)`;
            required when shuffling so every replica and every rerun draws
            the same order.
        drop_remainder: Drop the partial last step of a training epoch
            (counted and reported) instead of running it on the real rows.
        placement: `"shard"`: each replica holds `1/num_replicas` of the rows.
            `"replicate"`: each replica holds all rows.
        transform: A function applied to each batch's `x` inside the
            compiled step, e.g. `lambda x: tf.cast(x, "float32") / 255`.
        augment: A function `(x, seed) -> x` applied to each *training*
            batch inside the compiled step, after `transform`, before the
            model (never by `evaluate`/`predict`); `seed` is a stateless
            `[2]` seed drawn from `(seed, epoch, step, replica)`. See
            `shardfeed.augment` for blocks. Requires `seed`.
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
        shuffle: bool | Literal["local"] = True,
        seed: int | None = None,
        drop_remainder: bool = False,
        placement: _plan.Placement = "shard",
        transform: Callable[[Any], Any] | None = None,
        augment: Callable[[Any, Any], Any] | None = None,
        load_options: LoadOptions | None = None,
        strategy: tf.distribute.Strategy | None = None,
    ) -> None:
        self._engine: Engine | None = None
        opts = self._start(
            x, y, sample_weight, per_replica_batch_size=per_replica_batch_size,
            shuffle=shuffle, seed=seed, drop_remainder=drop_remainder, placement=placement,
            transform=transform, augment=augment, load_options=load_options, strategy=strategy,
        )
        self._label_stats: dict[tuple[int, int | None], list[np.ndarray]] = {}
        exchanged = self.moves_rows
        row_bytes = self.columns.row_bytes
        self.memory_reports = self._memory_reports(exchanged)
        # One decision for every rank: a rank that streamed or refused alone
        # ran other collectives than the others and hung the job.
        agreed = _memory.agree_on_fit(self.world, self.memory_reports, self._usable_per_replica())
        misfit = agreed.misfit
        if exchanged and self.shuffle is False and self._cannot_move(misfit):
            # Rows in order stay where they were loaded: each replica takes its
            # own shard's rows, and the one warning says why and what to pass.
            exchanged = False
            self.memory_reports = self._memory_reports(exchanged)
            agreed = _memory.agree_on_fit(
                self.world, self.memory_reports, self._usable_per_replica()
            )
            misfit = agreed.misfit
        self.stream: _streaming.StreamLayout | None = None
        self._exchanged = exchanged
        self._open_epochs: weakref.WeakSet[_epoch.ResidentEpoch] = weakref.WeakSet()
        if exchanged and (opts.streaming is True or misfit is not None):
            numbers = misfit.numbers() if misfit is not None else ""
            error = MemoryError if misfit is not None else ValueError
            buffer = _exchange.buffer_bytes(opts.exchange_buffer_bytes, self.eval_plan, row_bytes)
            raise error(_global_order.misfit_error(numbers, opts, opts.streaming is True, buffer))
        if opts.streaming is True or (misfit is not None and opts.streaming == "auto"):
            self.stream = _streaming.stream_layout(
                self.eval_plan, self.columns.row_bytes, agreed.usable_per_replica, opts
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
        # How rows are held, chosen once above: resident, streamed, or sharded
        # with the exchange (the per-epoch global order of sharded rows);
        # every epoch's order comes from it. `split` lets go of them.
        self._held: _Held | None = self._hold()
        _args.log_dropped(self._train_plan, self.world.is_chief)

    _TRANSFORM_EXAMPLE = "tf.cast(x, 'float32') / 255"

    def _memory_reports(self, exchanged: bool) -> list[_memory.MemoryReport]:
        """The fit of the shards, plus the exchange's staging when rows move."""
        opts, plan, row_bytes = self.load_options, self.eval_plan, self.columns.row_bytes
        staged = _global_order.staging_bytes(plan, row_bytes, opts, self.world) if exchanged else 0
        # Each replica's `[steps, batch]` index matrix of an epoch lives on its
        # device (`order.py`, `exchange.py`): device memory on a GPU too.
        needed = _memory.device_bytes(
            plan, self.world.global_replica_ids, self.world.local_devices, row_bytes,
            staged + _memory.call_rows_bytes(plan, row_bytes) + _memory.position_bytes(plan),
            _memory.index_bytes_per_row(self.world.local_devices, opts.device_memory_bytes),
        )
        return _memory.memory_reports(needed, opts.memory_fraction, opts.device_memory_bytes)

    def _cannot_move(self, misfit: _memory.MemoryReport | None) -> bool:
        """Whether rows in order (`shuffle=False`) cannot move to follow one
        replica's batches: streamed shards (asked for, or not fitting with the
        exchange's staging on some worker; every worker decides alike, since
        the exchange is a collective). Warns once, on the chief, when so."""
        opts = self.load_options
        misfits = [misfit is not None]
        if opts.streaming is not True and self.world.world_size > 1:
            misfits = [p == b"1" for p in self.world.all_gather_bytes(b"1" if misfit else b"0")]
        if opts.streaming is not True and not any(misfits):
            return False
        if self.world.is_chief:
            why = (
                "LoadOptions(streaming=True)" if opts.streaming is True
                else "the shards with the exchange's staging do not fit"
                f"{'' if misfit is None else f' ({misfit.numbers()})'}"
            )
            logger.warning(
                "shardfeed: shuffle=False on %d sharded replicas: %s, so each replica "
                "takes its own shard's rows in order and a global batch joins rows from "
                "%d places of the data, not the batches one replica with batch %d takes. "
                "For those, hold the shards resident with room for the exchange (more "
                "replicas, or a smaller LoadOptions.exchange_buffer_bytes; "
                "streaming=False), or pass placement=\"replicate\" where every row fits "
                "on each device.",
                self.eval_plan.num_replicas, why, self.eval_plan.num_replicas,
                self.eval_plan.global_batch_size,
            )
        return True

    def _check_backend_args(self, strategy: Any, options: LoadOptions) -> None:
        if options.epoch_copy is True:
            raise ValueError(
                _errors.message(
                    "A per-epoch copy of the rows (`epoch_copy=True`) is the JAX backend's: "
                    "TensorFlow always gathers each batch from the resident rows.",
                    "LoadOptions(epoch_copy=True)",
                    'Leave `epoch_copy="auto"` (or False), or use `KERAS_BACKEND=jax`.',
                )
            )

    def _take_world(self, strategy: Any) -> tuple[World, Callable[[], Any] | None]:
        before_init = (
            strategy is None and not tf.distribute.has_strategy() and initialized_world() is None
        )
        return current_world(strategy), initialized_world if before_init else None

    def _split_kwargs(self) -> dict[str, Any]:
        return {"strategy": self.world.strategy}

    @classmethod
    def from_tf_dataset(cls, dataset: Any, **kwargs: Any) -> ShardedResidentDataset:
        """Builds a resident dataset from a finite `tf.data.Dataset`; each
        worker drains only its shard. See `shardfeed._tf.tfdata.from_tf_dataset`
        for the arguments.

        Example:
            >>> ds = ShardedResidentDataset.from_tf_dataset(
            ...     tf.data.Dataset.from_tensor_slices((x, y)),
            ...     per_replica_batch_size=256, seed=0)
        """
        return _tfdata.from_tf_dataset(cls, dataset, **kwargs)

    # -- what it holds -------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The engine its replicas run under (`tf.distribute` or Horovod),
        built once with its world: the global shuffle's exchange, `fit`'s
        compiled loop and the sparse-label check share it."""
        if self._engine is None:
            self._engine = engine_for(self.world)
        return self._engine

    def _hold(self) -> _Held:
        """Allocates the device variables and uploads the rows (or the
        streaming rings), in the residency `__init__` chose."""
        opts = self.load_options
        if self.stream is not None:
            stores = _streaming.allocate_rings(
                self.columns,
                self.eval_plan,
                self.stream,
                self.world.global_replica_ids,
                self.world.local_devices,
            )
            streamed = _streaming.StreamedRows(
                self.columns, stores, self.stream, self.seed, self.shuffle, opts
            )
            return _Held(stores, streamed, None)
        stores = _storage.upload(self.columns, self.eval_plan, self.world, opts)
        if not self._exchanged:
            return _Held(stores, _order.ResidentRows(stores, self.seed, self.shuffle), None)
        exchange = _global_order.GlobalShuffle(
            self.eval_plan, stores, self.engine, self.columns.row_bytes, opts, self.seed,
            shuffle=self.shuffle is True,
        )
        return _Held(stores, exchange, exchange)

    def _holding(self) -> _Held:
        if self._held is None:
            # Let go of by `split`; used again: load the rows again.
            logger.info("shardfeed: loading the rows of a dataset that `split` let go of.")
            self._held = self._hold()
        return self._held

    @property
    def stores(self) -> tuple[_storage.ReplicaStore, ...]:
        """The local replicas' device variables (the data layer's; not an interface)."""
        return self._holding().stores

    @property
    def residency(self) -> _order.Residency:
        """How the rows are held: resident, streamed, or sharded with the exchange."""
        return self._holding().residency

    @property
    def exchange(self) -> _global_order.GlobalShuffle | None:
        """The per-epoch exchange of globally shuffled sharded rows, or None."""
        return self._holding().exchange

    @property
    def nbytes_on_device(self) -> int:
        """Bytes this process holds on its devices (shared copies once).

        Taken from the variables' shapes: reading a variable's value (even for
        `tf.size`) would copy all its rows to the host.
        """
        stores = () if self._held is None else self._held.stores  # (let go of: none)
        seen = {id(v): v for s in stores for v in s.variables}
        return sum(v.shape.num_elements() * v.dtype.size for v in seen.values())

    def describe(self) -> str:
        """One line: rows, columns, bytes on the devices, the plan, who holds what."""
        plan = self._train_plan or self.eval_plan
        held = ", ".join(
            f"replica {s.replica} on {s.device}: rows [{s.row_start}, {s.row_stop})"
            for s in (() if self._held is None else self._held.stores)
        )
        if self._held is None:
            held = "rows let go of by `split` (loaded again when next used)"
        elif self._held.exchange is not None:
            # The ranges are what each replica loaded; the exchange moves rows every epoch.
            held = (
                f"loaded {held}; shuffle=True: rows move between replicas each epoch"
                if self.shuffle is True
                else f"loaded {held}; shuffle=False: rows move between replicas once, "
                "before the first training epoch, to follow one replica's batches"
            )
        return (
            f"ShardedResidentDataset: {plan.num_rows:,} rows ({self.columns.describe()}), "
            f"{self.nbytes_on_device / 2**20:,.1f} MiB on this worker's devices; "
            f"{_args.describe_plan(plan, self._train_plan is not None)}"
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
        """Whether the rows stream through device rings (they did not fit)."""
        return self.stream is not None

    @property
    def epoch_copy(self) -> bool:
        """Whether epochs keep a copy of their rows in step order: never on
        TensorFlow (batches are gathered from the resident rows; as on JAX
        with `LoadOptions(epoch_copy=False)`)."""
        return False

    @property
    def trace_signature(self) -> tuple[Any, ...]:
        """Everything a compiled function that gathers from this dataset reads
        from it at trace time: the strategy, the placement, the local replicas,
        each column's dtype and row shape, the structure of `(x, y,
        sample_weight)`, `transform`, `augment` (and its seed). Datasets with
        equal signatures can run one trace, as `tf.function` reuses a trace
        for arguments of one `TraceType`."""
        cols = self.columns
        return (
            self.world.strategy,
            self.eval_plan.placement,  # (no training plan for too few rows)
            self.world.replicas_in_process,
            tuple((c.dtype.str, c.shape[1:]) for c in cols.columns),
            repr((cols.x, cols.y, cols.sample_weight)),
            self.transform,
            self.augment,
            self.seed if self.augment is not None else None,
        )

    @property
    def order_is_global(self) -> bool:
        """Whether step `s` of a training epoch takes the same global rows on
        any number of replicas: `placement="replicate"`, or sharded rows with
        `shuffle=True` and the full exchange, or `shuffle=False` with the rows
        moved to follow one replica's batches (`_plan.uses_exchange`), or one
        replica holding every row.

        Not with `shuffle="local"` (one order per replica), `shuffle=False`
        over several replicas when its rows could not move (streamed: rows
        per replica depend on their number), a partial exchange (it mixes the
        rows each replica happened to hold) or streaming (chunks are shuffled
        per replica).
        """
        if self.is_streaming:
            return False
        if self.plan.placement == "replicate":
            return True
        if self.shuffle is True:
            return self.plan.num_replicas == 1 or self.load_options.exchange_fraction == 1
        return self.shuffle is False and (self.plan.num_replicas == 1 or self._exchanged)

    @property
    def order_name(self) -> str:
        """The neutral order's name (`_data/order.NAME`, JAX's too), but
        where TensorFlow's epochs take another order: a streamed shard
        shuffled chunk by chunk (`streaming.py`), or sharded rows in order
        that could not move (each replica takes its own shard)."""
        if self.is_streaming and self.shuffle is not False:
            return f"{_data_order.NAME}+tensorflow-stream-chunks"
        if self.moves_rows and not self._exchanged:
            return f"{_data_order.NAME}+tensorflow-unmoved"
        return _data_order.NAME

    @property
    def order_is_replayable(self) -> bool:
        """Whether epoch `e`'s order depends only on `(seed, e)` and the plan,
        so a restarted process draws it again. False for a partial exchange
        (`exchange_fraction < 1`), which mixes what each replica held after
        the epochs before, and a restart reloads the shards as first loaded."""
        return self.exchange is None or not _plan.partial_exchange(
            self.shuffle, self.plan, self.load_options.exchange_fraction
        )

    # -- label ranges (checked by the Keras surface) -----------------------------

    def label_stats(
        self, target: tuple[Any, ...] = (), ignore: int | None = None
    ) -> list[np.ndarray]:
        """Smallest and largest value of a target, and whether any is fractional.

        Computed once per `(target, ignore)` and cached: resident rows are
        reduced on their device (a few scalars come back, never the column);
        streamed rows are read in chunks. Values equal to `ignore` count as 0.

        Args:
            target: Where the target sits in `y`, as keys and positions: `()`
                for a single `y`, `("kind",)` for `y["kind"]`, `(1,)` for
                `y[1]` (the `element_spec.y` leaf's place).
            ignore: A value to leave out of the range (a loss's `ignore_class`).

        Returns:
            Per local replica, `np.array([min, max, fractional])` (float64;
            `fractional` is 1.0 if some value is not a whole number or NaN) over
            the rows that replica holds; `[inf, -inf, 0]` if it holds none.
        """
        column = _args.label_column(self.columns.y, target)
        key = (column, ignore)
        if key not in self._label_stats:
            self._label_stats[key] = [
                _labels.store_label_stats(
                    store, self.columns.columns[column], column, ignore,
                    streamed=self.stream is not None,
                    chunk_bytes=self.load_options.chunk_bytes,
                )
                for store in self.stores
            ]
        return self._label_stats[key]

    # -- Keras' validation_split -----------------------------------------------

    def _let_go(self) -> None:
        """Drops the device rows (and closes open epochs, whose orders and
        handles refer to them); `_holding` loads them again when next used."""
        for opened in list(self._open_epochs):
            opened.close()
        self._held = None

    # -- epochs ---------------------------------------------------------------

    def epoch(
        self, epoch: int, *, training: bool = True, first_step: int = 0, augment: bool = False
    ) -> _epoch.ResidentEpoch:
        """Opens one epoch: its batches, gathered on the replicas' devices.

        Args:
            epoch: The epoch number; with `seed` it fixes the order.
            training: The training plan and order (shuffle, drops, the
                exchange of globally shuffled sharded rows); False: the
                evaluation plan, rows in order, nothing dropped.
            first_step: Resume inside the epoch: iteration starts here.
            augment: Apply the dataset's `augment` (training epochs only).

        Returns:
            A `ResidentEpoch` (see docs/custom_loops.md).

        Example:
            >>> epoch = ds.epoch(0)
            >>> for step, (x, y, sample_weight) in epoch:
            ...     train_step(x, y, epoch.global_rows(step))
        """
        return _epoch.open_epoch(self, epoch, training, first_step, augment)

    def iterator(
        self, *, augment: bool = False, model: Any = None
    ) -> _iterator.ResidentIterator:
        """A resumable position over training epochs (`get_state`/`set_state`,
        trackable by `tf.train.Checkpoint`); see `ResidentIterator`.

        Args:
            augment: Apply the dataset's `augment` to training batches.
            model: The Keras model a loop of your own steps on these batches.
                With several workers its variables (and its compiled
                optimizer's) are compared across them here, before the loop's
                first step, and refused on every worker when they differ,
                naming `shardfeed.sync_model` (an unseeded model starts from
                other values on each). A collective: every worker calls it.
        """
        self.check_loop_model(model)
        return _iterator.ResidentIterator(self, augment=augment)

    @property
    def element_spec(self) -> Batch:
        """`Batch` of `tf.TensorSpec`s of one batch (`transform` applied to
        `x`; leading dimension None), as `tf.data.Dataset.element_spec`."""
        x = self.gather(self.stores[0].handles, tf.constant([0]), with_targets=False).x
        columns = self.columns.columns

        def spec(t: Any) -> Any:
            # None: an absent optional input has no column, and no spec.
            return None if t is None else tf.TensorSpec((None, *t.shape[1:]), t.dtype)

        def column_spec(i: int) -> tf.TensorSpec:
            # Targets from the columns: nothing to gather.
            return tf.TensorSpec((None, *columns[i].row_shape), columns[i].dtype)

        def specs(structure: Any) -> Any:
            return None if structure is None else keras.tree.map_structure(column_spec, structure)

        return Batch(
            keras.tree.map_structure(spec, x),
            specs(self.columns.y),
            specs(self.columns.sample_weight),
        )

    def epoch_order(
        self, epoch: int, training: bool, plan: _plan.ShardPlan | None = None
    ) -> _order.Order:
        """The epoch's per-replica `[steps_per_epoch, per_replica_batch_size]`
        index matrices, and what must happen before each call (the residency's
        `Order`; `ResidentEpoch` is the public form).

        Padding slots of a partial last step come after the real ones; the
        plan's `last_step_rows` says how many are real. `plan` (training
        only) replaces the training plan, e.g. one from `training_plan`.
        """
        if plan is None:
            plan = self.plan if training else self.eval_plan
        return self.residency.epoch_order(plan, epoch, training)

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
        x, y, sw = self.gather_rows(handles, indices, with_targets)
        return Batch(self.transformed(x), y, sw)

    def gather_rows(
        self, handles: tuple[tf.Tensor, ...], indices: tf.Tensor, with_targets: bool = True
    ) -> Batch:
        """`gather` without `transform`: the rows as they are held (the
        compiled loop gathers a call's rows at once, then transforms each step's)."""
        cols = self.columns
        dtypes = [tf.as_dtype(column.dtype) for column in cols.columns]

        def gather_column(i: int) -> tf.Tensor:
            # The op `tf.gather(variable, indices)` runs, on the handle.
            return tf.raw_ops.ResourceGather(resource=handles[i], indices=indices, dtype=dtypes[i])

        def take(structure: Any) -> Any:
            if structure is None:
                return None
            # A None leaf is an absent optional input: None in the batch too.
            return keras.tree.map_structure(
                lambda i: None if i is None else gather_column(i), structure
            )

        x = take(cols.x)
        if not with_targets:
            return Batch(x, None, None)
        return Batch(x, take(cols.y), take(cols.sample_weight))

    def transformed(self, x: Any) -> Any:
        """`transform(x)`, or `x` without one."""
        return x if self.transform is None else self.transform(x)
