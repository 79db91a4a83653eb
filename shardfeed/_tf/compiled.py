"""The compiled loops of each (model, dataset, options): built once, freed with either.

Owns building the model's optimizer, compiled loss and metrics before the
first trace, checking that model and dataset share a strategy, and the one cache
of `Loop`s and their traces per model compile, so repeated
`fit`/`evaluate`/`predict` calls do not retrace.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import keras
import tensorflow as tf

from shardfeed._common import errors as _errors
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.engines.engine import Engine
from shardfeed._tf.loop import Loop, run_eagerly
from shardfeed._tf.model_steps import ModelSteps
from shardfeed._tf.traces import Traces
from shardfeed._tf.world import initialized_world, is_default_strategy
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
        _check_strategy(model, dataset)
        _build(model, dataset, engine)
        loop = Loop(model, dataset, engine, options, class_weights, compiled.traces.get(key))
        compiled.traces[key] = loop.traces
        loops[key] = loop
    return loop


def _check_strategy(model: keras.Model, dataset: ShardedResidentDataset) -> None:
    """Refuses a model and a dataset on different strategies, naming the one
    built outside the strategy's scope (the one on the default strategy)."""
    model_strategy = model.distribute_strategy
    data_strategy = dataset.world.strategy
    if model_strategy is data_strategy:
        return
    received = (
        f"model.distribute_strategy={type(model_strategy).__name__}, "
        f"dataset strategy={type(data_strategy).__name__}"
    )
    constraint = "The model and the dataset must use the same `tf.distribute` strategy."
    if is_default_strategy(data_strategy):
        raise ValueError(
            _errors.message(
                constraint + " The dataset was built outside the strategy's scope.",
                received,
                "Build the dataset inside the scope the model was built in: `with "
                "world.scope(): dataset = shardfeed.ShardedResidentDataset(...)` (or pass "
                "`ShardedResidentDataset(..., strategy=model.distribute_strategy)`).",
            )
        )
    if is_default_strategy(model_strategy):
        constraint += " The model was built, compiled or loaded outside the strategy's scope."
    raise ValueError(
        _errors.message(
            constraint,
            received,
            "Build, compile or load the model inside the dataset's strategy scope, "
            "e.g. `world = shardfeed.init()` (or `world = dataset.world`), then "
            "`with world.scope(): model = keras.models.load_model(path)`.",
        )
    )


def check_model_scope(model: keras.Model) -> None:
    """Refuses a model outside the strategy `shardfeed.init` started, for
    arrays given to `evaluate`/`predict` (they would run on the model's
    default strategy: one device, and alone on each worker)."""
    world = initialized_world()
    if world is None or is_default_strategy(world.strategy):
        return
    if is_default_strategy(model.distribute_strategy):
        raise ValueError(
            _errors.message(
                "The model must be built, compiled or loaded inside the scope of the "
                "strategy `shardfeed.init()` started.",
                f"model.distribute_strategy={type(model.distribute_strategy).__name__}, "
                f"shardfeed.init() strategy={type(world.strategy).__name__}",
                "Build or load it inside that scope: `with world.scope(): model = "
                "keras.models.load_model(path)`.",
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
