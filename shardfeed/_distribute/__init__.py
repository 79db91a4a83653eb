"""Who this process is and how replicas run: launch variables, TF_CONFIG, start-up.

May import only `_common`; never `_data`, `_training`, `_tf`, `_jax`, `_launch` or
`_commands`. Importing this package imports nothing; no module here imports
TensorFlow or Horovod; the runtime (world, init, engines) is `_tf/`.
"""
