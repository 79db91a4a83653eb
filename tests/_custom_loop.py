"""Custom training loops over `ResidentEpoch`, shared by the tests (not a test module).

Imported by `tests/_tf/test_iterator.py` (one process, 1 device or 3 logical
devices) and run as a worker script (`shardfeed launch -n 2`, `horovodrun -np
2`): each loop trains the same seeded model on the same rows, so its weights
can be compared with `shardfeed.fit`'s. Run as a script it writes, per rank,
`<out>.rank<r>.npz` with the weights of `fit`, of each custom loop, and the
row ids each epoch handed out per sharding mode.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ROWS = 203  # with batch 16: a partial last step on 1, 2 and 3 replicas
BATCH = 16
EPOCHS = 3
SEED = 5


def data(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + 0.1 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


def model(world: Any) -> Any:
    """The same initial weights every call (seeded), SGD, MSE."""
    import keras

    with world.scope():
        keras.utils.set_random_seed(7)
        m = keras.Sequential(
            [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        )
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        m.optimizer.build(m.trainable_variables)
    return m


def dataset(world: Any, **kwargs: Any) -> Any:
    import shardfeed

    x, y = data()
    kwargs = {"per_replica_batch_size": BATCH, "seed": SEED, **kwargs}
    with world.scope():
        return shardfeed.ShardedResidentDataset(x, y, **kwargs)


def weights(m: Any) -> np.ndarray:
    return np.concatenate([v.ravel() for v in m.get_weights()])


def fit_weights(world: Any, **kwargs: Any) -> np.ndarray:
    import shardfeed

    m = model(world)
    shardfeed.fit(m, dataset(world, **kwargs), epochs=EPOCHS, verbose=0)
    return weights(m)


def _per_example(m: Any, x: Any, y: Any) -> Any:
    import tensorflow as tf

    return tf.reduce_mean(tf.square(y - m(x, training=True)), axis=-1)


def replica_step(world: Any, m: Any) -> Any:
    """One replica's training step on `(x, y)` of a step with `global_rows`
    real rows in all: the `tf.distribute` custom-loop tutorial's form
    (`optimizer.apply` sums gradients over replicas), or Horovod's
    (`DistributedGradientTape` summing over ranks: each rank's loss is
    already divided by the global rows, exact on a partial step too)."""
    import tensorflow as tf

    def step(x, y, global_rows):
        with tf.GradientTape() as tape:
            per_example = _per_example(m, x, y)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_rows)
        if world.backend == "horovod":
            import horovod.tensorflow as hvd

            # Keras 3 variables: Horovod needs their tf.Variable (`.value`).
            tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
            grads = tape.gradient(loss, [v.value for v in m.trainable_variables])
        else:
            grads = tape.gradient(loss, m.trainable_variables)
        m.optimizer.apply(grads, m.trainable_variables)

    return step


def run_step(world: Any, step: Any, batch: Any, global_rows: Any) -> None:
    """`strategy.run(step, ...)`, or the step itself under Horovod (one
    replica per process, no strategy)."""
    if world.backend == "horovod":
        step(batch.x, batch.y, global_rows)
    else:
        world.strategy.run(step, args=(batch.x, batch.y, global_rows))


def train_eagerly(world: Any, m: Any, epochs: Any, stop: tuple[int, int] | None = None) -> None:
    """`for step, batch in epoch` over `epochs` (ResidentEpochs), one
    `tf.function` call per step; with `stop` = (epoch, step), returns right
    after that step, as a preempted run would."""
    import tensorflow as tf

    step = replica_step(world, m)
    train = tf.function(lambda batch, rows: run_step(world, step, batch, rows))
    for epoch in epochs:
        for s, batch in epoch:
            train(batch, tf.constant(epoch.global_rows(s), tf.int32))
            if stop == (epoch.epoch, s):
                return


def custom_weights(world: Any, **kwargs: Any) -> np.ndarray:
    """The eager custom loop over `dataset.epoch(e)`."""
    m = model(world)
    ds = dataset(world, **kwargs)
    train_eagerly(world, m, (ds.epoch(e) for e in range(EPOCHS)))
    return weights(m)


def in_graph_weights(world: Any, **kwargs: Any) -> np.ndarray:
    """All full steps of an epoch in one `tf.function` (`epoch.batch(step)` with
    a tensor step), then the partial last step asked with a Python int."""
    import tensorflow as tf

    m = model(world)
    ds = dataset(world, **kwargs)
    step = replica_step(world, m)
    for e in range(EPOCHS):
        epoch = ds.epoch(e)

        @tf.function
        def full_steps(epoch=epoch):
            rows = tf.constant(epoch.global_batch_size, tf.int32)
            for s in tf.range(epoch.full_steps):
                run_step(world, step, epoch.batch(s), rows)

        full_steps()
        if epoch.has_partial_step:
            last = epoch.steps - 1
            rows = tf.constant(epoch.global_rows(last), tf.int32)
            tf.function(lambda b, r: run_step(world, step, b, r))(epoch.batch(last), rows)
    return weights(m)


def row_ids(world: Any, epochs: int = 2, **kwargs: Any) -> list[np.ndarray]:
    """Per epoch, the row ids this process's replicas were handed (each
    replica's real rows, in step order)."""
    import shardfeed

    ids = np.arange(ROWS, dtype=np.int64)
    with world.scope():
        ds = shardfeed.ShardedResidentDataset(
            {"id": ids, "twice": 2 * ids}, per_replica_batch_size=BATCH, seed=SEED, **kwargs
        )
    out = []
    for e in range(epochs):
        got = []
        for _, batch in ds.epoch(e):
            for part, twice in zip(_local(world, batch.x["id"]), _local(world, batch.x["twice"]),
                                   strict=True):
                assert np.array_equal(2 * part, twice), "columns must move together"
                got.append(part)
        out.append(np.concatenate(got))
    return out


def _local(world: Any, value: Any) -> list[np.ndarray]:
    if world.replicas_in_process == 1:
        return [np.asarray(value)]
    return [np.asarray(v) for v in world.strategy.experimental_local_results(value)]


MODES = {
    "replicate": {"placement": "replicate"},
    "sharded_local": {"shuffle": "local"},
    "sharded_global": {},
}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import shardfeed

    world = shardfeed.init()
    out = {
        "fit": fit_weights(world),
        "custom": custom_weights(world),
        "in_graph": in_graph_weights(world),
    }
    for name, kwargs in MODES.items():
        for e, ids in enumerate(row_ids(world, **kwargs)):
            out[f"ids_{name}_{e}"] = ids
    np.savez(f"{args.out}.rank{world.rank}.npz", **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
