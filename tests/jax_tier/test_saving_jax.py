"""`shardfeed.save_model` on JAX, one process: one complete file, no partial
left, the same refusals as on TensorFlow (tests/test_saving.py). Two
processes: tests/jax_tier/test_fit_processes_jax.py."""

from __future__ import annotations

import zipfile

import keras
import numpy as np
import pytest
from _helpers_fit import mlp, regression_data

import shardfeed


def test_save_model_writes_one_complete_file_and_leaves_no_partial(tmp_path):
    x, y = regression_data(200)
    model = mlp()
    ds = shardfeed.ShardedResidentDataset(x, y, per_replica_batch_size=20, seed=0)
    shardfeed.fit(model, ds, verbose=0)
    path = tmp_path / "m.keras"
    shardfeed.save_model(model, path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.keras"]
    assert zipfile.ZipFile(path).testzip() is None
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_save_model_refuses_other_suffixes_before_writing(tmp_path):
    with pytest.raises(ValueError) as err:
        shardfeed.save_model(mlp(), tmp_path / "m.ckpt")
    assert str(err.value).startswith(
        "`save_model` writes what `model.save` writes: a `.keras` (or legacy `.h5`) file. "
        "Received: filepath="
    )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="Received: type\\(model\\)=str"):
        shardfeed.save_model("model", tmp_path / "m.keras")
