"""`ResidentEpoch` on TensorFlow: what a training loop sees of one epoch (docs/custom_loops.md).

Its steps and each step's `Batch` gathered on the replicas' devices, the real
rows of a partial last step, and for compiled loops `handles`, `indices` and
`gather`; it wraps whichever residency the dataset chose, so no caller branches.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data import memory as _memory
from shardfeed._data.batch import Batch as Batch
from shardfeed._data.plan import EpochSizes, ShardPlan
from shardfeed._data.position import check_int
from shardfeed._distribute import progress as _progress
from shardfeed._tf.augment import step_seed
from shardfeed._tf.order import Order, Residency

# A tensor step's range is checked in the graph, which prints the step
# between these two (Assert's data: "[constraint... step=] [6] [, full_steps...]").
_PAST_FULL_STEPS = (
    "A tensor `step` of `ResidentEpoch.batch` must be a full step of the epoch, in "
    "[0, full_steps): the slots of the partial last step past its real rows are padding, which "
    "a tensor step trained as data. Received: step="
)
_PAST_FULL_STEPS_FIX = (
    ", full_steps={}. Loop over `tf.range(epoch.full_steps)` in the compiled step and take "
    "the partial last step with a Python int (`epoch.batch(epoch.steps - 1)`), as "
    "`shardfeed.fit` does."
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from shardfeed._tf.storage import ReplicaStore
    from shardfeed._tf.world import World


class EpochSource(Protocol):
    """What an epoch reads of its dataset (`ShardedResidentDataset`, which
    imports this module: typed here, so `epoch` never imports `dataset`)."""

    @property
    def augment(self) -> Callable[[Any, Any], Any] | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def plan(self) -> ShardPlan: ...
    @property
    def eval_plan(self) -> ShardPlan: ...
    @property
    def residency(self) -> Residency: ...
    @property
    def stores(self) -> tuple[ReplicaStore, ...]: ...
    @property
    def columns(self) -> Any: ...
    @property
    def world(self) -> World: ...

    # The epochs open now, closed when a new one invalidates them (`open_epoch`).
    _open_epochs: weakref.WeakSet[ResidentEpoch]

    def gather(
        self, handles: tuple[tf.Tensor, ...], indices: tf.Tensor, with_targets: bool = True
    ) -> Batch: ...
    def gather_rows(
        self, handles: tuple[tf.Tensor, ...], indices: tf.Tensor, with_targets: bool = True
    ) -> Batch: ...
    def transformed(self, x: Any) -> Any: ...


def augmented(dataset: EpochSource, x: Any, epoch: Any, step: Any, replica: Any) -> Any:
    """`dataset.augment(x, seed)` for `step` of `epoch` on global `replica`
    (tensors or ints; the seed is `augment.step_seed`'s), `x` unchanged
    without `augment`. The compiled loop and `ResidentEpoch` draw alike."""
    if dataset.augment is None:
        return x
    assert dataset.seed is not None  # checked when the dataset was built
    return dataset.augment(x, step_seed(dataset.seed, epoch, step, replica))


def open_epoch(
    dataset: EpochSource,
    epoch: int,
    training: bool,
    first_step: int,
    augment: bool,
    plan: ShardPlan | None = None,
) -> ResidentEpoch:
    """`ShardedResidentDataset.epoch`: validates, closes what the new epoch
    invalidates, then opens it (a training epoch of exchanged rows moves them).
    `plan` replaces the training plan (`fit` resuming on another number of
    replicas passes `dataset.training_plan(...)`)."""
    epoch = check_int("epoch", epoch, 0, 2**62, "Pass the epoch number, e.g. `epoch=0`.")
    if augment and not training:
        raise ValueError(
            _errors.message(
                "Only training epochs augment (evaluation reads the rows as they are).",
                "augment=True, training=False",
                "Pass `augment=False` for an evaluation epoch.",
            )
        )
    if augment and dataset.augment is None:
        raise ValueError(
            _errors.message(
                "`augment=True` applies the dataset's `augment` function; it has none.",
                "augment=True, dataset augment=None",
                "Build the dataset with `augment=...`, or pass `augment=False`.",
            )
        )
    if plan is None:
        plan = dataset.plan if training else dataset.eval_plan
    first_step = check_int(
        "first_step", first_step, 0, plan.steps_per_epoch,
        f"Pass a step of this epoch (it has {plan.steps_per_epoch} steps).",
    )
    if dataset.residency.exclusive(training):
        for other in list(dataset._open_epochs):
            other._close_stale()
    opened = ResidentEpoch(dataset, plan, epoch, training, first_step, augment)
    dataset._open_epochs.add(opened)
    return opened


class ResidentEpoch(EpochSizes):
    """One epoch of a `ShardedResidentDataset`: steps and their batches.

    Made by `ShardedResidentDataset.epoch(...)`. Iterating yields
    `(step, Batch(x, y, sample_weight))` for `step` in
    `range(first_step, steps)`, each leaf on its replica's device (a
    `tf.distribute` per-replica value with several local replicas, which
    `strategy.run` accepts). A partial last step hands out only the real rows;
    `global_rows(step)` counts them over all replicas.

    Attributes:
        epoch, training, first_step, plan: As opened (`EpochSizes`).
        steps: Steps every replica of every rank runs (equal on all ranks).
        full_steps: Steps with `per_replica_batch_size` rows on every replica.
        has_partial_step: Whether the last step is partial.
        per_replica_batch_size, global_batch_size, num_replicas_in_sync: As
            in `tf.distribute`.
    """

    _traced_step = "a tensor step works in `batch()` for full steps only."

    def __init__(
        self,
        dataset: EpochSource,
        plan: ShardPlan,
        epoch: int,
        training: bool,
        first_step: int,
        augment: bool,
    ) -> None:
        super().__init__(plan, epoch, training, first_step)
        self._dataset = dataset
        self._augment = augment
        self._closed = False
        self._order: Order = dataset.residency.epoch_order(plan, epoch, training)
        self._matrices: list[tf.Tensor] | None = None
        # The iterator's position hook: called with each step handed out.
        self._on_step: Any = None
        self._weak_finalizer = weakref.finalize(self, self._order.close)

    # -- what it is ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"ResidentEpoch(epoch={self.epoch}, training={self.training}, steps={self.steps}, "
            f"first_step={self.first_step}, global_batch_size={self.global_batch_size}"
            f"{', closed' if self._closed else ''})"
        )

    # -- batches ---------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[int, Batch]]:
        for step in range(self.first_step, self.steps):
            self._check_open()
            _progress.report_progress()  # a custom loop's step, for `shardfeed launch`
            (batch,) = self._batches(step, step + 1)
            if self._on_step is not None:
                self._on_step(self, step)
            yield step, batch

    def batch(self, step: int | tf.Tensor) -> Batch:
        """The `Batch` of `step`, usable inside the user's `tf.function`.

        `step` may be a scalar int tensor for a full step (`for step in
        tf.range(epoch.full_steps)`); the partial last step must be asked with
        a Python int, its shapes differ per replica.

        Raises:
            ValueError: For a step out of range, or the partial step as a tensor.
            RuntimeError: If the epoch is closed, or the rows are streamed.
        """
        self._check_open()
        if self._dataset.residency.streamed:
            raise RuntimeError(
                _errors.message(
                    "`ResidentEpoch.batch` reads rows already on the device; streamed rows "
                    "are uploaded from the host between steps, by eager iteration only.",
                    "streaming=True",
                    "Iterate the epoch eagerly (`for step, batch in epoch:`), or hold the "
                    "rows resident (`LoadOptions(streaming=False)`, more replicas).",
                )
            )
        if isinstance(step, tf.Tensor | tf.Variable):
            if self._matrices is None:
                # Full steps only: the partial step's padding slots are not
                # rows, and a tensor step trained them as data.
                self._matrices = self._order.slice(0, self.full_steps)
            step = tf.cast(step, tf.int32)
            # XLA compiles asserts away: there a step past the full ones reads
            # the last full step's rows (a clamped slice), never padding.
            check = tf.debugging.Assert(
                tf.logical_and(step >= 0, step < self.full_steps),
                [_PAST_FULL_STEPS, step, _PAST_FULL_STEPS_FIX.format(self.full_steps)],
                summarize=1,
            )
            with tf.control_dependencies([check]):  # before the slice can fail on its own
                step = tf.identity(step)
            stores = self._dataset.stores
            per_replica = []
            for local, store in enumerate(stores):
                with tf.device(store.device):
                    per_replica.append(self._gather(local, self._matrices[local][step], step))
            return self._distribute(per_replica)
        self._check_step(step)
        _progress.report_progress()  # a custom loop's step, for `shardfeed launch`
        (batch,) = self._batches(int(step), int(step) + 1)
        return batch

    def close(self) -> None:
        """Closes the epoch (a later epoch that moves rows closes it too)."""
        if not self._closed:
            self._closed = True
            self._matrices = None
            self._weak_finalizer()

    def _close_stale(self) -> None:
        """Closes the epoch for a training epoch that moves rows, and lets go
        of its order, which no longer matches the slots (its rows are not
        asked for again, unlike a closed epoch's in `predict`)."""
        self.close()
        self._order.release()

    # -- for the compiled multi-step loop (`_tf/loop.py`) -----------------

    @property
    def call_bounds(self) -> list[int] | None:
        """Steps at which a compiled call must start (a streamed chunk's first
        step); None: any step may."""
        return self._order.call_bounds

    def handles(self) -> list[tuple[tf.Tensor, ...]]:
        """Per local replica, the columns' resource handles, for compiled
        functions: a trace keeps the variables passed to it alive, never
        the handles' rows (see `_tf/loop.py`)."""
        self._check_open()
        return [store.handles for store in self._dataset.stores]

    def indices(self, start: int, stop: int) -> list[tf.Tensor]:
        """Per local replica, the `[stop - start, per_replica_batch_size]` slots
        of steps `[start, stop)` (made resident first); padding slots of a
        partial last step come after the real ones."""
        self._check_open()
        self._order.prepare(start, stop)
        return self._order.slice(start, stop)

    def gather(self, handles: tuple[tf.Tensor, ...], index_row: tf.Tensor,
               with_targets: bool = True) -> Batch:
        """One replica's `Batch` at slots `index_row`, inside a compiled call
        (`transform` applied, no augmentation: see `augmented`)."""
        return self._dataset.gather(handles, index_row, with_targets)

    @property
    def steps_per_gather(self) -> int:
        """Steps whose rows `gather_rows` may take at once within the device
        memory the dataset counted for it (`memory.call_rows_bytes`)."""
        row_bytes = self._dataset.columns.row_bytes
        return _memory.call_rows_steps(self.per_replica_batch_size, row_bytes)

    def gather_rows(self, handles: tuple[tf.Tensor, ...], indices: tf.Tensor) -> Batch:
        """The rows at slots `indices` as they are held, without `transform`
        (`transformed` applies it to one step's `x`): a compiled call may
        gather many steps' rows at once, then transform step by step."""
        return self._dataset.gather_rows(handles, indices)

    def transformed(self, x: Any) -> Any:
        """The dataset's `transform(x)` (`x` without one)."""
        return self._dataset.transformed(x)

    def slot_rows(self, local: int) -> np.ndarray:
        """Global row of each slot of local replica `local`, step by step;
        -1 for padding."""
        out = np.asarray(self._order.rows(local)).copy()
        out[self.plan.rows_per_epoch(self._dataset.stores[local].replica) :] = -1
        return out

    # -- internals -------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                _errors.message(
                    "This epoch is closed: a later epoch of the dataset moved its rows "
                    "(the global shuffle's exchange, a streamed ring), or it was closed.",
                    f"epoch={self.epoch}, training={self.training}",
                    "Open the epoch again with `dataset.epoch(...)` (or use the iterator's "
                    "`epochs()`); keep one training epoch open at a time.",
                )
            )

    def _gather(self, local: int, index_row: Any, step: Any) -> Batch:
        x, y, sw = self._dataset.gather(self._dataset.stores[local].handles, index_row)
        if self._augment:
            replica = self._dataset.stores[local].replica
            x = augmented(self._dataset, x, self.epoch, step, replica)
        return Batch(x, y, sw)

    def _batches(self, start: int, stop: int) -> list[Batch]:
        slots = self.indices(start, stop)
        out = []
        for step in range(start, stop):
            per_replica = []
            for local, store in enumerate(self._dataset.stores):
                rows = self.replica_rows(step)[store.replica]
                with tf.device(store.device):
                    row = slots[local][step - start][:rows]
                    per_replica.append(self._gather(local, row, step))
            out.append(self._distribute(per_replica))
        return out

    def _distribute(self, per_replica: list[Batch]) -> Batch:
        if len(per_replica) == 1:
            return per_replica[0]
        strategy = self._dataset.world.strategy
        first = self._dataset.world.global_replica_ids[0]

        def place(field: int) -> Any:
            if per_replica[0][field] is None:
                return None
            return strategy.experimental_distribute_values_from_function(
                lambda ctx: per_replica[ctx.replica_id_in_sync_group - first][field]
            )

        return Batch(place(0), place(1), place(2))
