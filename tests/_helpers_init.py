"""Helpers shared by the init-ordering tests of both backends (`tests/_tf/test_initialize.py`
on TensorFlow, `tests/_jax/test_initialize_jax.py` on JAX): no TensorFlow import, so the
JAX tier can import them too."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import numpy as np

# What `shardfeed.fit` says on either backend when a one-replica dataset meets the
# 4-replica world `shardfeed.init()` started after it.
BUILT_BEFORE_INIT = (
    "A dataset holds its rows on the replicas of the world it was built in, and this one was "
    "built before `shardfeed.init()`, which has since started another: training it would use "
    "1 replica(s) while the model's world has 4. Received: dataset.world: world_size=1, "
    "num_replicas_in_sync=1; shardfeed.init(): world_size=1, num_replicas_in_sync=4. Call "
    "shardfeed.init() before building the dataset (first thing in the script), then build the "
    "dataset again."
)


@contextlib.contextmanager
def no_world_from_init() -> Iterator[None]:
    """No world from `shardfeed.init()` inside, and the previous one after (in the world
    module of Keras' backend: `shardfeed.World` is that backend's)."""
    import shardfeed

    world = importlib.import_module(shardfeed.World.__module__)
    saved = list(world._initialized)
    world._initialized.clear()
    try:
        yield
    finally:
        world._initialized[:] = saved


def rows(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """`n` rows of 3 features and their sum as the label."""
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    return x, x.sum(axis=1, keepdims=True)
