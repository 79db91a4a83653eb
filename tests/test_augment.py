"""On-device augmentation: the blocks (`shardfeed.augment`) and `augment=` in training.

Blocks are pinned per example: flip is an involution, translate by 0 is the
identity, offsets stay within bounds and vary per image, a seed repeats.
Training: augment runs on training batches only, its draws are a function
of (seed, epoch, step, replica) -- not of `steps_per_execution` -- so reruns
and resumed runs repeat.
"""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from _helpers import mirrored_strategy
from keras import layers

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset
from shardfeed import augment as aug
from shardfeed._tf.augment import step_seed

SEED = tf.constant([3, 4])
H = W = 6


def _coords(batch=64):
    """Images whose pixel (i, j) holds 1000 + 10 * i + j (all channels)."""
    grid = 1000.0 + 10 * np.arange(H)[:, None] + np.arange(W)[None, :]
    return tf.constant(np.broadcast_to(grid[None, :, :, None], (batch, H, W, 2)), tf.float32)


def test_flip_is_an_involution_and_per_example():
    x = _coords()
    flip = aug.flip_left_right()
    once = flip(x, SEED).numpy()
    np.testing.assert_array_equal(flip(tf.constant(once), SEED).numpy(), x.numpy())
    flipped = (once != x.numpy()).any(axis=(1, 2, 3))
    assert 0 < flipped.sum() < len(flipped)  # each image its own coin
    np.testing.assert_array_equal(once[flipped], x.numpy()[flipped][:, :, ::-1])


def test_translate_by_zero_is_the_identity():
    x = _coords()
    assert aug.translate(0)(x, SEED) is x


@pytest.mark.parametrize("pixels", [1, 2])
def test_translate_offsets_stay_within_bounds_and_vary(pixels):
    x = _coords(256)
    out = aug.translate(pixels, fill=-1.0)(x, SEED).numpy()[..., 0]
    offsets = set()
    for image in out:
        inside = np.argwhere(image >= 0)
        (i, j), value = inside[0], image[tuple(inside[0])]
        di, dj = int(value - 1000) // 10 - int(i), int(value - 1000) % 10 - int(j)
        assert -pixels <= di <= pixels and -pixels <= dj <= pixels
        # The window is a shifted copy of the image; the rest is the fill.
        expected = np.full((H, W), -1.0)
        src = 1000.0 + 10 * np.arange(H)[:, None] + np.arange(W)[None, :]
        for a in range(H):
            for b in range(W):
                if 0 <= a + di < H and 0 <= b + dj < W:
                    expected[a, b] = src[a + di, b + dj]
        np.testing.assert_array_equal(image, expected)
        offsets.add((int(di), int(dj)))
    shifts = range(-pixels, pixels + 1)
    assert offsets == {(a, b) for a in shifts for b in shifts}


def test_translate_reflects_the_border_and_keeps_uint8():
    x = tf.constant(np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4, 1))
    out = aug.translate(2)(x, SEED)
    assert out.dtype == tf.uint8 and out.shape == x.shape
    padded = np.pad(x.numpy(), [(0, 0), (2, 2), (2, 2), (0, 0)], mode="reflect")
    for image, source in zip(out.numpy(), padded, strict=True):
        windows = [source[a : a + 4, b : b + 4] for a in range(5) for b in range(5)]
        assert any(np.array_equal(image, w) for w in windows)


def test_blocks_repeat_for_a_seed_and_differ_across_seeds():
    x = _coords() / 2000.0
    block = aug.compose(
        aug.flip_left_right(),
        aug.translate(2),
        aug.cutout(2),
        aug.gaussian_noise(0.01),
        aug.brightness(0.1),
        aug.contrast(0.8, 1.2),
    )
    a, b = block(x, SEED).numpy(), block(x, SEED).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, block(x, tf.constant([3, 5])).numpy())
    # XLA-friendly; XLA draws its own stream (another RNG algorithm), repeatably.
    compiled = tf.function(block, jit_compile=True)
    np.testing.assert_array_equal(compiled(x, SEED).numpy(), compiled(x, SEED).numpy())


def test_cutout_blanks_at_most_a_square_per_image():
    x = _coords(128)
    out = aug.cutout(3, fill=0.0)(x, SEED).numpy()[..., 0]
    blanked = (out == 0).sum(axis=(1, 2))
    assert blanked.max() == 9 and blanked.min() >= 1  # border cuts the square


