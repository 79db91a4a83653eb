"""Training, backend-neutral: argument checks, callbacks, progress, resume state and
backup, `FitOptions`, the model file; each backend's `fit` uses them.

May import `_data`, `_distribute` and `_common`. Importing this package imports
nothing; no module here imports TensorFlow, JAX or Horovod.
"""
