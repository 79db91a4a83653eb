"""The benchmark workloads W1-W6: their data, models, losses and inputs.

Deterministic synthetic data, seeded models, the `transform` and the tf.data
pipeline the Keras variants read. W2 is also what `shardfeed demo` and the
engines bench train. TensorFlow and Keras are imported inside the functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

DEFAULT_BATCH_SIZE = 256
LEARNING_RATE = 1e-3


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark workload: data shape, model and loss.

    Attributes:
        name: "W1" ... "W6".
        rows: Rows at `--rows-scale 1`.
        description: One line for the report.
        input_note: How the inputs reach the model, per variant family.
        batch_size: The global batch of one step: every variant's, the one
            owner of it.
    """

    name: str
    rows: int
    description: str
    input_note: str
    batch_size: int = DEFAULT_BATCH_SIZE

    @property
    def min_rows(self) -> int:
        """`--rows-scale` never goes below two batches."""
        return 2 * self.batch_size


# W5 (issue 17): Keras' collaborative-filtering example, whose gradients are
# `IndexedSlices`.
EMBEDDING_USERS, EMBEDDING_ITEMS, EMBEDDING_WIDTH = 610, 9_724, 50

WORKLOADS: dict[str, Workload] = {
    "W1": Workload(
        "W1",
        60_000,
        "60,000 x 784 float32, MLP 256-256-10 (relu), sparse softmax cross-entropy",
        "float32 rows as they are.",
    ),
    "W2": Workload(
        "W2",
        1_000_000,
        "1,000,000 x 32 float32, MLP 64-64-1 (relu), MSE",
        "float32 rows as they are.",
    ),
    "W3": Workload(
        "W3",
        20_000,
        "20,000 x 32x32x3 uint8 images, CNN Conv32-Pool-Conv64-Pool-Dense128-Dense10, "
        "sparse softmax cross-entropy",
        "uint8 rows everywhere. Keras variants: the model's first layer is "
        "`Rescaling(1/255)` (casts to float32 and scales inside the step). shardfeed: "
        "`transform=lambda x: tf.cast(x, 'float32') / 255` inside the step, no Rescaling "
        "layer. Floor: one batch normalised once, outside the loop.",
    ),
    "W4": Workload(
        "W4",
        50_000,
        "50,000 x 32x32x3 uint8 images (CIFAR-10-shaped), 10 classes, airbench-like CNN "
        "(conv-BN-ReLU blocks 24-32-64-64 with max pooling, global max pool, Dense10), "
        "flip + translate(2, reflect) augmentation per image",
        "uint8 rows everywhere, augmentation on every training batch. model.fit(numpy): "
        "Keras preprocessing layers in the model (`Rescaling(1/255)`, `RandomFlip("
        "'horizontal')`, `RandomTranslation(2/32, 2/32, fill_mode='reflect')`). tf.data "
        "variants: `shardfeed.augment` flip + translate(2) in `map` after `batch` "
        "(AUTOTUNE, a seed per batch), `Rescaling(1/255)` in the model. shardfeed: "
        "`transform` (cast, /255) and `augment=compose(flip_left_right(), translate(2))` in "
        "the step. Floor: the same train step and the same augmentation on one batch.",
    ),
    "W5": Workload(
        "W5",
        100_000,
        f"100,000 ratings of {EMBEDDING_USERS:,} users x {EMBEDDING_ITEMS:,} movies (int32 id "
        f"pairs), two Embedding towers of width {EMBEDDING_WIDTH} with biases, dot product, "
        "sigmoid, binary cross-entropy (Keras' collaborative-filtering example)",
        "int32 (user, movie) rows as they are; the gradients are IndexedSlices.",
        batch_size=64,
    ),
    "W6": Workload(
        "W6",
        60_000,
        "60,000 x 28x28x1 float32 (MNIST-shaped), keras-io's Simple MNIST convnet "
        "(Conv32-Pool-Conv64-Pool-Flatten-Dropout0.5-Dense10 softmax), batch 128, "
        "sparse cross-entropy",
        "float32 rows in [0, 1] as they are (keras-io scales MNIST once, up front).",
        batch_size=128,
    ),
}