def test_float_only_blocks_refuse_integers():
    with pytest.raises(TypeError) as err:
        aug.gaussian_noise(0.1)(tf.zeros((1, 2, 2, 1), tf.uint8), SEED)
    assert str(err.value) == (
        "`shardfeed.augment.gaussian_noise` works on float images. Received: x.dtype=uint8. "
        "Convert first, e.g. `transform=lambda x: tf.cast(x, 'float32') / 255` "
        "(augment runs after transform)."
    )


def test_step_seeds_differ_per_epoch_step_and_replica():
    seeds = {
        tuple(step_seed(7, tf.constant(e), tf.constant(s), tf.constant(r)).numpy())
        for e in range(2)
        for s in range(3)
        for r in range(2)
    }
    assert len(seeds) == 12


def test_augment_needs_a_seed_and_a_function():
    x, y = np.zeros((8, 4, 4, 3), "float32"), np.zeros(8, "int32")
    with pytest.raises(ValueError) as err:
        ShardedResidentDataset(
            x, y, per_replica_batch_size=4, shuffle=False, augment=aug.flip_left_right()
        )
    assert str(err.value) == (
        "Augmenting requires a seed, so that reruns and resumed runs draw the same "
        "augmentations. Received: augment=<function>, seed=None. Pass `seed=<int>`."
    )
    with pytest.raises(TypeError, match=r"Received: type\(augment\)=int"):
        ShardedResidentDataset(x, y, per_replica_batch_size=4, seed=0, augment=3)


# -- in training -------------------------------------------------------------------------


def _images(rows=300, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(rows, 6, 6, 3), dtype=np.uint8)
    labels = images[:, :, :3, 0].mean(axis=(1, 2)).astype("int32") % 3
    return images, labels


def _cnn():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            layers.Conv2D(4, 3, activation="relu"),
            layers.Flatten(),
            layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _scale(x):
    return tf.cast(x, "float32") / 255.0


AUGMENT = aug.compose(aug.flip_left_right(), aug.translate(2))


def _fit(augment, steps_per_execution=2, shuffle=True, epochs=2, **kwargs):
    images, labels = _images()
    ds = ShardedResidentDataset(
        images, labels, per_replica_batch_size=64, seed=5, shuffle=shuffle,
        transform=_scale, augment=augment, **kwargs,
    )
    model = _cnn()
    shardfeed.fit(
        model, ds, epochs=epochs, verbose=0,
        options=FitOptions(steps_per_execution=steps_per_execution, jit_compile=False),
    )
    return model, ds


@pytest.fixture(scope="module")
def augmented():
    """`_fit(AUGMENT)`'s model and dataset, made once (CI time): the first of
    the two runs compared below, and the model evaluate and predict read."""
    return _fit(AUGMENT)


def test_two_runs_with_one_seed_give_identical_weights_and_augment_changes_them(augmented):
    a, _ = augmented
    b, _ = _fit(AUGMENT)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)
    plain, _ = _fit(None)
    assert not all(
        np.array_equal(wa, wp) for wa, wp in zip(a.get_weights(), plain.get_weights(), strict=True)
    )


def test_draws_depend_on_the_step_not_on_steps_per_execution():
    # 300 rows / 64: 4 full steps and a partial one, cut into calls differently.
    a, _ = _fit(AUGMENT, steps_per_execution=1)
    b, _ = _fit(AUGMENT, steps_per_execution=3)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=1e-6, atol=1e-7)


def test_evaluate_and_predict_see_unaugmented_rows(augmented):
    model, ds = augmented
    images, labels = _images()
    expected = model.evaluate(_scale(images), labels, batch_size=64, verbose=0, return_dict=True)
    got = shardfeed.evaluate(model, ds, verbose=0, return_dict=True)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5)
    np.testing.assert_allclose(
        shardfeed.predict(model, ds),
        model.predict(_scale(images), batch_size=64, verbose=0),
        rtol=1e-5, atol=1e-6,
    )


def test_augment_receives_the_input_structure():
    seen = []

    def on_dict(x, seed):
        seen.append(sorted(x))
        return {"image": AUGMENT(x["image"], seed), "extra": x["extra"]}

    images, labels = _images()
    keras.utils.set_random_seed(0)
    image_in, extra_in = keras.Input((6, 6, 3), name="image"), keras.Input((2,), name="extra")
    hidden = layers.Concatenate()([layers.Flatten()(image_in), extra_in])
    model = keras.Model({"image": image_in, "extra": extra_in}, layers.Dense(3)(hidden))
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    x = {"image": images.astype("float32") / 255, "extra": np.ones((len(images), 2), "float32")}
    ds = ShardedResidentDataset(x, labels, per_replica_batch_size=64, seed=1, augment=on_dict)
    shardfeed.fit(model, ds, epochs=1, verbose=0)
    assert seen and seen[0] == ["extra", "image"]


