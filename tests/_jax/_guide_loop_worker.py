"""Keras' guide "Writing a training loop from scratch in JAX" (keras-io
`guides/writing_a_custom_training_loop_in_jax.py`), run as a worker script
(`shardfeed launch -n 2`) by tests/_jax/test_guide_loop_jax.py; not a test module.

The guide's code, unseeded, building its two models, but for the lines
marked `# shardfeed:` (the dataset lines, and `shardfeed.init()` first) and
`# JAX 0.10:` (a jit argument must be an array, not a Keras Variable). MNIST
is replaced by rows of its shapes around 10 random centres (no download).
Writes `<out>.rank<r>.npz`: both models' weights and the second's training
and validation accuracy.
"""

# The guide's code as written: its `zip`s and its eval loop's unused `step`.
# ruff: noqa: B905, B007

from __future__ import annotations

import argparse

import jax
import keras
import numpy as np

import shardfeed

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

world = shardfeed.init()  # shardfeed: the devices of every worker


def get_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


model = get_model()

# Prepare the training dataset.
batch_size = 32
data_rng = np.random.default_rng(0)  # shardfeed: MNIST's shapes, 10 blobs, no download
labels = data_rng.integers(0, 10, 2560)
x_train = data_rng.normal(size=(10, 784))[labels] + data_rng.normal(size=(2560, 784)) * 2
x_train = x_train.astype("float32")
y_train = keras.utils.to_categorical(labels)

# Reserve 512 samples for validation.
x_val = x_train[-512:]
y_val = y_train[-512:]
x_train = x_train[:-512]
y_train = y_train[:-512]

# shardfeed: resident rows, each replica's batch on its own device (was tf.data).
train_dataset = shardfeed.ShardedResidentDataset(
    x_train, y_train, per_replica_batch_size=batch_size, seed=1024
)
val_dataset = shardfeed.ShardedResidentDataset(
    x_val, y_val, per_replica_batch_size=batch_size, shuffle=False
)

# Instantiate a loss function.
loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

# Instantiate an optimizer.
optimizer = keras.optimizers.Adam(learning_rate=1e-3)


def compute_loss_and_updates(trainable_variables, non_trainable_variables, x, y):
    y_pred, non_trainable_variables = model.stateless_call(
        trainable_variables, non_trainable_variables, x, training=True
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
    # Return updated state
    return loss, (
        trainable_variables,
        non_trainable_variables,
        optimizer_variables,
    )


# Build optimizer variables.
optimizer.build(model.trainable_variables)

trainable_variables = [v.value for v in model.trainable_variables]  # JAX 0.10: arrays
non_trainable_variables = [v.value for v in model.non_trainable_variables]  # JAX 0.10
optimizer_variables = [v.value for v in optimizer.variables]  # JAX 0.10
state = trainable_variables, non_trainable_variables, optimizer_variables

# Training loop
for step, data in train_dataset.epoch(0):  # shardfeed: was enumerate(train_dataset)
    data = (data.x, data.y)  # shardfeed: the batch is on the devices already
    loss, state = train_step(state, data)
    # Log every 100 batches.
    if step % 100 == 0:
        print(f"Training loss (for 1 batch) at step {step}: {float(loss):.4f}")
        print(f"Seen so far: {(step + 1) * batch_size} samples")

trainable_variables, non_trainable_variables, optimizer_variables = state
for variable, value in zip(model.trainable_variables, trainable_variables):
    variable.assign(value)
for variable, value in zip(model.non_trainable_variables, non_trainable_variables):
    variable.assign(value)
first_weights = model.get_weights()

# Low-level handling of metrics: a fresh model.
model = get_model()

# Instantiate an optimizer to train the model.
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
# Instantiate a loss function.
loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)

# Prepare the metrics.
train_acc_metric = keras.metrics.CategoricalAccuracy()
val_acc_metric = keras.metrics.CategoricalAccuracy()


