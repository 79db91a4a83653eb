"""The augmentation blocks, written once in `keras.ops` for both backends.

Owns what a block does to a batch (`(x, seed) -> x`, each example its own
draw, XLA-friendly) and their checks; not where a seed comes from. Draws come
from the `Random` a backend registers (`register_random`) when its augment
module is imported.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import keras
from keras import ops

from shardfeed._common import errors as _errors

Augment = Callable[[Any, Any], Any]


class Random(Protocol):
    """A backend's stateless draws from a seed (TensorFlow's `[2]` seed, a JAX
    key): booleans True with probability `p`, float32 in `[low, high)`, int32
    in `[low, high)`, normal of `dtype`, and `num` independent seeds. Shapes
    may hold a tensor (TensorFlow's dynamic batch size)."""

    def bernoulli(self, seed: Any, shape: Sequence[Any], p: float) -> Any: ...

    def uniform(self, seed: Any, shape: Sequence[Any], low: float, high: float) -> Any: ...

    def integers(self, seed: Any, shape: Sequence[Any], low: int, high: int) -> Any: ...

    def normal(self, seed: Any, shape: Sequence[Any], stddev: float, dtype: str) -> Any: ...

    def split(self, seed: Any, num: int) -> Any: ...


_RANDOM: dict[str, Random] = {}


def register_random(backend: str, random: Random) -> None:
    """Makes `random` the draws of the blocks on Keras backend `backend`
    (called by `_tf/augment.py` and `_jax/augment.py` when imported)."""
    _RANDOM[backend] = random


def backend_random() -> Random:
    """The draws of Keras' current backend.

    Raises:
        NotImplementedError: On a backend with none registered (torch, numpy).
    """
    backend = keras.backend.backend()
    try:
        return _RANDOM[backend]
    except KeyError:
        raise NotImplementedError(
            _errors.message(
                "`shardfeed.augment`'s blocks draw with TensorFlow's or JAX's stateless "
                "random ops.",
                f"keras.backend.backend()={backend!r}",
                "Use the TensorFlow or JAX backend (`KERAS_BACKEND`), with "
                "`from shardfeed import augment` before the blocks run.",
            )
        ) from None


def _on_jax() -> bool:
    return keras.backend.backend() == "jax"


def _float_only(name: str, x: Any) -> None:
    dtype = keras.backend.standardize_dtype(x.dtype)
    if "float" not in dtype:
        cast = "x.astype('float32') / 255" if _on_jax() else "tf.cast(x, 'float32') / 255"
        raise TypeError(
            _errors.message(
                f"`shardfeed.augment.{name}` works on float images.",
                f"x.dtype={dtype}",
                f"Convert first, e.g. `transform=lambda x: {cast}` "
                "(augment runs after transform).",
            )
        )


def _number(name: str, arg: str, value: Any, example: str, low: float | None = 0.0) -> float:
    """A finite real argument, `>= low` unless `low` is None (NaN and inf
    were accepted and trained to NaN)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and (low is None or value >= low)
    if not ok:
        bound = "a finite number" if low is None else f"a finite number >= {low:g}"
        raise ValueError(
            _errors.message(
                f"`shardfeed.augment.{name}`'s `{arg}` must be {bound}.",
                f"{arg}={value!r}",
                f"Pass e.g. `{example}`.",
            )
        )
    return float(value)


class Block:
    """An augmentation block: `block(x, seed) -> x` for one batch of images
    `[batch, height, width, channels]`.

    It checks its arguments against the images it gets: `check` runs when
    the dataset is built if the image shape is known then (no `transform`),
    and on every call otherwise (the first batch, when the step is traced),
    before any op is built -- so a size larger than the image or a dict is
    a clear error, not a rank error or an XLA RET_CHECK.

    Args:
        name: The block's function name, for messages.
        apply: The block itself, `(x, seed, random) -> x`, drawing with `random`.
        sizes: Arguments (name -> pixels) that must be smaller than the
            image's height and width.
        example: A call that fits, for messages.
    """

    def __init__(
        self,
        name: str,
        apply: Callable[[Any, Any, Random], Any],
        sizes: dict[str, int] | None = None,
        example: str = "",
    ) -> None:
        self.name = name
        self._apply = apply
        self._sizes = sizes or {}
        self._example = example

    def __call__(self, x: Any, seed: Any) -> Any:
        self.check(x)
        return self._apply(x, seed, backend_random())

    def check(self, x: Any) -> None:
        """Refuses inputs this block cannot augment.

        Args:
            x: A batch (a tensor, or anything with `shape` and `dtype`).

        Raises:
            TypeError: For a structure (dict, list) instead of one batch.
            ValueError: For a batch that is not `[batch, height, width,
                channels]`, or a size not smaller than the image.
        """
        constraint = (
            f"`shardfeed.augment.{self.name}` augments one batch of images "
            "`[batch, height, width, channels]`."
        )
        if isinstance(x, (dict, list, tuple)) or not hasattr(x, "shape"):
            what = f"type(x)={type(x).__name__}"
            if isinstance(x, dict):
                what += f" with keys {sorted(x)}"
            raise TypeError(
                _errors.message(
                    constraint,
                    what,
                    "Apply it to the image input only, e.g. `augment=lambda x, seed: "
                    "{**x, 'image': block(x['image'], seed)}`.",
                )
            )
        shape = tuple(x.shape)
        if len(shape) != 4:
            reshape = "x.reshape(-1, 28, 28, 1)" if _on_jax() else "tf.reshape(x, (-1, 28, 28, 1))"
            raise ValueError(
                _errors.message(
                    constraint,
                    f"x.shape={shape}",
                    f"Give the rows an image shape `(height, width, channels)` (e.g. "
                    f"`transform=lambda x: {reshape}`), or augment only image inputs.",
                )
            )
        height, width = shape[1], shape[2]
        for arg, pixels in self._sizes.items():
            if height is not None and width is not None and pixels >= min(height, width):
                raise ValueError(
                    _errors.message(
                        f"`shardfeed.augment.{self.name}`'s `{arg}` must be smaller than "
                        "the image's height and width.",
                        f"{arg}={pixels}, image height={height}, width={width}",
                        f"Pass a smaller `{arg}` (e.g. `{self._example}` for 32x32 images).",
                    )
                )


@dataclasses.dataclass(frozen=True)
class _Spec:
    """A stored column as a batch would hold it, for `check` before any batch exists."""

    shape: tuple[int | None, ...]
    dtype: Any


def check_columns(augment: Any, columns: Any) -> None:
    """Checks `augment` against the dataset's `x` columns (`sources.Columns`)
    as a batch would hold them, when `augment` is built from this module's
    blocks (a user's own function is checked by what it does)."""
    if isinstance(augment, (Block, _Composed)):
        augment.check(
            keras.tree.map_structure(
                lambda i: _Spec(
                    (None, *columns.columns[i].row_shape), columns.columns[i].dtype
                ),
                columns.x,
            )
        )


def flip_left_right() -> Block:
    """Flips each image left-right with probability 1/2.

    Returns:
        A block `(x, seed) -> x` for `[batch, height, width, channels]` images.

    Example:
        >>> aug = shardfeed.augment.flip_left_right()
        >>> flipped = aug(images, tf.constant([0, 1]))   # JAX: jax.random.key(0)
    """

    def flip(x: Any, seed: Any, random: Random) -> Any:
        coin = random.bernoulli(seed, (ops.shape(x)[0],), 0.5)
        return ops.where(coin[:, None, None, None], ops.flip(x, axis=2), x)

    return Block("flip_left_right", flip)


def _windows(padded: Any, rows: Any, cols: Any) -> Any:
    """Each image's own window: rows `rows[i]` and columns `cols[i]` of
    `padded[i]`. One gather per example (not one flat gather over the batch,
    which a JAX mesh would partition by gathering the whole batch to every
    device, and which TensorFlow's `take_along_axis` broadcasts to every
    element: 20x slower)."""
    return ops.vectorized_map(
        lambda e: ops.take(ops.take(e[0], e[1], axis=0), e[2], axis=1), (padded, rows, cols)
    )


def translate(pixels: int, fill: str | float = "reflect") -> Block:
    """Shifts each image by its own offset in `[-pixels, pixels]` along each axis.

    The image is padded by `pixels` on every side and a window of the
    original size is cut at a random position (airbench's "translate by 2
    with reflection padding" is `translate(2)`).

    Args:
        pixels: The largest shift, in pixels (0: the identity).
        fill: How the border is filled: `"reflect"` (mirror without
            repeating the edge), `"symmetric"` (mirror with it), or a number
            (a constant).

    Returns:
        A block `(x, seed) -> x` for `[batch, height, width, channels]` images.

    Raises:
        ValueError: For a negative `pixels`, an unknown or non-finite `fill`;
            when checked against the images, `pixels` not smaller than their
            height and width.

    Example:
        >>> aug = shardfeed.augment.translate(2)
    """
    return _shift("translate", "pixels", pixels, fill, "translate(2)")


def _shift(name: str, arg: str, pixels: Any, fill: Any, example: str) -> Block:
    """`translate` under the name and argument the user called (`random_crop`'s
    errors named `translate` and `pixels`)."""
    if not (_errors.is_integer(pixels) and pixels >= 0):
        raise ValueError(
            _errors.message(
                f"`shardfeed.augment.{name}`'s `{arg}` must be a non-negative integer.",
                f"{arg}={pixels!r}",
                f"Pass e.g. `{example}`.",
            )
        )
    if isinstance(fill, str) and fill not in ("reflect", "symmetric"):
        raise ValueError(
            _errors.message(
                f'`shardfeed.augment.{name}`\'s `fill` must be "reflect", "symmetric" or a '
                "number.",
                f"fill={fill!r}",
                'Pass e.g. `fill="reflect"` or `fill=0`.',
            )
        )
    if not isinstance(fill, str):
        _number(name, "fill", fill, "fill=0", low=None)
    p = int(pixels)

    def shift(x: Any, seed: Any, random: Random) -> Any:
        if p == 0:
            return x
        pad = [[0, 0], [p, p], [p, p], [0, 0]]
        if isinstance(fill, str):
            padded = ops.pad(x, pad, mode=fill)
        else:
            padded = ops.pad(x, pad, constant_values=ops.cast(fill, x.dtype))
        height, width = x.shape[1], x.shape[2]
        offsets = random.integers(seed, (2, ops.shape(x)[0]), 0, 2 * p + 1)
        rows = offsets[0][:, None] + ops.arange(height, dtype="int32")[None, :]
        cols = offsets[1][:, None] + ops.arange(width, dtype="int32")[None, :]
        return _windows(padded, rows, cols)

    # A shift as large as the image moves it out of the window (constant
    # fill: all border) and reflection padding needs fewer pixels than the side.
    return Block(name, shift, {arg: p}, example)


def random_crop(padding: int, fill: str | float = 0.0) -> Block:
    """The classic CIFAR crop: pad by `padding` (zeros by default), cut a
    window of the original size at a random position per image.

    The same as `translate(padding, fill)`; torchvision's
    `RandomCrop(32, padding=4)` is `random_crop(4)`.

    Args:
        padding: Pixels added on each side.
        fill: As in `translate`.

    Returns:
        A block `(x, seed) -> x`.

    Raises:
        ValueError: As `translate`.

    Example:
        >>> aug = shardfeed.augment.random_crop(4)
    """
    return _shift("random_crop", "padding", padding, fill, "random_crop(4)")


def cutout(size: int, fill: float = 0.0) -> Block:
    """Sets a `size` x `size` square of each image to `fill`, centred at a
    random pixel (the square may be cut by the border, as in DeVries & Taylor).

    Args:
        size: Side of the square, in pixels.
        fill: The value written into the square.

    Returns:
        A block `(x, seed) -> x` for `[batch, height, width, channels]` images.

    Raises:
        ValueError: For a non-positive `size` or a non-finite `fill`; when
            checked against the images, `size` not smaller than their height
            and width.

    Example:
        >>> aug = shardfeed.augment.cutout(8)
    """
    if not (_errors.is_integer(size) and size > 0):
        raise ValueError(
            _errors.message(
                "`size` must be a positive integer.", f"size={size!r}", "Pass e.g. `cutout(8)`."
            )
        )
    _number("cutout", "fill", fill, "fill=0.0", low=None)
    size = int(size)

    def cut(x: Any, seed: Any, random: Random) -> Any:
        height, width = x.shape[1], x.shape[2]
        draws = random.integers(seed, (2, ops.shape(x)[0]), 0, 2**31 - 1)
        top = draws[0] % height - size // 2
        left = draws[1] % width - size // 2
        ys = ops.arange(height, dtype="int32")[None, :]
        xs = ops.arange(width, dtype="int32")[None, :]
        in_rows = (ys >= top[:, None]) & (ys < top[:, None] + size)
        in_cols = (xs >= left[:, None]) & (xs < left[:, None] + size)
        square = in_rows[:, :, None, None] & in_cols[:, None, :, None]
        return ops.where(square, ops.cast(fill, x.dtype), x)

    return Block("cutout", cut, {"size": size}, "cutout(8)")


def gaussian_noise(stddev: float) -> Block:
    """Adds normal noise with standard deviation `stddev` (float images).

    Returns:
        A block `(x, seed) -> x`.

    Raises:
        ValueError: Unless `stddev` is a finite number >= 0.
        TypeError: When applied to a non-float batch.

    Example:
        >>> aug = shardfeed.augment.gaussian_noise(0.05)
    """

    stddev = _number("gaussian_noise", "stddev", stddev, "gaussian_noise(0.05)")

    def noise(x: Any, seed: Any, random: Random) -> Any:
        _float_only("gaussian_noise", x)
        dtype = keras.backend.standardize_dtype(x.dtype)
        return x + random.normal(seed, ops.shape(x), stddev, dtype)

    return Block("gaussian_noise", noise)


MAX_BRIGHTNESS_DELTA = 255.0


def brightness(max_delta: float) -> Block:
    """Adds one offset per image, uniform in `[-max_delta, max_delta]`
    (float images, e.g. in [0, 1]).

    Returns:
        A block `(x, seed) -> x`.

    Raises:
        ValueError: Unless `max_delta` is a finite number in [0, 255].
        TypeError: When applied to a non-float batch.

    Example:
        >>> aug = shardfeed.augment.brightness(0.1)
    """

    max_delta = _number("brightness", "max_delta", max_delta, "brightness(0.1)")
    # An offset in the images' own units: past the widest common range, every
    # image is replaced by noise of that size (1e30 trained without a word).
    _errors.require(
        max_delta <= MAX_BRIGHTNESS_DELTA,
        "`shardfeed.augment.brightness`'s `max_delta` is an offset in the images' units "
        f"([0, 1] or [0, 255]) and must be at most {MAX_BRIGHTNESS_DELTA:g}.",
        f"max_delta={max_delta!r}",
        "Pass e.g. `brightness(0.1)` for images in [0, 1], `brightness(25)` for [0, 255].",
    )

    def bright(x: Any, seed: Any, random: Random) -> Any:
        _float_only("brightness", x)
        delta = random.uniform(seed, (ops.shape(x)[0],), -max_delta, max_delta)
        return x + ops.cast(delta, x.dtype)[:, None, None, None]

    return Block("brightness", bright)


def contrast(lower: float, upper: float) -> Block:
    """Scales each image's deviation from its mean by one factor per image,
    uniform in `[lower, upper]` (float images; `tf.image.adjust_contrast`
    per channel).

    Returns:
        A block `(x, seed) -> x`.

    Raises:
        ValueError: Unless `0 <= lower <= upper`, both finite.
        TypeError: When applied to a non-float batch.

    Example:
        >>> aug = shardfeed.augment.contrast(0.9, 1.1)
    """
    lower = _number("contrast", "lower", lower, "contrast(0.9, 1.1)")
    upper = _number("contrast", "upper", upper, "contrast(0.9, 1.1)")
    if not lower <= upper:
        raise ValueError(
            _errors.message(
                "`contrast` needs 0 <= lower <= upper.",
                f"lower={lower!r}, upper={upper!r}",
                "Pass e.g. `contrast(0.9, 1.1)`.",
            )
        )

    def scale(x: Any, seed: Any, random: Random) -> Any:
        _float_only("contrast", x)
        factor = ops.cast(random.uniform(seed, (ops.shape(x)[0],), lower, upper), x.dtype)
        mean = ops.mean(x, axis=(1, 2), keepdims=True)
        return (x - mean) * factor[:, None, None, None] + mean

    return Block("contrast", scale)


def compose(*blocks: Augment) -> Augment:
    """Applies `blocks` in order, each with its own seed split from the step's.

    Args:
        *blocks: Functions `(x, seed) -> x`.

    Returns:
        A block `(x, seed) -> x`.

    Raises:
        TypeError: If a block is not callable.

    Example:
        >>> aug = shardfeed.augment.compose(
        ...     shardfeed.augment.flip_left_right(), shardfeed.augment.translate(2))
    """
    for block in blocks:
        if not callable(block):
            raise TypeError(
                _errors.message(
                    "`compose` takes functions `(x, seed) -> x`.",
                    f"type(block)={type(block).__name__}",
                    "Pass blocks such as `shardfeed.augment.flip_left_right()`.",
                )
            )

    return _Composed(blocks)


class _Composed:
    """`compose(*blocks)`: checks as each of its blocks does (all of ours keep
    the images' shape, so each sees the shape the first one does)."""

    def __init__(self, blocks: tuple[Augment, ...]) -> None:
        self.blocks = blocks

    def check(self, x: Any) -> None:
        for block in self.blocks:
            if isinstance(block, (Block, _Composed)):
                block.check(x)

    def __call__(self, x: Any, seed: Any) -> Any:
        if not self.blocks:
            return x
        seeds = backend_random().split(seed, len(self.blocks))
        for i, block in enumerate(self.blocks):
            x = block(x, seeds[i])
        return x
