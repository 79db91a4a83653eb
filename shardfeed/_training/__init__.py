"""Training: the compiled loop, `fit`/`evaluate`/`predict` (`api`), progress, `FitOptions`.

May import `_common`, `_distribute` and `_data`; never `_launch` or `_commands`.
Importing this package imports nothing (`options` is free of TensorFlow).
"""
