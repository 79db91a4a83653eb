"""The JAX tier's setup: Keras on JAX, in an environment without TensorFlow.

Run with the JAX venv (Keras + jax[cpu], no TensorFlow), e.g.
`KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=4
.venv-jax/bin/python -m pytest tests/_jax`. Stricter than normal use: the CPU
is split into `NUM_CPU_DEVICES` devices (as the TensorFlow tier splits it
into logical CPUs), and the tier refuses to run on the wrong backend or with
TensorFlow importable, so a test can never pass by falling back to TensorFlow.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator

import pytest
from _helpers_jax import NUM_CPU_DEVICES

if os.environ.get("KERAS_BACKEND") != "jax":
    raise RuntimeError(
        "tests/_jax runs on the JAX backend only. Received: KERAS_BACKEND="
        f"{os.environ.get('KERAS_BACKEND')!r}. Run it as `KERAS_BACKEND=jax "
        ".venv-jax/bin/python -m pytest tests/_jax` (see .ci/test)."
    )
if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is not None:
    raise RuntimeError(
        "tests/_jax proves shardfeed works without TensorFlow, so TensorFlow must not be "
        f"importable. Received: sys.executable={sys.executable!r} finds tensorflow. Run it "
        "with the JAX venv (.venv-jax, made by .ci/setup)."
    )

# Worker processes started by the tests inherit the split.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={NUM_CPU_DEVICES}")

import jax

jax.config.update("jax_num_cpu_devices", NUM_CPU_DEVICES)


@pytest.fixture
def replicas() -> Iterator[object]:
    """`replicas(n)`: the world of the first `n` CPU devices, for the test."""
    from shardfeed._jax import world as _world

    def use(n: int) -> _world.World:
        world = _world.World(0, 1, 0, tuple(jax.devices()[:n]))
        _world.remember_initialized(world)
        return world

    yield use
    _world._initialized.clear()
