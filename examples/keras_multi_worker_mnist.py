"""TensorFlow's "Multi-worker training with Keras" tutorial, ported to shardfeed.

The tutorial's `mnist_setup.py` and `main.py` (and its saving section) in one
file; run it as the tutorial runs its workers, or alone:

    shardfeed launch -n 2 python examples/keras_multi_worker_mnist.py
    horovodrun -np 2 python examples/keras_multi_worker_mnist.py
    python examples/keras_multi_worker_mnist.py --data mnist.npz   # real MNIST

Without `--data` the images are synthetic, MNIST-shaped (28x28 uint8, 10
classes). `--rows`, `--epochs` shrink the run (CI runs it small).

The original, in order (every line not marked `# shardfeed:` is unchanged):
    mnist_setup.py:
    1. mnist_dataset(batch_size): mnist.load_data(); x_train / np.float32(255);
       y_train.astype(np.int64); Dataset.from_tensor_slices(...)
       .shuffle(60000).repeat().batch(batch_size)
    2. build_and_compile_cnn_model(): Sequential([InputLayer((28, 28)),
       Reshape((28, 28, 1)), Conv2D(32, 3, relu), Flatten, Dense 128 relu,
       Dense 10]); compile(SparseCategoricalCrossentropy(from_logits=True),
       SGD(learning_rate=0.001), metrics=['accuracy'])
    main.py:
    3. per_worker_batch_size = 64; tf_config = json.loads(os.environ['TF_CONFIG']);
       num_workers = len(tf_config['cluster']['worker'])
    4. strategy = tf.distribute.MultiWorkerMirroredStrategy()
    5. global_batch_size = per_worker_batch_size * num_workers;
       multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)
    6. with strategy.scope(): multi_worker_model = build_and_compile_cnn_model()
    7. multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
    saving section:
    8. write_filepath(...): the chief writes model_path, others a temporary
       directory they delete; multi_worker_model.save(write_model_path)
"""

import argparse  # shardfeed: --data/--rows/--epochs, for CI's small runs
import os

import numpy as np
import tensorflow as tf

import shardfeed  # shardfeed

args = argparse.ArgumentParser()  # shardfeed: small runs and real data by path
args.add_argument("--data", help="MNIST as Keras' mnist.npz (x_train, y_train)")  # shardfeed
args.add_argument("--rows", type=int, default=60000)  # shardfeed
args.add_argument("--epochs", type=int, default=3)  # shardfeed
args.add_argument("--model-path", default="/tmp/keras-model.keras")  # shardfeed: .keras
args = args.parse_args()  # shardfeed


def mnist_dataset(batch_size):
    if args.data:  # shardfeed: real MNIST by path, else synthetic of its shape
        with np.load(args.data) as mnist:
            x_train, y_train = mnist["x_train"][: args.rows], mnist["y_train"][: args.rows]
    else:
        rng = np.random.default_rng(0)  # shardfeed
        y_train = rng.integers(0, 10, size=args.rows).astype("uint8")  # shardfeed
        noise = rng.integers(0, 64, size=(args.rows, 28, 28))  # shardfeed
        x_train = (noise + 19 * y_train[:, None, None]).astype("uint8")  # shardfeed: learnable
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    # shardfeed: uint8 rows stay on the device; the conversion runs inside the step.
    y_train = y_train.astype(np.int64)
    train_dataset = shardfeed.ShardedResidentDataset(  # shardfeed: instead of tf.data
        x_train, y_train, per_replica_batch_size=batch_size, seed=0,  # shardfeed
        transform=lambda x: tf.cast(x, tf.float32) / np.float32(255))  # shardfeed
    return train_dataset


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(shape=(28, 28)),  # shardfeed: Keras 3 spells it `shape`
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=['accuracy'])
    return model


per_worker_batch_size = 64
# shardfeed: no TF_CONFIG parsing: the world knows the workers.
world = shardfeed.init()  # shardfeed: MWMS under `shardfeed launch`/TF_CONFIG, Horovod, ...
num_workers = world.world_size  # shardfeed

# shardfeed: the batch is per replica; the global batch is per_worker_batch_size * num_workers.
with world.scope():
    multi_worker_dataset = mnist_dataset(per_worker_batch_size)  # shardfeed: per replica
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

# shardfeed: an epoch is one pass over the rows (steps_per_epoch=70 in the original)
shardfeed.fit(multi_worker_model, multi_worker_dataset, epochs=args.epochs)

# shardfeed: the chief writes, the others wait; no temporary directories to delete.
shardfeed.save_model(multi_worker_model, args.model_path)
if world.is_chief:  # shardfeed: report the saved file once
    print("saved", os.path.basename(args.model_path))
