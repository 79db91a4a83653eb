"""Ranks that disagree, on two `jax.distributed` processes on 127.0.0.1.

`fit`'s own arguments: one `fit` per case of `tests/_ranks_worker.FIT_CASES`,
each with one argument other on rank 1 (epochs, steps per epoch,
validation data, steps per call); both ranks raise the same words
(`_common/agreement.py`), then train together. Before, such a rank waited in
a collective the other never joined.

A user's own loop (Keras' JAX guide's, on the resident batches): a model
seeded per rank trains to other weights on each process; after `shardfeed.sync_model`
both end with the same (`_common/model_sync.py`); `iterator(model=)`,
`save_model`, `predict` and `evaluate` refuse the first (its processes hold
other weights) and take the second.
"""

from __future__ import annotations

import keras
from _helpers_jax import run_jax_processes
from _ranks_worker import assert_fit_case_outcomes  # the cases, shared with TensorFlow's tier

FIT_ARGS_CHILD = """
import json, sys
sys.path[:0] = ["tests/_jax", "tests"]
import jax
port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
import keras
import shardfeed
from _ranks_worker import _arrays, fit_setting_outcomes
world = shardfeed.init()
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = _arrays("same", world.rank)
ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=50, seed=0)
outcomes = fit_setting_outcomes(shardfeed, model, ds, x, y, world.rank, world.scope)
print("RESULT " + json.dumps("\\n".join(outcomes)))
"""


def test_two_processes_with_other_fit_arguments_both_raise():
    assert_fit_case_outcomes(run_jax_processes(FIT_ARGS_CHILD))


# Keras' guide "Writing a training loop from scratch" (JAX), on the resident
# rows: its code, but for the lines marked `# shardfeed:`. `SYNC` decides
# whether the script calls `shardfeed.sync_model` before reading the state.
GUIDE_LOOP_CHILD = """
import json, sys
import jax
port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, coordinator_bind_address=f"127.0.0.1:{port}",
                           initialization_timeout=60)
import keras
import numpy as np
import shardfeed

world = shardfeed.init()                                          # shardfeed: the devices
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
dataset = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=16, seed=0)

def get_model():
    inputs = keras.Input(shape=(8,), name="digits")
    x1 = keras.layers.Dense(16, activation="relu")(inputs)
    x2 = keras.layers.Dense(16, activation="relu")(x1)
    outputs = keras.layers.Dense(1, name="predictions")(x2)
    return keras.Model(inputs=inputs, outputs=outputs)

# Seeded per rank on purpose (say, for other draws per process): kept as it
# is, so the models start apart (`shardfeed.init` agrees Keras' seed only
# for a script that did not seed it).
keras.utils.set_random_seed(world.rank)
weights = {}
for sync in (False, True):
    model = get_model()
    loss_fn = keras.losses.MeanSquaredError()
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)

    def compute_loss_and_updates(trainable_variables, non_trainable_variables, x, y):
        y_pred, non_trainable_variables = model.stateless_call(
            trainable_variables, non_trainable_variables, x
        )
        loss = loss_fn(y, y_pred)
        return loss, non_trainable_variables

    grad_fn = jax.value_and_grad(compute_loss_and_updates, has_aux=True)

    @jax.jit
    def train_step(state, data):
        trainable_variables, non_trainable_variables, optimizer_variables = state
        x, y = data
        (loss, non_trainable_variables), grads = grad_fn(
            trainable_variables, non_trainable_variables, x, y
        )
        trainable_variables, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable_variables
        )
        return loss, (trainable_variables, non_trainable_variables, optimizer_variables)

    optimizer.build(model.trainable_variables)
    if sync:
        shardfeed.sync_model(model)                               # shardfeed: rank 0's start
    try:  # the opt-in check before the first step
        dataset.iterator(model=model)
        weights[f"iterator {sync}"] = "ok"
    except ValueError as err:
        weights[f"iterator {sync}"] = str(err)
    # JAX 0.10 no longer takes a Keras Variable as a jit argument (`__jax_array__`): values.
    trainable_variables = [v.value for v in model.trainable_variables]
    non_trainable_variables = [v.value for v in model.non_trainable_variables]
    optimizer_variables = [v.value for v in optimizer.variables]
    state = trainable_variables, non_trainable_variables, optimizer_variables

    for epoch in dataset.iterator().epochs(1):                    # shardfeed: resident batches
        for step, batch in epoch:
            loss, state = train_step(state, (batch.x, batch.y))

    trainable_variables, non_trainable_variables, optimizer_variables = state
    for variable, value in zip(model.trainable_variables, trainable_variables):
        variable.assign(value)
    weights[str(sync)] = [np.asarray(w).tolist() for w in model.get_weights()]
    try:
        shardfeed.save_model(model, sys.argv[3])
        weights[f"save {sync}"] = "ok"
    except ValueError as err:
        weights[f"save {sync}"] = str(err)
    # predict and evaluate read the weights too: refused alike when they differ.
    model.compile(loss="mse")
    for name, call in (("predict", lambda: shardfeed.predict(model, x).sum().item()),
                       ("evaluate", lambda: shardfeed.evaluate(model, x, y))):
        try:
            weights[f"{name} {sync}"] = call()
        except ValueError as err:
            weights[f"{name} {sync}"] = str(err)
print("RESULT " + json.dumps(weights))
"""


