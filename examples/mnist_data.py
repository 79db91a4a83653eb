"""MNIST-shaped data for the ports: IDX files from a directory, or synthetic.

`load_data(data_dir, rows)` returns `(x_train, y_train), (x_test, y_test)` as
`tf.keras.datasets.mnist.load_data()` does (uint8 images 28x28, uint8 labels).
`data_dir` holds the four IDX files under either common name
(`train-images-idx3-ubyte.gz` as Keras and Fashion-MNIST ship them, or
`train-images.idx3-ubyte` as MNIST's site does), gzipped or not. Without it,
synthetic images with a bar where the label says: learnable in a few steps,
so CI runs train for seconds and still show the loss falling.
"""

from __future__ import annotations

import gzip
import pathlib

import numpy as np

SYNTHETIC_TEST_ROWS = 1_000


def _read_idx(path: pathlib.Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    # IDX header: two zero bytes, the type (0x08: uint8), the rank, then one
    # big-endian uint32 per dimension.
    if data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not an IDX file of uint8 (header {data[:4]!r})")
    rank = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=rank, offset=4))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * rank).reshape(shape)


def _find(data_dir: pathlib.Path, split: str, kind: str) -> pathlib.Path:
    rank = 3 if kind == "images" else 1
    found = sorted(data_dir.glob(f"{split}-{kind}[.-]idx{rank}-ubyte*"))
    if not found:
        raise FileNotFoundError(
            f"No {split}-{kind}-idx{rank}-ubyte[.gz] in {data_dir}. "
            "Pass --data-dir a directory holding MNIST's (or Fashion-MNIST's) four IDX files."
        )
    return found[0]


def synthetic(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=rows).astype("uint8")
    images = rng.integers(0, 64, size=(rows, 28, 28)).astype("uint8")
    # A bright bar two pixels high at a height set by the label: local, as a
    # convolution sees it (a brightness offset alone takes a CNN many more steps).
    bar = 3 + 2 * labels[:, None] + np.arange(2)
    images[np.arange(rows)[:, None], bar] = 255
    return images, labels


def load_data(data_dir: str | None, rows: int | None = None):
    """`(x_train, y_train), (x_test, y_test)`; `rows` keeps the first training rows."""
    if data_dir is None:
        train = synthetic(rows or 60_000, seed=0)
        test = synthetic(SYNTHETIC_TEST_ROWS, seed=1)
    else:
        root = pathlib.Path(data_dir)
        train = tuple(_read_idx(_find(root, "train", kind)) for kind in ("images", "labels"))
        test = tuple(_read_idx(_find(root, "t10k", kind)) for kind in ("images", "labels"))
        if rows is not None:
            train = (train[0][:rows], train[1][:rows])
    return train, test
