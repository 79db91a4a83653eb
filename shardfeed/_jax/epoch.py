"""`ResidentEpoch` on JAX: what a loop on JAX sees of one epoch.

`arrays` (the resident rows and each replica's positions, or the epoch's copy)
and `batch_fn(arrays, step)`, a pure jittable function that takes the global
batch out of them on each device; `call_arrays` for a call's steps, the
partial last step (`partial_batch`), `slot_rows` for `predict`. No host work per step.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardfeed._common import errors as _errors
from shardfeed._data import order as _order
from shardfeed._data.batch import Batch
from shardfeed._data.plan import EpochSizes, ShardPlan
from shardfeed._distribute import progress as _progress
from shardfeed._jax import exchange as _exchange
from shardfeed._jax.augment import augment_key, augmented
from shardfeed._jax.epoch_arrays import EpochArrays
from shardfeed._jax.world import REPLICA_AXIS, World

# A traced step is a device value: refused from the device (`_check_full_step`).
PAST_FULL_STEPS = (
    "A step of `batch_fn` must be a full step of the epoch, in [0, full_steps): the "
    "partial last step's slots past its real rows are padding, which a traced step would "
    "train as data (and a step past the epoch would repeat clamped rows). Received: "
    "step={step}, full_steps={full_steps}. Loop over `range(epoch.full_steps)` in the "
    "compiled step and take the partial last step's real rows with "
    "`epoch.partial_batch()`, as `shardfeed.fit` does."
)


def _refuse_step(step: Any, full_steps: Any) -> np.ndarray:
    raise ValueError(PAST_FULL_STEPS.format(step=int(step), full_steps=int(full_steps)))


def _check_full_step(step: Any, full_steps: Any) -> jax.Array:
    """0 (int32) for a step in `[0, full_steps)`; raises for another, from
    the device, so also in a `jax.jit` step. Called inside `shard_map`, so
    every device raises: a callback on one device only (outside it) left the
    others waiting at the program's next collective until XLA aborted the
    process. The host callback runs only on that branch: a good step costs
    one compare on the device. A `pure_callback` whose zero the caller adds
    to its step (so it is kept), not a `debug.callback`: that is an effect,
    and a compiled function holding an effect leaves JAX's fast dispatch
    path on every call (measured on CPU, JAX 0.10.2: 265 us a call against
    28 us)."""
    return lax.cond(
        (step < 0) | (step >= full_steps),
        lambda s, f: jax.pure_callback(_refuse_step, jax.ShapeDtypeStruct((), jnp.int32), s, f),
        lambda s, f: jnp.zeros((), jnp.int32),
        step,
        full_steps,
    )


class EpochData(NamedTuple):
    """What a dataset hands an epoch it opens (`ShardedResidentDataset.epoch_data`).

    Attributes:
        rows: Per global replica, the global rows it takes in step order.
        columns, positions: As in `EpochArrays`.
        partial_rows: Indices into `columns` (global arrays) of the partial
            last step's real rows, replicas in order (empty without one).
    """

    rows: list[np.ndarray]
    columns: tuple[jax.Array, ...]
    positions: jax.Array | None
    partial_rows: np.ndarray


@functools.cache
def _slicer(mesh: Mesh, per_replica_batch_size: int, checked: bool) -> Callable[..., Any]:
    """`(columns, local, step[, full_steps])`: each replica's batch at
    `local` of its copy; `checked`: `step` refused outside `[0, full_steps)`."""
    b = per_replica_batch_size

    def slice_step(columns: tuple[jax.Array, ...], local: jax.Array, *check: Any) -> Any:
        if checked:
            local = local + _check_full_step(*check)
        # Each replica's slice of its own copy: contiguous rows, no gather, no traffic.
        return tuple(lax.dynamic_slice_in_dim(c, local * b, b, axis=0) for c in columns)

    return jax.shard_map(
        slice_step, mesh=mesh, in_specs=(P(REPLICA_AXIS), P(), *[P()] * (2 * checked)),
        out_specs=P(REPLICA_AXIS),
    )


@functools.cache
def _gatherer(mesh: Mesh, per_replica_batch_size: int, checked: bool) -> Callable[..., Any]:
    """`(columns, positions, step[, step, full_steps])`: each replica's batch
    gathered at its positions of `step`; `checked` as in `_slicer`."""
    b = per_replica_batch_size

    def gather_step(
        columns: tuple[jax.Array, ...], positions: jax.Array, step: jax.Array, *check: Any
    ) -> tuple[jax.Array, ...]:
        if checked:
            step = step + _check_full_step(*check)
        # Each replica gathers its batch from its own buffer: no traffic.
        at = lax.dynamic_slice_in_dim(positions, step * b, b, axis=0)
        return tuple(jnp.take(c, at, axis=0, mode="clip") for c in columns)

    return jax.shard_map(
        gather_step,
        mesh=mesh,
        in_specs=(P(REPLICA_AXIS), P(REPLICA_AXIS), P(), *[P()] * (2 * checked)),
        out_specs=P(REPLICA_AXIS),
    )


@functools.cache
def _rows_taker(mesh: Mesh) -> Callable[..., Any]:
    # Replicated output: the partial step's few rows on every device.
    return jax.jit(
        lambda columns, rows: tuple(jnp.take(c, rows, axis=0) for c in columns),
        out_shardings=NamedSharding(mesh, P()),
    )


@dataclasses.dataclass(frozen=True, eq=False)
class BatchFn:
    """`batch_fn(arrays, step) -> Batch`: the global batch of a full step.

    Pure and jittable: `step` may be a traced int32 scalar in
    `[0, full_steps)`. The batch is `[global_batch_size, ...]` sharded along
    rows (`P(REPLICA_AXIS)`), each replica's part sliced on its own device;
    `transform` (and, for augmented training epochs, `augment`) applied to
    the global batch's `x`. One object per dataset and batch size, equal to
    another dataset's when their batches trace alike (the same mesh, batch,
    column structure, transform, and augment with its seed), so compiled calls that
    take it as a static argument are reused across datasets. It holds no
    device array.
    """

    mesh: Mesh
    per_replica_batch_size: int
    structure: tuple[Any, Any, Any]
    transform: Callable[[Any], Any] | None
    augment: Callable[[Any, Any], Any] | None
    seed: int | None

    def _key(self) -> tuple[Any, ...]:
        leaves, tree = jax.tree.flatten(self.structure, is_leaf=lambda v: v is None)
        # The seed only reaches a batch through `augment`.
        seed = None if self.augment is None else self.seed
        return (self.mesh, self.per_replica_batch_size, tree, tuple(leaves),
                self.transform, self.augment, seed)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BatchFn) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __call__(self, arrays: EpochArrays, step: Any) -> Batch:
        """The global batch of full step `step`; another step (the partial
        one, whose padding slots it would hand out as rows) is refused on
        the device (`PAST_FULL_STEPS`)."""
        return self._batch(arrays, step, checked=True)

    def unchecked(self, arrays: EpochArrays, step: Any) -> Batch:
        """As calling it, without the check that `step` is a full step: for
        `fit`'s loop, whose schedule (`_jax/loop.py`) never asks another."""
        return self._batch(arrays, step, checked=False)

    def _batch(self, arrays: EpochArrays, step: Any, checked: bool) -> Batch:
        if arrays is None:
            raise ValueError(
                _errors.message(
                    "`batch_fn` needs an open epoch's device data.",
                    "arrays=None",
                    "Pass `epoch.call_arrays(start, stop)` (a streamed epoch's chunk of "
                    "those steps; a resident epoch's `arrays`) of an open epoch.",
                )
            )
        arrays.check_open()
        b = self.per_replica_batch_size
        step = jnp.asarray(step, jnp.int32)
        checked = checked and arrays.full_steps is not None
        check = (step, arrays.full_steps) if checked else ()
        if arrays.positions is None:
            # A streamed chunk's copy starts at its first step.
            local = step if arrays.first_step is None else step - arrays.first_step
            columns = _slicer(self.mesh, b, checked)(arrays.columns, local, *check)
        else:
            columns = _gatherer(self.mesh, b, checked)(
                arrays.columns, arrays.positions, step, *check
            )
        return self.assemble(columns, arrays.epoch, step)

    @functools.cached_property
    def jitted(self) -> Callable[..., Batch]:
        """`jax.jit` of this function, for eager batches (compiled once per
        `BatchFn`, and let go of with it)."""
        return jax.jit(self)

    def assemble(self, columns: tuple[Any, ...], epoch: Any, step: Any) -> Batch:
        """`Batch` of the user's structures from one step's columns."""

        def take(structure: Any) -> Any:
            if structure is None:
                return None
            # A None leaf is an absent optional input: None in the batch too.
            return keras.tree.map_structure(
                lambda i: None if i is None else columns[i], structure
            )

        x, y, sw = (take(s) for s in self.structure)
        if self.transform is not None:
            x = self.transform(x)
        if self.augment is not None:
            assert self.seed is not None  # checked when the dataset was built
            x = augmented(self.augment, x, augment_key(self.seed, epoch, step))
        return Batch(x, y, sw)


