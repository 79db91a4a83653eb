"""TFRecord files of `tf.train.Example`s as lazy leaves (`shardfeed.files.tfrecord`).

Files in sorted order, a worker opening only those that hold its rows;
encoded images decoded once, at load. Every rank counts every file's records
first (storage is allocated before rows are read) unless `num_records` is
given. TensorFlow is imported inside the functions, and refused naming the fix
where it is not installed.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed._common import errors as _errors
from shardfeed._data.formats.base import FileArray, concat
from shardfeed._tf.drain import Cursor

COMPRESSIONS = ("", "GZIP", "ZLIB")


def _files(pattern: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    if isinstance(pattern, (str, os.PathLike)):
        paths = sorted(glob.glob(os.fspath(pattern)))
    else:
        paths = [os.fspath(p) for p in pattern]
    if not paths:
        raise ValueError(
            _errors.message(
                "A TFRecord source needs at least one file.",
                f"pattern={pattern!r} matches no file",
                "Check the path or glob pattern (e.g. 'data/train-*.tfrecord').",
            )
        )
    return paths


def _tensorflow() -> Any:
    """TensorFlow, or an ImportError saying what needs it and what to do."""
    try:
        import tensorflow as tf
    except ImportError as err:
        raise ImportError(
            _errors.message(
                "Reading TFRecord files (`shardfeed.files.tfrecord`) needs TensorFlow: it "
                "parses `tf.train.Example`s with `tf.io`.",
                f"import tensorflow failed ({err})",
                "Install TensorFlow (`pip install shardfeed[cpu]`), or convert the records "
                "once to .npy/.npz/HDF5/Parquet and read those (`shardfeed.files.npy`, ...), "
                "which need no TensorFlow.",
            )
        ) from err
    return tf


_GZIP_MAGIC = b"\x1f\x8b"


def _damaged(path: str, compression: str, err: Any) -> ValueError:
    """A `DataLossError` from TF's record reader, as an error naming the file
    and where in it the framing broke (TF's own message names neither)."""
    found = re.search(r"(corrupted|truncated) record at (\d+)", err.message)
    where = f"{found[1]} record at byte offset {found[2]}" if found else err.message.strip()
    if found and compression:
        where += f" of the {compression}-decompressed stream"
    fix = (
        "The file is damaged or was copied incompletely (a record's length or data "
        "does not match its CRC-32); write it again or copy it again."
    )
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == _GZIP_MAGIC
    except OSError:
        gzipped = False
    if gzipped and not compression:
        fix = 'The file starts with the GZIP magic bytes: pass `compression="GZIP"`.'
    return ValueError(
        _errors.message(
            "A TFRecord file must hold whole records whose CRC-32s match, read with the "
            "compression it was written with.",
            f"{path} (compression={compression!r}): {where}",
            fix,
        )
    )


def count_records(path: str, compression: str = "") -> int:
    """Records in one TFRecord file (reads the framing, parses nothing)."""
    tf = _tensorflow()

    ds = tf.data.TFRecordDataset(path, compression_type=compression)
    try:
        return int(ds.reduce(np.int64(0), lambda n, _: n + 1))
    except tf.errors.DataLossError as err:
        raise _damaged(path, compression, err) from None


class _TFRecordFeature(FileArray):
    """One feature of one TFRecord file, read by a cursor over its records."""

    _handles = ("_cursor",)

    def __init__(
        self,
        path: str,
        name: str,
        feature: Any,
        image: tuple[int, int, int] | None,
        resize: bool,
        compression: str,
        num_rows: int,
    ) -> None:
        self.path, self.name, self.feature = path, name, feature
        self.image, self.resize, self.compression = image, resize, compression
        self.source = f"{path}[{name!r}]"
        if image is not None:
            self.shape, self.dtype = (num_rows, *image), np.dtype(np.uint8)
        else:
            self.shape = (num_rows, *feature.shape)
            self.dtype = np.dtype(feature.dtype.as_numpy_dtype)
        self._cursor: Cursor | None = None

    def _parse(self, record: Any) -> Any:
        tf = _tensorflow()

        value = tf.io.parse_single_example(record, {self.name: self.feature})[self.name]
        if self.image is None:
            return value
        height, width, channels = self.image
        pixels = tf.io.decode_image(value, channels=channels, expand_animations=False)
        if self.resize:
            resized = tf.image.resize(pixels, (height, width))
            return tf.saturate_cast(tf.round(resized), tf.uint8)
        return tf.ensure_shape(pixels, self.image)

    def _read_into(self, start: int, stop: int, out: np.ndarray) -> None:
        tf = _tensorflow()

        if self._cursor is None:
            def make(skip: int) -> Any:
                records = tf.data.TFRecordDataset(self.path, compression_type=self.compression)
                return records.skip(skip).map(
                    self._parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
                )

            self._cursor = Cursor(make, out[:1].nbytes, self.source)
        try:
            self._cursor.read(start, stop, out)
        except tf.errors.DataLossError as err:
            self._cursor = None
            raise _damaged(self.path, self.compression, err) from None
        except tf.errors.InvalidArgumentError as err:
            self._cursor = None
            raise ValueError(
                _errors.message(
                    "Every record must hold the feature as declared (images of the "
                    "declared shape unless `resize=True`).",
                    f"{self.source} rows [{start}, {stop}): {err.message.splitlines()[0]}",
                    "Fix the feature spec or image shape, or pass `resize=True`.",
                )
            ) from None


def _check_feature(name: str, feature: Any, image: Any) -> None:
    tf = _tensorflow()

    ok = isinstance(feature, tf.io.FixedLenFeature) and (
        image is None or (feature.dtype == tf.string and tuple(feature.shape) == ())
    )
    if ok and image is None and feature.dtype == tf.string:
        ok = False
    if not ok:
        raise ValueError(
            _errors.message(
                "Each feature must be a `tf.io.FixedLenFeature` of numbers, or a scalar "
                "string feature listed in `images` (encoded JPEG/PNG).",
                f"features[{name!r}]={feature!r}",
                "Use e.g. `tf.io.FixedLenFeature([], tf.int64)`, or "
                "`tf.io.FixedLenFeature([], tf.string)` with `images={name!r: (32, 32, 3)}`.",
            )
        )


def tfrecord(
    pattern: str | os.PathLike | Sequence[str | os.PathLike],
    features: Mapping[str, Any],
    *,
    images: Mapping[str, tuple[int, int, int]] | None = None,
    resize: bool = False,
    compression: str | None = None,
    num_records: Sequence[int] | None = None,
) -> dict[str, FileArray]:
    """Reads TFRecord files of `tf.train.Example`s as one lazy leaf per feature.

    Args:
        pattern: A glob pattern (files sorted by name) or a list of paths (in
            that order).
        features: A `tf.io.parse_example` spec: name -> `tf.io.FixedLenFeature`.
        images: Names of string features holding encoded images (JPEG, PNG,
            BMP, GIF), each with its `(height, width, channels)`; decoded once,
            at load time, to uint8.
        resize: Resize images of another size to the given one (bilinear,
            rounded); by default such an image is an error.
        compression: `None`/`""` (plain), `"GZIP"` or `"ZLIB"`.
        num_records: Records per file, in file order; skips the counting pass.

    Returns:
        A dict name -> leaf (rows = records), for `x`, `y` or `sample_weight`.

    Raises:
        ValueError: For no file, an unknown compression, an unsupported
            feature, counts that do not match the files; when read, a record
            that does not match its feature.

    Example:
        >>> cols = shardfeed.files.tfrecord(
        ...     "train-*.tfrecord",
        ...     {"image": tf.io.FixedLenFeature([], tf.string),
        ...      "label": tf.io.FixedLenFeature([], tf.int64)},
        ...     images={"image": (32, 32, 3)})
        >>> ds = shardfeed.ShardedResidentDataset(
        ...     cols["image"], cols["label"], per_replica_batch_size=256, seed=0)
    """
    _tensorflow()
    compression = (compression or "").upper()
    if compression not in COMPRESSIONS:
        raise ValueError(
            _errors.message(
                '`compression` must be None, "GZIP" or "ZLIB".',
                f"compression={compression!r}",
                "Pass the compression the files were written with.",
            )
        )
    paths = _files(pattern)
    images = dict(images or {})
    unknown = sorted(set(images) - set(features))
    if unknown or not features:
        raise ValueError(
            _errors.message(
                "`images` must name features of `features`, and `features` must not be empty.",
                f"features={sorted(features)}, images={sorted(images)}",
                "List each image feature in `features` as `tf.io.FixedLenFeature([], tf.string)`.",
            )
        )
    for name, feature in features.items():
        _check_feature(name, feature, images.get(name))
    if num_records is None:
        counts = [count_records(p, compression) for p in paths]
    else:
        counts = [int(n) for n in num_records]
        if len(counts) != len(paths) or min(counts) < 0:
            raise ValueError(
                _errors.message(
                    "`num_records` must give one non-negative count per file.",
                    f"len(num_records)={len(counts)}, files={len(paths)}",
                    "Pass the counts in file order, or leave `num_records` out to count.",
                )
            )
    leaves: dict[str, FileArray] = {}
    for name, feature in features.items():
        image = tuple(images[name]) if name in images else None
        parts = [
            _TFRecordFeature(p, name, feature, image, resize, compression, n)  # type: ignore[arg-type]
            for p, n in zip(paths, counts, strict=True)
            if n > 0
        ]
        if not parts:
            raise ValueError(
                _errors.message(
                    "A TFRecord source needs at least one record.",
                    f"{len(paths)} file(s) matching {pattern!r} hold 0 records",
                    "Check the files (and `compression`).",
                )
            )
        leaves[name] = parts[0] if len(parts) == 1 else concat(parts, f"{pattern}[{name!r}]")
    return leaves