def test_the_guides_own_loop_ends_with_the_same_weights_on_both_processes(tmp_path):
    saved = tmp_path / "model.keras"
    results = run_jax_processes(GUIDE_LOOP_CHILD, [str(saved)])
    unsynced, synced = ([r[k] for r in results] for k in ("False", "True"))
    # Seeded per rank and unsynced: each process trains its own start...
    assert unsynced[0] != unsynced[1]
    # ...and `save_model` refuses on both rather than write rank 0's alone (before: rc 0).
    for result in results:
        assert result["save False"] == (
            f"Every worker must hold the same weights to save one model file ({saved}): the "
            "workers trained one model only if they started from the same values. Received: "
            "variable dense/kernel differs on ranks [1] from rank 0 (3 of 6 variables differ). "
            "Call `shardfeed.sync_model(model)` on every worker after building the model and "
            "its optimizer and before your loop's first step (or seed Keras alike on every "
            "worker: `keras.utils.set_random_seed(0)` before building); `shardfeed.fit` does "
            "this itself."
        )  # the kernels; the biases start at zeros
    # `dataset.iterator(model=model)` refuses them before the loop's first step.
    for result in results:
        assert result["iterator False"].startswith(
            "Every worker must hold the same weights to start a training loop of your own: "
            "the workers trained one model only if they started from the same values. "
            "Received: variable dense/kernel differs on ranks [1] from rank 0 (3 of 6 variables "
            "differ). Call `shardfeed.sync_model(model)`"
        )
        assert result["iterator True"] == "ok"
    # `predict` and `evaluate` refuse them too (before: a blend of the two
    # processes' weights, returned without a word).
    for result in results:
        for name in ("predict", "evaluate"):
            assert result[f"{name} False"].startswith(
                f"Every worker must hold the same weights to {name}: the workers trained one "
                "model only if they started from the same values. Received: variable "
                "dense/kernel differs on ranks [1] from rank 0 (3 of 6 variables differ)."
            )
    # After `sync_model`, both processes step one model: it saves, predicts
    # and evaluates, with the same results on both.
    assert synced[0] == synced[1]
    assert [r["save True"] for r in results] == ["ok", "ok"]
    for name in ("predict", "evaluate"):
        assert results[0][f"{name} True"] == results[1][f"{name} True"]
        assert isinstance(results[0][f"{name} True"], float)
    assert [w.tolist() for w in keras.models.load_model(saved).get_weights()] == synced[0]
