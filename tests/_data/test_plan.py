"""The shard plan: a pure function, tested on its own with an edge-case table."""

import numpy as np
import pytest

from shardfeed import plan_shards
from shardfeed._data.plan import EpochSizes, split_rows

# (rows, replicas, batch, placement, drop, training) ->
#   (steps, last_step_rows, dropped)
CASES = [
    ((1000, 1, 256, "shard", False, True), (4, (232,), 0)),  # Keras' partial last batch
    ((1024, 1, 256, "shard", False, True), (4, (256,), 0)),  # divides exactly
    ((1000, 1, 256, "shard", True, True), (3, (256,), 232)),  # partial batch dropped
    ((1001, 3, 100, "shard", False, True), (4, (34, 34, 33), 0)),  # uneven shards padded
    ((1001, 3, 100, "shard", True, True), (3, (100, 100, 100), 101)),
    ((1001, 2, 500, "shard", False, True), (1, (500, 500), 1)),  # replica 1 would get 0 rows
    ((1001, 2, 500, "shard", False, False), (2, (1, 0), 0)),  # ...evaluation pads instead
    ((1000, 4, 250, "shard", False, True), (1, (250,) * 4, 0)),  # exact fit
    ((999, 4, 250, "shard", False, True), (1, (250, 250, 250, 249), 0)),  # one short
    ((1001, 4, 250, "shard", False, True), (1, (250,) * 4, 1)),  # one over: dropped
    ((1001, 4, 250, "shard", False, False), (2, (1, 0, 0, 0), 0)),  # eval keeps it
    ((1025, 4, 256, "replicate", False, True), (1, (256,) * 4, 1)),  # 1 row < 4 replicas
    ((1027, 4, 256, "replicate", False, True), (1, (256,) * 4, 3)),  # 3 rows < 4 replicas
    ((1027, 4, 256, "replicate", False, False), (2, (1, 1, 1, 0), 0)),  # eval pads
    ((1028, 4, 256, "replicate", False, True), (2, (1, 1, 1, 1), 0)),  # 4 rows, 1 each
    ((1030, 4, 256, "replicate", False, True), (2, (2, 2, 1, 1), 0)),  # balanced split
    ((1030, 4, 256, "replicate", True, True), (1, (256,) * 4, 6)),
    ((5, 1, 256, "shard", False, True), (1, (5,), 0)),  # batch larger than data
    ((3, 4, 1, "shard", False, False), (1, (1, 1, 1, 0), 0)),  # more replicas than rows
]


@pytest.mark.parametrize(
    ("args", "planned_batch"),
    [
        ((600, 1, 10**8, "shard", False, True), 600),  # allocated 3 GiB of slots
        ((600, 4, 10**8, "shard", False, False), 150),
        ((601, 4, 10**8, "replicate", False, True), 151),  # the fullest replica's rows
        ((100, 2, 64, "shard", False, True), 50),  # one step of 50 + 50 either way
        ((100, 2, 50, "shard", False, True), 50),  # not larger: as given
        ((100, 2, 64, "shard", True, False), 50),  # evaluation never drops
    ],
)
def test_a_batch_wider_than_the_rows_is_planned_as_the_rows(args, planned_batch):
    """One step per epoch either way (as Keras), without a slot per
    requested row: the fullest replica's rows, `ceil(num_rows / num_replicas)`."""
    plan = plan_shards(*args)
    assert plan.per_replica_batch_size == planned_batch
    assert plan.steps_per_epoch == 1
    assert plan.used_rows_per_epoch == args[0]


def test_a_batch_wider_than_the_rows_with_drop_remainder_is_still_refused():
    with pytest.raises(ValueError, match=r"per_replica_batch_size=100000000, num_replicas=1"):
        plan_shards(600, 1, 10**8, "shard", True, True)


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_plan_table(args, expected):
    plan = plan_shards(*args)
    steps, last, dropped = expected
    assert (plan.steps_per_epoch, plan.last_step_rows, plan.dropped_rows_per_epoch) == (
        steps,
        last,
        dropped,
    )
    assert plan.used_rows_per_epoch + plan.dropped_rows_per_epoch == plan.num_rows


