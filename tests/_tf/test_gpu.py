"""The thin GPU tier: paths only a GPU exercises, run for real where one exists.

Their logic is tested on CPU (tests/_tf/test_initialize.py, tests/_tf/test_dataset.py);
here they run against a real device: rows land in GPU memory, the free-memory
query answers, and training on the GPU matches Keras.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import shardfeed
from shardfeed._data import memory as _memory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not tf.config.list_physical_devices("GPU"),
        reason="no GPU visible to TensorFlow (CI and developer machines here are CPU-only); "
        "the logic of these paths is tested on CPU in test_initialize.py and test_dataset.py",
    ),
]


def test_rows_are_resident_on_the_gpu():
    x = np.arange(4000, dtype="float32").reshape(1000, 4)
    ds = shardfeed.ShardedResidentDataset(x, per_replica_batch_size=100, shuffle=False)
    assert "GPU:0" in ds.stores[0].variables[0].device
    np.testing.assert_array_equal(ds.stores[0].variables[0].numpy(), x)


def test_free_gpu_memory_is_known_with_nvml():
    pytest.importorskip("pynvml", reason="nvidia-ml-py not installed (pip install shardfeed[gpu])")
    free, source = _memory.free_bytes("/device:GPU:0")
    assert source == "nvml" and free > 0


def test_fit_on_the_gpu_matches_keras():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1000, 8)).astype("float32")
    y = rng.normal(size=(1000, 1)).astype("float32")

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        return m

    reference, ours = model(), model()
    reference.fit(x, y, batch_size=100, shuffle=False, verbose=0)
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=100, shuffle=False)
    shardfeed.fit(ours, ds, verbose=0)
    for a, b in zip(reference.get_weights(), ours.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
