"""What a step of a user's own JAX loop costs, by how it takes its batch (one device).

Keras' guide "Writing a training loop from scratch in JAX" (its MLP 784-64-64-10,
Adam, batch 32, one `jax.jit` train step) on one CPU device, fed five ways:
`numpy` (the guide's NumPy batches: a slice of host arrays into the jitted
step), `resident` (`for step, batch in dataset.epoch(e)`), `batch-fn` (the
step jitted around `epoch.batch_fn(arrays, i)`, one call a step), `scan`
(`batch_fn` in a `lax.scan` of 100 steps per call, docs/custom_loops.md's
chunk) and `batches` (the eager batches alone, no step). Not a `shardfeed
bench` variant: run it as
`KERAS_BACKEND=jax python -m shardfeed._commands.bench.custom_loop_jax [--rows N]`.
Prints ms per step of each round (the variants rotate within a round) and
each one's minimum and median; numbers in NOTES.md ("A user's own JAX loop").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

VARIANTS = ("numpy", "resident", "batch-fn", "scan", "batches")
BATCH = 32
SCAN_STEPS = 100


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args(argv)

    import shardfeed

    shardfeed.init(cpu_devices=1)
    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np

    rows = args.rows
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 784)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 10, rows), 10).astype("float32")
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(784,))
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    hidden = keras.layers.Dense(64, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)

    def compute_loss(trainable: Any, non_trainable: Any, x: Any, y: Any) -> Any:
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, y_pred), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    def step_body(state: Any, data: Any) -> Any:
        trainable, non_trainable, optimizer_variables = state
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, *data)
        trainable, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable
        )
        return loss, (trainable, non_trainable, optimizer_variables)

    train_step = jax.jit(step_body)
    # JAX's dataset (mypy sees TensorFlow's).
    dataset: Any = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=BATCH, seed=0)
    steps = rows // BATCH

    def fresh() -> Any:
        return (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in optimizer.variables],
        )

    def numpy_epoch(state: Any, e: int) -> Any:
        for i in range(steps):
            _, state = train_step(
                state, (x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH])
            )
        return state

    def resident_epoch(state: Any, e: int) -> Any:
        epoch = dataset.epoch(e)
        for _, batch in epoch:
            _, state = train_step(state, (batch.x, batch.y))
        epoch.close()
        return state

    batch_fn = dataset.epoch(0).batch_fn

    @jax.jit
    def batch_fn_step(state: Any, arrays: Any, i: Any) -> Any:
        batch = batch_fn(arrays, i)
        return step_body(state, (batch.x, batch.y))

    def batch_fn_epoch(state: Any, e: int) -> Any:
        epoch = dataset.epoch(e)
        for i in range(epoch.full_steps):
            _, state = batch_fn_step(state, epoch.arrays, np.int32(i))
        return rest(epoch, state, epoch.full_steps)

    @jax.jit
    def scan_chunk(state: Any, arrays: Any, start: Any) -> Any:
        def one(state: Any, i: Any) -> Any:
            batch = batch_fn(arrays, start + i)
            return step_body(state, (batch.x, batch.y))[1], None

        return jax.lax.scan(one, state, jnp.arange(SCAN_STEPS))[0]

    def scan_epoch(state: Any, e: int) -> Any:
        epoch = dataset.epoch(e)
        start = 0
        while start + SCAN_STEPS <= epoch.full_steps:
            state = scan_chunk(state, epoch.arrays, np.int32(start))
            start += SCAN_STEPS
        return rest(epoch, state, start)

    def rest(epoch: Any, state: Any, start: int) -> Any:
        for step in range(start, epoch.steps):
            batch = epoch.batch(step)
            _, state = train_step(state, (batch.x, batch.y))
        epoch.close()
        return state

    def batches_epoch(state: Any, e: int) -> Any:
        epoch = dataset.epoch(e)
        last = None
        for _, batch in epoch:
            last = batch.x
        jax.block_until_ready(last)
        epoch.close()
        return state

    run: dict[str, Callable[[Any, int], Any]] = {
        "numpy": numpy_epoch,
        "resident": resident_epoch,
        "batch-fn": batch_fn_epoch,
        "scan": scan_epoch,
        "batches": batches_epoch,
    }
    for name in args.variants:  # compiles
        jax.block_until_ready(run[name](fresh(), 0))
    times: dict[str, list[float]] = {name: [] for name in args.variants}
    for r in range(args.rounds):
        order = args.variants[r % len(args.variants) :] + args.variants[: r % len(args.variants)]
        for name in order:
            state = jax.block_until_ready(fresh())
            start = time.perf_counter()
            jax.block_until_ready(run[name](state, r + 1))
            times[name].append((time.perf_counter() - start) / steps * 1e3)
        print(f"round {r}: " + ", ".join(f"{n} {times[n][-1]:.3f}" for n in args.variants))
    for name in args.variants:
        print(
            f"{name:9s} ms/step min {min(times[name]):.3f} median "
            f"{statistics.median(times[name]):.3f} ({args.rounds} rounds)"
        )
    print(
        f"jax {jax.__version__}, keras {keras.__version__}, numpy {np.__version__}, "
        f"{steps} steps of {BATCH} rows an epoch, {jax.devices()[0].device_kind}"
    )


if __name__ == "__main__":
    main()
