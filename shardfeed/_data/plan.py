"""The shard plan: which rows each replica holds and how many steps an epoch has.

A pure function of `(num_rows, num_replicas, per_replica_batch_size, placement,
drop_remainder, training)`: every rank computes the same plan, so all agree on
the step count without a message. The one owner of the layout numbers: rows
per epoch, dropped rows, `global_order_positions` (tested: `tests/_data/test_plan.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import numpy as np

from shardfeed._common import errors as _errors

Placement = Literal["shard", "replicate"]
PLACEMENTS = ("shard", "replicate")


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Which rows each replica holds and how each epoch is cut into steps.

    Attributes:
        num_rows: Rows in the whole dataset.
        num_replicas: Replicas across all workers (`num_replicas_in_sync`).
        per_replica_batch_size: Rows each replica takes per full step.
        placement: `"shard"` (each replica holds its own slice of rows) or
            `"replicate"` (each replica holds every row and takes its slice of
            each global batch).
        drop_remainder: Whether a partial last step is dropped (training only).
        training: Training plans may drop rows; evaluation plans never do.
        shards: Per replica, the global row range `(start, stop)` it holds.
        steps_per_epoch: Steps every replica runs per epoch.
        last_step_rows: Per replica, real rows in the last step (equal to
            `per_replica_batch_size` when the last step is full).
        dropped_rows_per_epoch: Rows not used in an epoch.
    """

    num_rows: int
    num_replicas: int
    per_replica_batch_size: int
    placement: Placement
    drop_remainder: bool
    training: bool
    shards: tuple[tuple[int, int], ...]
    steps_per_epoch: int
    last_step_rows: tuple[int, ...]
    dropped_rows_per_epoch: int

    @property
    def global_batch_size(self) -> int:
        return self.per_replica_batch_size * self.num_replicas

    @functools.cached_property
    def has_partial_step(self) -> bool:
        # Cached: `used_rows_per_epoch` asks once per replica, and where the
        # last step is full the scan reads every replica (the memory plan's
        # search tries plans of up to millions of replicas).
        return any(n != self.per_replica_batch_size for n in self.last_step_rows)

    @property
    def full_steps_per_epoch(self) -> int:
        return self.steps_per_epoch - int(self.has_partial_step)

    @property
    def used_rows_per_epoch(self) -> int:
        return sum(self.rows_per_epoch(r) for r in range(self.num_replicas))

    def shard_rows(self, replica: int) -> int:
        start, stop = self.shards[replica]
        return stop - start

    def rows_per_epoch(self, replica: int) -> int:
        """Real rows `replica` takes per epoch; the rest of its
        `steps_per_epoch * per_replica_batch_size` slots are padding.

        Example:
            >>> plan_shards(1001, 3, 100, training=False).rows_per_epoch(2)
            333
        """
        full = self.full_steps_per_epoch * self.per_replica_batch_size
        return full + (self.last_step_rows[replica] if self.has_partial_step else 0)

    def dropped_rows(self, replica: int) -> int:
        """Rows of `replica` left out of each epoch. Sharded: rows it holds
        and does not take. Replicated: its share of the dropped last global
        batch, dealt out round-robin as `plan_shards` counts it.

        Example:
            >>> plan_shards(1001, 3, 100, drop_remainder=True).dropped_rows(0)
            34
        """
        if self.placement == "replicate":
            return len(range(replica, self.dropped_rows_per_epoch, self.num_replicas))
        return self.shard_rows(replica) - self.rows_per_epoch(replica)

    def global_order_positions(self, replica: int) -> np.ndarray:
        """Positions in an epoch's order of all rows that `replica` takes, in
        step order, when each global batch is sliced across the replicas
        (`DistributedSampler` semantics): its slice `[r*b, (r+1)*b)` of every
        full global step, then its share of the partial last step (the
        replicas before it take theirs first).

        Returns:
            int64 positions, `rows_per_epoch(replica)` of them.

        Example:
            >>> plan_shards(10, 2, 2).global_order_positions(1).tolist()
            [2, 3, 6, 7, 9]
        """
        b, g = self.per_replica_batch_size, self.global_batch_size
        steps = np.arange(self.full_steps_per_epoch, dtype=np.int64)
        body = (steps[:, None] * g + replica * b + np.arange(b, dtype=np.int64)).reshape(-1)
        if not self.has_partial_step:
            return body
        start = self.full_steps_per_epoch * g + sum(self.last_step_rows[:replica])
        return np.concatenate(
            [body, np.arange(start, start + self.last_step_rows[replica], dtype=np.int64)]
        )


