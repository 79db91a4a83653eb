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