def test_keras_preprocessing_layers_work_as_augment():
    flip = layers.RandomFlip("horizontal", seed=0)

    def keras_augment(x, seed):
        del seed  # Keras layers draw from their own seed generator
        return flip(x, training=True)

    model, _ = _fit(keras_augment, epochs=1)
    assert all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.multi_device
def test_replicas_draw_different_augmentations():
    """Two replicas holding the same rows (placement="replicate") with the
    same batch: each records the draw it got; they differ."""
    strategy = mirrored_strategy(2)
    images = np.ones((16, 6, 6, 3), "uint8")
    labels = np.zeros(16, "int32")
    with strategy.scope():
        model = _cnn()
        draws = tf.Variable(
            tf.zeros([2]),
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.NONE,
        )

    def recorder(x, seed):
        ctx = tf.distribute.get_replica_context()
        value = tf.random.stateless_uniform([], seed)
        draws.assign(tf.tensor_scatter_nd_update(
            tf.zeros([2]), [[ctx.replica_id_in_sync_group]], [value]
        ))
        return x

    ds = ShardedResidentDataset(
        images, labels, per_replica_batch_size=8, seed=2, transform=_scale,
        augment=recorder, placement="replicate", strategy=strategy, shuffle=False,
    )
    shardfeed.fit(model, ds, epochs=1, verbose=0)
    per_replica = [v.numpy() for v in draws.values]
    assert per_replica[0][0] != 0 and per_replica[1][1] != 0
    assert per_replica[0][0] != per_replica[1][1]


def test_a_run_resumed_at_an_epoch_repeats_the_augmentations():
    whole, _ = _fit(AUGMENT, epochs=2)
    images, labels = _images()
    ds = ShardedResidentDataset(
        images, labels, per_replica_batch_size=64, seed=5, transform=_scale, augment=AUGMENT
    )
    resumed = _cnn()
    options = FitOptions(steps_per_execution=2, jit_compile=False)
    shardfeed.fit(resumed, ds, epochs=1, verbose=0, options=options)
    shardfeed.fit(resumed, ds, epochs=2, initial_epoch=1, verbose=0, options=options)
    for wa, wb in zip(whole.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)


# -- arguments checked: at construction, against the images when their shape is known --------

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: aug.gaussian_noise(NAN), "`shardfeed.augment.gaussian_noise`'s `stddev` must be "
         "a finite number >= 0. Received: stddev=nan. Pass e.g. `gaussian_noise(0.05)`."),
        (lambda: aug.gaussian_noise(-0.1), "`shardfeed.augment.gaussian_noise`'s `stddev` must "
         "be a finite number >= 0. Received: stddev=-0.1. Pass e.g. `gaussian_noise(0.05)`."),
        (lambda: aug.brightness(INF), "`shardfeed.augment.brightness`'s `max_delta` must be a "
         "finite number >= 0. Received: max_delta=inf. Pass e.g. `brightness(0.1)`."),
        # A finite offset past any image range (it trained without a word).
        (lambda: aug.brightness(1e30), "`shardfeed.augment.brightness`'s `max_delta` is an "
         "offset in the images' units ([0, 1] or [0, 255]) and must be at most 255. Received: "
         "max_delta=1e+30. Pass e.g. `brightness(0.1)` for images in [0, 1], `brightness(25)` "
         "for [0, 255]."),
        (lambda: aug.contrast(0, INF), "`shardfeed.augment.contrast`'s `upper` must be a finite "
         "number >= 0. Received: upper=inf. Pass e.g. `contrast(0.9, 1.1)`."),
        (lambda: aug.contrast(NAN, 1), "`shardfeed.augment.contrast`'s `lower` must be a finite "
         "number >= 0. Received: lower=nan. Pass e.g. `contrast(0.9, 1.1)`."),
        (lambda: aug.translate(2, fill=NAN), "`shardfeed.augment.translate`'s `fill` must be a "
         "finite number. Received: fill=nan. Pass e.g. `fill=0`."),
        (lambda: aug.cutout(4, fill=INF), "`shardfeed.augment.cutout`'s `fill` must be a finite "
         "number. Received: fill=inf. Pass e.g. `fill=0.0`."),
        # `random_crop` is `translate` under its own name: its errors named
        # `translate` and `pixels`.
        (lambda: aug.random_crop(-1), "`shardfeed.augment.random_crop`'s `padding` must be a "
         "non-negative integer. Received: padding=-1. Pass e.g. `random_crop(4)`."),
        (lambda: aug.random_crop(4, fill="edge"), "`shardfeed.augment.random_crop`'s `fill` "
         "must be \"reflect\", \"symmetric\" or a number. Received: fill='edge'. Pass e.g. "
         "`fill=\"reflect\"` or `fill=0`."),
    ],
)
def test_block_arguments_must_be_finite_and_in_range(make, message):
    """NaN and inf were accepted and trained to NaN."""
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == message


