"""Who this process is, backend-neutral: the launcher's variables, TF_CONFIG, start-up settings.

May import only `_common`. Importing this package imports nothing; no module
here imports TensorFlow, JAX or Horovod (each backend's world and `init` are
`_tf/` and `_jax/`).
"""
