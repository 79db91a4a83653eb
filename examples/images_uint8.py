"""uint8 images resident on the device, normalised inside the compiled step.

    python examples/images_uint8.py

Images stay uint8 on the device -- a quarter of float32's memory (and of its
upload time) -- and the dataset's `transform` casts and scales each batch
inside the compiled step, after the gather. Lines that differ from a plain
Keras script say why in a `# shardfeed:` comment.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def synthetic_images(rows: int, seed: int = 0):
    """Ten noisy colour prototypes (32x32x3, uint8) and their labels."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 48, (10, 8, 8, 3), dtype=np.uint8).repeat(4, 1).repeat(4, 2)
    labels = rng.integers(0, 10, rows, dtype=np.int32)
    images = prototypes[labels] + rng.integers(0, 208, (rows, 32, 32, 3), dtype=np.uint8)
    return images, labels


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)

    import keras
    import tensorflow as tf

    import shardfeed

    images, labels = synthetic_images(args.rows)
    world = shardfeed.init()  # shardfeed: picks the engine from how we were started
    with world.scope():  # shardfeed: model and data live on the engine's devices
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((32, 32, 3)),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        train = shardfeed.ShardedResidentDataset(
            images[:-500],  # shardfeed: uploaded as uint8, not float32
            labels[:-500],
            per_replica_batch_size=64,
            seed=0,
            # shardfeed: runs inside the compiled step, on the gathered batch
            transform=lambda x: tf.cast(x, "float32") / 255.0,
        )
    print(train.describe())
    shardfeed.fit(model, train, epochs=args.epochs)  # shardfeed: instead of model.fit
    # shardfeed: raw uint8 arrays get the training dataset's transform
    # (transform="auto"), as fit's validation_data arrays do
    print(shardfeed.evaluate(model, images[-500:], labels[-500:], return_dict=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
