"""The compiled loop on JAX: Keras' own stateless steps, many per `jax.jit` call.

The model's `train_step`/`test_step`/`predict_step` (so an override runs), `k`
steps per call under `lax.scan` with a traced start (one compile per call
length); the state replicated on the mesh and the batch sharded along rows, so
XLA's partitioner all-reduces the gradients; the state written back into the
model after each call. `compiled.loop_for` keeps each model's loops across calls.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Literal

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from keras.src import backend as keras_backend
from keras.src.models.functional import Functional
from keras.src.trainers.data_adapters import data_adapter_utils

from shardfeed._data.batch import Batch
from shardfeed._distribute import progress as _progress
from shardfeed._jax import interrupts as _interrupts
from shardfeed._jax.world import REPLICA_AXIS, World
from shardfeed._training.calls import Call, epoch_calls
from shardfeed._training.class_weights import ClassWeights
from shardfeed._training.options import auto_steps_per_execution, has_convolution

Mode = Literal["train", "test", "predict"]


def schedule(
    epoch: Any, k: int, start: int = 0, stop: int | None = None, step_offset: int = 0
) -> list[Call]:
    """The calls covering steps `[start, stop)` of `epoch` (None: all) on
    Keras' grid of `k` steps from `step_offset` (`_training/calls.py`): a
    cell is cut into pieces at a streamed epoch's chunks (`call_bounds`) and
    where the partial last step starts (its own compiled call)."""
    return epoch_calls(
        start, epoch.steps if stop is None else stop, k, step_offset=step_offset,
        partial_step=epoch.full_steps if epoch.has_partial_step else None,
        bounds=epoch.call_bounds,
    )


def is_partial(epoch: Any, start: int) -> bool:
    """Whether the piece starting at `start` is `epoch`'s partial last step."""
    return bool(epoch.has_partial_step) and start == epoch.full_steps


def _data(batch: Any) -> Any:
    """A `Batch` as Keras' array adapter hands it to a step (`x`, `(x, y)` or
    `(x, y, sample_weight)`), so an overridden step unpacks it as under Keras."""
    return data_adapter_utils.pack_x_y_sample_weight(*batch)


def _variables(model: keras.Model, mode: Mode) -> tuple[list[Any], ...]:
    """The model's variables making up `mode`'s state, in Keras' order."""
    groups = [model.trainable_variables, model.non_trainable_variables]
    if mode == "train":
        groups.append(model.optimizer.variables)
    if mode != "predict":
        groups.append(model.metrics_variables)
    return tuple(groups)


def to_host(value: Any) -> np.ndarray:
    """A replicated array's value (this process's first copy; no collective)."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        value = value.addressable_data(0)
    return np.asarray(value)


def python_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """Logs as Keras' callbacks get them (its `pythonify_logs`): nested dicts
    flattened into one (a step returning `{m.name: m.result() for m in
    self.metrics}` gives the compiled metrics' dict of results), scalars as
    floats, arrays kept as arrays."""
    out: dict[str, Any] = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            out.update(python_logs(value))
            continue
        array = to_host(value)
        out[name] = float(array) if array.ndim == 0 else array
    return out


# "auto" steps per call of an unrolled loop, at most (and about ten calls per
# epoch below that): on CPU the keras-io MNIST convnet and timeseries FCN ran
# 8 unrolled steps per call 12-36% faster per step than 1, and 16-32 no
# faster, while the compile grows with the steps (shardfeed/_commands/bench/NOTES.md).
UNROLLED_AUTO_STEPS = 8


def unrolls_steps(model: keras.Model, world: World) -> bool:
    """Whether a call's steps run unrolled (no `while` loop): a model with a
    convolution on CPU devices, where XLA's convolutions inside a loop are
    slow (on GPUs the rolled `lax.scan` is kept: its compile does not grow
    with the steps per call; measured on CPU only)."""
    on_cpu = all(d.platform == "cpu" for d in world.devices)
    return on_cpu and has_convolution(model)


# Compiled calls shared by models of one architecture: KerasTuner's trials and
# repeated fits build new models whose steps compute the same function of their
# state, so one trace (and XLA executable) serves them all. Only models whose
# whole computation their configs name: Sequential or functional models of
# Keras' own layers, compiled with Keras' own optimizer, losses and metrics
# (`architecture_key`); anything with code of its own (a subclass, a custom
# layer, loss or metric, a step override) keeps its own traces. Bounded, least
# recently used first out.
MAX_SHARED_ARCHITECTURES = 16


@dataclasses.dataclass
class _Shared:
    """One architecture's compiled calls, and the loop whose model a trace
    reads (set for the length of each call, under `lock`)."""

    jitted: dict[tuple[Mode, bool], Callable[..., Any]] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    current: Loop | None = None
    # The loop that last asked for the calls, weakly: a trace outside `run`
    # (`fn.lower(...)`) reads its model.
    last: Any = None
    traces: int = 0  # Python traces of its calls (tests count them)

    def tracing(self) -> Loop:
        """The loop whose model a trace reads: the one calling now, else the
        one that last asked for the calls (never one that made them first:
        its model may be gone)."""
        loop = self.current or (self.last() if self.last is not None else None)
        assert loop is not None, "a shared call is traced for a live loop"
        return loop


_STEPS = ("train_step", "test_step", "predict_step", "compute_loss", "call")
_SHARED: collections.OrderedDict[Hashable, _Shared] = collections.OrderedDict()
_SHARED_LOCK = threading.Lock()


def _keras_own(value: Any) -> bool:
    """Whether `value` (a compile argument) is Keras' own: a name, a number, or
    an object or function from Keras' modules (with no user code inside)."""
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list | tuple):
        return all(_keras_own(v) for v in value)
    if isinstance(value, dict):
        return all(_keras_own(v) for v in value.values())
    module = getattr(type(value), "__module__", "") or ""
    if isinstance(value, types.FunctionType):
        module = value.__module__ or ""
    if not module.startswith("keras."):
        return False
    wrapped = getattr(value, "fn", None)  # LossFunctionWrapper / MeanMetricWrapper
    return wrapped is None or _keras_own(wrapped)


