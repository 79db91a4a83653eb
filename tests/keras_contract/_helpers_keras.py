"""Keras' own test cases run through `shardfeed.fit`/`evaluate`/`predict`.

The adapted Keras tests call `fit(model, x, y, batch_size=b, ...)` where
Keras wrote `model.fit(x, y, batch_size=b, ...)` (and the same for
`evaluate`/`predict`); everything else, the assertions included, is Keras'.
These functions are the only adaptation, and it is data plumbing only:

- `fit`: the arrays become `ShardedResidentDataset(x, y, sample_weight,
  per_replica_batch_size=batch_size, shuffle=False)` (Keras' default batch
  is 32), the remaining arguments go to `shardfeed.fit` unchanged.
- `evaluate`/`predict`: the arrays go to `shardfeed.evaluate`/`predict`
  with `per_replica_batch_size=batch_size`; the remaining arguments go
  unchanged (so Keras' names such as `steps` reach shardfeed as Keras users
  type them).
- Steps per call: Keras runs `model.steps_per_execution` steps per call (1
  unless compiled otherwise); shardfeed's default is "auto" (docs/keras.md,
  "When batch hooks fire"). A model compiled with the default 1 gets
  `FitOptions(steps_per_execution=1)`, Keras' default; a model compiled with
  another value gets no options, so `compile(steps_per_execution=k)` itself
  must be honoured.

`SHARDFEED_KERAS_CONTROL=1` runs the same tests on plain `model.fit` (the
control: Keras' assertions hold there; `conftest.py` then marks nothing).
`SHARDFEED_KERAS_RESIDENT=1` runs them through Keras' own `model.fit`/
`evaluate`/`predict` in resident mode (`shardfeed.resident_arrays`, with the
same `FitOptions` as above): the arrays are made resident by the hooks, with
Keras' meaning of every argument (its default `shuffle=True` included).
"""

from __future__ import annotations

import os
from typing import Any

import shardfeed
from shardfeed import FitOptions, ShardedResidentDataset

CONTROL = os.environ.get("SHARDFEED_KERAS_CONTROL") == "1"
RESIDENT = os.environ.get("SHARDFEED_KERAS_RESIDENT") == "1"
# Why a file is skipped in the JAX tier (a venv without TensorFlow): Keras'
# TensorBoard and SwapEMAWeights tests read TensorFlow's event files / contexts.
NEEDS_TENSORFLOW = (
    "imports TensorFlow (Keras' test reads TensorFlow's summaries or contexts); the JAX "
    "tier's venv has none, so it runs on the TensorFlow tier only"
)
KERAS_DEFAULT_BATCH_SIZE = 32


def _options(model: Any) -> FitOptions | None:
    return FitOptions(steps_per_execution=1) if model.steps_per_execution == 1 else None


def fit(
    model: Any,
    x: Any = None,
    y: Any = None,
    batch_size: int | None = None,
    sample_weight: Any = None,
    **kwargs: Any,
) -> Any:
    if CONTROL:
        return model.fit(x, y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)
    if RESIDENT:
        with shardfeed.resident_arrays(options=_options(model)):
            return model.fit(x, y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)
    dataset = ShardedResidentDataset(
        x,
        y,
        sample_weight,
        per_replica_batch_size=batch_size or KERAS_DEFAULT_BATCH_SIZE,
        shuffle=False,
    )
    return shardfeed.fit(model, dataset, options=_options(model), **kwargs)


def evaluate(
    model: Any,
    x: Any = None,
    y: Any = None,
    batch_size: int | None = None,
    sample_weight: Any = None,
    **kwargs: Any,
) -> Any:
    if CONTROL:
        return model.evaluate(x, y, batch_size=batch_size, sample_weight=sample_weight, **kwargs)
    if RESIDENT:
        with shardfeed.resident_arrays(options=_options(model)):
            return model.evaluate(
                x, y, batch_size=batch_size, sample_weight=sample_weight, **kwargs
            )
    return shardfeed.evaluate(
        model,
        x,
        y,
        sample_weight,
        per_replica_batch_size=batch_size or KERAS_DEFAULT_BATCH_SIZE,
        options=_options(model),
        **kwargs,
    )


def predict(model: Any, x: Any, batch_size: int | None = None, **kwargs: Any) -> Any:
    if CONTROL:
        return model.predict(x, batch_size=batch_size, **kwargs)
    if RESIDENT:
        with shardfeed.resident_arrays(options=_options(model)):
            return model.predict(x, batch_size=batch_size, **kwargs)
    return shardfeed.predict(
        model,
        x,
        per_replica_batch_size=batch_size or KERAS_DEFAULT_BATCH_SIZE,
        options=_options(model),
        **kwargs,
    )
