"""A GAN with its own `train_step` (Keras' guide "Customizing what happens in fit()").

    python examples/custom_train_step.py                   # one device
    python examples/custom_train_step.py --cpu-devices 2   # two local devices (MirroredStrategy)
    shardfeed launch --num-workers 2 examples/custom_train_step.py
    horovodrun -np 2 --gloo python examples/custom_train_step.py

The generator learns to draw points on the unit circle from 3 noise values
(on one CPU, 10 epochs took `radius_error` from 0.58 to 0.39, noisily, as
GANs train); the discriminator tells them from real ones. `train_step` is the guide's,
two optimizers and all, plus a custom metric (`radius_error`: how far the
generated points lie from the circle) that the step updates and History
shows. `shardfeed.fit` calls the step inside its compiled multi-step loop
with each resident batch as `data`, exactly as `model.fit` would.
Lines that differ from a plain Keras script say why in a `# shardfeed:`
comment.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--per-replica-batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-devices", type=int, default=0, help="split the CPU into N devices")
    return p.parse_args(argv)


def circle(rows, seed):
    angle = np.random.default_rng(seed).uniform(0, 2 * np.pi, rows)
    return np.stack([np.cos(angle), np.sin(angle)], axis=1).astype("float32")


def main(argv=None):
    args = parse_args(argv)
    import keras
    import tensorflow as tf

    import shardfeed

    latent_dim = 3

    class GAN(keras.Model):
        def __init__(self, discriminator, generator):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.seed_generator = keras.random.SeedGenerator(args.seed)
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
            self.radius_error = keras.metrics.Mean(name="radius_error")

        def compile(self, d_optimizer, g_optimizer):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker, self.radius_error]

        def train_step(self, real):
            if isinstance(real, tuple):
                real = real[0]
            batch = tf.shape(real)[0]
            noise = keras.random.normal((batch, latent_dim), seed=self.seed_generator)
            fake = self.generator(noise)
            points = tf.concat([fake, real], axis=0)
            labels = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(points))
            weights = self.discriminator.trainable_weights
            grads = tape.gradient(d_loss, weights)
            self.d_optimizer.apply_gradients(zip(grads, weights, strict=True))

            noise = keras.random.normal((batch, latent_dim), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                fake = self.generator(noise)
                g_loss = self.loss_fn(tf.zeros((batch, 1)), self.discriminator(fake))
            weights = self.generator.trainable_weights
            grads = tape.gradient(g_loss, weights)
            self.g_optimizer.apply_gradients(zip(grads, weights, strict=True))

            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            self.radius_error.update_state(tf.abs(tf.norm(fake, axis=1) - 1.0))
            return {m.name: m.result() for m in self.metrics}

    # shardfeed: picks the engine from how we were started; --cpu-devices N splits a CPU.
    world = shardfeed.init(cpu_devices=args.cpu_devices or None)
    with world.scope():  # shardfeed: model and data live on the engine's devices
        keras.utils.set_random_seed(args.seed)
        discriminator = keras.Sequential(
            [keras.Input((2,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
        )
        generator = keras.Sequential(
            [keras.Input((latent_dim,)), keras.layers.Dense(32, activation="relu"),
             keras.layers.Dense(2)]
        )
        gan = GAN(discriminator, generator)
        gan.compile(
            d_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
            g_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
        )
        # shardfeed: uploaded once; batches are gathered on the device. No `y`:
        # the model's own step needs only the points, as with `model.fit(x)`.
        points = shardfeed.ShardedResidentDataset(
            circle(args.rows, args.seed),
            per_replica_batch_size=args.per_replica_batch_size,
            seed=args.seed,
        )

    history = shardfeed.fit(  # shardfeed: instead of gan.fit
        gan, points, epochs=args.epochs, verbose=2 if world.is_chief else 0
    )
    if world.is_chief:
        print(json.dumps({"final": {k: v[-1] for k, v in history.history.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