def uses_exchange(shuffle: bool | str, plan: ShardPlan) -> bool:
    """Whether training epochs move rows between replicas so that global step
    `s` takes the rows one replica with batch `global_batch_size` takes: sharded
    rows on several replicas, in the global order (`shuffle=True`, moved every
    epoch) or in order (`shuffle=False`: moved once, before the first training
    epoch, so that replica r holds its slice `[r*b, (r+1)*b)` of every global
    batch; nothing moves after). `"local"` keeps each replica on its own shard;
    one replica, or replicated rows, hold every row already. The one owner of
    this rule: both backends' residency, their memory checks and `memory_plan`.

    Example:
        >>> uses_exchange(False, plan_shards(8, 2, 2)), uses_exchange("local", plan_shards(8, 2, 2))
        (True, False)
    """
    return shuffle != "local" and plan.placement == "shard" and plan.num_replicas > 1


def partial_exchange(shuffle: bool | str, plan: ShardPlan, exchange_fraction: float) -> bool:
    """Whether training epochs mix only `exchange_fraction` of each replica's
    rows (`LoadOptions.exchange_fraction` below 1): a partial global shuffle.
    Rows in order (`shuffle=False`) always follow one replica's batches."""
    return shuffle is True and uses_exchange(shuffle, plan) and exchange_fraction < 1