class EpochSource(Protocol):
    """What an epoch reads of its dataset (`ShardedResidentDataset`, which
    imports this module: typed here, so `epoch` never imports `dataset`)."""

    @property
    def world(self) -> World: ...
    @property
    def tables(self) -> tuple[Any, ...]: ...
    def epoch_data(self, plan: ShardPlan, epoch: int, training: bool) -> EpochData: ...
    def batch_fn(self, per_replica_batch_size: int, augment: bool) -> BatchFn: ...
    def opened(self, epoch: ResidentEpoch) -> None: ...
    def recycle(self, columns: tuple[Any, ...]) -> None: ...


class ResidentEpoch(EpochSizes):
    """One epoch of a JAX `ShardedResidentDataset`: steps and their batches.

    Made by `ShardedResidentDataset.epoch(...)`. Iterating yields
    `(step, Batch(x, y, sample_weight))` for `step` in `range(first_step,
    steps)`: full steps' batches are global `[global_batch_size, ...]` arrays
    sharded along rows; a partial last step hands out only its real rows
    (`partial_batch`). In the user's own `jax.jit` step, call
    `epoch.batch_fn(epoch.arrays, i)` with a traced `i`.

    Attributes:
        epoch, training, first_step, plan: As opened.
        arrays: This epoch's device data (`EpochArrays`; None once closed,
            and in a streamed epoch: `call_arrays`).
        batch_fn: The pure function of `(arrays, step)` (see `BatchFn`).
        chunk_steps: Steps per streamed chunk; None: every step is resident.
    """

    chunk_steps: int | None = None
    _traced_step = "a traced step works in `batch_fn` for full steps only."

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
        self._mesh = dataset.world.mesh
        self._dataset = weakref.ref(dataset)  # `close` hands the copy back to it
        self.batch_fn: BatchFn = dataset.batch_fn(plan.per_replica_batch_size, augment)
        data = dataset.epoch_data(plan, epoch, training)
        self._rows, self._partial_rows = data.rows, data.partial_rows
        replicated = NamedSharding(self._mesh, P())
        number = jax.device_put(np.int32(epoch), replicated)
        full_steps = jax.device_put(np.int32(self.full_steps), replicated)
        self.arrays: EpochArrays | None = EpochArrays(
            data.columns, number, data.positions, None, full_steps
        )
        # The iterator's position hook (`_jax/iterator.py`): called with each
        # step eager iteration hands out.
        self._on_step: Callable[[ResidentEpoch, int], None] | None = None
        dataset.opened(self)

    # -- what it is ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.arrays is None

    def __repr__(self) -> str:
        return (
            f"ResidentEpoch(epoch={self.epoch}, training={self.training}, steps={self.steps}, "
            f"first_step={self.first_step}, global_batch_size={self.global_batch_size}"
            f"{', closed' if self.closed else ''})"
        )

    def slot_rows(self) -> np.ndarray:
        """Global row of each real row of the epoch, in the order the steps
        emit them (full steps, replicas in order, then the partial step)."""
        return _order.slot_rows(self.plan, self._rows)

    @property
    def call_bounds(self) -> list[int]:
        """The steps a compiled call must start at (a streamed epoch's chunks'
        first steps; here every step's rows are resident: step 0)."""
        return [0]

    # -- batches ---------------------------------------------------------------

    def call_arrays(self, start: int, stop: int) -> EpochArrays:
        """The device data of steps `[start, stop)` for `batch_fn`: here
        `arrays`, all of the epoch's (a streamed epoch hands out a chunk)."""
        return self._open()

    def ran(self, result: Any) -> None:
        """Told of each call's result (a streamed epoch waits for the last
        one before its chunk's slot is let go of); nothing here."""

    def partial_batch(self) -> Batch | None:
        """The partial last step's real rows (all replicas', in global order),
        replicated on every device, `transform` applied; None without one."""
        if not self.has_partial_step:
            return None
        arrays = self._open()
        columns = _rows_taker(self._mesh)(arrays.columns, self._partial_rows)
        return self.batch_fn.assemble(columns, arrays.epoch, jnp.int32(self.steps - 1))

    def batch(self, step: Any) -> Batch:
        """The `Batch` of `step`, eagerly: a full step through `batch_fn`
        (compiled once), the partial last step as `partial_batch()`. A traced
        `step` (full steps only) goes through `batch_fn` as it is.

        Raises:
            ValueError: For a step out of range.
            RuntimeError: If the epoch is closed.
        """
        arrays = self._open()
        if isinstance(step, jax.Array) and not isinstance(step, np.ndarray):
            return self.batch_fn(arrays, step)
        self._check_step(step)
        _progress.report_progress()  # a custom loop's step, for `shardfeed launch`
        if step >= self.full_steps:
            batch = self.partial_batch()
            assert batch is not None
            return batch
        # A host scalar: `jnp.int32(step)` would be one more dispatch (82 us a step).
        return self.batch_fn.jitted(arrays, np.int32(step))

    def __iter__(self) -> Iterator[tuple[int, Batch]]:
        for step in range(self.first_step, self.steps):
            batch = self.batch(step)
            if self._on_step is not None:
                self._on_step(self, step)
            yield step, batch

    def close(self) -> None:
        """Lets go of the epoch's device copy (a closed epoch hands out nothing).

        The dataset takes the copy back: its next epoch writes its rows into
        that memory, which deletes the closed epoch's `arrays` (batches
        already taken stay valid)."""
        arrays, self.arrays = self.arrays, None
        if arrays is not None:
            arrays.close(f"epoch={self.epoch}, training={self.training}")
        dataset = self._dataset()
        if arrays is not None and arrays.positions is None and dataset is not None:
            dataset.recycle(arrays.columns)

    def invalidate(self) -> None:
        """Closes the epoch without handing anything back: the dataset moved
        its rows in place (a new epoch of the global order of sharded rows,
        or of a partial exchange), so these `arrays` are deleted."""
        if self.arrays is not None:
            self.arrays.close(f"epoch={self.epoch}, training={self.training}")
        self.arrays = None

    # -- internals -------------------------------------------------------------

    def _open(self) -> EpochArrays:
        if self.arrays is None:
            raise RuntimeError(
                _errors.message(
                    "This epoch is closed: its device data was let go of (`close()`, or "
                    "the dataset moved its rows in place for a training epoch opened later).",
                    f"epoch={self.epoch}, training={self.training}",
                    "Open the epoch again with `dataset.epoch(...)`, after the others are done.",
                )
            )
        return self.arrays


