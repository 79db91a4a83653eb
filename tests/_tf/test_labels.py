"""Sparse categorical labels are checked before the first step.

Keras' non-XLA step stops on an out-of-range label with TensorFlow's
"Received a label value of 7 which is outside the valid range of [0, 3)";
under XLA (shardfeed's default for MLPs) the same label gave loss=nan and no
error. shardfeed checks the labels once per dataset and model, with or
without XLA, for training, validation and evaluation data.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _helpers import mirrored_strategy
from keras import layers

import shardfeed
from shardfeed import FitOptions, LoadOptions, ShardedResidentDataset
from shardfeed._tf import labels as _data_labels
from shardfeed._training import sparse_labels as _label_check

ROWS = 120


def _x(rows=ROWS):
    return np.random.default_rng(0).normal(size=(rows, 4)).astype("float32")


def _labels(rows=ROWS, dtype="int32"):
    return (np.arange(rows) % 3).astype(dtype)


def _classifier(loss="sparse_categorical_crossentropy", units=3, activation="softmax"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), layers.Dense(units, activation=activation)])
    model.compile(optimizer="sgd", loss=loss, metrics=["accuracy"])
    return model


def _range_error(bad, span, where="y of `dataset`", classes=3, also=""):
    return (
        "Labels of a sparse categorical crossentropy must be class indices in the valid "
        f"range of [0, {classes}){also}: the model's output has {classes} units. Received: a "
        f"label value of {bad} in {where} (labels span {span}). Number the classes from 0 "
        f"to {classes - 1}, or give the output layer one unit per class."
    )


@pytest.mark.parametrize(
    ("bad", "span", "loss", "jit_compile"),
    [
        (7, "0 to 7", "sparse_categorical_crossentropy", True),  # was loss=nan
        (7, "0 to 7", "sparse_categorical_crossentropy", False),  # was TF's error mid-step
        (-1, "-1 to 2", keras.losses.SparseCategoricalCrossentropy(), True),
        (3, "0 to 3", keras.losses.SparseCategoricalCrossentropy(from_logits=True), True),
    ],
)
def test_out_of_range_labels_are_refused_before_training(bad, span, loss, jit_compile):
    labels = _labels()
    labels[57] = bad
    activation = None if getattr(loss, "_fn_kwargs", {}).get("from_logits") else "softmax"
    model = _classifier(loss, activation=activation)
    weights = model.get_weights()
    ds = ShardedResidentDataset(_x(), labels, per_replica_batch_size=20, shuffle=False)
    with pytest.raises(ValueError) as err:
        shardfeed.fit(model, ds, verbose=0, options=FitOptions(jit_compile=jit_compile))
    assert str(err.value) == _range_error(bad, span)
    for before, after in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)  # no step ran


def test_fractional_labels_are_refused_and_whole_float_labels_train_as_in_keras():
    x = _x()
    labels = _labels(dtype="float32")
    model = _classifier()
    ds = ShardedResidentDataset(x, labels, per_replica_batch_size=20, shuffle=False)
    hist = shardfeed.fit(model, ds, verbose=0)  # 0.0, 1.0, 2.0 are class ids to Keras too
    reference = _classifier()
    ref = reference.fit(x, labels, batch_size=20, shuffle=False, verbose=0)
    np.testing.assert_allclose(hist.history["loss"], ref.history["loss"], rtol=1e-4)

    labels[3] = 1.5
    bad = ShardedResidentDataset(x, labels, per_replica_batch_size=20, shuffle=False)
    with pytest.raises(ValueError) as err:
        shardfeed.fit(_classifier(), bad, verbose=0)
    assert str(err.value) == (
        "Labels of a sparse categorical crossentropy must be whole class indices (Keras "
        "would silently truncate 1.5 to 1). Received: fractional or NaN labels in y of "
        "`dataset` (labels span 0 to 2). Pass integer class ids (e.g. `y.astype('int32')`); "
        "for one-hot or soft targets use `categorical_crossentropy`."
    )


def test_validation_and_evaluation_labels_are_checked_too():
    x, labels = _x(), _labels()
    wrong = labels.copy()
    wrong[-1] = 9
    model = _classifier()
    ds = ShardedResidentDataset(x, labels, per_replica_batch_size=20, shuffle=False)
    before = model.get_weights()
    with pytest.raises(ValueError) as err:
        shardfeed.fit(model, ds, validation_data=(x, wrong), verbose=0)
    assert str(err.value) == _range_error(9, "0 to 9", "y of `validation_data`")
    # Before the first step: no weight moved.
    for now, then in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(now, then)
    with pytest.raises(ValueError) as err:
        shardfeed.evaluate(model, x, wrong)
    assert str(err.value) == _range_error(9, "0 to 9", "y of `data`")


def test_each_sparse_output_of_a_multi_output_model_is_checked():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(
        inputs,
        {
            "kind": layers.Dense(5, activation="softmax", name="kind")(inputs),
            "size": layers.Dense(1, name="size")(inputs),
        },
    )
    model.compile(
        optimizer="sgd",
        loss={"kind": "sparse_categorical_crossentropy", "size": "mse"},
    )
    kind = np.arange(ROWS) % 5
    size = np.full(ROWS, 100.0, "float32")  # not a class id, and not checked as one
    ds = ShardedResidentDataset(
        _x(), {"kind": kind, "size": size}, per_replica_batch_size=20, shuffle=False
    )
    shardfeed.fit(model, ds, verbose=0)
    kind[0] = 5
    bad = ShardedResidentDataset(
        _x(), {"kind": kind, "size": size}, per_replica_batch_size=20, shuffle=False
    )
    with pytest.raises(ValueError) as err:
        shardfeed.fit(model, bad, verbose=0)
    assert str(err.value) == _range_error(5, "0 to 5", "y['kind'] of `dataset`", classes=5)


def test_ignore_class_is_allowed_and_other_values_are_not():
    labels = _labels(dtype="uint8")
    labels[::7] = 255  # e.g. the "void" label of segmentation masks
    loss = keras.losses.SparseCategoricalCrossentropy(ignore_class=255)
    ds = ShardedResidentDataset(_x(), labels, per_replica_batch_size=20, shuffle=False)
    shardfeed.fit(_classifier(loss), ds, verbose=0)
    labels[5] = 4
    bad = ShardedResidentDataset(_x(), labels, per_replica_batch_size=20, shuffle=False)
    with pytest.raises(ValueError) as err:
        shardfeed.fit(_classifier(loss), bad, verbose=0)
    assert str(err.value) == _range_error(4, "0 to 4", also=" (or ignore_class=255)")


def test_streamed_labels_are_checked():
    labels = _labels()
    labels[100] = 3
    ds = ShardedResidentDataset(
        _x(),
        labels,
        per_replica_batch_size=20,
        shuffle=False,
        load_options=LoadOptions(streaming=True, stream_chunk_bytes=40 * 20, chunk_bytes=7 * 4),
    )
    assert ds.is_streaming
    with pytest.raises(ValueError) as err:
        shardfeed.fit(_classifier(), ds, verbose=0)
    assert str(err.value) == _range_error(3, "0 to 3")


def test_label_stats_take_the_targets_place_in_y():
    kind, size = np.arange(ROWS) % 5, np.full(ROWS, 2.5, "float32")
    ds = ShardedResidentDataset(
        _x(), {"kind": kind, "size": size}, per_replica_batch_size=20, shuffle=False
    )
    np.testing.assert_array_equal(ds.label_stats(("kind",))[0], [0, 4, 0])
    np.testing.assert_array_equal(ds.label_stats(("size",))[0], [2.5, 2.5, 1])
    with pytest.raises(ValueError) as err:
        ds.label_stats(("kind", 0))
    assert str(err.value) == (
        "`target` must lead to one array of `y`. Received: target=('kind', 0). "
        "Pass the keys and positions of one leaf of `element_spec.y`."
    )


@pytest.mark.multi_device
def test_a_bad_label_on_one_replica_stops_every_replica():
    strategy = mirrored_strategy(2)
    labels = _labels()
    labels[-1] = 3  # held by replica 1 only
    with strategy.scope():
        model = _classifier()
        ds = ShardedResidentDataset(_x(), labels, per_replica_batch_size=20, shuffle=False)
    assert ds.label_stats()[0][1] == 2  # replica 0's rows are fine
    with pytest.raises(ValueError) as err:
        shardfeed.fit(model, ds, verbose=0)
    assert str(err.value) == _range_error(3, "0 to 3")


def test_the_check_runs_once_per_dataset_and_model(monkeypatch):
    calls = {"stats": 0, "columns": 0}
    stats, columns = _data_labels.store_label_stats, _label_check._sparse_label_columns

    def count_stats(*args, **kwargs):
        calls["stats"] += 1
        return stats(*args, **kwargs)

    def count_columns(*args, **kwargs):
        calls["columns"] += 1
        return columns(*args, **kwargs)

    monkeypatch.setattr(_data_labels, "store_label_stats", count_stats)
    monkeypatch.setattr(_label_check, "_sparse_label_columns", count_columns)
    ds = ShardedResidentDataset(_x(), _labels(), per_replica_batch_size=20, shuffle=False)
    model = _classifier()
    shardfeed.fit(model, ds, verbose=0)
    shardfeed.fit(model, ds, verbose=0)
    shardfeed.evaluate(model, ds)
    assert calls == {"stats": 1, "columns": 1}
    other = _classifier()  # another model: its output size is read, the labels are not
    shardfeed.fit(other, ds, verbose=0)
    assert calls == {"stats": 1, "columns": 2}
    other.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")  # a new loss
    shardfeed.fit(other, ds, verbose=0)
    assert calls == {"stats": 1, "columns": 3}
