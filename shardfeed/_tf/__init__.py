"""The TensorFlow backend: tf.distribute and Horovod over the resident dataset.

The same file names as `_jax/` where both have the concept (world, initialize,
storage, dataset, epoch, order, exchange, labels, iterator, streaming, augment,
loop, training, evaluation, inputs, saving, sync). It uses the backend-neutral
`_training`, `_data`, `_distribute` and `_common`, and nothing there imports it.
Importing this package imports nothing (`shardfeed.files` reaches `tfrecord`
here without TensorFlow).
"""