def copied(
    dataset: EpochSource, plan: ShardPlan, rows: _order.EpochRows,
    spare: tuple[jax.Array, ...] | None = None,
    placed: tuple[list[np.ndarray], np.ndarray] | None = None,
) -> EpochData:
    """The epoch as a per-epoch copy of each replica's rows in step order
    (`epoch_columns`); its partial step's rows are at the end of each block.
    `placed`: once rows were moved in place (a partial exchange), each
    replica's rows and the slot of every row on its replica, copied from there."""
    positions = None
    if placed is not None:
        taken, slot_of = placed
        rows, positions = _order.EpochRows(taken, False), [slot_of[t] for t in taken]
    columns = epoch_columns(dataset, plan, rows, spare, positions)
    b, slots = plan.per_replica_batch_size, plan.steps_per_epoch * plan.per_replica_batch_size
    first = plan.full_steps_per_epoch * b
    partial = [g * slots + first + np.arange(n) for g, n in enumerate(plan.last_step_rows)]
    return EpochData(rows.rows, columns, None, _partial(plan, partial))


def gathered(
    dataset: EpochSource, plan: ShardPlan, rows: list[np.ndarray],
    slot_of: np.ndarray | None,
) -> EpochData:
    """The epoch as positions in the resident rows: replica `g`'s positions
    of `rows[g]` in its own buffer, in step order (`slot_of[row]`: the slot
    holding a global row on its replica; None: the row itself, replicated)."""
    slots = plan.steps_per_epoch * plan.per_replica_batch_size
    held = dataset.tables[0].shape[0] // plan.num_replicas  # rows of each replica's buffer
    first = plan.full_steps_per_epoch * plan.per_replica_batch_size
    positions = []
    for taken in rows:
        padded = np.zeros(slots, np.int32)  # padding: slot 0, never handed out
        if slot_of is None:
            padded[: len(taken)] = taken
        else:
            np.take(slot_of, taken, out=padded[: len(taken)])
        positions.append(padded)
    del slot_of
    partial = [
        g * held + p[first : first + n]
        for g, (p, n) in enumerate(zip(positions, plan.last_step_rows, strict=True))
    ]
    on_device = _exchange.local_array(dataset.world, positions)
    return EpochData(rows, dataset.tables, on_device, _partial(plan, partial))


