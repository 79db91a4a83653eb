"""`ShardedResidentDataset` on JAX: rows resident on the replicas' devices, or streamed.

`DatasetBase`'s construction and checks, then the fit (`storage.py`; streaming
when a shard does not fit), the upload, and epochs (`epoch.py`, orders from
`order.py`); whether an epoch keeps a copy of its rows (`LoadOptions.epoch_copy`),
and where the rows sit after an in-place exchange.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data import dataset_args as _args
from shardfeed._data import exchange as _rounds
from shardfeed._data import memory as _memory
from shardfeed._data import order as _order
from shardfeed._data import plan as _plan
from shardfeed._data import relayout as _relayout
from shardfeed._data.options import LoadOptions
from shardfeed._jax import epoch as _epoch
from shardfeed._jax import exchange as _exchange
from shardfeed._jax import iterator as _iterator
from shardfeed._jax import labels as _labels
from shardfeed._jax import storage as _storage
from shardfeed._jax import streaming as _streaming
from shardfeed._jax.world import World, current_world, initialized_world

logger = logging.getLogger("shardfeed")


_STREAMED_COPY = _errors.message(
    "A streamed dataset keeps no per-epoch copy: each chunk is already a copy of its "
    "rows in step order.",
    "LoadOptions(streaming={streaming}, epoch_copy=True)",
    'Leave `epoch_copy="auto"` (or False), or pass `streaming=False` to hold the rows '
    "resident.",
)


class ShardedResidentDataset(_args.DatasetBase[World]):
    """A dataset held in device memory, sharded across replicas, on JAX.

    The same arguments, checks and messages as the TensorFlow backend's (see
    `shardfeed._tf.dataset.ShardedResidentDataset`), with these differences:

    - `strategy` must be None: the replicas are `current_world()`'s devices.
    - `transform` and `augment` see the global batch (`[global_batch_size, ...]`,
      sharded along rows); `augment` is a function `(x, key) -> x` (of JAX ops,
      or `shardfeed.augment`'s blocks), `key` a `jax.random` key from `(seed,
      epoch, step)`: each example of the global batch draws its own transform.
    - Epoch orders are TensorFlow's (`_data/order.py`, shared by both
      backends): the same seed trains the same rows in the same steps, except
      that a streamed shard's order is the resident one (TensorFlow's streams
      chunk by chunk).
    - 64-bit columns are held in 32 bits (JAX without `jax_enable_x64`, as
      Keras on JAX feeds them); integers that do not fit are refused.
    - Streaming (`LoadOptions(streaming=True)`, or `"auto"` when a shard does
      not fit) keeps the rows on the host and streams each epoch through a
      ring of two chunks per replica (`streaming.py`), in the resident
      order: the same batches. `epoch_copy=True` and a partial exchange are
      refused then.
    - A partial exchange (`exchange_fraction` below 1) moves the same rows
      as TensorFlow's (`_data/exchange.py` `partial_destinations`), in place
      in `relayout`'s rounds, and an epoch's rows per replica depend only on
      `(seed, epoch)`: opened out of turn (a resumed run), the holdings of
      the epochs before are replayed on the host.

    A step gathers each replica's batch from its resident rows, so device
    memory stays near one copy of them plus 4 bytes of positions per row.
    The global order of sharded rows moves rows between replicas in place
    before each training epoch, in rounds that stage at most
    `LoadOptions.exchange_buffer_bytes` per replica (`_data/relayout.py`).
    On CPU devices, where contiguous slices were measured faster than a
    gather, an epoch whose copy fits in `LoadOptions.epoch_copy_bytes`
    keeps a copy of its rows in step order instead (`epoch_copy`; the
    memory check counts it, and the global order's all-to-all then stages
    about twice a replica's epoch rows).

    Example:
        >>> ds = ShardedResidentDataset(x, y, per_replica_batch_size=256, seed=0)
        >>> epoch = ds.epoch(0)
        >>> batch = epoch.batch_fn(epoch.arrays, 0)
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
        strategy: Any = None,
    ) -> None:
        options = self._start(
            x, y, sample_weight, per_replica_batch_size=per_replica_batch_size,
            shuffle=shuffle, seed=seed, drop_remainder=drop_remainder, placement=placement,
            transform=transform, augment=augment, load_options=load_options, strategy=strategy,
        )
        self._batch_fns: dict[tuple[int, bool], _epoch.BatchFn] = {}
        self._label_stats: dict[tuple[int, int | None], list[Any]] = {}
        # The copy of an order that never changes (see `epoch_data`).
        self._static: tuple[_plan.ShardPlan, _epoch.EpochData] | None = None
        # A closed epoch's copy, which the next epoch's copy is written into
        # (`recycle`): held between epochs, within the one copy the memory
        # check counts.
        self._spare: tuple[Any, ...] | None = None
        # Per global replica, the global row in each slot once rows have moved
        # in place (the global order of sharded rows, no copy); None: as loaded.
        self._layout: list[Any] | None = None
        # The training epoch whose partial-exchange holdings `_layout` holds.
        self._layout_epoch: int | None = None
        self._epochs: weakref.WeakSet[_epoch.ResidentEpoch] = weakref.WeakSet()
        plan = self.eval_plan
        self._epoch_copy, self.memory_reports = _choose_epoch_copy(
            self.world, plan, self.columns.row_bytes, self.moves_rows,
            _plan.partial_exchange(self.shuffle, plan, options.exchange_fraction), options,
        )
        # One decision for every rank: a rank that streamed or refused alone
        # ran other collectives than the others and hung the job.
        agreed = _memory.agree_on_fit(
            self.world, self.memory_reports,
            _streaming.usable_per_replica(self.memory_reports, self.world),
        )
        misfit = agreed.misfit
        # Rows per ring slot when streaming (the rows stay on the host); None: resident.
        self._slot_rows: int | None = None
        if options.streaming is True or (misfit is not None and options.streaming == "auto"):
            self._stream(misfit, agreed.usable_per_replica, options)
        elif misfit is not None:
            raise MemoryError(_memory.fit_error(misfit, options.memory_fraction))
        self._tables: tuple[Any, ...] | None = None
        if self._slot_rows is None:
            self._tables = _storage.upload(self.columns, plan, self.world, options)
        _args.log_dropped(self._train_plan, self.world.is_chief)

    _TRANSFORM_EXAMPLE = "x.astype('float32') / 255"

    def _check_backend_args(self, strategy: Any, options: LoadOptions) -> None:
        """What only the JAX backend refuses: a strategy, an epoch copy of streamed rows."""
        if strategy is not None:
            raise ValueError(
                _errors.message(
                    "On the JAX backend the replicas are `shardfeed.init()`'s devices (or a "
                    "`keras.distribution.DataParallel`'s); a `tf.distribute` strategy has no role.",
                    f"strategy={strategy!r}",
                    "Leave `strategy=None`; to choose devices, call `shardfeed.init()` or set "
                    "`keras.distribution.set_distribution(DataParallel(...))` first.",
                )
            )
        if options.streaming is True and options.epoch_copy is True:
            raise ValueError(_STREAMED_COPY.format(streaming=True))

    def _take_world(self, strategy: Any) -> tuple[World, Callable[[], Any] | None]:
        return current_world(), initialized_world if initialized_world() is None else None

    def _stream(
        self, misfit: _memory.MemoryReport | None, usable: int | None, options: LoadOptions
    ) -> None:
        """Chooses the ring (its slot sized by `usable` bytes per replica, the
        same on every rank) and its memory check (two slots, no rows)."""
        if misfit is not None and options.epoch_copy is True:
            raise ValueError(_STREAMED_COPY.format(streaming='"auto"'))
        if _plan.partial_exchange(self.shuffle, self.eval_plan, options.exchange_fraction):
            raise ValueError(
                _errors.message(
                    "A streamed dataset moves no rows between devices (each chunk is "
                    "assembled on the host), so a partial exchange has no role.",
                    f"LoadOptions(streaming={options.streaming!r}, "
                    f"exchange_fraction={options.exchange_fraction})",
                    "Leave `exchange_fraction=1` (the global order costs a streamed "
                    "epoch nothing more), or pass `streaming=False` with more devices.",
                )
            )
        plan, row_bytes = self.eval_plan, self.columns.row_bytes
        self._slot_rows = _streaming.slot_rows(self.world, plan, row_bytes, usable, options)
        self._epoch_copy = False
        self.memory_reports = _streaming.ring_reports(
            self.world, plan, row_bytes, self._slot_rows, options
        )
        if misfit is not None and self.world.is_chief:
            logger.warning(
                "shardfeed: the shard does not fit (%s); streaming it in chunks of "
                "%d rows through two slots per replica.",
                misfit.numbers(), self._slot_rows,
            )

    @classmethod
    def from_tf_dataset(cls, dataset: Any, **kwargs: Any) -> ShardedResidentDataset:
        """Refused on JAX: a `tf.data.Dataset` needs TensorFlow."""
        raise ValueError(
            _errors.message(
                "`from_tf_dataset` drains a `tf.data.Dataset`, which needs TensorFlow; "
                "the JAX backend runs without it.",
                f"type(dataset)={type(dataset).__name__}",
                "Build the dataset from arrays (NumPy, `np.memmap`, HDF5) or "
                "`shardfeed.files`' readers, or use the TensorFlow backend.",
            )
        )

    # -- what it was built with ------------------------------------------------

    # -- plans -----------------------------------------------------------------

    @property
    def order_is_global(self) -> bool:
        """Whether step `s` of a training epoch takes the same global rows on
        any number of replicas: replicated rows, or one order of all rows
        (`shuffle=True` without a partial exchange, or `shuffle=False`:
        `_plan.uses_exchange`), streamed or not. Not `shuffle="local"`."""
        if self.plan.placement == "replicate":
            return True
        if self.shuffle is False:
            return self.plan.num_replicas == 1 or self.moves_rows
        return self.shuffle is True and not _plan.partial_exchange(
            self.shuffle, self.plan, self.load_options.exchange_fraction
        )

    @property
    def epoch_copy(self) -> bool:
        """Whether epochs keep a copy of their rows in step order
        (`LoadOptions.epoch_copy`, as resolved for these devices and rows)."""
        return self._epoch_copy

    @property
    def is_streaming(self) -> bool:
        """Whether the rows stay on the host and each epoch streams them
        through a two-slot ring per replica (`streaming.py`)."""
        return self._slot_rows is not None

    @property
    def order_is_replayable(self) -> bool:
        """Whether epoch `e`'s order depends only on `(seed, e)` and the plan:
        always on JAX (a partial exchange's holdings are replayed from the
        loaded shards when an epoch opens out of turn)."""
        return True

    # -- what it holds -----------------------------------------------------------

    @property
    def tables(self) -> tuple[Any, ...]:
        """Each column's global array (the data layer's; not an interface)."""
        if self.is_streaming:
            raise RuntimeError("a streamed dataset holds no resident rows")
        if self._tables is None:
            # Let go of by `split`; used again: load the rows again.
            self._tables = _storage.upload(
                self.columns, self.eval_plan, self.world, self.load_options
            )
            self._layout = None
        return self._tables

    @property
    def nbytes_on_device(self) -> int:
        """Bytes this process holds on its devices for the rows (epochs' copies aside)."""
        tables = self._tables or ()
        return sum(s.data.nbytes for t in tables for s in t.addressable_shards)

    def describe(self) -> str:
        """One line: rows, columns, bytes on the devices, the plan."""
        plan = self._train_plan or self.eval_plan
        if self._slot_rows is not None:
            held = (f"streamed from the host in chunks of up to {self._slot_rows:,} rows, "
                    "two slots per replica")
        elif self._tables is None:
            held = "rows let go of by `split`"
        else:
            held = ", ".join(
                f"replica {g} on {d}: rows [{plan.shards[g][0]}, {plan.shards[g][1]})"
                for g, d in zip(self.world.global_replica_ids, self.world.local_devices,
                                strict=True)
            )
        return (
            f"ShardedResidentDataset (JAX): {plan.num_rows:,} rows ({self.columns.describe()}), "
            f"{self.nbytes_on_device / 2**20:,.1f} MiB on this worker's devices; "
            f"{_args.describe_plan(plan, self._train_plan is not None)}; {held}"
        )

    def __repr__(self) -> str:
        return self.describe()

    def label_stats(
        self, target: tuple[Any, ...] = (), ignore: int | None = None
    ) -> list[Any]:
        """Smallest and largest value of a target, and whether any is
        fractional, per local replica, reduced on its device (as on
        TensorFlow; cached per `(target, ignore)`).

        Example:
            >>> ds.label_stats()  # a single `y` of classes 0..9
            [array([0., 9., 0.])]
        """
        column = _args.label_column(self.columns.y, target)
        key = (column, ignore)
        if key not in self._label_stats and self.is_streaming:
            self._label_stats[key] = _streaming.host_label_stats(
                self.columns.columns[column], self.eval_plan, self.world.global_replica_ids,
                ignore, self.load_options,
            )
        if key not in self._label_stats:
            world = self.world
            self._label_stats[key] = _labels.label_stats(
                self.tables[column], self.eval_plan, world.global_replica_ids,
                world.local_devices, ignore,
            )
        return self._label_stats[key]

    # -- Keras' validation_split -------------------------------------------------

    def _let_go(self) -> None:
        """Drops the device rows and the copies made of them; `_holding`
        loads them again when next used."""
        self._tables = self._static = self._spare = self._layout = None

    # -- epochs -------------------------------------------------------------------

    def epoch(
        self, epoch: int = 0, *, training: bool = True, first_step: int = 0,
        augment: bool = False, plan: _plan.ShardPlan | None = None,
    ) -> _epoch.ResidentEpoch:
        """Opens one epoch: its rows copied into step order on each device.

        Args:
            epoch: The epoch number; with `seed` it fixes the order.
            training: The training plan and order; False: the evaluation plan,
                rows in order, nothing dropped.
            first_step: Iteration starts here (resuming inside an epoch).
            augment: Apply the dataset's `augment` (training epochs only).
            plan: Replaces the training plan (e.g. `training_plan(b)`).

        Example:
            >>> epoch = ds.epoch(0)
            >>> for step, (x, y, sample_weight) in epoch: ...
        """
        epoch = _check_int("epoch", epoch, 2**62, "Pass the epoch number, e.g. `epoch=0`.")
        if augment and (not training or self.augment is None):
            raise ValueError(
                _errors.message(
                    "`augment=True` applies the dataset's `augment` function to training "
                    "epochs only.",
                    f"augment=True, training={training}, dataset augment={self.augment!r}",
                    "Build the dataset with `augment=...` and open a training epoch, or "
                    "pass `augment=False`.",
                )
            )
        if plan is None:
            plan = self.plan if training else self.eval_plan
        first_step = _check_int(
            "first_step", first_step, plan.steps_per_epoch,
            f"Pass a step of this epoch (it has {plan.steps_per_epoch} steps).",
        )
        if self._slot_rows is not None:
            return _streaming.StreamedEpoch(
                self, plan, epoch, training, first_step, augment, self._slot_rows
            )
        return _epoch.ResidentEpoch(self, plan, epoch, training, first_step, augment)

    def iterator(
        self, *, augment: bool = False, model: Any = None
    ) -> _iterator.ResidentIterator:
        """A resumable position over training epochs (`get_state`/`set_state`,
        plain ints to save beside the weights); see `ResidentIterator`.

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

    def epoch_data(
        self, plan: _plan.ShardPlan, epoch: int, training: bool
    ) -> _epoch.EpochData:
        """An epoch's rows per replica (global numbers, step order) and its
        device data (`EpochData`). With `shuffle=False` the order never
        changes, so it is made once and kept (a copy: the one the memory
        check counts), and repeated epochs and validation passes make nothing."""
        static = self.shuffle is False
        if static and self._static is not None and self._static[0] == plan:
            return self._static[1]
        mixed = training and _plan.partial_exchange(
            self.shuffle, plan, self.load_options.exchange_fraction
        )
        if mixed:
            assert self.seed is not None  # a shuffle needs one: checked when built
            rows = _order.mixed_rows(plan, self._layout, self._layout_epoch,
                                     self.load_options.exchange_fraction, self.seed, epoch)
        else:
            rows = _order.epoch_rows(
                plan, self.shuffle, self.seed, epoch, training, self.moves_rows
            )
        if self.epoch_copy:
            # Rows moved in place (a partial exchange) are copied from where they sit.
            placed = self._placed(plan, rows) if mixed or self._layout is not None else None
            data = _epoch.copied(self, plan, rows, self._take_spare(), placed)
        else:
            data = self._gathered(plan, rows)
        if mixed:
            self._layout_epoch = epoch
        if static:
            self._static = (plan, data)
        return data

    def _gathered(self, plan: _plan.ShardPlan, rows: _order.EpochRows) -> _epoch.EpochData:
        """The epoch as positions in the resident rows; for the global order
        of sharded rows, the rows are first moved in place to their replicas."""
        if plan.placement == "replicate":
            return _epoch.gathered(self, plan, rows.rows, None)
        taken, slot_of = self._placed(plan, rows)
        return _epoch.gathered(self, plan, taken, slot_of)

    def _placed(
        self, plan: _plan.ShardPlan, rows: _order.EpochRows
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """Each replica's rows this epoch and the slot of every row on its
        replica, once rows that must move were moved there in place."""
        tables = self.tables
        held = tables[0].shape[0] // plan.num_replicas
        row_dtype = np.int32 if self.num_rows < 2**31 else np.int64  # 4 bytes a row on the host
        layout = self._layout or [
            np.arange(a, b, dtype=row_dtype) for a, b in self.eval_plan.shards
        ]
        taken = rows.rows
        if rows.moved:
            target = _relayout.targets(layout, taken) if rows.target is None else rows.target
            if any((target[h] != g).any() for g, h in enumerate(layout)):
                for open_epoch in list(self._epochs):  # the tables are donated below
                    if open_epoch.arrays is not None and open_epoch.arrays.positions is not None:
                        open_epoch.invalidate()  # (an epoch's own copy stays valid)
                row_bytes = self.columns.row_bytes
                buffer = _rounds.buffer_bytes(
                    self.load_options.exchange_buffer_bytes, self.eval_plan, row_bytes
                )
                per_pair = _relayout.rows_per_pair(plan.num_replicas, row_bytes, buffer)
                # `layout` is moved in place; `targets` is let go of once planned.
                moves, layout = _relayout.rounds(layout, target, held, per_pair)
                del target
                self._tables = _exchange.relayout(self.world, tables, moves)
                self._layout = layout
                del moves, tables
        elif self._layout is not None:
            # Rows in order after they moved: each replica takes the rows it
            # holds (`slot_rows` keeps `predict`'s order).
            taken = [layout[g][: plan.rows_per_epoch(g)] for g in range(plan.num_replicas)]
        slot_of = np.empty(self.num_rows, row_dtype)
        for held_rows in layout:
            slot_of[held_rows] = np.arange(len(held_rows), dtype=row_dtype)
        return taken, slot_of

    def opened(self, epoch: _epoch.ResidentEpoch) -> None:
        """Keeps (weakly) an epoch this dataset opened: moving rows in place
        closes it; a streamed one lets the others' rings go (one ring per
        replica at a time: they stream their chunks in again when used)."""
        if isinstance(epoch, _streaming.StreamedEpoch):
            for other in list(self._epochs):
                if isinstance(other, _streaming.StreamedEpoch):
                    other.release()
        self._epochs.add(epoch)

    def _take_spare(self) -> tuple[Any, ...] | None:
        # Taken either way: one of another shape is let go of before the new copy.
        spare, self._spare = self._spare, None
        return spare

    def recycle(self, columns: tuple[Any, ...]) -> None:
        """Takes back a closed epoch's device copy: the next epoch writes its
        rows into that memory (donated) instead of a new buffer. Arrays of a
        closed epoch are deleted then; the copy of rows in order
        (`shuffle=False`) is kept as it is."""
        if self._tables is None:  # `split` let go of the rows: keep nothing either
            return
        if self._static is None or columns is not self._static[1].columns:
            self._spare = columns

    def batch_fn(self, per_replica_batch_size: int, augment: bool) -> _epoch.BatchFn:
        """The `batch_fn` of this dataset's epochs with that batch (one object)."""
        key = (int(per_replica_batch_size), bool(augment))
        if key not in self._batch_fns:  # one per batch: compiled calls keyed on it are reused
            cols = self.columns
            self._batch_fns[key] = _epoch.BatchFn(
                self.world.mesh, key[0], (cols.x, cols.y, cols.sample_weight),
                self.transform, self.augment if augment else None, self.seed,
            )
        return self._batch_fns[key]


def _choose_epoch_copy(
    world: World, plan: _plan.ShardPlan, row_bytes: int, exchange: bool, mixed: bool,
    options: LoadOptions,
) -> tuple[bool, list[_memory.MemoryReport]]:
    """Whether epochs keep a copy of their rows (`LoadOptions.epoch_copy`), and
    the memory reports of that choice: what the devices hold besides the rows."""
    slots = plan.steps_per_epoch * plan.per_replica_batch_size
    # The in-place rounds' staging (the global order without a copy, a partial
    # exchange), no more than one replica can send another: its shard, or its pool.
    in_place = 0
    if exchange:
        most = max(plan.shard_rows(r) for r in range(plan.num_replicas))
        in_place = _relayout.staging_bytes(
            plan.num_replicas, row_bytes,
            _rounds.buffer_bytes(options.exchange_buffer_bytes, plan, row_bytes),
            int(options.exchange_fraction * most) if mixed else most,
        )
    copy_bytes = slots * row_bytes
    if exchange and mixed:  # rows move in place, then a local copy
        copy_bytes += in_place
    elif exchange:  # the copy's all-to-all stages about twice the epoch's rows
        copy_bytes += _exchange.staging_rows(slots, plan.num_replicas) * row_bytes
    # Without a copy: the positions, and the in-place rounds' staging.
    gather_bytes = _memory.position_bytes(plan) + in_place
    copy = options.epoch_copy
    if copy == "auto":
        # Measured faster only on CPU devices (W2: 0.34 s/epoch against 0.47);
        # on a GPU a batch's gather from device memory is cheap, and rows fit 2x.
        on_cpu = all(d.platform == "cpu" for d in world.devices)
        reports = []
        if on_cpu and copy_bytes <= options.epoch_copy_bytes:  # per rank: a host's option
            reports = _storage.memory_reports(world, plan, row_bytes, copy_bytes, options)
        # A copy changes the exchange's collectives: every rank or none.
        if _memory.fits_on_every_rank(world, bool(reports) and all(r.fits for r in reports)):
            return True, reports
        copy = False
    extra = copy_bytes if copy else gather_bytes
    return bool(copy), _storage.memory_reports(world, plan, row_bytes, extra, options)


def _check_int(name: str, value: Any, high: int, fix: str) -> int:
    if not (_errors.is_integer(value) and 0 <= value <= high):
        raise ValueError(
            _errors.message(f"`{name}` must be an integer in [0, {high}].",
                            f"{name}={value!r}", fix)
        )
    return int(value)
