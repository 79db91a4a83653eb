"""File formats: lazy leaves that read row ranges out of files, one module per format.

Re-exported by `shardfeed.files`. Importing this package imports nothing.
"""
