"""The sparse-gradient tests' data and model (`tests/_tf/test_sparse_gradients.py`, and
its Horovod twin's workers): ratings of users and items, and Keras'
collaborative-filtering towers at a small scale."""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

USERS, ITEMS, WIDTH = 61, 97, 5


def ratings(rows, seed=0):
    rng = np.random.default_rng(seed)
    x = np.stack([rng.integers(0, USERS, rows), rng.integers(0, ITEMS, rows)], 1)
    y = rng.uniform(0, 1, (rows, 1))
    return x.astype("int32"), y.astype("float32")


def towers(with_dense=False):
    """Keras' collaborative-filtering model at a small scale: user and item
    embeddings and biases, a dot product, a sigmoid (`with_dense`: a Dense
    head too, so dense and sparse gradients cross in the same step)."""
    keras.utils.set_random_seed(3)
    ids = keras.Input((2,), dtype="int32")
    user, item = ids[:, 0], ids[:, 1]
    dot = layers.Dot(axes=1)(
        [layers.Embedding(USERS, WIDTH)(user), layers.Embedding(ITEMS, WIDTH)(item)]
    )
    logit = layers.Add()([dot, layers.Embedding(USERS, 1)(user), layers.Embedding(ITEMS, 1)(item)])
    if with_dense:
        logit = layers.Dense(1)(logit)
    model = keras.Model(ids, layers.Activation("sigmoid")(logit))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    return model
