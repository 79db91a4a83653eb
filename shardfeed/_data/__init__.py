"""Data: sources, files, split manifests, the shard plan, memory checks, storage,
streaming, the dataset, `LoadOptions`.

May import `_common` and `_distribute`; never `_training`, `_launch` or `_commands`.
Importing this package imports nothing; `plan`, `memplan`, `memadvice`, `memnumbers`,
`described`, `memory`, `exchange`, `split`, `formats` and `options` stay free of TensorFlow
so the CLI can use them.
"""
