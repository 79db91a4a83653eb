"""Test helpers shared by several test files (one place, not copied)."""

from __future__ import annotations

import tensorflow as tf


def mirrored_strategy(num_devices: int) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy over the first `num_devices` logical CPUs.

    Strategies built in one process share collective group keys; one over 2
    devices and one over 4 then collide ("joining a group with size 4, but
    that group has size 2"). TensorFlow's own tests move the key base per
    strategy (strategy_combinations._mirrored_strategy_with_collective_key_base).
    """
    tf.distribute.MirroredStrategy._collective_key_base += 100_000
    return tf.distribute.MirroredStrategy([f"/CPU:{i}" for i in range(num_devices)])


def strategy_of(num_devices: int) -> tf.distribute.Strategy:
    """The default strategy (one device, CPU:0) for 1, else `mirrored_strategy`."""
    if num_devices == 1:
        return tf.distribute.get_strategy()
    return mirrored_strategy(num_devices)
