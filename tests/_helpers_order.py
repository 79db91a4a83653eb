"""The epoch order's cases, shared by both backends' tiers (one place, not copied).

Each backend builds the same dataset (`y` = the row number), opens the same
training and evaluation epochs, and records the rows each replica's batch
holds at each step, read back from the batches the loop gathers: these
records must be equal on TensorFlow and JAX (tests/_data/test_order.py
runs the JAX side in a child process: the two venvs cannot share one) and
equal the neutral order's (`shardfeed._data.order`).

Imports neither TensorFlow nor JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ROWS = 103  # uneven shards on 2 and 4 replicas, and a partial last step
BATCH = 4
SEED = 11
TRAINING_EPOCHS = 3  # in turn: a partial exchange mixes what the epoch before left

# name: (replicas, placement, shuffle, exchange_fraction, drop_remainder)
CASES: dict[str, tuple[int, str, bool | str, float, bool]] = {
    "one replica, global": (1, "shard", True, 1.0, False),
    "shard x2, global": (2, "shard", True, 1.0, False),
    "shard x4, global, drop_remainder": (4, "shard", True, 1.0, True),
    "shard x2, local": (2, "shard", "local", 1.0, False),
    "shard x4, local": (4, "shard", "local", 1.0, False),
    "shard x2, in order": (2, "shard", False, 1.0, False),
    "shard x2, partial exchange": (2, "shard", True, 0.5, False),
    "shard x4, partial exchange": (4, "shard", True, 0.25, False),
    "replicate x2, global": (2, "replicate", True, 1.0, False),
    "replicate x2, in order": (2, "replicate", False, 1.0, False),
}

# Per epoch (one evaluation epoch, then the training epochs): per step, per
# global replica, the rows it took.
Record = list[list[list[int]]]


def data() -> tuple[np.ndarray, np.ndarray]:
    """`x` and `y` both name the row: `y` is its number."""
    return np.arange(ROWS, dtype=np.float32)[:, None], np.arange(ROWS, dtype=np.int32)


def dataset_kwargs(name: str) -> dict[str, Any]:
    """`ShardedResidentDataset`'s keyword arguments for case `name` (but
    `load_options`, whose class each backend imports)."""
    _, placement, shuffle, _, drop = CASES[name]
    return dict(
        per_replica_batch_size=BATCH,
        seed=SEED,
        placement=placement,
        shuffle=shuffle,
        drop_remainder=drop,
    )


def record(
    open_epoch: Callable[[int, bool], Any], replica_ys: Callable[[Any, int, Any], Sequence[Any]]
) -> Record:
    """The rows of one evaluation epoch, then `TRAINING_EPOCHS` training
    epochs in turn: `open_epoch(epoch, training)` opens one, `replica_ys(epoch,
    step, batch)` gives each global replica's `y` in a step's batch.

    Evaluation comes first: once training epochs moved rows between replicas,
    an evaluation epoch takes each replica's rows where its backend's
    exchange left them (every row once either way)."""
    out: Record = []
    for epoch, training in [(0, False)] + [(e, True) for e in range(TRAINING_EPOCHS)]:
        ep = open_epoch(epoch, training)
        steps = []
        for step, batch in ep:
            steps.append([np.asarray(y).reshape(-1).tolist() for y in replica_ys(ep, step, batch)])
        ep.close()
        out.append(steps)
    return out


def neutral_record(name: str) -> Record:
    """What `record` must give for case `name`, from the neutral order alone."""
    from shardfeed._data import order as _order
    from shardfeed._data.plan import partial_exchange, plan_shards, uses_exchange

    replicas, placement, shuffle, fraction, drop = CASES[name]
    plan = plan_shards(ROWS, replicas, BATCH, placement, drop)
    evaluation = plan_shards(ROWS, replicas, BATCH, placement, training=False)
    out: Record = [
        split_steps(evaluation, _order.epoch_rows(evaluation, shuffle, SEED, 0, False, False).rows)
    ]
    layout, since = None, None
    for epoch in range(TRAINING_EPOCHS):
        if partial_exchange(shuffle, plan, fraction):
            rows = _order.mixed_rows(plan, layout, since, fraction, SEED, epoch)
            layout, since = _order_holdings(rows, replicas), epoch
        else:
            rows = _order.epoch_rows(plan, shuffle, SEED, epoch, True, uses_exchange(shuffle, plan))
        out.append(split_steps(plan, rows.rows))
    return out


def _order_holdings(rows: Any, replicas: int) -> list[np.ndarray]:
    from shardfeed._data import exchange as _exchange

    return _exchange.holdings(rows.target, replicas)


def split_steps(plan: Any, rows: list[np.ndarray]) -> list[list[list[int]]]:
    """Per step, per replica, its rows: `rows` (per replica, step order) cut
    by the plan's steps."""
    b = plan.per_replica_batch_size
    return [
        [rows[g][s * b : s * b + _real(plan, g, s)].tolist() for g in range(plan.num_replicas)]
        for s in range(plan.steps_per_epoch)
    ]


def _real(plan: Any, replica: int, step: int) -> int:
    if plan.has_partial_step and step == plan.steps_per_epoch - 1:
        return plan.last_step_rows[replica]
    return plan.per_replica_batch_size


# -- a fit interrupted on one backend, resumed on the other ---------------------

RESUME_CASE = "shard x2, global"  # 13 steps an epoch (12 full, 7 rows in the last)


def regression() -> tuple[np.ndarray, np.ndarray]:
    """`ROWS` rows of a linear target, the same on every backend."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)


def regression_model() -> Any:
    """A small compiled MLP (its first weights do not matter: a resume loads them)."""
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model
