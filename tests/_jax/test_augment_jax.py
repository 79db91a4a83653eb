"""`shardfeed.augment`'s blocks on JAX: the same blocks as on TensorFlow
(written once in `keras.ops`), drawing from the key the JAX loop passes.

Per block: a key repeats, another step or epoch draws anew, each example
draws its own transform, and what each does is pinned exactly where it can
be (a flip is the mirror, a translated image is a shifted copy, cutout
blanks a square of the given size, brightness and contrast stay in range,
noise has the given deviation). Then in `fit` on 2 devices: the blocks
train, change the batches, and a resumed run draws what an uninterrupted
one does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from _helpers_fit import max_weight_diff, replicas
from _helpers_jax import coordinate_images
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardfeed import FitOptions, ShardedResidentDataset, fit
from shardfeed import augment as aug
from shardfeed._jax.augment import augment_key

KEY = jax.random.key(3)
H, W = 8, 10
BLOCKS = {
    "flip_left_right": lambda: aug.flip_left_right(),
    "translate": lambda: aug.translate(2),
    "random_crop": lambda: aug.random_crop(2),
    "cutout": lambda: aug.cutout(3),
    "gaussian_noise": lambda: aug.gaussian_noise(0.1),
    "brightness": lambda: aug.brightness(0.2),
    "contrast": lambda: aug.contrast(0.5, 1.5),
    "compose": lambda: aug.compose(aug.flip_left_right(), aug.translate(2), aug.cutout(3),
                                   aug.gaussian_noise(0.01), aug.brightness(0.1),
                                   aug.contrast(0.8, 1.2)),
}


def _images(batch: int = 64) -> jax.Array:
    return jnp.asarray(coordinate_images(batch, H, W) / 4096.0)  # float images in [0.24, 1]


def _changed(before: jax.Array, after: jax.Array) -> np.ndarray:
    """Per example: whether the block changed it."""
    return (np.asarray(before) != np.asarray(after)).any(axis=(1, 2, 3))


@pytest.mark.parametrize("name", BLOCKS)
def test_a_key_repeats_and_each_step_epoch_and_example_draws_anew(name):
    block, x = BLOCKS[name](), _images()
    first = np.asarray(block(x, augment_key(5, 0, 0)))
    np.testing.assert_array_equal(first, np.asarray(block(x, augment_key(5, 0, 0))))
    for other in (augment_key(5, 0, 1), augment_key(5, 1, 0), augment_key(6, 0, 0)):
        assert not np.array_equal(first, np.asarray(block(x, other)))
    # Each example its own transform: the 64 identical images come out in
    # many different ways (a flip has only 2).
    distinct = {image.tobytes() for image in first}
    assert len(distinct) >= (2 if name == "flip_left_right" else 20), len(distinct)
    # Compiled: the same draws (one key, the same numbers; float rounding aside).
    np.testing.assert_allclose(np.asarray(jax.jit(block)(x, augment_key(5, 0, 0))), first,
                               rtol=1e-6, atol=1e-6)


def test_flip_gives_each_image_or_its_exact_mirror():
    x = _images()
    out = np.asarray(aug.flip_left_right()(x, KEY))
    flipped = _changed(x, out)
    assert 0 < flipped.sum() < len(flipped)
    np.testing.assert_array_equal(out[flipped], np.asarray(x)[flipped][:, :, ::-1])
    np.testing.assert_array_equal(out[~flipped], np.asarray(x)[~flipped])


def _offset(image: np.ndarray) -> tuple[int, int]:
    """The shift of a translated coordinate image, from its first pixel inside."""
    i, j = np.argwhere(image >= 1000)[0]
    value = int(image[i, j]) - 1000
    return value // 100 - int(i), value % 100 - int(j)


@pytest.mark.parametrize("pixels", [1, 2])
def test_translate_is_a_shifted_copy_with_every_offset_and_none_beyond(pixels):
    x = coordinate_images(256, H, W)
    out = np.asarray(aug.translate(pixels, fill=-1.0)(jnp.asarray(x), KEY))[..., 0]
    source, offsets = x[0, :, :, 0], set()
    for image in out:
        di, dj = _offset(image)
        assert -pixels <= di <= pixels and -pixels <= dj <= pixels
        expected = np.full((H, W), -1.0, np.float32)  # the window, the rest the fill
        for a in range(H):
            for b in range(W):
                if 0 <= a + di < H and 0 <= b + dj < W:
                    expected[a, b] = source[a + di, b + dj]
        np.testing.assert_array_equal(image, expected)
        offsets.add((di, dj))
    shifts = range(-pixels, pixels + 1)
    assert offsets == {(a, b) for a in shifts for b in shifts}


def test_translate_reflects_the_border_keeps_uint8_and_random_crop_pads_zeros():
    x = np.arange(64 * 4 * 4, dtype=np.uint8).reshape(64, 4, 4, 1)
    out = np.asarray(aug.translate(2)(jnp.asarray(x), KEY))
    assert out.dtype == np.uint8 and out.shape == x.shape
    padded = np.pad(x, [(0, 0), (2, 2), (2, 2), (0, 0)], mode="reflect")
    for image, source in zip(out, padded, strict=True):
        windows = [source[a:a + 4, b:b + 4] for a in range(5) for b in range(5)]
        assert any(np.array_equal(image, w) for w in windows)
    # random_crop(p) is translate(p) with zero padding: the same windows.
    np.testing.assert_array_equal(
        np.asarray(aug.random_crop(2)(jnp.asarray(x), KEY)),
        np.asarray(aug.translate(2, fill=0)(jnp.asarray(x), KEY)),
    )


def test_translate_by_zero_is_the_identity():
    x = _images()
    assert aug.translate(0)(x, KEY) is x


@pytest.mark.parametrize("size", [3, 4])
def test_cutout_fills_one_square_of_the_given_size_per_image(size):
    x = jnp.ones((256, 16, 16, 2), jnp.float32)
    out = np.asarray(aug.cutout(size, fill=0.5)(x, KEY))
    assert set(np.unique(out)) <= {0.5, 1.0}
    np.testing.assert_array_equal(out[..., 0], out[..., 1])  # every channel
    corners, whole = set(), 0
    for image in out[..., 0]:
        rows, cols = np.nonzero(image == 0.5)
        assert len(rows) >= 1  # the centre is always inside
        top, left = rows.min(), cols.min()
        height, width = rows.max() - top + 1, cols.max() - left + 1
        assert len(rows) == height * width and height <= size and width <= size  # a rectangle
        # A square cut only by the border: whole where the border is not near.
        if 0 < top and top + size < 16 and 0 < left and left + size < 16:
            assert (height, width) == (size, size)
        whole += (height, width) == (size, size)
        corners.add((top, left))
    assert len(corners) > 100  # each image its own square
    assert whole > 128  # most centres are far enough from the border


def test_gaussian_noise_has_the_given_deviation_per_example():
    x = jnp.zeros((64, 16, 16, 3), jnp.float32)
    noise = np.asarray(aug.gaussian_noise(0.1)(x, KEY))
    assert abs(noise.std() - 0.1) < 0.003 and abs(noise.mean()) < 0.003
    assert not np.array_equal(noise[0], noise[1])
    # bfloat16 images get bfloat16 noise.
    assert aug.gaussian_noise(0.1)(x.astype(jnp.bfloat16), KEY).dtype == jnp.bfloat16


def test_brightness_adds_one_offset_per_image_within_range():
    x = _images(256)
    delta = np.asarray(aug.brightness(0.2)(x, KEY)) - np.asarray(x)
    per_image = delta[:, 0, 0, 0]
    np.testing.assert_allclose(delta, np.broadcast_to(per_image[:, None, None, None], delta.shape),
                               atol=1e-6)
    assert per_image.min() >= -0.2 - 1e-6 and per_image.max() <= 0.2 + 1e-6
    assert per_image.min() < -0.15 and per_image.max() > 0.15  # spread over the range
    assert len(np.unique(per_image)) > 250


def test_contrast_scales_each_image_around_its_mean_within_range():
    x = np.asarray(_images(256))
    out = np.asarray(aug.contrast(0.5, 1.5)(jnp.asarray(x), KEY))
    mean = x.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(out.mean(axis=(1, 2), keepdims=True), mean, rtol=1e-5)
    factor = ((out - mean) / (x - mean))[:, 0, 0, 0]  # pixel (0, 0) is off the mean
    np.testing.assert_allclose((out - mean), (x - mean) * factor[:, None, None, None],
                               atol=1e-5)
    assert factor.min() >= 0.5 - 1e-4 and factor.max() <= 1.5 + 1e-4
    assert factor.min() < 0.6 and factor.max() > 1.4


@pytest.mark.parametrize("name", ["gaussian_noise", "brightness", "contrast"])
def test_float_only_blocks_refuse_integers_naming_the_jax_fix(name):
    with pytest.raises(TypeError) as err:
        BLOCKS[name]()(jnp.zeros((1, 2, 2, 1), jnp.uint8), KEY)
    assert str(err.value) == (
        f"`shardfeed.augment.{name}` works on float images. Received: x.dtype=uint8. "
        "Convert first, e.g. `transform=lambda x: x.astype('float32') / 255` "
        "(augment runs after transform)."
    )


def test_blocks_are_checked_against_the_images_when_a_jax_dataset_is_built():
    with replicas(1):
        with pytest.raises(ValueError) as err:
            ShardedResidentDataset(np.zeros((16, 32, 32, 3), "float32"), per_replica_batch_size=8,
                                   seed=0, augment=aug.compose(aug.cutout(64)))
        assert str(err.value).startswith(
            "`shardfeed.augment.cutout`'s `size` must be smaller than the image's height and "
            "width. Received: size=64, image height=32, width=32."
        )
        with pytest.raises(ValueError) as err:
            ShardedResidentDataset(np.zeros((16, 108), "float32"), per_replica_batch_size=8,
                                   seed=0, augment=aug.flip_left_right())
        assert str(err.value) == (
            "`shardfeed.augment.flip_left_right` augments one batch of images `[batch, height, "
            "width, channels]`. Received: x.shape=(None, 108). Give the rows an image shape "
            "`(height, width, channels)` (e.g. `transform=lambda x: x.reshape(-1, 28, 28, "
            "1)`), or augment only image inputs."
        )


def test_draws_do_not_depend_on_how_the_batch_is_sharded_and_stay_on_its_devices():
    """One key per global batch: 1 device or 2 draw the same numbers, and each
    example's gather runs where the example is (no collective)."""
    block = BLOCKS["compose"]()
    x = np.asarray(_images(64))
    one = np.asarray(jax.jit(block)(jax.device_put(x, jax.devices()[0]), KEY))
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("replica",)), P("replica"))
    sharded = jax.device_put(x, sharding)
    compiled = jax.jit(block).lower(sharded, KEY).compile()
    out = compiled(sharded, KEY)
    np.testing.assert_allclose(np.asarray(out), one, rtol=1e-6, atol=1e-6)
    assert out.sharding.is_equivalent_to(sharding, out.ndim)
    hlo = compiled.as_text()
    assert not any(op in hlo for op in ("all-gather", "all-reduce", "all-to-all")), "a collective"