def _ratings(rows: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """W5: (user, movie) id pairs, ratings in [0, 1] from a rank-8 teacher."""
    users = rng.integers(0, EMBEDDING_USERS, rows)
    items = rng.integers(0, EMBEDDING_ITEMS, rows)
    u = rng.standard_normal((EMBEDDING_USERS, 8), dtype=np.float32) / np.float32(math.sqrt(8))
    m = rng.standard_normal((EMBEDDING_ITEMS, 8), dtype=np.float32)
    score = np.sum(u[users] * m[items], axis=1, keepdims=True)
    y = np.clip(1 / (1 + np.exp(-score)) + 0.05 * rng.standard_normal(score.shape), 0, 1)
    return np.stack([users, items], 1).astype(np.int32), y.astype(np.float32)


def _embedding_towers(seed: int) -> Any:
    """W5's model: Keras' `RecommenderNet` as a functional model."""
    import keras
    from keras import layers

    def embedding(rows: int, width: int, offset: int) -> Any:
        init = keras.initializers.HeNormal(seed=seed * 100 + offset)
        return layers.Embedding(rows, width, embeddings_initializer=init)

    ids = keras.Input((2,), dtype="int32")
    user, item = ids[:, 0], ids[:, 1]
    dot = layers.Dot(axes=1)(
        [
            embedding(EMBEDDING_USERS, EMBEDDING_WIDTH, 0)(user),
            embedding(EMBEDDING_ITEMS, EMBEDDING_WIDTH, 1)(item),
        ]
    )
    logit = layers.Add()(
        [dot, embedding(EMBEDDING_USERS, 1, 2)(user), embedding(EMBEDDING_ITEMS, 1, 3)(item)]
    )
    return keras.Model(ids, layers.Activation("sigmoid")(logit))


def make_data(workload: Workload, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic, learnable synthetic data for a workload.

    W1: Gaussian rows, labels = argmax of a random linear teacher. W2: Gaussian
    rows, target = a random one-hidden-layer tanh teacher plus 0.1 noise. W3:
    ten random 8x8 colour prototypes upsampled to 32x32, each image its class'
    prototype (0-127) plus uniform noise (0-127), as uint8. W5: uniform
    (user, movie) id pairs, ratings from a rank-8 teacher plus 0.05 noise.
    W6: ten random 7x7 grey prototypes upsampled to 28x28x1, each image its
    class' prototype plus uniform noise, as float32 in [0, 1].

    Args:
        workload: Which workload.
        rows: Number of rows.
        seed: NumPy seed.

    Returns:
        `(x, y)` NumPy arrays.

    Example:
        >>> x, y = make_data(WORKLOADS["W2"], 1000, seed=0); x.shape, y.shape
        ((1000, 32), (1000, 1))
    """
    rng = np.random.default_rng(seed)
    if workload.name == "W5":
        return _ratings(rows, rng)
    if workload.name == "W1":
        x = rng.standard_normal((rows, 784), dtype=np.float32)
        teacher = rng.standard_normal((784, 10), dtype=np.float32)
        return x, np.argmax(x @ teacher, axis=1).astype(np.int32)
    if workload.name == "W2":
        x = rng.standard_normal((rows, 32), dtype=np.float32)
        w1 = rng.standard_normal((32, 16), dtype=np.float32) / np.float32(math.sqrt(32))
        w2 = rng.standard_normal((16, 1), dtype=np.float32)
        noise = np.float32(0.1) * rng.standard_normal((rows, 1), dtype=np.float32)
        return x, (np.tanh(x @ w1) @ w2 + noise).astype(np.float32)
    if workload.name == "W6":
        digits = rng.random((10, 7, 7, 1), dtype=np.float32).repeat(4, axis=1).repeat(4, axis=2)
        y = rng.integers(0, 10, rows, dtype=np.int32)
        noise = rng.random((rows, 28, 28, 1), dtype=np.float32)
        return (digits[y] + noise) / np.float32(2), y
    # W3 and W4: class prototypes plus noise.
    prototypes = rng.integers(0, 48, (10, 8, 8, 3), dtype=np.uint8)
    prototypes = prototypes.repeat(4, axis=1).repeat(4, axis=2)
    y = rng.integers(0, 10, rows, dtype=np.int32)
    images: np.ndarray = prototypes[y]
    images += rng.integers(0, 208, images.shape, dtype=np.uint8)  # <= 254: no overflow
    return images, y


def _airbench_like(head: list[Any], seeds: Any) -> list[Any]:
    """W4's CNN: conv-BN-ReLU blocks with max pooling (airbench's shape, narrower
    so an epoch fits a CPU)."""
    import keras
    from keras import layers

    def block(filters: int, pool: bool) -> list[Any]:
        init = keras.initializers.GlorotUniform(seed=next(seeds))
        conv = layers.Conv2D(filters, 3, padding="same", use_bias=False, kernel_initializer=init)
        pooling = [layers.MaxPooling2D()] if pool else []
        return [conv, *pooling, layers.BatchNormalization(), layers.ReLU()]

    init = keras.initializers.GlorotUniform(seed=next(seeds))
    return [
        *head,
        *block(24, False),
        *block(32, True),
        *block(64, True),
        *block(64, True),
        layers.GlobalMaxPooling2D(),
        layers.Dense(10, kernel_initializer=init),
    ]


def _mnist_convnet(seeds: Any) -> list[Any]:
    """W6's model: keras-io's "Simple MNIST convnet", layer for layer."""
    import keras
    from keras import layers

    def init() -> Any:
        return keras.initializers.GlorotUniform(seed=next(seeds))

    return [
        keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu", kernel_initializer=init()),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, activation="relu", kernel_initializer=init()),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dropout(0.5, seed=next(seeds)),
        layers.Dense(10, activation="softmax", kernel_initializer=init()),
    ]


def build_model(
    workload: Workload, for_keras_fit: bool, seed: int, keras_augment: bool = False
) -> Any:
    """The workload's model, with seeded initialisers.

    Args:
        workload: Which workload.
        for_keras_fit: For W3 and W4, take uint8 input with a `Rescaling(1/255)`
            first layer (the Keras variants); else float32 input (shardfeed's
            `transform` normalises). Ignored for W1, W2, W5 and W6.
        seed: Initialiser seed.
        keras_augment: W4 only: Keras' `RandomFlip` and `RandomTranslation`
            after the rescaling (they hold no weights).

    Returns:
        An uncompiled `keras.Model`.

    Example:
        >>> build_model(WORKLOADS["W2"], True, seed=0).count_params()
        6337
    """
    import keras
    from keras import layers

    if workload.name == "W5":
        return _embedding_towers(seed)
    seeds = iter(range(seed * 100, seed * 100 + 100))

    def dense(units: int, activation: str | None = None) -> Any:
        init = keras.initializers.GlorotUniform(seed=next(seeds))
        return layers.Dense(units, activation=activation, kernel_initializer=init)

    def conv(filters: int) -> Any:
        init = keras.initializers.GlorotUniform(seed=next(seeds))
        return layers.Conv2D(filters, 3, activation="relu", kernel_initializer=init)

    if workload.name == "W6":
        return keras.Sequential(_mnist_convnet(seeds))
    if workload.name == "W1":
        stack = [keras.Input((784,)), dense(256, "relu"), dense(256, "relu"), dense(10)]
    elif workload.name == "W2":
        stack = [keras.Input((32,)), dense(64, "relu"), dense(64, "relu"), dense(1)]
    else:
        head = (
            [keras.Input((32, 32, 3), dtype="uint8"), layers.Rescaling(1 / 255)]
            if for_keras_fit
            else [keras.Input((32, 32, 3))]
        )
        if keras_augment:
            head += [
                layers.RandomFlip("horizontal", seed=seed),
                layers.RandomTranslation(2 / 32, 2 / 32, fill_mode="reflect", seed=seed),
            ]
    if workload.name == "W4":
        stack = _airbench_like(head, seeds)
    elif workload.name == "W3":
        stack = [
            *head,
            conv(32),
            layers.MaxPooling2D(),
            conv(64),
            layers.MaxPooling2D(),
            layers.Flatten(),
            dense(128, "relu"),
            dense(10),
        ]
    return keras.Sequential(stack)


def loss_for(workload: Workload) -> Any:
    """The workload's Keras loss: MSE for W2, binary cross-entropy for W5,
    sparse cross-entropy on W6's softmax, sparse softmax cross-entropy
    otherwise."""
    import keras

    if workload.name == "W6":
        return keras.losses.SparseCategoricalCrossentropy()

    if workload.name == "W5":
        return keras.losses.BinaryCrossentropy()
    if workload.name == "W2":
        return keras.losses.MeanSquaredError()
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def transform_for(workload: Workload) -> Callable[[Any], Any] | None:
    """shardfeed's per-batch `transform`: W3's and W4's uint8 -> float32 / 255, else None."""
    if workload.name not in ("W3", "W4"):
        return None
    import tensorflow as tf

    def normalise(x: Any) -> Any:
        return tf.cast(x, "float32") / 255  # shardfeed: uint8 stays resident, cast per batch

    return normalise


def augments(workload: Workload) -> bool:
    """Whether the workload augments its training batches (W4), without
    importing the augmentation: the Keras variants (and every variant on
    JAX) add Keras' preprocessing layers to the model instead."""
    return workload.name == "W4"


def augment_for(workload: Workload) -> Callable[[Any, Any], Any] | None:
    """W4's augmentation (flip, translate by 2 with reflection), else None."""
    if not augments(workload):
        return None
    from shardfeed import augment

    return augment.compose(augment.flip_left_right(), augment.translate(2))


def compile_model(model: Any, workload: Workload, **compile_kw: Any) -> Any:
    """Compiles `model` with Adam(`LEARNING_RATE`) and the workload's loss.

    Args:
        model: A model from `build_model`.
        workload: Which workload.
        **compile_kw: Extra `model.compile` arguments (`steps_per_execution`,
            `jit_compile`, `metrics`, ...).

    Returns:
        `model`, compiled.

    Example:
        >>> w2 = WORKLOADS["W2"]
        >>> compile_model(build_model(w2, True, seed=0), w2, metrics=["mae"]).loss
        <MeanSquaredError ...>
    """
    import keras

    model.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=loss_for(workload), **compile_kw
    )
    return model


