"""File formats: lazy leaves that read row ranges out of files, one module per format.

Separation of concerns: this package owns *opening files and reading row
ranges out of them*. `base` holds the leaf type (`FileArray`), the shared
ranged-read machinery and `concat`; `npy`, `npz`, `hdf5` and `parquet` read one
format each; `directory` concatenates shard files; `manifest` reads a split
dataset back. `shardfeed.files` re-exports the public functions.

Importing this package imports nothing; no module here imports TensorFlow.
"""
