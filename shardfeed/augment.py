"""On-device augmentation for `ShardedResidentDataset(augment=...)`.

Stateless, batched, XLA-friendly blocks `(x, seed) -> x` that compose; each
example draws its own transform. Implementation: `shardfeed._data.augment`.

Example:
    >>> from shardfeed import augment
    >>> ds = shardfeed.ShardedResidentDataset(
    ...     images, labels, per_replica_batch_size=256, seed=0,
    ...     transform=lambda x: tf.cast(x, "float32") / 255,
    ...     augment=augment.compose(augment.flip_left_right(), augment.translate(2)))
"""

from shardfeed._data.augment import brightness as brightness
from shardfeed._data.augment import compose as compose
from shardfeed._data.augment import contrast as contrast
from shardfeed._data.augment import cutout as cutout
from shardfeed._data.augment import flip_left_right as flip_left_right
from shardfeed._data.augment import gaussian_noise as gaussian_noise
from shardfeed._data.augment import random_crop as random_crop
from shardfeed._data.augment import translate as translate

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
