"""Horovod's `examples/tensorflow2/tensorflow2_keras_mnist.py`, ported to shardfeed.

Runs as Horovod users run the original, and under shardfeed's own launcher:

    horovodrun -np 2 python examples/horovod_keras_mnist.py
    shardfeed launch -n 2 python examples/horovod_keras_mnist.py
    python examples/horovod_keras_mnist.py --data mnist.npz   # real MNIST (Keras' npz)

Without `--data` the images are synthetic, MNIST-shaped (28x28 uint8, 10
classes). `--rows`, `--epochs` shrink the run (CI runs it small).

The original, in order (every line not marked `# shardfeed:` below is
unchanged):
    1. import tensorflow, horovod.tensorflow.keras as hvd; hvd.init()
    2. pin one GPU per process (set_memory_growth, set_visible_devices)
    3. (mnist_images, mnist_labels) = tf.keras.datasets.mnist.load_data(...)
    4. dataset = tf.data.Dataset.from_tensor_slices((images / 255.0, labels))
       .repeat().shuffle(10000).batch(128)
    5. mnist_model = Sequential([Conv2D 32, Conv2D 64, MaxPooling2D, Dropout,
       Flatten, Dense 128, Dropout, Dense 10 softmax])
    6. scaled_lr = 0.001 * hvd.size(); opt = Adam(scaled_lr);
       opt = hvd.DistributedOptimizer(opt, ...)
    7. mnist_model.compile(loss=SparseCategoricalCrossentropy(), optimizer=opt,
       metrics=['accuracy'], experimental_run_tf_function=False)
    8. callbacks = [BroadcastGlobalVariablesCallback(0), MetricAverageCallback(),
       LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1)]
    9. if hvd.rank() == 0: callbacks.append(ModelCheckpoint('./checkpoint-{epoch}.h5'))
   10. verbose = 1 if hvd.rank() == 0 else 0
   11. mnist_model.fit(dataset, steps_per_epoch=500 // hvd.size(),
       callbacks=callbacks, epochs=24, verbose=verbose)

On Keras 3 the original does not run (horovod.tensorflow.keras's callbacks
fail and its DistributedOptimizer silently does not average; horovod #4290):
shardfeed averages gradients itself, broadcasts rank 0's weights at set-up
and logs global metrics, so lines 6's wrapper and 8's first two callbacks go.
"""

import argparse  # shardfeed: --data/--rows/--epochs, for CI's small runs

import numpy as np  # shardfeed: synthetic images
import tensorflow as tf

import shardfeed  # shardfeed: instead of horovod.tensorflow.keras

args = argparse.ArgumentParser()  # shardfeed: small runs and real data by path
args.add_argument("--data", help="MNIST as Keras' mnist.npz (x_train, y_train)")  # shardfeed
args.add_argument("--rows", type=int, default=60000)  # shardfeed
args.add_argument("--epochs", type=int, default=24)  # shardfeed
args.add_argument("--checkpoint-dir", default=".")  # shardfeed
args = args.parse_args()  # shardfeed

# Horovod: initialize Horovod.
world = shardfeed.init()  # shardfeed: picks Horovod under horovodrun, else MWMS / one device

# Horovod: pin GPU to be used to process local rank (one GPU per process)
# shardfeed: init() does the pinning (one GPU per Horovod process).

if args.data:  # shardfeed: real MNIST by path, else synthetic of its shape
    with np.load(args.data) as mnist:
        mnist_images, mnist_labels = mnist["x_train"][: args.rows], mnist["y_train"][: args.rows]
else:
    rng = np.random.default_rng(0)  # shardfeed
    mnist_labels = rng.integers(0, 10, size=args.rows).astype("uint8")  # shardfeed
    noise = rng.integers(0, 64, size=(args.rows, 28, 28))  # shardfeed
    mnist_images = (noise + 19 * mnist_labels[:, None, None]).astype("uint8")  # shardfeed

with world.scope():  # shardfeed: a no-op under Horovod; MWMS builds the model here
    # shardfeed: uint8 rows stay on the device; the cast and scaling run in the step.
    dataset = shardfeed.ShardedResidentDataset(
        mnist_images[..., np.newaxis], mnist_labels.astype("int64"),
        per_replica_batch_size=128, seed=0,
        transform=lambda x: tf.cast(x, tf.float32) / 255.0,
    )

    mnist_model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),  # shardfeed: Keras 3 builds the model before fit
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.001 * world.num_replicas_in_sync  # shardfeed: replicas, not hvd.size()
    opt = tf.keras.optimizers.Adam(scaled_lr)

    # shardfeed: no DistributedOptimizer: shardfeed.fit averages the gradients.

    mnist_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'])  # shardfeed: no experimental_run_tf_function

callbacks = [
    # shardfeed: no BroadcastGlobalVariablesCallback / MetricAverageCallback: shardfeed
    # broadcasts rank 0's weights at set-up and logs global metrics on every rank.

    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first three epochs. See https://arxiv.org/abs/1706.02677 for details.
    tf.keras.callbacks.LearningRateScheduler(  # shardfeed: Keras' own warm-up callback
        lambda epoch, lr: scaled_lr * min(1.0, (epoch + 1) / 3), verbose=1),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if world.rank == 0:  # shardfeed: world.rank
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(
        args.checkpoint_dir + '/checkpoint-{epoch}.keras'))  # shardfeed: dir, .keras

# Horovod: write logs on worker 0.
verbose = 1 if world.rank == 0 else 0  # shardfeed: world.rank

# Train the model.
# shardfeed: an epoch is one pass over the rows (steps_per_epoch=500 // hvd.size() in the original)
shardfeed.fit(mnist_model, dataset, callbacks=callbacks, epochs=args.epochs, verbose=verbose)
