"""The compiled loops of each (model, dataset, options): built once, freed with the dataset.

Owns building the model's optimizer, compiled loss and metrics before the
first trace, checking that model and dataset share a strategy, and caching
each `Loop` so repeated `fit`/`evaluate`/`predict` calls do not retrace.
"""

from __future__ import annotations

import weakref
from typing import Any

import keras
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._data.dataset import ShardedResidentDataset
from shardfeed._distribute.engine import Engine, engine_for
from shardfeed._training.class_weights import ClassWeights
from shardfeed._training.loop import Loop
from shardfeed._training.model_steps import ModelSteps
from shardfeed._training.options import FitOptions

# Compiled loops per dataset, keyed per model and options so repeated
# fit/evaluate/predict calls do not retrace. Weak keys, and a `Loop` holds its
# dataset weakly: dropping the last reference to a dataset frees its device
# variables at once, and its loops with it.
_LOOPS: weakref.WeakKeyDictionary[ShardedResidentDataset, dict[Any, Loop]] = (
    weakref.WeakKeyDictionary()
)


def loop_for(
    model: keras.Model,
    dataset: ShardedResidentDataset,
    options: FitOptions,
    class_weights: ClassWeights | None = None,
) -> Loop:
    loops = _LOOPS.setdefault(dataset, {})
    # A recompiled model has a new optimizer, loss and metrics: new traces.
    compiled = (id(getattr(model, "optimizer", None)), id(getattr(model, "_compile_loss", None)))
    key = (id(model), compiled, options, class_weights)
    loop = loops.get(key)
    if loop is None or loop.model is not model:
        engine = engine_for(dataset.world)
        _check_strategy(model, dataset)
        _build(model, dataset, engine)
        loop = Loop(model, dataset, engine, options, class_weights)
        loops[key] = loop
    return loop


def _check_strategy(model: keras.Model, dataset: ShardedResidentDataset) -> None:
    model_strategy = model.distribute_strategy
    if model_strategy is not dataset.world.strategy:
        raise ValueError(
            _errors.message(
                "The model and the dataset must use the same `tf.distribute` strategy.",
                f"model.distribute_strategy={type(model_strategy).__name__}, "
                f"dataset strategy={type(dataset.world.strategy).__name__}",
                "Build, compile or load the model inside the dataset's strategy scope, "
                "e.g. `world = shardfeed.init()` (or `world = dataset.world`), then "
                "`with world.scope(): model = keras.models.load_model(path)`.",
            )
        )


def _build(model: keras.Model, dataset: ShardedResidentDataset, engine: Engine) -> None:
    """Builds the model, its compiled loss and metrics and its optimizer before
    tracing, so no variable is created inside the compiled loop.

    Uses Keras' own symbolic build (what `model.fit` does) on the shapes of
    one row: nothing runs and no metric state changes.
    """
    with engine.scope():
        # Only shapes and dtypes matter: one row of zeros per spec.
        batch = keras.tree.map_structure(
            lambda s: None if s is None else tf.zeros((1, *s.shape[1:]), s.dtype),
            dataset.element_spec,
        )
        # A model with its own steps may have no `call` (the guide's GAN):
        # no forward pass to build from; its layers are built already or in
        # its step, as under Keras' `fit` without a strategy.
        has_call = type(model).call is not keras.Model.call
        if getattr(model, "compiled", False) and batch[1] is not None and has_call:
            model._symbolic_build(data_batch=batch)
        else:
            if has_call:
                model(batch[0], training=False)
            optimizer = getattr(model, "optimizer", None)
            if ModelSteps.of(model).train and optimizer is not None and not optimizer.built:
                optimizer.build(model.trainable_variables)
    engine.prepare_model(model)