def compute_loss_and_updates(  # the guide redefines it for the fresh model
    trainable_variables, non_trainable_variables, metric_variables, x, y
):
    y_pred, non_trainable_variables = model.stateless_call(
        trainable_variables, non_trainable_variables, x
    )
    loss = loss_fn(y, y_pred)
    metric_variables = train_acc_metric.stateless_update_state(metric_variables, y, y_pred)
    return loss, (non_trainable_variables, metric_variables)


grad_fn = jax.value_and_grad(compute_loss_and_updates, has_aux=True)


@jax.jit
def train_step(state, data):
    (
        trainable_variables,
        non_trainable_variables,
        optimizer_variables,
        metric_variables,
    ) = state
    x, y = data
    (loss, (non_trainable_variables, metric_variables)), grads = grad_fn(
        trainable_variables,
        non_trainable_variables,
        metric_variables,
        x,
        y,
    )
    trainable_variables, optimizer_variables = optimizer.stateless_apply(
        optimizer_variables, grads, trainable_variables
    )
    # Return updated state
    return loss, (
        trainable_variables,
        non_trainable_variables,
        optimizer_variables,
        metric_variables,
    )


@jax.jit
def eval_step(state, data):
    trainable_variables, non_trainable_variables, metric_variables = state
    x, y = data
    y_pred, non_trainable_variables = model.stateless_call(
        trainable_variables, non_trainable_variables, x
    )
    loss = loss_fn(y, y_pred)
    metric_variables = val_acc_metric.stateless_update_state(metric_variables, y, y_pred)
    return loss, (
        trainable_variables,
        non_trainable_variables,
        metric_variables,
    )


# Build optimizer variables.
optimizer.build(model.trainable_variables)

trainable_variables = [v.value for v in model.trainable_variables]  # JAX 0.10: arrays
non_trainable_variables = [v.value for v in model.non_trainable_variables]  # JAX 0.10
optimizer_variables = [v.value for v in optimizer.variables]  # JAX 0.10
metric_variables = [v.value for v in train_acc_metric.variables]  # JAX 0.10
state = (
    trainable_variables,
    non_trainable_variables,
    optimizer_variables,
    metric_variables,
)

# Training loop
for step, data in train_dataset.epoch(0):  # shardfeed: was enumerate(train_dataset)
    data = (data.x, data.y)  # shardfeed
    loss, state = train_step(state, data)
    # Log every 100 batches.
    if step % 100 == 0:
        print(f"Training loss (for 1 batch) at step {step}: {float(loss):.4f}")
        _, _, _, metric_variables = state
        for variable, value in zip(train_acc_metric.variables, metric_variables):
            variable.assign(value)
        print(f"Training accuracy: {train_acc_metric.result()}")
        print(f"Seen so far: {(step + 1) * batch_size} samples")
_, _, _, metric_variables = state
for variable, value in zip(train_acc_metric.variables, metric_variables):
    variable.assign(value)

metric_variables = [v.value for v in val_acc_metric.variables]  # JAX 0.10
(
    trainable_variables,
    non_trainable_variables,
    optimizer_variables,
    _,
) = state
state = (
    trainable_variables,
    non_trainable_variables,
    metric_variables,
)

# Eval loop
for step, data in val_dataset.epoch(0, training=False):  # shardfeed: was enumerate(val_dataset)
    data = (data.x, data.y)  # shardfeed
    loss, state = eval_step(state, data)
_, _, metric_variables = state
for variable, value in zip(val_acc_metric.variables, metric_variables):
    variable.assign(value)
print(f"Validation accuracy: {val_acc_metric.result()}")

for variable, value in zip(model.trainable_variables, trainable_variables):
    variable.assign(value)
np.savez(
    f"{args.out}.rank{world.rank}.npz",
    first=np.concatenate([w.ravel() for w in first_weights]),
    second=np.concatenate([w.ravel() for w in model.get_weights()]),
    train_accuracy=float(train_acc_metric.result()),
    val_accuracy=float(val_acc_metric.result()),
)