def _reference(rows, replicas, b, placement, drop, training):
    """The plan's numbers from their definition, written independently of
    `plan_shards`: `(steps, last_step_rows, dropped)`, or None when training
    would have no step with a real row on every replica."""
    if placement == "replicate":
        g = replicas * b
        full, rem = divmod(rows, g)
        last = tuple(hi - lo for lo, hi in split_rows(rem, replicas))
        if not training:
            return (full + (rem > 0), last if rem else (b,) * replicas, 0)
        if rem >= replicas and not drop:
            return (full + 1, last, 0)
        return (full, (b,) * replicas, rem) if full else None
    shards = [hi - lo for lo, hi in split_rows(rows, replicas)]
    if not training:
        steps = max(1, *(-(-n // b) for n in shards))
    elif drop:
        steps = min(n // b for n in shards)
    else:
        steps = min(-(-n // b) for n in shards)  # every replica has a row in every step
    if steps == 0:
        return None
    used = [min(n, steps * b) for n in shards]
    return (steps, tuple(u - (steps - 1) * b for u in used), sum(shards) - sum(used))


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_reference_agrees_with_the_table(args, expected):
    assert _reference(*args) == expected  # the reference itself is checked against the table


@pytest.mark.parametrize("rows", [1, 2, 7, 100, 1001, 1024])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("placement", ["shard", "replicate"])
@pytest.mark.parametrize("drop", [False, True])
def test_invariants_around_every_divisibility_edge(rows, replicas, batch, placement, drop):
    expected = _reference(rows, replicas, batch, placement, drop, training=True)
    if expected is None:
        with pytest.raises(ValueError, match="at least one step"):
            plan_shards(rows, replicas, batch, placement, drop, training=True)
        return
    plan = plan_shards(rows, replicas, batch, placement, drop, training=True)
    numbers = (plan.steps_per_epoch, plan.last_step_rows, plan.dropped_rows_per_epoch)
    assert numbers == expected
    b = batch
    assert plan.steps_per_epoch >= 1
    assert all(0 < n <= b for n in plan.last_step_rows)  # no empty replica in training
    assert plan.used_rows_per_epoch + plan.dropped_rows_per_epoch == rows
    assert plan.dropped_rows_per_epoch >= 0
    for r in range(replicas):
        used = (plan.steps_per_epoch - 1) * b + plan.last_step_rows[r]
        assert used <= plan.shard_rows(r)
    if not drop:
        # Without drop_remainder, rows are only dropped when a replica would
        # have no row in the last step: fewer rows than replicas are left.
        assert plan.dropped_rows_per_epoch < replicas * (1 if placement == "replicate" else b)
    evaluation = plan_shards(rows, replicas, batch, placement, training=False)
    eval_numbers = (
        evaluation.steps_per_epoch,
        evaluation.last_step_rows,
        evaluation.dropped_rows_per_epoch,
    )
    assert eval_numbers == _reference(rows, replicas, batch, placement, False, training=False)
    assert evaluation.dropped_rows_per_epoch == 0
    assert evaluation.used_rows_per_epoch == rows


def _reference_layout(plan):
    """Per replica, `(rows_per_epoch, dropped_rows, global_order_positions)`
    from their definition, step by step: a sharded replica takes the first
    rows of its shard; with each global batch sliced across replicas, every
    global step is the next `global_batch_size` positions of the epoch's
    order, cut into balanced contiguous parts (`np.array_split`)."""
    n, b, steps = plan.num_replicas, plan.per_replica_batch_size, plan.steps_per_epoch
    g = n * b
    taken = [[] for _ in range(n)]
    for step in range(steps):
        batch = np.arange(step * g, min((step + 1) * g, plan.num_rows))
        for r, part in enumerate(np.array_split(batch, n)):
            taken[r].extend(part.tolist())
    out = []
    for r in range(n):
        if plan.placement == "shard":
            used = min(plan.shard_rows(r), steps * b)
            dropped = plan.shard_rows(r) - used
        else:
            used = len(taken[r])
            # Every replica holds every row: the dropped ones are dealt out round-robin.
            dropped = len(np.array_split(np.arange(plan.dropped_rows_per_epoch), n)[r])
        out.append((used, dropped, taken[r]))
    return out


@pytest.mark.parametrize("rows", [1, 2, 7, 100, 1001, 1024])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("placement", ["shard", "replicate"])
@pytest.mark.parametrize(("drop", "training"), [(False, True), (True, True), (False, False)])
def test_layout_numbers_agree_with_a_step_by_step_reference(
    rows, replicas, batch, placement, drop, training
):
    """`ShardPlan` owns every replica's real rows, drops and slice of the
    global order; the epoch orders (TF), the exchange (NumPy), streaming,
    predictions and the memory plan all read them from it."""
    if _reference(rows, replicas, batch, placement, drop, training) is None:
        return  # no training epoch (tested above)
    plan = plan_shards(rows, replicas, batch, placement, drop, training)
    for r, (used, dropped, positions) in enumerate(_reference_layout(plan)):
        assert plan.rows_per_epoch(r) == used
        assert plan.dropped_rows(r) == dropped
        got = plan.global_order_positions(r)
        assert got.dtype == np.int64 and got.tolist() == positions
        assert len(got) == plan.rows_per_epoch(r)  # the global shuffle's sharded slots too
    assert sum(plan.dropped_rows(r) for r in range(replicas)) == plan.dropped_rows_per_epoch
    taken = np.concatenate([plan.global_order_positions(r) for r in range(replicas)])
    assert len(np.unique(taken)) == len(taken) == plan.used_rows_per_epoch  # each once


def test_split_rows_is_balanced_and_contiguous():
    assert split_rows(10, 3) == ((0, 4), (4, 7), (7, 10))
    assert split_rows(2, 4) == ((0, 1), (1, 2), (2, 2), (2, 2))


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        (
            {"num_rows": 10, "num_replicas": 1, "per_replica_batch_size": 0},
            "`per_replica_batch_size` must be an integer >= 1. Received: "
            "per_replica_batch_size=0. Pass a batch size such as 256.",
        ),
        (
            {"num_rows": 10, "num_replicas": 1, "per_replica_batch_size": 2, "placement": "x"},
            "`placement` must be one of ('shard', 'replicate'). Received: placement='x'.",
        ),
        (
            {
                "num_rows": 10,
                "num_replicas": 1,
                "per_replica_batch_size": 20,
                "drop_remainder": True,
            },
            "A training epoch needs at least one step with a real row on every replica. "
            "Received: per_replica_batch_size=20, num_replicas=1, num_rows=10, "
            "placement='shard'. Lower `per_replica_batch_size`, use fewer replicas, or "
            "pass `drop_remainder=False` to run the partial step.",
        ),
        (  # fewer rows than replicas: some replica would take a zero-row step
            {"num_rows": 3, "num_replicas": 4, "per_replica_batch_size": 8},
            "A training epoch needs at least one step with a real row on every replica. "
            "Received: per_replica_batch_size=8, num_replicas=4, num_rows=3, "
            "placement='shard'. Use at most 3 replica(s) (each needs a row in a step), or "
            "more rows.",
        ),
    ],
)
def test_errors(kwargs, text):
    with pytest.raises(ValueError) as err:
        plan_shards(**kwargs)
    assert text in str(err.value)


def test_epoch_sizes_row_arithmetic():
    """Both backends' `ResidentEpoch` inherit their row arithmetic from `EpochSizes`."""
    # 10 rows, 3 replicas, batch 2, evaluation: steps of [2,2,2], [2,2,0]... padded.
    plan = plan_shards(10, 3, 2, "shard", training=False)
    sizes = EpochSizes(plan, epoch=4, training=False, first_step=1)
    assert (sizes.steps, sizes.full_steps, len(sizes)) == (2, 1, 1)
    assert sizes.replica_rows(0) == (2, 2, 2)
    assert sizes.replica_rows(1) == tuple(plan.last_step_rows)
    assert sizes.global_rows(0) == 6 and sizes.global_rows(1) == 4
    with pytest.raises(ValueError) as info:
        sizes.replica_rows(2)
    assert str(info.value) == (
        "`step` must be a step of this epoch, an integer in [0, 2). Received: step=2. "
        "Ask for `range(epoch.steps)`."
    )
    with pytest.raises(ValueError, match="Received: step=True"):
        sizes.global_rows(True)  # a bool is never a step
