"""Data, backend-neutral: sources and files, the shard plan, the memory plan, the
exchange's arithmetic, the dataset's shared checks (`DatasetBase`), `LoadOptions`.

May import `_distribute` and `_common`. Importing this package imports nothing,
and no module here imports TensorFlow, JAX or a backend package.
"""
