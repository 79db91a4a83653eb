"""Models built after `shardfeed.init()` start alike on every `jax.distributed`
process (`_jax/seeding.py`): Keras' JAX guide's own loop, two models, unseeded
and without `sync_model`, ends with the same weights on both workers of
`shardfeed launch -n 2`; a user's own Keras seed is kept as it is."""

from __future__ import annotations

import random
import subprocess
import sys

import keras
import numpy as np
import pytest
from _helpers_jax import REPO, SUBPROCESS_TIMEOUT_S, jax_env

from shardfeed._jax import seeding
from shardfeed._jax.world import World

WORKER = str(REPO / "tests" / "_jax" / "_guide_loop_worker.py")


@pytest.mark.multi_process
def test_the_guides_two_models_end_alike_on_both_workers_unseeded(tmp_path):
    out = tmp_path / "guide"
    env = jax_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    env = {k: v for k, v in env.items() if not k.startswith(("TF_CONFIG", "SHARDFEED_"))}
    launch = [
        sys.executable,
        "-m",
        "shardfeed._commands.cli",
        "launch",
        "-n",
        "2",
        "--timeout-s",
        "200",
        "python",
        WORKER,
        "--out",
        str(out),
    ]
    proc = subprocess.run(
        launch,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=2 * SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [dict(np.load(f"{out}.rank{r}.npz")) for r in (0, 1)]
    # Before: each process drew its own initial weights and trained its own
    # copy of the state (the issue: checksums 2683.57 vs 2690.84), silently.
    for name in ("first", "second"):
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
    assert ranks[0]["val_accuracy"] == ranks[1]["val_accuracy"]
    # One model trained on the global batch: it learned.
    assert ranks[0]["train_accuracy"] > 0.3 and ranks[0]["val_accuracy"] > 0.3


class _TwoRanks:
    """Rank 1 of two, given rank 0's payload (no `jax.distributed`)."""

    world_size = 2

    def __init__(self, rank0: bytes) -> None:
        self.rank0 = rank0

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        return [self.rank0, payload]


def _payload(seeded: bool, seed: int) -> bytes:
    """What `agree_keras_seed` sends: whether Keras was seeded, then its draw."""
    return bytes([seeded]) + seed.to_bytes(8, "little")


@pytest.fixture
def keras_unseeded():
    """Keras' seed record and global generator cleared before and after
    (`set_random_seed` leaves the record set)."""
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
    from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED

    def clear() -> None:
        global_state.set_global_attribute(GLOBAL_RANDOM_SEED, None)
        global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, None)

    clear()
    yield
    clear()


def _dense_kernel() -> np.ndarray:
    """An unseeded `Dense` kernel (its initializer draws from Python's `random`)."""
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    return np.asarray(layer.kernel)


def _keras_global_draw() -> np.ndarray:
    """An unseeded `keras.random` draw (Keras' global seed generator)."""
    return np.asarray(keras.random.uniform((4,)))


def test_unseeded_processes_take_rank_0s_seed_for_keras_draws(keras_unseeded):
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    _keras_global_draw()  # this process's own global generator, made before `init`
    agreed = 123_456_789
    assert seeding.agree_keras_seed(_TwoRanks(_payload(False, agreed))) == agreed
    here = _dense_kernel(), _keras_global_draw()
    # What rank 0 drew after seeding with the same seed: the same values.
    random.seed(agreed)
    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, None)
    there = _dense_kernel(), _keras_global_draw()
    for mine, theirs in zip(here, there, strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("seeded_rank", [0, 1])
def test_a_user_keras_seed_on_any_rank_is_kept(keras_unseeded, seeded_rank):
    """`keras.utils.set_random_seed` (rank-dependent or not) is the user's:
    no rank seeds anything, and a seeded rank draws nothing from `random`."""
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    if seeded_rank == 1:  # this process
        keras.utils.set_random_seed(11)
    _keras_global_draw()
    generator = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
    state = random.getstate()
    rank0 = _payload(seeded_rank == 0, 0 if seeded_rank == 0 else 5)
    assert seeding.agree_keras_seed(_TwoRanks(rank0)) is None
    assert global_state.get_global_attribute(GLOBAL_SEED_GENERATOR) is generator
    if seeded_rank == 1:
        assert random.getstate() == state


def test_one_process_seeds_nothing(keras_unseeded):
    state = random.getstate()
    assert seeding.agree_keras_seed(World(0, 1, 0, (object(),))) is None
    assert random.getstate() == state
