# Copyright 2019 Uber Technologies, Inc. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""Horovod's `examples/tensorflow2/tensorflow2_mnist.py` on a resident dataset.

The original's GradientTape loop with `hvd.DistributedGradientTape`, fed by
`ShardedResidentDataset.epoch()` instead of tf.data. Every line not marked
`# shardfeed:` is the original's (this docstring is new; the model and optimizer
are indented under `with strategy.scope():`). One file runs every way:

    horovodrun -np 2 python examples/horovod_tf2_mnist.py       # Horovod
    shardfeed launch -n 2 python examples/horovod_tf2_mnist.py  # 2 workers (MWMS)
    python examples/horovod_tf2_mnist.py --cpu-devices 2        # MirroredStrategy
    python examples/horovod_tf2_mnist.py --data-dir DIR         # real MNIST (IDX)

Horovod is needed only under horovodrun: elsewhere `shardfeed.init()` picks
tf.distribute, `strategy.run` runs the same step, and the optimizer sums the
replicas' gradients of Keras' replica-scaled loss (their average). Without
`--data-dir` the images are synthetic; `--steps` is the original's 10000.
"""
import argparse  # shardfeed: --data-dir/--steps/--cpu-devices for small runs
import itertools  # shardfeed: repeat() as one epoch after another

import tensorflow as tf

# shardfeed: `import horovod.tensorflow as hvd` moved into main(), for horovodrun only.
import mnist_data  # shardfeed: IDX files by path, or synthetic MNIST-shaped images
import shardfeed  # shardfeed

parser = argparse.ArgumentParser()  # shardfeed: small runs and real data by path
parser.add_argument("--data-dir", help="MNIST's four IDX files (else synthetic)")  # shardfeed
parser.add_argument("--rows", type=int, default=None)  # shardfeed: first rows only
parser.add_argument("--steps", type=int, default=10000)  # shardfeed: the original's 10000
parser.add_argument("--cpu-devices", type=int, default=0)  # shardfeed: Mirrored on a CPU
parser.add_argument("--checkpoint-dir", default="./checkpoints")  # shardfeed
args = parser.parse_args()  # shardfeed


def main():
    # Horovod: initialize Horovod.
    # shardfeed: Horovod under horovodrun, else tf.distribute (--cpu-devices N: N logical CPUs)
    world = shardfeed.init(cpu_devices=args.cpu_devices or None)  # shardfeed
    strategy = world.strategy  # shardfeed: the default strategy under Horovod
    if world.backend == "horovod":  # shardfeed: Horovod only where it runs
        import horovod.tensorflow as hvd  # shardfeed

    # Horovod: pin GPU to be used to process local rank (one GPU per process)
    # shardfeed: shardfeed.init() pins one GPU per Horovod process.

    (mnist_images, mnist_labels), _ = \
        mnist_data.load_data(args.data_dir, args.rows)  # shardfeed: IDX or synthetic

    with strategy.scope():  # shardfeed: model, optimizer and rows on the replicas' devices
        dataset = shardfeed.ShardedResidentDataset(  # shardfeed: resident, no tf.data
            mnist_images[..., tf.newaxis], mnist_labels.astype("int64"),  # shardfeed
            per_replica_batch_size=128, seed=0,  # shardfeed: batch(128), shuffled
            drop_remainder=True,  # shardfeed: full batches only, as repeat().batch() gives
            transform=lambda x: tf.cast(x, tf.float32) / 255.0)  # shardfeed: on the device

        mnist_model = tf.keras.Sequential([
            tf.keras.Input((28, 28, 1)),  # shardfeed: variables exist before the step
            tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
            tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
            tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
            tf.keras.layers.Dropout(0.25),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(128, activation='relu'),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(10, activation='softmax')
        ])
        loss = tf.losses.SparseCategoricalCrossentropy()

        # Horovod: adjust learning rate based on number of GPUs.
        opt = tf.optimizers.Adam(0.001 * world.num_replicas_in_sync)  # shardfeed: replicas
        opt.build(mnist_model.trainable_variables)  # shardfeed: not inside strategy.run

    checkpoint_dir = args.checkpoint_dir  # shardfeed: by flag
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        if world.backend == "horovod":  # shardfeed: tf.distribute sums in apply_gradients
            tape = hvd.DistributedGradientTape(tape)

        # shardfeed: Keras 3 variables: the tape watches their values (horovod #4290).
        grads = tape.gradient(loss_value,  # shardfeed
                              [v.value for v in mnist_model.trainable_variables])  # shardfeed
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        # This is necessary to ensure consistent initialization of all workers when
        # training is started with random weights or restored from a checkpoint.
        #
        # Note: broadcast should be done after the first gradient step to ensure optimizer
        # initialization.
        # shardfeed: Keras 3: broadcast the variables' values; tf.distribute mirrors them itself.
        if first_batch and world.backend == "horovod":  # shardfeed
            hvd.broadcast_variables(  # shardfeed
                [v.value for v in mnist_model.variables], root_rank=0)  # shardfeed
            hvd.broadcast_variables([v.value for v in opt.variables], root_rank=0)  # shardfeed

        return loss_value

    @tf.function  # shardfeed: one step on every replica; the loss summed (it is replica-scaled)
    def distributed_training_step(batch, first_batch):  # shardfeed
        per_replica = strategy.run(training_step, args=(batch.x, batch.y, first_batch))  # shardfeed
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)  # shardfeed

    # shardfeed: each epoch is a new global shuffle; every rank runs the same steps.
    batches = (batch for e in itertools.count() for _, batch in dataset.epoch(e))  # shardfeed
    # Horovod: adjust number of steps based on number of GPUs.
    steps = args.steps // world.num_replicas_in_sync  # shardfeed: replicas, by flag
    for batch, data in enumerate(itertools.islice(batches, steps)):  # shardfeed: resident
        loss_value = distributed_training_step(data, batch == 0)  # shardfeed

        if batch % 10 == 0 and world.rank == 0:  # shardfeed: world.rank
            print('Step #%d\tLoss: %.6f' % (batch, loss_value))

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting it.
    if world.rank == 0:  # shardfeed: world.rank
        checkpoint.save(checkpoint_dir)


if __name__ == '__main__':
    # shardfeed: horovod.run(main, ...) (the original's `np hosts comm` arguments) is
    # shardfeed: horovodrun's Python form; run it as `horovodrun -np N`.
    main()
