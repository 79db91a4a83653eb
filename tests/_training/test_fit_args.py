"""`model.fit`'s arguments under `shardfeed.fit`, each against `model.fit`'s numbers.

`validation_split`, `class_weight` and `validation_freq` give what Keras
gives on the same rows (the same ops in the same order without XLA, so the
weights agree to float rounding); the arguments `shardfeed.fit` cannot take
are refused with what to use instead.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from _helpers import mirrored_strategy
from keras import layers

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset
from shardfeed._training import fit_args

EXACT = FitOptions(jit_compile=False, steps_per_execution=3)


def _data(rows=1003, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype("float32")
    y = np.argmax(x[:, :classes] + 0.5 * rng.normal(size=(rows, classes)), axis=1)
    return x, y.astype("int32")


def _classifier(loss="sparse_categorical_crossentropy", classes=3):
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((6,)), layers.Dense(16, activation="relu"), layers.Dense(classes, "softmax")]
    )
    model.compile(
        optimizer="adam", loss=loss, metrics=["accuracy"], weighted_metrics=["accuracy"]
    )
    return model


def _assert_same(reference, model, ref_hist, hist, keys):
    for a, b in zip(reference.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert sorted(hist.history) == sorted(ref_hist.history)
    for key in keys:
        np.testing.assert_allclose(hist.history[key], ref_hist.history[key], rtol=1e-5)


def test_validation_split_takes_the_last_rows_as_keras_does():
    x, y = _data()
    reference, model = _classifier(), _classifier()
    ref = reference.fit(
        x, y, batch_size=64, epochs=2, validation_split=0.25, shuffle=False, verbose=0
    )
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=64, shuffle=False)
    hist = shardfeed.fit(model, ds, epochs=2, validation_split=0.25, verbose=0, options=EXACT)
    _assert_same(reference, model, ref, hist, ["loss", "val_loss", "val_accuracy"])
    assert hist.params["samples"] == 752  # floor(1003 * 0.75), as Keras
    # A second fit reuses the split datasets (no second upload).
    again = fit_args.split_validation(ds, 0.25)
    assert again == fit_args.split_validation(ds, 0.25)


def test_validation_split_lets_go_of_the_whole_while_the_parts_are_held():
    x, y = _data()
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=64, shuffle=False)
    model = _classifier()
    before = shardfeed.evaluate(model, ds, return_dict=True)
    whole = ds.nbytes_on_device
    opened = ds.epoch(0)
    training, validation = fit_args.split_validation(ds, 0.25)
    # The devices hold the two parts, not the whole as well.
    assert ds.nbytes_on_device == 0
    assert training.nbytes_on_device + validation.nbytes_on_device == whole
    assert opened.closed  # its order and handles were the whole's
    assert "let go of by `split`" in ds.describe()
    # Used again, the whole loads its rows again from its sources.
    assert shardfeed.evaluate(model, ds, return_dict=True) == before
    assert ds.nbytes_on_device == whole


@pytest.mark.multi_device
def test_a_split_dataset_loads_its_global_order_again():
    x, _ = _data(rows=203)
    ids = np.arange(203, dtype="int32")  # row ids as the "labels": which rows a step took
    with mirrored_strategy(2).scope():
        ds = ShardedResidentDataset(x, ids, per_replica_batch_size=8, seed=0)
    assert ds.exchange is not None  # the global order moves sharded rows each epoch

    def steps(epoch):
        strategy = ds.world.strategy
        return [
            [t.numpy().tolist() for t in strategy.experimental_local_results(batch.y)]
            for _, batch in ds.epoch(epoch)
        ]

    expected = [steps(0), steps(1)]
    fit_args.split_validation(ds, 0.25)
    assert [steps(0), steps(1)] == expected


@pytest.mark.parametrize(
    "one_hot, class_weight",
    [
        (False, {0: 1.0, 1: 4.0, 2: 0.5}),
        (False, {1: 3.0}),  # classes left out weigh 1
        (True, {0: 2.0, 1: 1.0, 2: 0.25}),  # one-hot labels: the argmax is the class
    ],
)
def test_class_weight_matches_keras(one_hot, class_weight):
    x, y = _data()
    loss = "sparse_categorical_crossentropy"
    if one_hot:
        y = np.eye(3, dtype="float32")[y]
        loss = "categorical_crossentropy"
    reference, model = _classifier(loss), _classifier(loss)
    ref = reference.fit(
        x, y, batch_size=100, epochs=2, class_weight=class_weight, shuffle=False, verbose=0
    )
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=100, shuffle=False)
    hist = shardfeed.fit(model, ds, epochs=2, class_weight=class_weight, verbose=0, options=EXACT)
    _assert_same(reference, model, ref, hist, ["loss", "accuracy", "weighted_accuracy"])
    # Validation is not class-weighted, as in Keras: it equals a plain evaluate.
    again = shardfeed.fit(
        model, ds, epochs=1, class_weight=class_weight, validation_data=ds, verbose=0
    )
    np.testing.assert_allclose(
        again.history["val_loss"][0], shardfeed.evaluate(model, ds)[0], rtol=1e-5
    )


def test_validation_freq_list_matches_keras():
    x, y = _data(400)
    reference, model = _classifier(), _classifier()
    val = (x[:100], y[:100])
    ref = reference.fit(
        x, y, batch_size=50, epochs=4, validation_data=val, validation_freq=[1, 3],
        shuffle=False, verbose=0,
    )
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=50, shuffle=False)
    hist = shardfeed.fit(
        model, ds, epochs=4, validation_data=val, validation_freq=[1, 3], verbose=0,
        options=EXACT,
    )
    assert len(hist.history["val_loss"]) == len(ref.history["val_loss"]) == 2
    _assert_same(reference, model, ref, hist, ["loss", "val_loss"])


def test_batch_size_names_the_per_replica_batch_and_the_global_batch():
    x, y = _data(200)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
    with pytest.raises(TypeError) as err:
        shardfeed.fit(_classifier(), ds, batch_size=64)
    assert str(err.value) == (
        "The batch belongs to the dataset: the global batch is `per_replica_batch_size x "
        "num_replicas_in_sync` (this dataset: 32 per replica x 1 replicas = 32). Received: "
        "batch_size=64. Build the dataset with `ShardedResidentDataset(x, y, "
        "per_replica_batch_size=batch_size // world.num_replicas_in_sync)`."
    )


@pytest.mark.parametrize("name", sorted(fit_args.REFUSED))
def test_other_fit_arguments_say_what_to_use_instead(name):
    x, y = _data(200)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
    constraint, fix = fit_args.REFUSED[name]
    with pytest.raises(TypeError) as err:
        shardfeed.fit(_classifier(), ds, **{name: x})
    assert str(err.value) == (
        f"{constraint} Received: {name}=<ndarray of shape (200, 6)>. {fix}"
    )


def test_an_unknown_argument_is_a_type_error_naming_it():
    x, y = _data(200)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument `epoch`\. Received: epoch=3"):
        shardfeed.fit(_classifier(), ds, epoch=3)


@pytest.mark.parametrize(
    "kwargs, pinned",
    [
        ({"validation_split": 1.5}, "Received: validation_split=1.5."),
        ({"validation_split": 0.999}, "Received: validation_split=0.999 of 200 rows."),
        (
            {"validation_split": 0.2, "validation_data": "given"},
            "Pass either `validation_data` or `validation_split`, not both.",
        ),
        ({"class_weight": {-1: 2.0}}, "Received: class_weight={-1: 2.0}."),
        ({"class_weight": [1.0, 2.0]}, "Received: type(class_weight)=list."),
    ],
)
def test_bad_values_are_refused(kwargs, pinned):
    x, y = _data(200)
    ds = ShardedResidentDataset(x, y, per_replica_batch_size=32, seed=0)
    with pytest.raises((TypeError, ValueError)) as err:
        shardfeed.fit(_classifier(), ds, **kwargs)
    assert pinned in str(err.value)


def test_class_weight_with_sample_weights_or_several_outputs_is_refused():
    x, y = _data(200)
    w = np.ones(200, "float32")
    ds = ShardedResidentDataset(x, y, w, per_replica_batch_size=32, seed=0)
    with pytest.raises(ValueError, match="cannot be used together"):
        shardfeed.fit(_classifier(), ds, class_weight={0: 2.0})
    two = ShardedResidentDataset(x, [y, y], per_replica_batch_size=32, seed=0)
    with pytest.raises(ValueError, match="Received: targets of several outputs"):
        shardfeed.fit(_classifier(), two, class_weight={0: 2.0})


def test_fit_options_jit_compile_is_a_switch_not_a_number():
    # 1 == True passed `jit_compile in (True, False, "auto")`.
    with pytest.raises(ValueError) as err:
        FitOptions(jit_compile=1)
    assert str(err.value) == (
        '`jit_compile` must be True, False or "auto". Received: jit_compile=1. '
        'Use "auto" unless you measured otherwise.'
    )
