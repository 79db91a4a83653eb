"""`save_model` checks shared by both backends' tests (`tests/test_saving.py` on
TensorFlow, `tests/jax_tier/test_saving_jax.py` on JAX): Keras, NumPy and the
standard library only; `shardfeed` is the caller's, resolved on its backend."""

from __future__ import annotations

import zipfile
from typing import Any

import keras
import numpy as np
import pytest


def check_writes_one_complete_file(shardfeed: Any, model: Any, x: np.ndarray, tmp_path) -> None:
    """`save_model` of a trained `model` leaves exactly one complete `.keras`
    file in `tmp_path`, which loads to the same predictions."""
    path = tmp_path / "m.keras"
    shardfeed.save_model(model, path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.keras"]
    assert zipfile.ZipFile(path).testzip() is None
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def check_refuses_other_suffixes_before_writing(shardfeed: Any, model: Any, tmp_path) -> None:
    with pytest.raises(ValueError) as err:
        shardfeed.save_model(model, tmp_path / "m.ckpt")
    assert str(err.value).startswith(
        "`save_model` writes what `model.save` writes: a `.keras` (or legacy `.h5`) file. "
        "Received: filepath="
    )
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="Received: type\\(model\\)=str"):
        shardfeed.save_model("model", tmp_path / "m.keras")