def test_compose_passes_user_functions_a_jax_key():
    seen = []

    def mine(x, key):
        seen.append(jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key))
        return x + jax.random.uniform(key, x.shape)

    x = _images(8)
    out = aug.compose(aug.flip_left_right(), mine)(x, KEY)
    assert seen == [True] and out.shape == x.shape


def test_a_backend_without_draws_names_the_fix(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "torch")
    with pytest.raises(NotImplementedError) as err:
        aug.flip_left_right()(_images(2), KEY)
    assert str(err.value) == (
        "`shardfeed.augment`'s blocks draw with TensorFlow's or JAX's stateless random ops. "
        "Received: keras.backend.backend()='torch'. Use the TensorFlow or JAX backend "
        "(`KERAS_BACKEND`), with `from shardfeed import augment` before the blocks run."
    )


# -- in a JAX dataset and `fit` ------------------------------------------------------------

AUGMENT = aug.compose(aug.flip_left_right(), aug.translate(2), aug.brightness(0.1))


def _data(rows: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    images = rng.random((rows, 6, 6, 3), np.float32)
    labels = (images[:, :, :3, 0].mean(axis=(1, 2)) * 3).astype("int32") % 3
    return images, labels


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    return model


def _fit(augment, epochs=2, steps_per_execution=2, model=None, initial_epoch=0):
    images, labels = _data()
    with replicas(2):
        ds = ShardedResidentDataset(images, labels, per_replica_batch_size=32, seed=5,
                                    augment=augment)
        model = _model() if model is None else model
        history = fit(model, ds, epochs=epochs, initial_epoch=initial_epoch, verbose=0,
                      options=FitOptions(steps_per_execution=steps_per_execution))
    return model, history


def test_replicas_draw_their_own_transforms_from_the_global_batch():
    """Two replicas, identical rows: the two halves of a global batch differ."""
    with replicas(2):
        ds = ShardedResidentDataset(np.full((64, 6, 6, 3), 0.5, np.float32),
                                    per_replica_batch_size=8, seed=1, shuffle=False,
                                    augment=aug.brightness(0.2))
        epoch = ds.epoch(0, augment=True)
        x = np.asarray(epoch.batch(0).x)
        np.testing.assert_array_equal(x, np.asarray(ds.epoch(0, augment=True).batch(0).x))
        assert len({float(v) for v in x[:, 0, 0, 0]}) == 16  # every example its own offset
        assert not np.array_equal(x, np.asarray(epoch.batch(1).x))


@pytest.fixture(scope="module")
def two_epochs():
    """The uninterrupted run the fit tests compare against: 2 epochs, 2 steps per call."""
    return _fit(AUGMENT)


def test_fit_trains_with_the_blocks_and_they_change_the_batches(two_epochs):
    augmented, history = two_epochs
    assert np.isfinite(history.history["loss"]).all()
    plain, _ = _fit(None)
    assert max_weight_diff(augmented, plain) > 1e-3


def test_draws_depend_on_the_step_not_on_steps_per_execution(two_epochs):
    # 300 rows, global batch 64: 4 full steps and a partial one, cut into calls differently.
    one_step_per_call, _ = _fit(AUGMENT, steps_per_execution=1)
    assert max_weight_diff(two_epochs[0], one_step_per_call) < 1e-6


def test_a_run_resumed_at_an_epoch_repeats_the_augmentations(two_epochs):
    resumed, _ = _fit(AUGMENT, epochs=1)
    _fit(AUGMENT, epochs=2, model=resumed, initial_epoch=1)
    assert max_weight_diff(two_epochs[0], resumed) == 0


def test_a_keras_layer_drawing_from_its_own_seed_generator_is_refused_with_the_fix(replicas):
    # Was JAX's UnexpectedTracerError after the trace (docs/data.md said Keras
    # preprocessing layers work; they do on TensorFlow). The form the message
    # gives, drawing from the key, trains.
    replicas(1)
    x = coordinate_images(32, 8, 8) / 1000.0
    y = np.zeros(32, "int32")
    flip = keras.layers.RandomFlip("horizontal", seed=1)

    def stateless(x, key):
        t = flip.get_random_transformation(x, training=True, seed=jax.random.key_data(key))
        return flip.transform_images(x, t, training=True)

    for augment in (lambda x, key: flip(x, training=True), stateless):
        ds = ShardedResidentDataset(x, y, per_replica_batch_size=8, seed=0, augment=augment)
        model = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Flatten(),
                                  keras.layers.Dense(2)])
        model.compile("adam", "sparse_categorical_crossentropy")
        if augment is stateless:
            fit(model, ds, epochs=1, verbose=0)
            continue
        with pytest.raises(ValueError) as err:
            fit(model, ds, epochs=1, verbose=0)
        assert str(err.value).startswith(
            "On JAX an `augment` must draw only from the key it is given: the compiled loop "
            "cannot advance a Keras layer's own seed generator (a preprocessing layer called "
            "as `layer(x, training=True)` does). Received: augment=<function "
        )
        assert str(err.value).endswith(
            "updated 1 Keras variable(s). Draw from the key: `t = "
            "layer.get_random_transformation(x, training=True, seed=jax.random.key_data(key)); "
            "x = layer.transform_images(x, t, training=True)`, or use `shardfeed.augment`'s "
            "blocks, or put the layer inside the model."
        )
