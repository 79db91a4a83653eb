"""`class_weight` under `fit` on JAX against Keras' own `model.fit` on JAX."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _helpers_fit import assert_history_close, max_weight_diff, replicas

from shardfeed import FitOptions, ShardedResidentDataset, fit


def _data(rows: int = 203, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype("float32")
    y = np.argmax(x[:, :classes] + 0.5 * rng.normal(size=(rows, classes)), axis=1)
    return x, y.astype("int32")


def _classifier(loss: str = "sparse_categorical_crossentropy") -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    one_hot = loss == "categorical_crossentropy"
    metric = "categorical_accuracy" if one_hot else "accuracy"
    loss_class = keras.losses.CategoricalCrossentropy if one_hot else (
        keras.losses.SparseCategoricalCrossentropy)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=loss_class(from_logits=True),
        metrics=[metric],
        weighted_metrics=[metric],
    )
    return model


@pytest.mark.parametrize(
    ("labels", "class_weight"),
    [
        ("sparse", {0: 1.0, 1: 4.0, 2: 0.5}),
        ("sparse", {1: 3.0}),  # classes left out weigh 1
        ("column", {0: 0.5, 2: 2.0}),  # labels of shape (n, 1)
        ("one_hot", {0: 2.0, 1: 1.0, 2: 0.25}),  # the argmax is the class
    ],
)
def test_class_weight_equals_keras_fit(labels, class_weight):
    x, y = _data()  # batch 16: 12 full steps and a partial step of 11 rows
    loss = "sparse_categorical_crossentropy"
    if labels == "column":
        y = y[:, None]
    elif labels == "one_hot":
        y, loss = np.eye(3, dtype="float32")[y], "categorical_crossentropy"
    val = (x[:50], y[:50])
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
        history = fit(ours := _classifier(loss), ds, epochs=2, class_weight=class_weight,
                      validation_data=val, verbose=0, options=FitOptions(steps_per_execution=5))
    theirs = _classifier(loss)
    expected = theirs.fit(x, y, batch_size=16, epochs=2, class_weight=class_weight,
                          validation_data=val, shuffle=False, verbose=0)
    assert max_weight_diff(ours, theirs) < 1e-5
    # Validation is not class-weighted, as in Keras: `val_` logs agree too.
    assert_history_close(history.history, expected.history)


def test_class_weight_on_two_replicas_equals_one_replica_with_the_global_batch():
    x, y = _data(400)
    weights = {0: 0.5, 1: 3.0}
    with replicas(1):
        one = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=5)
        expected = fit(theirs := _classifier(), one, epochs=2, class_weight=weights, verbose=0)
    with replicas(2):
        two = ShardedResidentDataset(x, y, per_replica_batch_size=16, seed=5)
        history = fit(ours := _classifier(), two, epochs=2, class_weight=weights, verbose=0)
    assert max_weight_diff(ours, theirs) < 1e-5
    assert_history_close(history.history, expected.history)


def test_a_fit_without_class_weight_after_one_with_it_is_not_weighted():
    # The loops are cached per model: the weighted one must not serve the next fit.
    x, y = _data(96)
    weights = {0: 10.0}
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
        fit(ours := _classifier(), ds, epochs=1, class_weight=weights, verbose=0)
        history = fit(ours, ds, epochs=1, verbose=0)
    theirs = _classifier()
    theirs.fit(x, y, batch_size=16, epochs=1, class_weight=weights, shuffle=False, verbose=0)
    expected = theirs.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    assert max_weight_diff(ours, theirs) < 1e-5
    assert_history_close(history.history, expected.history)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"class_weight": {-1: 2.0}},
         "`class_weight` maps class indices (integers from 0) to finite weights. "
         "Received: class_weight={-1: 2.0}."),
        ({"class_weight": [1.0, 2.0]},
         "`class_weight` must be a dict from class index to weight. "
         "Received: type(class_weight)=list."),
    ],
)
def test_bad_class_weights_are_refused(kwargs, message):
    x, y = _data(64)
    with replicas(1):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=16, shuffle=False)
        with pytest.raises((TypeError, ValueError)) as raised:
            fit(_classifier(), ds, **kwargs)
    assert str(raised.value).startswith(message)


def test_class_weight_with_sample_weights_or_several_outputs_is_refused():
    x, y = _data(64)
    with replicas(1):
        weighted = ShardedResidentDataset(x, y, np.ones(64, "float32"),
                                          per_replica_batch_size=16, shuffle=False)
        with pytest.raises(ValueError) as raised:
            fit(_classifier(), weighted, class_weight={0: 2.0})
        assert str(raised.value) == (
            "`class_weight` and sample weights cannot be used together (as in Keras). "
            "Received: class_weight and a dataset built with sample_weight. Multiply the "
            "class weights into the dataset's `sample_weight` column "
            "(`sample_weight * weights[y]`), or leave `class_weight` out."
        )
        two = ShardedResidentDataset(x, [y, y], per_replica_batch_size=16, shuffle=False)
        with pytest.raises(ValueError, match="Received: targets of several outputs"):
            fit(_classifier(), two, class_weight={0: 2.0})
        cube = ShardedResidentDataset(x, np.zeros((64, 3, 2), "float32"),
                                      per_replica_batch_size=16, shuffle=False)
        with pytest.raises(ValueError, match=r"Received: targets of shape \(64, 3, 2\)"):
            fit(_classifier(), cube, class_weight={0: 2.0})