def split_rows(num_rows: int, num_parts: int) -> tuple[tuple[int, int], ...]:
    """Splits `range(num_rows)` into `num_parts` contiguous, balanced ranges.

    The first `num_rows % num_parts` parts get one row more, like
    `np.array_split`.
    """
    base, extra = divmod(num_rows, num_parts)
    bounds, start = [], 0
    for part in range(num_parts):
        stop = start + base + (1 if part < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


def _check_positive(name: str, value: int, fix: str) -> None:
    if not _errors.is_integer(value) or value < 1:
        raise ValueError(
            _errors.message(f"`{name}` must be an integer >= 1.", f"{name}={value!r}", fix)
        )


def plan_shards(
    num_rows: int,
    num_replicas: int,
    per_replica_batch_size: int,
    placement: Placement = "shard",
    drop_remainder: bool = False,
    training: bool = True,
) -> ShardPlan:
    """Plans one epoch: rows per replica, steps, partial last step, drops.

    Args:
        num_rows: Rows in the dataset (all workers together).
        num_replicas: Replicas across all workers.
        per_replica_batch_size: Rows per replica per step; one larger than
            `ceil(num_rows / num_replicas)` is planned as that (one step per
            epoch either way), but for a training plan with `drop_remainder`.
        placement: `"shard"` or `"replicate"` (see `ShardPlan`).
        drop_remainder: Training only: drop a partial last step instead of
            running it with padding.
        training: Training plans drop a last step in which some replica would
            have no real row (a replica cannot take a step on zero rows);
            evaluation and prediction plans pad instead and never drop.

    Returns:
        The `ShardPlan`.

    Raises:
        ValueError: For non-positive sizes, an unknown placement, or a training
            plan that would have no step at all.

    Example:
        >>> plan = plan_shards(1001, 3, 100)
        >>> plan.steps_per_epoch, plan.last_step_rows, plan.dropped_rows_per_epoch
        (4, (34, 34, 33), 0)
    """
    _check_positive("num_rows", num_rows, "Build the dataset from at least one row.")
    _check_positive("num_replicas", num_replicas, "Use at least one replica.")
    _check_positive(
        "per_replica_batch_size", per_replica_batch_size, "Pass a batch size such as 256."
    )
    # NumPy integers are accepted; the plan holds Python ints.
    num_rows, num_replicas = int(num_rows), int(num_replicas)
    per_replica_batch_size = int(per_replica_batch_size)
    if placement not in PLACEMENTS:
        raise ValueError(
            _errors.message(
                f"`placement` must be one of {PLACEMENTS}.",
                f"placement={placement!r}",
                'Use "shard" to split rows across replicas or "replicate" to '
                "give every replica all rows.",
            )
        )
    b, n_rep = per_replica_batch_size, num_replicas
    # A batch wider than the most rows a replica takes in an epoch gives one
    # step either way (as Keras); clamped, so its slots are not allocated
    # (10**8 on 600 rows allocated 3 GiB). Not where drop_remainder refuses
    # such a batch (no full step).
    most = -(-num_rows // n_rep)
    if b > most and not (drop_remainder and training):
        b = most
    if placement == "shard":
        shards = split_rows(num_rows, n_rep)
        sizes = [stop - start for start, stop in shards]
        if drop_remainder and training:
            steps = min(sizes) // b
            last = (b,) * n_rep
        else:
            steps = -(-max(sizes) // b)
            last = tuple(n - (steps - 1) * b for n in sizes)
    else:
        shards = ((0, num_rows),) * n_rep
        global_batch = b * n_rep
        if drop_remainder and training:
            steps = num_rows // global_batch
            last = (b,) * n_rep
        else:
            steps = -(-num_rows // global_batch)
            rest = num_rows - (steps - 1) * global_batch
            last = tuple(len(range(r, rest, n_rep)) for r in range(n_rep))
            if rest == global_batch:
                last = (b,) * n_rep
    if training and steps > 0 and min(last) == 0:
        # A replica with no real row would need a zero-row step; drop the
        # last step's rows instead (counted below).
        steps -= 1
        last = (b,) * n_rep
    if training and steps == 0:
        # Without drop_remainder a batch larger than the data still runs one
        # short step (as Keras); no step at all means fewer rows than replicas.
        fix = (
            f"Use at most {num_rows} replica(s) (each needs a row in a step), or more rows."
            if not drop_remainder
            else "Lower `per_replica_batch_size`, use fewer replicas, or pass "
            "`drop_remainder=False` to run the partial step."
        )
        raise ValueError(
            _errors.message(
                "A training epoch needs at least one step with a real row on every replica.",
                f"per_replica_batch_size={per_replica_batch_size}, num_replicas={n_rep}, "
                f"num_rows={num_rows}, placement={placement!r}",
                fix,
            )
        )
    plan = ShardPlan(
        num_rows=num_rows,
        num_replicas=n_rep,
        per_replica_batch_size=b,
        placement=placement,
        drop_remainder=drop_remainder,
        training=training,
        shards=shards,
        steps_per_epoch=steps,
        last_step_rows=last,
        dropped_rows_per_epoch=0,
    )
    # What is dropped follows from what each replica takes (`rows_per_epoch`).
    return dataclasses.replace(plan, dropped_rows_per_epoch=num_rows - plan.used_rows_per_epoch)


class EpochSizes:
    """One epoch of `plan`: what it is and its row arithmetic, both backends'
    `ResidentEpoch`'s base (each adds its batches).

    Attributes:
        plan: The epoch's `ShardPlan`.
        epoch: The epoch number.
        training: Training order (True) or evaluation order.
        first_step: The first step iteration yields.
    """

    plan: ShardPlan
    epoch: int
    training: bool
    first_step: int

    # How a step that is not a host integer is asked for on this backend (the
    # end of `_check_step`'s message).
    _traced_step: str = ""

    def __init__(self, plan: ShardPlan, epoch: int, training: bool, first_step: int) -> None:
        self.plan = plan
        self.epoch, self.training, self.first_step = epoch, training, first_step

    @property
    def steps(self) -> int:
        return self.plan.steps_per_epoch

    @property
    def full_steps(self) -> int:
        return self.plan.full_steps_per_epoch

    @property
    def has_partial_step(self) -> bool:
        return self.plan.has_partial_step

    @property
    def per_replica_batch_size(self) -> int:
        return self.plan.per_replica_batch_size

    @property
    def global_batch_size(self) -> int:
        return self.plan.global_batch_size

    @property
    def num_replicas_in_sync(self) -> int:
        return self.plan.num_replicas

    def __len__(self) -> int:
        """The steps iteration yields: `steps - first_step`."""
        return self.steps - self.first_step

    def replica_rows(self, step: int) -> tuple[int, ...]:
        """Real rows of `step` on each global replica."""
        self._check_step(step)
        if step == self.steps - 1:
            return tuple(self.plan.last_step_rows)
        return (self.per_replica_batch_size,) * self.num_replicas_in_sync

    def global_rows(self, step: int) -> int:
        """Real rows of `step` over all replicas: `global_batch_size` but in a
        partial last step (the `global_batch_size` of TensorFlow's
        `tf.nn.compute_average_loss`)."""
        return sum(self.replica_rows(step))

    def _check_step(self, step: Any) -> None:
        """Raises ValueError unless `step` is a host integer in `[0, steps)`."""
        if not (_errors.is_integer(step) and 0 <= step < self.steps):
            raise ValueError(
                _errors.message(
                    f"`step` must be a step of this epoch, an integer in [0, {self.steps}).",
                    f"step={step!r}",
                    "Ask for `range(epoch.steps)`"
                    + (f"; {self._traced_step}" if self._traced_step else "."),
                )
            )
