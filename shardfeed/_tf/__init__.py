"""The TensorFlow backend: tf.distribute and Horovod over the resident dataset.

The same file names as `_jax/` where both have the concept; it uses the
backend-neutral folders, which never import it. Importing this package imports
nothing (`shardfeed.files` reaches `tfrecord` here without TensorFlow).
"""