def _dataset(x, block, transform=None):
    return ShardedResidentDataset(
        x, np.zeros(len(keras.tree.flatten(x)[0]), "int32"), per_replica_batch_size=8, seed=0,
        augment=block, transform=transform,
    )


SIZES = [
    (lambda: aug.cutout(64), "`shardfeed.augment.cutout`'s `size` must be smaller than the "
     "image's height and width. Received: size=64, image height=32, width=32. Pass a smaller "
     "`size` (e.g. `cutout(8)` for 32x32 images)."),  # blanked every pixel
    (lambda: aug.translate(100), "`shardfeed.augment.translate`'s `pixels` must be smaller "
     "than the image's height and width. Received: pixels=100, image height=32, width=32. Pass "
     "a smaller `pixels` (e.g. `translate(2)` for 32x32 images)."),  # XLA RET_CHECK failure
    (lambda: aug.compose(aug.flip_left_right(), aug.translate(32, fill=0)),
     "`shardfeed.augment.translate`'s `pixels` must be smaller than the image's height and "
     "width. Received: pixels=32, image height=32, width=32. Pass a smaller `pixels` (e.g. "
     "`translate(2)` for 32x32 images)."),  # blanked 98% with translate(100, fill=0)
    (lambda: aug.random_crop(40), "`shardfeed.augment.random_crop`'s `padding` must be smaller "
     "than the image's height and width. Received: padding=40, image height=32, width=32. Pass "
     "a smaller `padding` (e.g. `random_crop(4)` for 32x32 images)."),
]


@pytest.mark.parametrize("make, message", SIZES)
def test_sizes_are_checked_against_the_images_when_the_dataset_is_built(make, message):
    x = np.zeros((16, 32, 32, 3), "float32")
    with pytest.raises(ValueError) as err:
        _dataset(x, make())
    assert str(err.value) == message
    # A size smaller than the image passes.
    _dataset(x, aug.compose(aug.cutout(31), aug.translate(31, fill=0)))


@pytest.mark.parametrize("make, message", SIZES[:2])
def test_sizes_are_checked_at_the_first_batch_after_a_transform(make, message):
    """With a `transform` the images' shape is known only when the step is traced."""
    x = np.zeros((16, 32 * 32 * 3), "float32")
    ds = _dataset(x, make(), transform=lambda v: tf.reshape(v, (-1, 32, 32, 3)))
    model = keras.Sequential([layers.Flatten(), layers.Dense(2)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    with pytest.raises(ValueError, match=re.escape(message)):
        shardfeed.fit(model, ds, epochs=1, verbose=0)


def test_blocks_refuse_non_image_and_dict_inputs():
    """Raw TensorFlow rank errors before."""
    images = np.zeros((16, 6, 6, 3), "float32")
    with pytest.raises(ValueError) as err:
        _dataset(images.reshape(16, -1), aug.flip_left_right())
    assert str(err.value) == (
        "`shardfeed.augment.flip_left_right` augments one batch of images `[batch, height, "
        "width, channels]`. Received: x.shape=(None, 108). Give the rows an image shape "
        "`(height, width, channels)` (e.g. `transform=lambda x: tf.reshape(x, (-1, 28, 28, "
        "1))`), or augment only image inputs."
    )
    with pytest.raises(TypeError) as err:
        _dataset({"image": images, "extra": np.ones((16, 2), "float32")}, aug.cutout(2))
    assert str(err.value) == (
        "`shardfeed.augment.cutout` augments one batch of images `[batch, height, width, "
        "channels]`. Received: type(x)=dict with keys ['extra', 'image']. Apply it to the "
        "image input only, e.g. `augment=lambda x, seed: {**x, 'image': block(x['image'], "
        "seed)}`."
    )
    with pytest.raises(TypeError, match=r"Received: type\(x\)=dict with keys \['image'\]"):
        aug.brightness(0.1)({"image": tf.zeros((1, 2, 2, 1))}, SEED)
