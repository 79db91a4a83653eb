"""The compiled loops of each model's current compile on JAX (`loop_for`): built
once per mesh, steps per call and class weights, kept across `fit`/`evaluate`/
`predict` calls on `_training/loop_cache.ModelCache`, as TensorFlow's."""

from __future__ import annotations

from collections.abc import Hashable

import keras

from shardfeed._jax.loop import Loop
from shardfeed._jax.world import World
from shardfeed._training.class_weights import ClassWeights
from shardfeed._training.loop_cache import ModelCache
from shardfeed._training.options import FitOptions, with_model_steps

# The loops of each model's current compile, per mesh and steps per call, so a
# second `fit`/`evaluate`/`predict` compiles nothing (a `Loop`'s `jax.jit`
# calls keep their traces). A `Loop` holds its model weakly: a dropped model
# frees its weights and its traces. Datasets are arguments of the calls, never
# held: a dropped dataset frees its device arrays; a new one whose batches
# trace alike (an equal `BatchFn`, the same shapes) reuses the traces.
_LOOPS: ModelCache[dict[Hashable, Loop]] = ModelCache(dict)


def loop_for(
    model: keras.Model,
    world: World,
    options: FitOptions,
    class_weights: ClassWeights | None = None,
) -> Loop:
    """The loop of `model` on `world` with `options`' steps per call (the
    model's `compile(steps_per_execution=k)` applied) and `fit`'s
    `class_weights`: the one made by an earlier call for the model's current
    compile, else a new one. `FitOptions(jit_compile=False)` or a model
    compiled with `run_eagerly=True` runs the steps un-jitted (`Loop`'s
    `jit`), as Keras' JAX trainer does."""
    options = with_model_steps(options, model)
    jit = options.jit_compile is not False and not getattr(model, "run_eagerly", False)
    steps = options.steps_per_execution
    loops = _LOOPS.of(model)
    key = (world.mesh, world.world_size, steps, class_weights, jit)
    loop = loops.get(key)
    if loop is None:
        loop = loops[key] = Loop(model, world, steps, class_weights, jit)
    return loop
