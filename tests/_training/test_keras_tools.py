"""Tools that call Keras' `model.fit` for the user, on resident data.

Each case is the tool's own getting-started code with at most two lines
changed (marked `# shardfeed:`): KerasTuner's `RandomSearch` and `Hyperband`
on a `ShardedResidentDataset` and on arrays in resident mode, scikeras'
`KerasClassifier` and `KerasRegressor` in resident mode. Uploads are counted
(every `ShardedResidentDataset` built).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import shardfeed

# The Horovod tier's venv collects every file and has neither tool.
keras_tuner = pytest.importorskip(
    "keras_tuner", reason="KerasTuner is not installed here (requirements-ci.txt pins it)"
)


@pytest.fixture
def uploads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the datasets built (each one uploads its rows once)."""
    built: list[int] = []
    kind = shardfeed.ShardedResidentDataset
    original = kind.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(kind, "__init__", counting)
    yield built
    shardfeed.resident_arrays(False)


def mnist_like(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28x28 "digits" whose class is which quarter of the image is bright."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=rows)
    x = rng.uniform(0, 0.5, size=(rows, 28, 28)).astype("float32")
    for i, label in enumerate(labels):
        r, c = divmod(int(label), 2)
        x[i, r * 14 : (r + 1) * 14, c * 14 : (c + 1) * 14] += 0.5
    return x, keras.utils.to_categorical(labels, 10)


# KerasTuner's getting-started hypermodel, as written there.
def build_model(hp: Any) -> keras.Model:
    model = keras.Sequential()
    model.add(keras.layers.Flatten())
    model.add(
        keras.layers.Dense(
            units=hp.Int("units", min_value=32, max_value=512, step=32), activation="relu"
        )
    )
    model.add(keras.layers.Dense(10, activation="softmax"))
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    return model


def _best_accuracy(tuner: Any) -> float:
    return float(tuner.oracle.get_best_trials(1)[0].score)


def test_keras_tuner_random_search_on_a_resident_dataset(
    tmp_path: Path, uploads: list[int]
) -> None:
    x_train, y_train = mnist_like(1024, seed=0)
    x_val, y_val = mnist_like(256, seed=1)
    tuner = keras_tuner.RandomSearch(
        hypermodel=build_model, objective="val_accuracy", max_trials=2, overwrite=True,
        directory=str(tmp_path), project_name="helloworld",
    )
    ds = shardfeed.ShardedResidentDataset(x_train, y_train, per_replica_batch_size=64, seed=0)  # shardfeed: the rows, uploaded once  # noqa: E501
    with shardfeed.resident_arrays():  # shardfeed: validation arrays uploaded once too
        tuner.search(ds, epochs=2, validation_data=(x_val, y_val))
    assert len(tuner.oracle.trials) == 2
    assert len(uploads) == 2  # the training rows and the validation rows, once each
    assert _best_accuracy(tuner) > 0.9


def test_keras_tuner_hyperband_on_arrays_in_resident_mode(
    tmp_path: Path, uploads: list[int]
) -> None:
    x_train, y_train = mnist_like(1024, seed=0)
    x_val, y_val = mnist_like(256, seed=1)
    tuner = keras_tuner.Hyperband(
        hypermodel=build_model, objective="val_accuracy", max_epochs=2, factor=2,
        overwrite=True, directory=str(tmp_path), project_name="hyperband",
    )
    with shardfeed.resident_arrays():  # shardfeed: the one changed line
        tuner.search(x_train, y_train, epochs=2, validation_data=(x_val, y_val), batch_size=64)
    # Two brackets: 2 trials of 1 epoch, the better one resumed at epoch 1 for a
    # second (Keras' `initial_epoch`), and 2 trials of 2 epochs (CI time: 11
    # epochs in 6 trials at max_epochs=3, factor=3).
    assert len(tuner.oracle.trials) == 5
    assert len(uploads) == 2  # every trial reused the training and validation uploads
    assert _best_accuracy(tuner) > 0.9


def test_scikeras_in_resident_mode(uploads: list[int]) -> None:
    from scikeras.wrappers import KerasClassifier, KerasRegressor

    x, onehot = mnist_like(512, seed=0)
    x = x.reshape(len(x), -1)
    y = onehot.argmax(1)

    # scikeras' quick-start model function, as written there.
    def get_clf(meta: dict[str, Any]) -> keras.Model:
        n_features_in_ = meta["n_features_in_"]
        n_classes_ = meta["n_classes_"]
        model = keras.models.Sequential()
        model.add(keras.layers.Input(shape=(n_features_in_,)))
        model.add(keras.layers.Dense(32, activation="relu"))
        model.add(keras.layers.Dense(n_classes_, activation="softmax"))
        return model

    def get_reg(meta: dict[str, Any]) -> keras.Model:
        model = keras.models.Sequential()
        model.add(keras.layers.Input(shape=(meta["n_features_in_"],)))
        model.add(keras.layers.Dense(16, activation="relu"))
        model.add(keras.layers.Dense(1))
        return model

    with shardfeed.resident_arrays():  # shardfeed: the one changed line
        clf = KerasClassifier(
            get_clf, loss="sparse_categorical_crossentropy", optimizer="adam", epochs=3,
            batch_size=32, verbose=0, random_state=0,
        )
        clf.fit(x, y)
        accuracy = clf.score(x, y)
        reg = KerasRegressor(get_reg, loss="mse", optimizer="adam", epochs=2, verbose=0)
        reg.fit(x, y.astype("float32"))
        predicted = reg.predict(x)
    assert accuracy > 0.9
    assert predicted.shape == (512,)
    assert len(uploads) >= 2  # the rows went through resident datasets
