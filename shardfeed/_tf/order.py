"""Each resident epoch's order on TensorFlow: the `Residency` and `Order` protocols, and the
resident form (`ResidentRows`, `EpochOrder`: per-replica `[steps, batch]` index matrices).

Which rows each replica takes is the neutral order's (`_data/order.py`, NumPy
on the worker's CPU: the same on every host, device and backend); this module
turns them into slots of the replica's store. The global order of sharded rows
is `exchange.py`'s.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import tensorflow as tf

from shardfeed._data import order as _order
from shardfeed._data.plan import ShardPlan
from shardfeed._tf import storage as _storage


class Order(Protocol):
    """One epoch's order: per local replica, which slot each step reads."""

    @property
    def call_bounds(self) -> list[int] | None:
        """Steps at which a compiled call must start (a streamed chunk's first
        step); None: any step may."""
        ...

    def prepare(self, start: int, stop: int) -> None:
        """Makes steps `[start, stop)` resident (uploads streamed chunks)."""

    def slice(self, start: int, stop: int) -> list[tf.Tensor]:
        """Per local replica, the `[stop - start, per_replica_batch_size]` slots."""
        ...

    def rows(self, local: int) -> np.ndarray:
        """Global row of each slot of local replica `local`, step by step."""
        ...

    def close(self) -> None:
        """Stops background uploads."""

    def release(self) -> None:
        """Lets go of what the order holds per row, once a training epoch that
        moves rows made it stale (nothing, where it holds nothing per row)."""


class Residency(Protocol):
    """How a dataset holds its rows; chosen once, in the dataset's constructor."""

    # Streamed rows pass through a ring refilled from the host between calls:
    # only eager iteration can feed them.
    streamed: bool

    def exclusive(self, training: bool) -> bool:
        """Whether opening such an epoch invalidates every other open epoch of
        the dataset (rows move, or a ring is refilled)."""
        ...

    def epoch_order(self, plan: ShardPlan, epoch: int, training: bool) -> Order:
        """Opens an epoch (moving rows first, if this residency moves them)."""
        ...


class ResidentRows:
    """Every replica's rows resident and in place: orders are index matrices.

    Args:
        stores: The local replicas' storage.
        seed: The dataset's seed.
        shuffle: The dataset's `shuffle` (training epochs only).
    """

    streamed = False

    def __init__(
        self, stores: tuple[_storage.ReplicaStore, ...], seed: int | None, shuffle: bool | str
    ) -> None:
        self._stores, self._seed, self._shuffle = stores, seed, shuffle

    def exclusive(self, training: bool) -> bool:
        return False

    def epoch_order(self, plan: ShardPlan, epoch: int, training: bool) -> EpochOrder:
        shuffle = self._shuffle if training else False
        indices = epoch_indices(plan, self._stores, self._seed, epoch, shuffle)
        return EpochOrder(indices, self._stores)


class EpochOrder:
    """One resident epoch: index matrices already on the devices.

    Streaming epochs (`_streaming.StreamingOrder`) offer the same methods and
    also upload chunks in `prepare`.
    """

    call_bounds: list[int] | None = None  # any step may start a call

    def __init__(
        self,
        indices: list[tf.Tensor],
        stores: tuple[_storage.ReplicaStore, ...],
        held: list[np.ndarray] | None = None,
    ):
        self._indices = indices
        self._stores = stores
        # Per local replica, the global row in each slot, once an exchange
        # (`exchange.py`) has moved rows; None: the uploaded rows in order.
        self._held = held

    def prepare(self, start: int, stop: int) -> None:
        """Nothing to do: every row is resident."""
        # A statement, not only the docstring: `ResidentEpoch.batch(int)` inside the user's
        # tf.function calls this, and AutoGraph cannot convert a docstring-only body (it warns).
        return None

    def slice(self, start: int, stop: int) -> list[tf.Tensor]:
        return [idx[start:stop] for idx in self._indices]

    def rows(self, local: int) -> np.ndarray:
        """Global row numbers of local replica `local`'s slots, step by step."""
        slots = self._indices[local].numpy().reshape(-1)
        if self._held is None:
            return slots + self._stores[local].row_start
        held = self._held[local] if len(self._held[local]) else np.zeros(1, np.int64)
        return held[slots]

    def close(self) -> None:
        pass

    def release(self) -> None:
        """Lets go of the index matrices and the layout (4 + 4 bytes a row),
        once a training epoch that moves rows made them stale: they would
        otherwise live on beside the new ones until the old epoch object is
        collected."""
        self._indices, self._held = [], [] if self._held is not None else None


def epoch_indices(
    plan: ShardPlan,
    stores: tuple[_storage.ReplicaStore, ...],
    seed: int | None,
    epoch: int,
    shuffle: bool | str,
) -> list[tf.Tensor]:
    """Per local replica, the index matrix of a resident epoch whose rows stay
    where they were loaded (no exchange): the neutral order's rows
    (`_data/order.py`, the same on JAX) as slots of the replica's store.

    Args:
        plan: The training or evaluation plan.
        stores: The local replicas' storage (rows they hold, devices).
        seed: The dataset's seed (required when `shuffle`).
        epoch: The epoch number; with `seed` it fixes the permutation.
        shuffle: True: the global order, one permutation of all rows from
            `(seed, epoch)` (sharded rows on several replicas get it through
            the exchange instead); "local": each sharded replica permutes its
            own rows from `(seed, epoch, replica)`; False: rows in order.

    Returns:
        Per local replica, an int `[steps_per_epoch, per_replica_batch_size]`
        tensor on its device. Padding slots of a partial last step come after
        the real ones; the plan's `last_step_rows` says how many are real.

    Example:
        >>> epoch_indices(plan, dataset.stores, seed=0, epoch=3, shuffle=True)[0].shape
        TensorShape([117, 256])
    """
    shared = None
    out = []
    # Each replica's slots go to `index_matrix` as their only reference (it
    # lets go of them once copied): the host holds one order at a time.
    for store in stores:
        r = store.replica
        if _order.stays_in_place(plan, shuffle, moved=False):
            out.append(
                index_matrix(
                    plan, _order.shard_positions(plan, shuffle, seed, epoch, r), store.device
                )
            )
            continue
        if shared is None:  # one order of all rows (replicated, or one replica), sliced
            local = [s.replica for s in stores]
            shared = dict(
                zip(local, _order.global_rows(plan, shuffle, seed, epoch, local), strict=True)
            )
        out.append(index_matrix(plan, _shifted(shared.pop(r), store.row_start), store.device))
    return out


def _shifted(rows: np.ndarray, start: int) -> np.ndarray:
    return rows - start if start else rows


def index_matrix(plan: ShardPlan, slots: np.ndarray, device: str) -> tf.Tensor:
    """`slots` (one replica's, step order) as its `[steps, batch]` index
    matrix on `device`, padded with slot 0 after the real ones. Pass the only
    reference to `slots`: it is let go of once copied (host memory, 4 bytes
    a row)."""
    b, steps = plan.per_replica_batch_size, plan.steps_per_epoch
    flat = slots
    if len(slots) < steps * b:  # a copy only to pad
        flat = np.zeros(steps * b, dtype=slots.dtype)
        flat[: len(slots)] = slots
    del slots
    with tf.device(device):
        # `tf.constant` of a NumPy array held the array's size twice (it is
        # not aligned, so nothing is shared); its identity holds it once.
        converted = tf.constant(flat.reshape(steps, b))
        del flat
        return tf.identity(converted)
