"""The shard plan: which rows each replica holds and how many steps an epoch has.

Separation of concerns: this layer is a pure function of
`(num_rows, num_replicas, per_replica_batch_size, placement, drop_remainder,
training)`. It reads no data, touches no device and talks to no other rank;
every rank computes the same plan from the same numbers, which is how all
ranks agree on the step count without exchanging a message -- and why an
allreduce can never wait on a rank that ran out of batches.

Invariants (tested in `tests/test_plan.py`):
- every replica runs exactly `steps_per_epoch` steps;
- all steps but the last are full (`per_replica_batch_size` rows on every
  replica); the last may be partial, with `last_step_rows[r]` real rows on
  replica r, the rest padding that never counts;
- each row is used at most once per epoch, and
  `used_rows_per_epoch + dropped_rows_per_epoch == num_rows`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

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

    @property
    def has_partial_step(self) -> bool:
        return any(n != self.per_replica_batch_size for n in self.last_step_rows)

    @property
    def full_steps_per_epoch(self) -> int:
        return self.steps_per_epoch - int(self.has_partial_step)

    @property
    def used_rows_per_epoch(self) -> int:
        b = self.per_replica_batch_size
        return self.full_steps_per_epoch * b * self.num_replicas + (
            sum(self.last_step_rows) if self.has_partial_step else 0
        )

    def shard_rows(self, replica: int) -> int:
        start, stop = self.shards[replica]
        return stop - start


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
        per_replica_batch_size: Rows per replica per step.
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
                f"per_replica_batch_size={b}, num_replicas={n_rep}, "
                f"num_rows={num_rows}, placement={placement!r}",
                fix,
            )
        )
    used = (steps - 1) * b * n_rep + sum(last) if steps else 0
    return ShardPlan(
        num_rows=num_rows,
        num_replicas=n_rep,
        per_replica_batch_size=b,
        placement=placement,
        drop_remainder=drop_remainder,
        training=training,
        shards=shards,
        steps_per_epoch=steps,
        last_step_rows=last,
        dropped_rows_per_epoch=num_rows - used,
    )
