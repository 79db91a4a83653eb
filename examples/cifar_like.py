"""A small CNN on CIFAR-shaped images with on-device augmentation.

    python examples/cifar_like.py                       # synthetic 32x32x3 uint8 data
    python examples/cifar_like.py --tfrecord 'train-*.tfrecord'   # image (PNG/JPEG) + label
    python examples/cifar_like.py --tfds cifar10        # needs tensorflow_datasets
    shardfeed launch --num-workers 2 examples/cifar_like.py       # unchanged on 2 workers

The images stay uint8 on the device; each training batch is gathered, cast
and scaled (`transform`) and augmented -- each image its own flip and shift
by up to 2 pixels with reflection, airbench's recipe -- inside the compiled
step (`augment`). Evaluation sees the images unaugmented. Lines that differ
from a plain Keras script say why in a `# shardfeed:` comment.
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


def build_model():
    import keras
    from keras import layers

    def block(filters):
        return [
            layers.Conv2D(filters, 3, padding="same", use_bias=False),
            layers.MaxPooling2D(),
            layers.BatchNormalization(),
            layers.ReLU(),
        ]

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((32, 32, 3)), *block(16), *block(32), layers.GlobalMaxPooling2D(),
         layers.Dense(10)]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000, help="synthetic rows")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128, help="per replica")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--tfrecord", help="glob of TFRecord files: 'image' (PNG/JPEG), 'label'")
    source.add_argument("--tfds", help="a tensorflow_datasets name, e.g. cifar10")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import shardfeed
    from shardfeed import augment, files

    world = shardfeed.init()  # shardfeed: picks the engine from how we were started
    options = dict(
        per_replica_batch_size=args.batch,
        seed=0,
        # shardfeed: uint8 on the device; cast and scaled per batch inside the step
        transform=lambda x: tf.cast(x, "float32") / 255.0,
        # shardfeed: per-image flip and translate(2), drawn from (seed, epoch, step,
        # replica) inside the compiled step; training batches only
        augment=augment.compose(augment.flip_left_right(), augment.translate(2)),
    )
    with world.scope():  # shardfeed: model and data live on the engine's devices
        model = build_model()
        if args.tfrecord:
            # shardfeed: each worker reads only the files holding its rows; images
            # are decoded once, here, to uint8
            cols = files.tfrecord(
                args.tfrecord,
                {
                    "image": tf.io.FixedLenFeature([], tf.string),
                    "label": tf.io.FixedLenFeature([], tf.int64),
                },
                images={"image": (32, 32, 3)},
            )
            train = shardfeed.ShardedResidentDataset(cols["image"], cols["label"], **options)
        elif args.tfds:
            import tensorflow_datasets as tfds

            pipeline = tfds.load(args.tfds, split="train", as_supervised=True)
            # shardfeed: each worker drains pipeline.shard(workers, rank) into its devices
            train = shardfeed.ShardedResidentDataset.from_tf_dataset(pipeline, **options)
        else:
            images, labels = synthetic_images(args.rows)
            train = shardfeed.ShardedResidentDataset(images, labels, **options)
    if world.is_chief:
        print(train.describe())
    shardfeed.fit(model, train, epochs=args.epochs, verbose=2)  # shardfeed: instead of model.fit
    # shardfeed: exact, global, on the unaugmented rows
    scores = shardfeed.evaluate(model, train, return_dict=True)
    if world.is_chief:
        print("evaluate:", {k: round(float(v), 4) for k, v in scores.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