def _partial(plan: ShardPlan, per_replica: list[np.ndarray]) -> np.ndarray:
    if not plan.has_partial_step:
        return np.zeros(0, np.int32)
    return np.concatenate(per_replica).astype(np.int32)


def epoch_columns(
    dataset: EpochSource, plan: ShardPlan, rows: _order.EpochRows,
    spare: tuple[jax.Array, ...] | None = None, positions: list[np.ndarray] | None = None,
) -> tuple[jax.Array, ...]:
    """Each replica's copy of the epoch's rows in step order, on its device:
    gathered from its own buffer (at `positions`, per replica, when given),
    or moved by the all-to-all (`exchange.py`); written into `spare` (a
    closed epoch's copy, donated) when it fits."""
    slots = plan.steps_per_epoch * plan.per_replica_batch_size
    tables, world = dataset.tables, dataset.world
    # Written into memory the process already has when it can: a new copy is
    # pages the OS faults in one by one (W2, 38 MB: ~9,400 faults, about 25 of
    # the copy's 57 ms on the 2-core VM; shardfeed/_commands/bench/NOTES.md).
    if not _exchange.fits(spare, world, tables, slots):
        spare = None  # let go of before a new copy is made
    out = _exchange.new_copy(world, tables, slots) if spare is None else spare
    del spare
    if positions is not None:
        return _exchange.gather_local(world, tables, [_pad(p, slots) for p in positions], out)
    if rows.moved:
        starts = [start for start, _ in plan.shards]
        return _exchange.exchange(world, tables, _exchange.moves(rows.rows, starts, slots), out)
    # Positions in each replica's own buffer (replicated: the global rows).
    local = [
        _pad(r - (plan.shards[g][0] if plan.placement == "shard" else 0), slots)
        for g, r in enumerate(rows.rows)
    ]
    return _exchange.gather_local(world, tables, local, out)


def _pad(positions: np.ndarray, slots: int) -> np.ndarray:
    """`positions` padded with row 0 to `slots` (padding is never handed out)."""
    out = np.zeros(slots, np.int32)
    out[: len(positions)] = positions
    return out