def architecture_key(model: keras.Model) -> str | None:
    """A key equal for models whose steps compute the same function of their
    state (the layer names, which differ per model, replaced by their place),
    or None when the model may hold code of its own."""
    if type(model) not in (keras.Sequential, Functional):
        return None
    if any(name in vars(model) for name in _STEPS):  # a step set on the instance
        return None
    layers = list(model._flatten_layers(include_self=False))
    if any(not type(layer).__module__.startswith("keras.") for layer in layers):
        return None
    compile_config = getattr(getattr(model, "_compile_config", None), "config", None)
    if not isinstance(compile_config, dict) or not _keras_own(compile_config):
        return None
    try:
        with warnings.catch_warnings():
            # Serializing a learning-rate variable: NumPy's `__array__` notice
            # about Keras' variables, not the user's business here.
            warnings.simplefilter("ignore", DeprecationWarning)
            config = model.get_config()
            compiled = model.get_compile_config()
    except Exception:  # a config Keras cannot serialize: nothing to compare
        return None
    places = {layer.name: f"@{i}" for i, layer in enumerate([model, *layers])}
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        places[optimizer.name] = "@optimizer"  # `adam_3`: a name, not a computation
        serialized = compiled.get("optimizer")
        learning_rate = getattr(optimizer, "_learning_rate", None)
        if isinstance(learning_rate, keras.Variable) and isinstance(serialized, dict):
            # A float learning rate is a variable of the optimizer's state, read
            # by the step: trials that differ only there share the trace.
            serialized.get("config", {}).pop("learning_rate", None)

    def placed(value: Any) -> Any:
        if isinstance(value, str):
            return places.get(value, value)
        if isinstance(value, list | tuple):
            return [placed(v) for v in value]
        if isinstance(value, dict):
            return {placed(k): placed(v) for k, v in value.items()}
        return value

    # Several outputs name their logs after the output layers: keep those names
    # (a Sequential has one, and may not be built yet).
    outputs = (
        list(model.output_names)
        if isinstance(model, Functional) and len(model.outputs) > 1
        else []
    )
    try:
        return json.dumps(
            [type(model).__name__, placed(config), placed(compiled), outputs],
            sort_keys=True, default=repr,
        )
    except (TypeError, ValueError):
        return None


def _shared_for(key: Hashable) -> _Shared:
    with _SHARED_LOCK:
        shared = _SHARED.pop(key, None) or _Shared()
        _SHARED[key] = shared
        while len(_SHARED) > MAX_SHARED_ARCHITECTURES:
            _SHARED.popitem(last=False)
        return shared


