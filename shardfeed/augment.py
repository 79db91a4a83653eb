"""On-device augmentation for `ShardedResidentDataset(augment=...)`, on both backends.

Stateless, batched, XLA-friendly blocks `(x, seed) -> x` that compose; each
example draws its own transform. `seed` is the backend's: a `[2]` integer
tensor on TensorFlow, a `jax.random` key on JAX (what each backend's loop
passes). Importing this module registers the draws of Keras' backend.

Example:
    >>> from shardfeed import augment
    >>> ds = shardfeed.ShardedResidentDataset(
    ...     images, labels, per_replica_batch_size=256, seed=0,
    ...     transform=lambda x: keras.ops.cast(x, "float32") / 255,
    ...     augment=augment.compose(augment.flip_left_right(), augment.translate(2)))
"""

import keras as _keras

# The blocks draw with the backend's stateless random ops, which register
# themselves when imported: JAX's without TensorFlow, TensorFlow's otherwise.
if _keras.backend.backend() == "jax":
    from shardfeed._jax import augment as _jax_draws  # noqa: F401
elif _keras.backend.backend() == "tensorflow":
    from shardfeed._tf import augment as _tf_draws  # noqa: F401

from shardfeed._data.augment_blocks import brightness as brightness
from shardfeed._data.augment_blocks import compose as compose
from shardfeed._data.augment_blocks import contrast as contrast
from shardfeed._data.augment_blocks import cutout as cutout
from shardfeed._data.augment_blocks import flip_left_right as flip_left_right
from shardfeed._data.augment_blocks import gaussian_noise as gaussian_noise
from shardfeed._data.augment_blocks import random_crop as random_crop
from shardfeed._data.augment_blocks import translate as translate

__all__ = [
    "brightness",
    "compose",
    "contrast",
    "cutout",
    "flip_left_right",
    "gaussian_noise",
    "random_crop",
    "translate",
]
