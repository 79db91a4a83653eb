"""Test setup: stricter than normal use.

On the TensorFlow backend (the default), the CPU is split into four logical
devices before TensorFlow initialises, so every test session can build a
`MirroredStrategy` over 2 or 4 "devices" (Keras' `multi_device` trick).
Single-device tests run on the default strategy, which places everything on
CPU:0.

With `KERAS_BACKEND=jax` (the JAX tier, in a venv without TensorFlow) this
file imports no TensorFlow and collects only `tests/_jax` (set up by its own
conftest), Keras' adapted tests in `tests/keras_contract` and the
backend-neutral files below; a test there marked `tensorflow` is skipped,
saying why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NUM_LOGICAL_CPUS = 4
ON_JAX = os.environ.get("KERAS_BACKEND", "tensorflow") == "jax"

# pytest puts tests/ on sys.path (for `from _helpers import ...`), so a
# directory tests/jax would be imported as the `jax` package wherever JAX is
# not installed: Keras' `try: import jax` then got that empty namespace
# package and failed ("module 'jax' has no attribute 'monitoring'").
if (Path(__file__).parent / "jax").exists():
    raise RuntimeError(
        "A directory tests/jax shadows the `jax` package for every test (tests/ is on "
        "sys.path). Received: tests/jax exists. Put the JAX tier's tests in tests/_jax."
    )
# Test files that import no TensorFlow: the JAX tier runs them too.
BACKEND_NEUTRAL_TEST_FILES = frozenset(
    {
        "test_credentials.py",
        "test_exchange.py",
        "test_keras_entry.py",
        "test_keras_tools.py",
        "test_relayout.py",
        "test_device_memory.py",
        "test_launch.py",
        "test_launch_integration.py",
        "test_memplan.py",
        "test_mtls_hosts.py",
        "test_plan.py",
        "test_startup.py",
        "test_two_hosts.py",
    }
)
# Of those, the files whose tests take the same path whatever the backend (pure
# arithmetic, the launcher, the startup wait, credentials): `.ci/test` runs them
# once, in the JAX tier, where TensorFlow cannot be imported, and sets
# SHARDFEED_NEUTRAL_ONCE=1 for the TensorFlow tier, which then runs only their
# tests marked `tensorflow`. The other neutral files go through each backend's
# Keras surface, datasets or workers, so both tiers run them.
SAME_PATH_ON_BOTH_BACKENDS = frozenset(
    {
        "test_credentials.py",
        "test_exchange.py",
        "test_launch.py",
        "test_launch_integration.py",
        "test_plan.py",
        "test_relayout.py",
        "test_startup.py",
    }
)
if not SAME_PATH_ON_BOTH_BACKENDS <= BACKEND_NEUTRAL_TEST_FILES:
    raise RuntimeError(
        "A file CI runs once, in the JAX tier, must be one the JAX tier runs. Received: "
        f"{sorted(SAME_PATH_ON_BOTH_BACKENDS - BACKEND_NEUTRAL_TEST_FILES)} only in "
        "SAME_PATH_ON_BOTH_BACKENDS. Add them to BACKEND_NEUTRAL_TEST_FILES too."
    )

if ON_JAX:
    # Keras' adapted tests run here too (tests/keras_contract/conftest.py
    # skips, saying why, the two files that import TensorFlow).
    # The files are named from this folder: a module's tests sit in the folder
    # named after its package (tests/_data, tests/_launch, ...).
    _TESTS = Path(__file__).parent
    collect_ignore = [
        str(path.relative_to(_TESTS))
        for path in _TESTS.rglob("test_*.py")
        if path.parent.name not in ("_jax", "keras_contract")
        and path.name not in BACKEND_NEUTRAL_TEST_FILES
    ]
else:
    collect_ignore = ["_jax"]  # run in .venv-jax (.ci/test)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import tensorflow as tf

    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
    )


@pytest.fixture
def no_init():
    """No world from an earlier `shardfeed.init` of this process, and none left
    after the test (the init-ordering tests of both backends)."""
    from _helpers_init import no_world_from_init

    with no_world_from_init():
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not ON_JAX:
        if os.environ.get("SHARDFEED_NEUTRAL_ONCE") == "1":
            elsewhere = [
                item
                for item in items
                if item.path.name in SAME_PATH_ON_BOTH_BACKENDS
                and item.get_closest_marker("tensorflow") is None
            ]
            if elsewhere:
                config.hook.pytest_deselected(items=elsewhere)
                gone = set(elsewhere)
                items[:] = [item for item in items if item not in gone]
        return
    skip = pytest.mark.skip(reason="needs TensorFlow; the JAX tier's venv has none")
    for item in items:
        if item.get_closest_marker("tensorflow") is not None:
            item.add_marker(skip)
