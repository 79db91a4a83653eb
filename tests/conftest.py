"""Test setup: stricter than normal use.

The CPU is split into four logical devices before TensorFlow initialises, so
every test session can build a `MirroredStrategy` over 2 or 4 "devices"
(Keras' `multi_device` trick). Single-device tests run on the default
strategy, which places everything on CPU:0.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

NUM_LOGICAL_CPUS = 4

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
)


def mirrored_strategy(num_devices: int) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy over the first `num_devices` logical CPUs.

    Strategies built in one process share collective group keys; one over 2
    devices and one over 4 then collide ("joining a group with size 4, but
    that group has size 2"). TensorFlow's own tests move the key base per
    strategy (strategy_combinations._mirrored_strategy_with_collective_key_base).
    """
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    return tf.distribute.MirroredStrategy([f"/CPU:{i}" for i in range(num_devices)])
