"""The compiled loops of each (model, dataset, options): built once, freed with either.

Owns building the model's optimizer, compiled loss and metrics before the
first trace, and the one cache
of `Loop`s and their traces per model compile, so repeated
`fit`/`evaluate`/`predict` calls do not retrace.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import keras
import tensorflow as tf

from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.engines.engine import Engine
from shardfeed._tf.inputs import check_strategy
from shardfeed._tf.loop import Loop, run_eagerly
from shardfeed._tf.model_steps import ModelSteps
from shardfeed._tf.traces import Traces
from shardfeed._training.class_weights import ClassWeights
from shardfeed._training.loop_cache import ModelCache
from shardfeed._training.options import FitOptions


@dataclasses.dataclass
class _Compiled:
    """What one compile of a model has built (`_training/loop_cache.ModelCache`
    makes a new one when the model is recompiled).

    Attributes:
        traces: The compiled calls, shared by its loops over datasets whose
            batches trace alike (`dataset.trace_signature`): a new dataset
            per `evaluate(model, x, y)` reuses them.
        loops: Its `Loop` per dataset (weak keys; a `Loop` holds its dataset
            and its model weakly): dropping the last reference to a dataset
            frees its device variables at once, and its loops with it.
    """

    traces: dict[Any, Traces] = dataclasses.field(default_factory=dict)
    loops: weakref.WeakKeyDictionary[ShardedResidentDataset, dict[Any, Loop]] = (
        dataclasses.field(default_factory=weakref.WeakKeyDictionary)
    )


# The one cache of compiled loops, per model and its current compile, so
# repeated fit/evaluate/predict calls do not retrace.
_COMPILED: ModelCache[_Compiled] = ModelCache(_Compiled)


def loop_for(
    model: keras.Model,
    dataset: ShardedResidentDataset,
    options: FitOptions,
    class_weights: ClassWeights | None = None,
) -> Loop:
    compiled = _COMPILED.of(model)
    eager = run_eagerly(model)  # `model.run_eagerly` may change without a recompile
    key = (dataset.trace_signature, options, class_weights, eager)
    loops = compiled.loops.setdefault(dataset, {})
    loop = loops.get(key)
    if loop is None:
        engine = dataset.engine
        check_strategy(model, dataset)
        _build(model, dataset, engine)
        loop = Loop(model, dataset, engine, options, class_weights, compiled.traces.get(key))
        compiled.traces[key] = loop.traces
        loops[key] = loop
    return loop


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
