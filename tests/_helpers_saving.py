"""`save_model` checks shared by both backends' tests (`tests/_tf/test_saving.py` on
TensorFlow, `tests/_jax/test_saving_jax.py` on JAX): Keras, NumPy and the
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


# A child whose `model.save` writes, says so, then sleeps: SIGTERM arrives mid-save.
_SLOW_SAVE = """
import pathlib, sys, time
import keras
import shardfeed
out = pathlib.Path(sys.argv[1])
save = keras.Model.save
def slow(self, filepath, **kwargs):
    save(self, filepath, **kwargs)
    (out / "saving").touch()
    time.sleep(120)
keras.Model.save = slow
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
shardfeed.save_model(model, str(out / "m.keras"))
"""


def check_sigterm_during_a_save_leaves_no_partial_file(tmp_path) -> None:
    """SIGTERM's default action ended the process at once, leaving the
    temporary `.m.keras.PID.partial.keras` beside the model (14 of 17 tries).
    Now the process still ends by SIGTERM, and leaves nothing."""
    import signal
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "saving").exists():
            assert child.poll() is None and time.monotonic() < deadline, "the child never saved"
            time.sleep(0.05)
        assert any(p.name.endswith(".partial.keras") for p in tmp_path.iterdir())
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saving"]
