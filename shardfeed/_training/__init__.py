"""Training, backend-neutral: argument checks, callbacks, progress, resume state
and backup, `FitOptions`. Each backend's `fit` is `_tf/training.py` /
`_jax/training.py`.

May import `_common`, `_distribute` and `_data`; never `_tf`, `_jax`, `_launch`
or `_commands`. Importing this package imports nothing; no module here imports
TensorFlow or Horovod.
"""
