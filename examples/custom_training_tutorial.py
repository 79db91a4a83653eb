#@title Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
# https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""TensorFlow's tutorial "Custom training with tf.distribute.Strategy", resident.

The notebook's code cells in order (`site/en/tutorials/distribute/
custom_training.ipynb` in tensorflow/docs), fed by `ShardedResidentDataset`
instead of `strategy.experimental_distribute_dataset`: `strategy.run` takes
the resident batch as it took the distributed tf.data one. Every line not
marked `# shardfeed:` is the tutorial's (this docstring is new). Run it as:

    python examples/custom_training_tutorial.py                   # one device
    python examples/custom_training_tutorial.py --cpu-devices 2   # MirroredStrategy
    shardfeed launch -n 2 python examples/custom_training_tutorial.py  # 2 workers
    python examples/custom_training_tutorial.py --data-dir DIR    # Fashion-MNIST IDX

Without `--data-dir` the images are synthetic, MNIST-shaped.
"""
import argparse  # shardfeed: --data-dir/--rows/--epochs/--cpu-devices for small runs

# Import TensorFlow
import tensorflow as tf

# Helper libraries
import numpy as np
import os

import mnist_data  # shardfeed: IDX files by path, or synthetic images of their shape
import shardfeed  # shardfeed

parser = argparse.ArgumentParser()  # shardfeed: small runs and real data by path
parser.add_argument("--data-dir", help="Fashion-MNIST's (or MNIST's) IDX files")  # shardfeed
parser.add_argument("--rows", type=int, default=None)  # shardfeed: first rows only
parser.add_argument("--epochs", type=int, default=10)  # shardfeed: the tutorial's 10
parser.add_argument("--cpu-devices", type=int, default=0)  # shardfeed: Mirrored on a CPU
parser.add_argument("--checkpoint-dir", default="./training_checkpoints")  # shardfeed
args = parser.parse_args()  # shardfeed

# shardfeed: Mirrored on local devices (--cpu-devices N: N logical CPUs), MWMS under `shardfeed launch`
world = shardfeed.init(cpu_devices=args.cpu_devices or None)  # shardfeed

print(tf.__version__)

(train_images, train_labels), (test_images, test_labels) = mnist_data.load_data(args.data_dir, args.rows)  # shardfeed: not fashion_mnist's download

# Add a dimension to the array -> new shape == (28, 28, 1)
# This is done because the first layer in our model is a convolutional
# layer and it requires a 4D input (batch_size, height, width, channels).
# batch_size dimension will be added later on.
train_images = train_images[..., None]
test_images = test_images[..., None]

# Scale the images to the [0, 1] range.
# shardfeed: the uint8 rows stay resident; the datasets' transform scales each batch.
def scale(images):  # shardfeed: runs on the device, batch by batch
  return tf.cast(images, tf.float32) / np.float32(255)  # shardfeed

# If the list of devices is not specified in
# `tf.distribute.MirroredStrategy` constructor, they will be auto-detected.
strategy = world.strategy  # shardfeed: the strategy shardfeed.init() chose

print('Number of devices: {}'.format(strategy.num_replicas_in_sync))

# shardfeed: no BUFFER_SIZE: every epoch is a global shuffle of all the rows.

BATCH_SIZE_PER_REPLICA = 64
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

EPOCHS = args.epochs  # shardfeed: by flag

with strategy.scope():  # shardfeed: the rows go to the replicas' devices
    train_dataset = shardfeed.ShardedResidentDataset(  # shardfeed: instead of tf.data
        train_images, train_labels, per_replica_batch_size=BATCH_SIZE_PER_REPLICA,  # shardfeed
        seed=0, transform=scale)  # shardfeed: shuffled each epoch from (seed, epoch)
    test_dataset = shardfeed.ShardedResidentDataset(  # shardfeed
        test_images, test_labels, per_replica_batch_size=BATCH_SIZE_PER_REPLICA,  # shardfeed
        shuffle=False, transform=scale)  # shardfeed

# shardfeed: `train_dataset.epoch(e)` is the distributed dataset, opened once per epoch.

def create_model():
  regularizer = tf.keras.regularizers.L2(1e-5)
  model = tf.keras.Sequential([
      tf.keras.Input((28, 28, 1)),  # shardfeed: variables exist before the first step
      tf.keras.layers.Conv2D(32, 3,
                             activation='relu',
                             kernel_regularizer=regularizer),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Conv2D(64, 3,
                             activation='relu',
                             kernel_regularizer=regularizer),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(64,
                            activation='relu',
                            kernel_regularizer=regularizer),
      tf.keras.layers.Dense(10, kernel_regularizer=regularizer)
    ])

  return model

# Create a checkpoint directory to store the checkpoints.
checkpoint_dir = args.checkpoint_dir if world.is_chief else os.path.join(  # shardfeed: by flag;
    args.checkpoint_dir, 'worker-%d' % world.rank)  # shardfeed: other workers write apart
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")

with strategy.scope():
  # Set reduction to `NONE` so you can do the reduction yourself.
  loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
      from_logits=True,
      reduction=tf.keras.losses.Reduction.NONE)
  def compute_loss(labels, predictions, model_losses, global_batch_size):  # shardfeed
    per_example_loss = loss_object(labels, predictions)
    loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)  # shardfeed: the step's real rows, exact on a partial step
    if model_losses:
      loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
    return loss

with strategy.scope():
  test_loss = tf.keras.metrics.Mean(name='test_loss')

  train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
      name='train_accuracy')
  test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
      name='test_accuracy')

# A model, an optimizer, and a checkpoint must be created under `strategy.scope`.
with strategy.scope():
  model = create_model()

  optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
  optimizer.build(model.trainable_variables)  # shardfeed: not inside strategy.run

  checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)

def train_step(inputs, global_batch_size):  # shardfeed: the step's real rows
  images, labels, _ = inputs  # shardfeed: a shardfeed.Batch(x, y, sample_weight)

  with tf.GradientTape() as tape:
    predictions = model(images, training=True)
    loss = compute_loss(labels, predictions, model.losses, global_batch_size)  # shardfeed

  gradients = tape.gradient(loss, model.trainable_variables)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))

  train_accuracy.update_state(labels, predictions)
  return loss

def test_step(inputs):
  images, labels, _ = inputs  # shardfeed: a shardfeed.Batch

  predictions = model(images, training=False)
  t_loss = loss_object(labels, predictions)

  test_loss.update_state(t_loss)
  test_accuracy.update_state(labels, predictions)

# `run` replicates the provided computation and runs it
# with the distributed input.
@tf.function
def distributed_train_step(dataset_inputs, global_batch_size):  # shardfeed
  per_replica_losses = strategy.run(train_step,  # shardfeed: and the step's real rows
                                    args=(dataset_inputs, global_batch_size))  # shardfeed
  return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses,
                         axis=None)

@tf.function
def distributed_test_step(dataset_inputs):
  return strategy.run(test_step, args=(dataset_inputs,))

for epoch in range(EPOCHS):
  # TRAIN LOOP
  total_loss = 0.0
  num_batches = 0
  train_dist_dataset = train_dataset.epoch(epoch)  # shardfeed: this epoch's global order
  for step, x in train_dist_dataset:  # shardfeed: (step, Batch)
    total_loss += distributed_train_step(x, train_dist_dataset.global_rows(step))  # shardfeed
    num_batches += 1
  train_loss = total_loss / num_batches

  # TEST LOOP
  for _, x in test_dataset.epoch(0, training=False):  # shardfeed: every row once, in order
    distributed_test_step(x)

  if epoch % 2 == 0:
    checkpoint.save(checkpoint_prefix)

  template = ("Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, "
              "Test Accuracy: {}")
  print(template.format(epoch + 1, train_loss,
                         train_accuracy.result() * 100, test_loss.result(),
                         test_accuracy.result() * 100))

  test_loss.reset_state()  # shardfeed: Keras 3 spells it reset_state
  train_accuracy.reset_state()  # shardfeed: Keras 3
  test_accuracy.reset_state()  # shardfeed: Keras 3

eval_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
      name='eval_accuracy')

new_model = create_model()
new_optimizer = tf.keras.optimizers.Adam()

# shardfeed: without a strategy the tutorial reads the test set from host memory, scaled.
test_images = scale(test_images).numpy()  # shardfeed
test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)

@tf.function
def eval_step(images, labels):
  predictions = new_model(images, training=False)
  eval_accuracy(labels, predictions)

checkpoint = tf.train.Checkpoint(optimizer=new_optimizer, model=new_model)
checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))

for images, labels in test_dataset:
  eval_step(images, labels)

print('Accuracy after restoring the saved model without strategy: {}'.format(
    eval_accuracy.result() * 100))

for i in range(EPOCHS):  # shardfeed: numbered, so each pass opens a new epoch order
  total_loss = 0.0
  num_batches = 0
  train_dist_dataset = train_dataset.epoch(EPOCHS + i)  # shardfeed: as iter() reshuffled
  train_iter = iter(train_dist_dataset)

  for _ in range(10):
    step, x = next(train_iter)  # shardfeed: (step, Batch)
    total_loss += distributed_train_step(x, train_dist_dataset.global_rows(step))  # shardfeed
    num_batches += 1
  average_train_loss = total_loss / num_batches

  template = ("Epoch {}, Loss: {}, Accuracy: {}")
  print(template.format(epoch + 1, average_train_loss, train_accuracy.result() * 100))
  train_accuracy.reset_state()  # shardfeed: Keras 3

# shardfeed: traced once per epoch: each epoch's order is a new capture (tf.data is an input).
@tf.function
def distributed_train_epoch(dataset):
  total_loss = 0.0
  num_batches = 0
  for step in tf.range(dataset.full_steps):  # shardfeed: the epoch's full steps, in-graph
    x = dataset.batch(step)  # shardfeed: gathered on the devices inside the tf.function
    per_replica_losses = strategy.run(train_step, args=(x, dataset.global_batch_size))  # shardfeed
    total_loss += strategy.reduce(
      tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
    num_batches += 1
  if dataset.has_partial_step:  # shardfeed: the partial last step, its shapes per replica
    last = dataset.steps - 1  # shardfeed: asked with a Python int
    x = dataset.batch(last)  # shardfeed
    per_replica_losses = strategy.run(train_step, args=(x, dataset.global_rows(last)))  # shardfeed
    total_loss += strategy.reduce(  # shardfeed
      tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)  # shardfeed
    num_batches += 1  # shardfeed
  return total_loss / tf.cast(num_batches, dtype=tf.float32)

for epoch in range(EPOCHS):
  train_loss = distributed_train_epoch(train_dataset.epoch(2 * EPOCHS + epoch))  # shardfeed: new

  template = ("Epoch {}, Loss: {}, Accuracy: {}")
  print(template.format(epoch + 1, train_loss, train_accuracy.result() * 100))

  train_accuracy.reset_state()  # shardfeed: Keras 3
