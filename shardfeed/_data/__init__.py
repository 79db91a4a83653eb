"""Data: sources, files, split manifests, the shard plan, memory checks, `LoadOptions`.

May import `_common` and `_distribute`; never `_training`, `_tf`, `_jax`, `_launch`
or `_commands`. Importing this package imports nothing, and every module here is
free of TensorFlow (the storage, streaming and the dataset on TensorFlow are
`_tf/`), so the CLI and the JAX backend can use them.
"""