class Loop:
    """Compiled train/test/predict calls for one model on one world.

    Args:
        model: A Keras 3 model (compiled for `train`/`test`).
        world: The replicas (the state is replicated on `world.mesh`).
        steps_per_execution: Steps per compiled call, or "auto": about ten
            calls per epoch, at most 512 steps each in a rolled `lax.scan`,
            at most `UNROLLED_AUTO_STEPS` (8) when unrolled (a convolution on
            CPU devices: `unrolls_steps`).
        class_weights: `fit`'s `class_weight`: training batches get weights
            by class (in place of the dataset's none), as in Keras.
        jit: False runs each step un-jitted, op by op, one step after
            another from Python, as Keras' JAX trainer runs a model compiled
            with `run_eagerly=True` or `jit_compile=False`: for debugging (a
            `print` or breakpoint in a step sees values); the steps per call
            and the hooks are those of the compiled loop.
    """

    def __init__(
        self,
        model: keras.Model,
        world: World,
        steps_per_execution: int | Literal["auto"],
        class_weights: ClassWeights | None = None,
        jit: bool = True,
    ) -> None:
        # Weakly: `compiled.py`'s cache keeps loops for as long as their model lives.
        self._model = weakref.ref(model)
        self.world = world
        self.steps_per_execution = steps_per_execution
        self.class_weights = class_weights
        self.jit = jit
        self.replicated = NamedSharding(world.mesh, P())
        self._stacked = NamedSharding(world.mesh, P(None, REPLICA_AXIS))
        self.unroll = unrolls_steps(model, world)
        # Another model of this architecture's compiled calls, where it can
        # share them (the key names what else shapes a trace).
        architecture = architecture_key(model) if jit else None
        self._shared = (
            _shared_for((architecture, world.mesh, steps_per_execution, class_weights, self.unroll))
            if architecture is not None
            else _Shared()
        )

    @property
    def model(self) -> keras.Model:
        model = self._model()
        assert model is not None, "a Loop is only used while its model is"
        return model

    def steps_per_call(self, full_steps: int) -> int:
        k = self.steps_per_execution
        if k == "auto":
            auto = auto_steps_per_execution(full_steps)
            # Unrolled, the compile grows with the steps per call.
            return min(auto, UNROLLED_AUTO_STEPS) if self.unroll else auto
        return int(k)

    def calls(
        self, epoch: Any, start: int = 0, stop: int | None = None, step_offset: int = 0
    ) -> list[Call]:
        return schedule(epoch, self.steps_per_call(epoch.full_steps), start, stop, step_offset)

    # -- building -------------------------------------------------------------

    def build(self, epoch: Any, mode: Mode) -> Any:
        """Builds what `mode`'s steps read from the batch's shapes (no
        compute), as Keras does before its first step: the model, its metrics
        and optimizer for `fit`/`evaluate`; for `predict` the model's layers
        only; returns that `Batch` of shapes and dtypes."""
        if epoch.full_steps:
            spec = jax.eval_shape(epoch.batch_fn, epoch.call_arrays(0, 1), jnp.int32(0))
        else:
            spec = epoch.partial_batch()
        model = self.model
        if mode != "predict":
            model._symbolic_build(data_batch=_data(spec))
        elif not all(layer.built for layer in model._flatten_layers()):
            # As Keras' `predict`: a compiled model's metrics need targets
            # to build, and an uncompiled one has no `optimizer` at all.
            x = keras.tree.map_structure(
                lambda v: keras.KerasTensor(v.shape, keras.backend.standardize_dtype(v.dtype)),
                spec.x,
            )
            keras_backend.compute_output_spec(model, x, training=False)
        return spec

    # -- state ------------------------------------------------------------------

    def _place(self, value: Any) -> jax.Array:
        # Only this exact sharding: an equivalent one (a single device's, a
        # `keras.distribution` layout) would be another compile of every call.
        if isinstance(value, jax.Array) and value.sharding == self.replicated:
            return value
        # One copy per local device, from this process's value (a single-device
        # array or NumPy), which also builds the global array across processes.
        devices = sorted(self.replicated.addressable_devices, key=lambda d: d.id)
        return jax.make_array_from_single_device_arrays(
            np.shape(value), self.replicated, [jax.device_put(value, d) for d in devices]
        )

    def state(self, mode: Mode) -> tuple[list[jax.Array], ...]:
        """`mode`'s state read from the model's variables, replicated (a copy
        only the first time: later the variables hold the replicated values)."""
        groups = _variables(self.model, mode)
        return tuple([self._place(v.value) for v in group] for group in groups)

    def write_back(self, mode: Mode, state: tuple[list[Any], ...]) -> None:
        """Puts `state` into the model's variables (Keras' `jax_state_sync`)."""
        for group, values in zip(_variables(self.model, mode), state, strict=True):
            for variable, value in zip(group, values, strict=True):
                variable.assign(value)

    def broadcast_from_chief(self) -> None:
        """Gives every process rank 0's weights and optimizer state (as the
        TensorFlow engines do at the start of `fit`)."""
        if self.world.world_size == 1:
            return
        groups = _variables(self.model, "train")[:3]
        values = multihost_utils.broadcast_one_to_all(
            [[np.asarray(v.value) for v in g] for g in groups]
        )
        for group, vals in zip(groups, values, strict=True):
            for variable, value in zip(group, vals, strict=True):
                variable.assign(value)

    # -- compiled calls ----------------------------------------------------------

    def _step(self, mode: Mode) -> Callable[[Any, Any], tuple[Any, Any]]:
        """One step `(state, data) -> (logs or outputs, state)` on the model's
        own method, the state shaped as `_variables(mode)`."""
        model = self.model
        if mode == "train":
            return model.train_step
        if mode == "test":
            return model.test_step

        def predict(state: Any, data: Any) -> tuple[Any, Any]:
            outputs, non_trainable = model.predict_step(state, data)
            return outputs, (state[0], non_trainable)

        return predict

    def _weighted(self, mode: Mode, batch: Batch) -> Batch:
        """`batch` with its class weights: training batches only, as Keras."""
        if mode != "train" or self.class_weights is None:
            return batch
        return batch._replace(sample_weight=self.class_weights.weights(batch.y))

    def _compiled(self, mode: Mode, partial: bool) -> Callable[..., Any]:
        key = (mode, partial)
        shared = self._shared
        shared.last = weakref.ref(self)
        if key in shared.jitted:
            return shared.jitted[key]
        # Logs and state come back replicated; predict's outputs stay sharded
        # along the batch (stacked per step under the scan).
        if mode == "predict":
            out = (self.replicated if partial else self._stacked, self.replicated)
        else:
            out = self.replicated
        donate = (0,) if mode == "train" else ()

        if partial:

            # The model's step is looked up when tracing: the compiled call
            # must not hold the model (`compiled.py`'s cache keys it weakly), and may serve
            # another model of the architecture (`_Shared`).
            def one(state: Any, batch: Any) -> Any:
                loop = shared.tracing()
                shared.traces += 1
                return loop._step(mode)(state, _data(loop._weighted(mode, batch)))

            fn = jax.jit(one, donate_argnums=donate, out_shardings=out) if self.jit else one
        elif not self.jit:

            def stepwise(state: Any, arrays: Any, start: Any, batch_fn: Any, num_steps: int) -> Any:
                # Un-jitted: each step's ops run as JAX dispatches them (the
                # batch is sliced by its own `jax.jit`, as in eager iteration).
                step = self._step(mode)
                results = []
                for i in range(num_steps):
                    batch = self._weighted(mode, batch_fn.jitted(arrays, np.int32(start + i)))
                    result, state = step(state, _data(batch))
                    results.append(result)
                if mode != "predict":
                    return results[-1], state  # logs after the last step
                return jax.tree.map(lambda *r: jnp.stack(r), *results), state

            fn = stepwise
        else:

            def many(state: Any, arrays: Any, start: Any, batch_fn: Any, num_steps: int) -> Any:
                one_step = _call_step(shared, mode, arrays, start, batch_fn)

                def body(state: Any, i: Any) -> tuple[Any, Any]:
                    result, state = one_step(state, i)
                    return state, result

                if num_steps == 1:
                    # No scan: JAX lowers even a length-1 `lax.scan(unroll=True)`
                    # to a `while` loop, where XLA:CPU's convolutions run 6-21x
                    # slower (shardfeed/_commands/bench/NOTES.md).
                    state, result = body(state, jnp.int32(0))
                    if mode != "predict":
                        return result, state
                    return jax.tree.map(lambda r: r[None], result), state  # stacked, as scan's
                steps = jnp.arange(num_steps, dtype=jnp.int32)
                state, results = jax.lax.scan(body, state, steps, unroll=self.unroll)
                if mode != "predict":
                    results = jax.tree.map(lambda r: r[-1], results)  # logs after the last step
                return results, state

            # Predictions stack per step (a static length); unrolled steps and
            # one step per call run without a loop (see `many`).
            if mode == "predict" or self.unroll or self.steps_per_execution == 1:
                fn = jax.jit(
                    many, static_argnums=(3, 4), donate_argnums=donate, out_shardings=out
                )
            else:
                fn = jax.jit(
                    self._rolled(mode, shared), static_argnums=(3,), donate_argnums=donate,
                    out_shardings=out,
                )
        shared.jitted[key] = fn
        return fn

    def _rolled(self, mode: Mode, shared: _Shared) -> Callable[..., Any]:
        """Train or test steps in a `while` loop whose trip count is an
        argument: one compile for every call length (an epoch's shorter last
        call included), where a static length compiled each length apart
        (0.2-0.45 s each for W2's MLP on this CPU)."""

        def rolled(state: Any, arrays: Any, start: Any, batch_fn: Any, num_steps: Any) -> Any:
            one_step = _call_step(shared, mode, arrays, start, batch_fn)

            # The logs' structure for the loop's carry (a trace, no compute);
            # strongly typed, as the body's are made to be.
            logs = jax.eval_shape(one_step, state, start)[0]
            zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), logs)

            def body(i: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
                result, new_state = one_step(carry[0], i)
                result = jax.tree.map(
                    lambda r, z: jax.lax.convert_element_type(r, z.dtype), result, zeros
                )
                return new_state, result

            state, result = jax.lax.fori_loop(0, num_steps, body, (state, zeros))
            return result, state  # logs after the last step

        return rolled

    def run(self, mode: Mode, epoch: Any, start: int, stop: int) -> Any:
        """Runs steps `[start, stop)` of `epoch` (one piece of a `Call`) and
        writes the state back; returns the raw logs (train/test: Keras' logs
        after the piece's last step) or the outputs (predict: stacked
        `[steps, global batch, ...]`, or the partial step's `[rows, ...]`)."""
        # Counted for `shardfeed launch`'s progress watch, which also sees a
        # rank stuck inside it (e.g. in an `io_callback` that never returns):
        # inside until the result is ready, not only dispatched (`fit` and
        # `evaluate` read the logs at once anyway).
        with _progress.call(f"a compiled {mode} call"):
            return jax.block_until_ready(self._run(mode, epoch, start, stop))

    def _run(self, mode: Mode, epoch: Any, start: int, stop: int) -> Any:
        partial = is_partial(epoch, start)
        fn = self._compiled(mode, partial)
        batch = epoch.partial_batch() if partial else None
        arrays = None if partial else epoch.call_arrays(start, stop)
        # A Ctrl-C waits until the model holds the call's state again: the
        # donated state is deleted once the call starts (`interrupts.py`).
        with _interrupts.CALL:
            state = self.state(mode)
            with self._shared.lock:  # a trace reads this loop's model
                self._shared.current = self
                try:
                    if partial:
                        result, state = fn(state, batch)
                    else:
                        result, state = fn(
                            state, arrays, np.int32(start), epoch.batch_fn,
                            np.int32(stop - start),
                        )
                finally:
                    self._shared.current = None
            self.write_back(mode, state)
        if not partial:
            epoch.ran(result)
        return result

    def iterate(
        self, mode: Mode, epoch: Any, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[bool, Any]]:
        """`(partial, result)` for each compiled piece of `epoch`'s steps
        `[start, stop)`: whether it ran the partial last step, and what it
        returned."""
        for call in self.calls(epoch, start, stop):
            for a, b in call.pieces:
                yield is_partial(epoch, a), self.run(mode, epoch, a, b)


def _call_step(
    shared: _Shared, mode: Mode, arrays: Any, start: Any, batch_fn: Any
) -> Callable[[Any, Any], tuple[Any, Any]]:
    """Step `i` of a compiled call, `(state, i) -> (result, state)`, on the
    model of the loop tracing it (a trace counted in `shared.traces`)."""
    loop = shared.tracing()
    shared.traces += 1
    step = loop._step(mode)

    def one_step(state: Any, i: Any) -> tuple[Any, Any]:
        # The schedule asks full steps only: no per-step check.
        batch = loop._weighted(mode, batch_fn.unchecked(arrays, start + i))
        return step(state, _data(batch))

    return one_step
