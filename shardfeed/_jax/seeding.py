"""Keras' unseeded draws made the same on every `jax.distributed` process (`shardfeed.init`).

An unseeded Keras initializer, `SeedGenerator` or global seed generator takes
its seed from Python's `random` module (Keras 3.15's
`keras.src.random.seed_generator.make_default_seed`). On JAX a loop of the
user's own steps every process's copy of the state as one replicated value,
so processes whose models started from other draws train apart without a
word. `agree_keras_seed` seeds exactly what Keras draws from, with one seed
agreed across the processes, unless the user seeded Keras
(`keras.utils.set_random_seed`) first. NumPy's global generator is left alone.
"""

from __future__ import annotations

import random

from shardfeed._common.world import WorldLike


def agree_keras_seed(world: WorldLike) -> int | None:
    """On several processes, seeds Python's `random` with one seed (rank
    0's draw from it) and drops Keras' global seed generator (Keras makes it
    again from that seed when next asked), so every model built afterwards
    starts from the same values on every process. A collective: every
    process calls it.

    Returns:
        The seed, or None where nothing was seeded: one process, or Keras
        seeded by the user (`keras.utils.set_random_seed`, kept as it is,
        rank-dependent or not).
    """
    if world.world_size == 1:
        return None
    # Keras' record of `set_random_seed` and its global generator's slot
    # (Keras 3.15; `keras.distribution.initialize` reads the same record
    # before seeding every process alike).
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
    from keras.src.utils.rng_utils import get_random_seed

    # Asked of every process at once (one collective): a process that was
    # seeded must not skip a collective its peers join. A seeded process
    # draws nothing, so its own stream stays as the user left it.
    user_seeded = get_random_seed() is not None
    drawn = 0 if user_seeded else random.getrandbits(62)
    gathered = world.all_gather_bytes(bytes([user_seeded]) + drawn.to_bytes(8, "little"))
    if any(payload[0] for payload in gathered):
        return None
    seed = int.from_bytes(gathered[0][1:], "little")
    random.seed(seed)
    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, None)
    return seed
