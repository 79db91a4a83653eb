"""File sources for `ShardedResidentDataset`: lazy leaves read by row range.

Each function returns a leaf usable wherever an array is accepted in `x`,
`y` or `sample_weight`; a worker reads only the rows its replicas own, one
chunk at a time. `split` writes per-rank shard files plus a manifest, and
`manifest` reads them back; `tfrecord` reads `tf.train.Example` files
(TensorFlow imported only when it is called).

Example:
    >>> from shardfeed import files
    >>> ds = shardfeed.ShardedResidentDataset(
    ...     files.npy("x.npy"), files.npy("y.npy"), per_replica_batch_size=256, seed=0)
"""

from shardfeed._data.formats.base import FileArray as FileArray
from shardfeed._data.formats.base import concat as concat
from shardfeed._data.formats.directory import directory as directory
from shardfeed._data.formats.hdf5 import hdf5 as hdf5
from shardfeed._data.formats.manifest import manifest as manifest
from shardfeed._data.formats.npy import npy as npy
from shardfeed._data.formats.npz import npz as npz
from shardfeed._data.formats.parquet import parquet as parquet
from shardfeed._data.formats.parquet import parquet_columns as parquet_columns
from shardfeed._data.split import split as split
from shardfeed._tf.tfrecord import tfrecord as tfrecord

__all__ = [
    "FileArray",
    "concat",
    "directory",
    "hdf5",
    "manifest",
    "npy",
    "npz",
    "parquet",
    "parquet_columns",
    "split",
    "tfrecord",
]
