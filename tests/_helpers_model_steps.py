"""Models with their own steps, shared by tests/_tf/test_model_steps.py and its worker.

Written as Keras' guide "Customizing what happens in fit()" writes them. Each
counts its step calls in a `tf.Variable` (a Python counter would count traces,
not steps) and the rows its steps saw.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

ROWS = 100  # batch 16: 6 full steps and a partial last step of 4 rows


def regression_data(rows: int = ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = (x @ rng.normal(size=(4, 1)) + 0.1 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


def _counter() -> tf.Variable:
    return tf.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM,
    )


class Counting(keras.Model):
    """A small regression model whose steps count their calls and rows."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.out = keras.layers.Dense(1)
        # Sync-on-read sums: each replica counts its own; a read sums them all.
        self.step_calls = _counter()
        self.rows_seen = _counter()

    def call(self, x):
        return self.out(self.hidden(x))

    def _count(self, x) -> None:
        self.step_calls.assign_add(1)
        self.rows_seen.assign_add(tf.cast(tf.shape(x)[0], tf.int64))


class CustomTrainStep(Counting):
    """The guide's "Going lower-level": its own loss tracker and a custom
    metric, an uncompiled loss, `self.optimizer.apply`."""

    def __init__(self) -> None:
        super().__init__()
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.my_metric = keras.metrics.MeanAbsoluteError(name="my_custom_metric")

    def train_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        self._count(x)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = keras.ops.mean(keras.losses.mean_squared_error(y, y_pred))
            # Under a strategy each replica's share of the global mean.
            loss_for_grads = loss / tf.distribute.get_strategy().num_replicas_in_sync
        grads = tape.gradient(loss_for_grads, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.my_metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self):
        return [self.loss_tracker, self.my_metric]


class AssignUpdates(Counting):
    """Plain SGD written out with `assign_sub`: no optimizer sees the gradients."""

    def train_step(self, data):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.mean_squared_error(y, self(x, training=True)))
        for v, g in zip(self.trainable_variables, tape.gradient(loss, self.trainable_variables),
                        strict=True):
            v.assign_sub(0.05 * g)
        return {"loss": loss}

    @classmethod
    def built(cls) -> AssignUpdates:
        model = cls()
        model.compile(optimizer="sgd")
        model(np.zeros((1, 4), "float32"))
        return model


def custom_train_step_model() -> CustomTrainStep:
    keras.utils.set_random_seed(3)
    model = CustomTrainStep()
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    model(np.zeros((1, 4), "float32"))
    return model


class GAN(keras.Model):
    """The guide's GAN: two models, two optimizers, no `call`, trained on `x` alone."""

    latent_dim = 3

    def __init__(self) -> None:
        super().__init__()
        self.discriminator = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
        )
        self.generator = keras.Sequential(
            [keras.Input((self.latent_dim,)), keras.layers.Dense(8, activation="relu"),
             keras.layers.Dense(4)]
        )
        self.seed_generator = keras.random.SeedGenerator(11)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, real):
        if isinstance(real, tuple):
            real = real[0]
        batch = tf.shape(real)[0]
        noise = keras.random.normal((batch, self.latent_dim), seed=self.seed_generator)
        fake = self.generator(noise)
        images = tf.concat([fake, real], axis=0)
        labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        weights = self.discriminator.trainable_weights
        self.d_optimizer.apply_gradients(zip(tape.gradient(d_loss, weights), weights, strict=True))
        noise = keras.random.normal((batch, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(
                tf.zeros((batch, 1)), self.discriminator(self.generator(noise))
            )
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights, strict=True))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def gan_model() -> GAN:
    keras.utils.set_random_seed(5)
    model = GAN()
    model.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3))
    return model