def new_model(
    workload: Workload,
    reference: Any,
    for_keras_fit: bool,
    seed: int,
    keras_augment: bool = False,
    **compile_kw: Any,
) -> Any:
    """A fresh compiled model starting from `reference`'s weights.

    Args:
        workload: Which workload.
        reference: A model of the same workload whose weights are copied.
        for_keras_fit: As in `build_model`.
        seed: Initialiser seed (overwritten by `reference`'s weights).
        keras_augment: As in `build_model`.
        **compile_kw: As in `compile_model`.

    Returns:
        A `keras.Model` compiled by `compile_model`.
    """
    model = build_model(workload, for_keras_fit, seed, keras_augment)
    model.set_weights(reference.get_weights())
    return compile_model(model, workload, **compile_kw)


def tf_data(x: np.ndarray, y: np.ndarray, workload: Workload) -> Any:
    """The Keras variants' pipeline: cache, full-size shuffle, batch of the
    workload's `batch_size`, its augmentation in `map` (W4; parallel, one seed
    per batch), prefetch."""
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(len(x))
    data = data.batch(workload.batch_size)
    augment = augment_for(workload)
    if augment is not None:
        data = data.enumerate().map(
            lambda i, xy: (augment(xy[0], tf.stack([tf.constant(0, tf.int64), i])), xy[1]),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
    return data.prefetch(tf.data.AUTOTUNE)
