"""Who this process is and how replicas run: world, cluster detection, `init`, engines.

May import only `_common`; never `_data`, `_training`, `_launch` or `_commands`.
Importing this package imports nothing; its modules import TensorFlow as they need.
"""
