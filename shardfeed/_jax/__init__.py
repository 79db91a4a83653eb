"""The JAX backend: Keras on JAX over the same resident dataset.

The same file names as `_tf/` where both have the concept; it uses the
backend-neutral folders and never imports TensorFlow, Horovod or `_tf`
(contracts in pyproject.toml). Importing this package imports nothing.
"""
