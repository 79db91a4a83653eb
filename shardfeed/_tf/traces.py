"""The compiled calls of a loop (`Traces`, one builder over mode and piece), shared by loops
whose traces are interchangeable (so `evaluate` on arrays does not retrace), and what
TensorFlow files for a trace removed after it (`_trace_gradients_dropped`)."""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import tensorflow as tf
from tensorflow.python.framework import ops as _tf_ops  # the gradient registry
from tensorflow.python.ops.control_flow_v2_func_graphs import ControlFlowFuncGraph

from shardfeed._common import errors as _errors
from shardfeed._tf import loss_trackers
from shardfeed._tf.engines.engine import Engine
from shardfeed._tf.functions import Mode, Piece, compiled

if TYPE_CHECKING:
    import keras

    from shardfeed._tf.epoch import ResidentEpoch
    from shardfeed._tf.model_steps import ModelSteps
    from shardfeed._training.options import FitOptions


class TracedLoop(Protocol):
    """What the compiled calls read of the loop bound to them (`Loop`, above
    this module: typed here, so `traces` never imports `loop`)."""

    @property
    def model(self) -> keras.Model: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def options(self) -> FitOptions: ...
    @property
    def jit_compile(self) -> bool: ...
    @property
    def model_steps(self) -> ModelSteps: ...
    def body(self, mode: Mode, piece: Piece) -> Callable[..., Any]: ...


# How many times a loop's partial last step runs eagerly before it is traced
# (`Traces._eager_first`).
EAGER_PARTIAL_CALLS = 3


class Bound:
    """The loop and epoch a compiled call runs with (`Traces.call`): its first
    argument, a Python value that traces alike whichever loop and epoch it
    holds, so one trace serves every loop sharing the `Traces`. A trace holds
    it weakly: no model or dataset is kept alive by a cached trace."""

    __slots__ = ("__weakref__", "epoch", "loop")

    def __init__(self, loop: TracedLoop, epoch: ResidentEpoch) -> None:
        self.loop = loop
        self.epoch = epoch

    def __tf_tracing_type__(self, context: Any) -> _BoundType:
        return _BoundType(weakref.ref(self))


class _BoundType(tf.types.experimental.TraceType):
    """`Bound`'s trace type: every `Bound` is of one type (TensorFlow's
    documented pattern for a Python value given to a trace as it is)."""

    def __init__(self, bound: weakref.ref[Bound]) -> None:
        self._bound = bound

    def is_subtype_of(self, other: Any) -> bool:
        return isinstance(other, _BoundType)

    def most_specific_common_supertype(self, others: Any) -> _BoundType | None:
        return self if all(isinstance(o, _BoundType) for o in others) else None

    def placeholder_value(self, placeholder_context: Any = None) -> Bound | None:
        return self._bound()  # the call being traced holds it

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BoundType)

    def __hash__(self) -> int:
        return hash(_BoundType)


class Traces:
    """The compiled calls shared by every `Loop` whose traces are interchangeable.

    A trace depends on the model, its compile, the options, the class weights,
    the strategy and the kind of batch the dataset gathers (column dtypes and
    row shapes, structure, transform, augment), not on which dataset holds the
    rows: they arrive as handle arguments. `evaluate(model, x, y)` builds a new
    dataset, and so a new `Loop`, on every call; sharing one `Traces` among
    such loops (`compiled.loop_for` keys them) keeps TensorFlow from tracing
    every call again, and from warning about it.

    `call(mode, piece)` is the one builder: a compiled function per kind of
    call, made on first use, called as `fn(Bound(loop, epoch), *tensors)`; it
    runs `loop.body(mode, piece)(epoch, *tensors)`. A trace made with one
    loop and epoch is right for every loop sharing the `Traces` (the epoch
    gives only the gather's shape of things, its rows come as handles).
    """

    def __init__(self, engine: Engine, whole_loop_jit: bool, eager: bool = False) -> None:
        self._eager = eager
        self._whole_loop_jit = whole_loop_jit
        self._calls: dict[tuple[str, Piece], Callable[..., Any]] = {}
        with engine.scope():
            self.loss_sum = tf.Variable(
                0.0,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

    def call(self, mode: Mode, piece: Piece) -> Callable[..., Any]:
        """The compiled call of `mode` (train, test or predict) and `piece`.

        Under XLA for a whole-loop-XLA engine, except `gathered` (TensorFlow's
        gather kernel, outside XLA: XLA's gather on CPU cost more than the rest
        of a small step's input) whose `rows` loop is always XLA, and
        `partial`: the partial last step, one step per epoch, whose XLA
        compile cost more than XLA could save it (0.4-0.7 s per `fit` for
        W2's MLP on this project's CPU; Keras compiles it too). Its row counts
        differ per replica: with one replica they are Python ints (static
        shapes), with several per-replica tensors."""
        key = (mode, piece)
        fn = self._calls.get(key)
        if fn is None:
            jit = {"gathered": None, "rows": True, "partial": None}.get(
                piece, self._whole_loop_jit
            )
            body = self._calling(mode, piece)
            # `run_eagerly=True`: the same Python, called as it is (every op
            # runs eagerly, one step after the other).
            fn = body if self._eager else compiled(body, jit_compile=jit)
            if piece == "partial" and not self._eager:
                fn = self._eager_first(mode, fn)
            self._calls[key] = fn
        return fn

    def _eager_first(self, mode: Mode, traced: Callable[..., Any]) -> Callable[..., Any]:
        """The partial last step `traced`, run eagerly for its first
        `EAGER_PARTIAL_CALLS` calls where that is ours on one replica.

        It is one step per epoch, and its trace cost about 8 eager steps
        (W2's MLP 0.23 s against 0.03 s, keras-io's text Transformer 1.0-1.2
        s against 0.13 s on this project's CPU): a search's fits of 1-3
        epochs paid the trace for 1-3 steps. A longer `fit` pays the eager
        calls once beside the trace. A model's own step is traced as Keras
        traces it (Keras never runs a step eagerly unasked), and so is a
        step under a strategy or Horovod."""
        eager_calls = 0

        def call(bound: Bound, *args: Any) -> Any:
            nonlocal eager_calls
            loop = bound.loop
            if (
                eager_calls >= EAGER_PARTIAL_CALLS
                or loop.model_steps.own(mode)
                or not loop.engine.can_compile_whole_loop
            ):
                return traced(bound, *args)
            eager_calls += 1
            # Weighed as traced: the trackers' batch size is not static there.
            with loss_trackers.keras_weights(loop.model):
                return loop.body(mode, "partial")(bound.epoch, *args)

        return call

    def _calling(self, mode: Mode, piece: Piece) -> Callable[..., Any]:
        """A function of its own per `Traces` and call (`_Function`), running
        the bound loop's body."""

        def call(bound: Bound, *args: Any) -> Any:
            body = bound.loop.body(mode, piece)  # ours, or the model's own step
            if self._eager:  # nothing is traced, so nothing is filed
                return body(bound.epoch, *args)
            with _trace_gradients_dropped(), loss_trackers.keras_weights(bound.loop.model):
                return body(bound.epoch, *args)

        return _Function(call, f"Loop.{mode}_{piece}")

    def nested(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn(epoch, *args)` as a function of its own inside the compiled
        calls, called as `(Bound(loop, epoch), *args)`: traced once per
        signature, wherever the calls use it (eager: `fn` itself). What its
        traces file in TensorFlow's gradient registry is removed, as for the
        calls' own traces."""

        def call(bound: Bound, *args: Any) -> Any:
            if self._eager:
                return fn(bound.epoch, *args)
            with _trace_gradients_dropped():
                return fn(bound.epoch, *args)

        if self._eager:
            return call
        return compiled(_Function(call, f"Loop.{getattr(fn, '__name__', 'step')}"))


@contextlib.contextmanager
def xla_refusals(loop: TracedLoop) -> Iterator[None]:
    """Inside the block, XLA refusing an op of the model (TensorFlow's
    "Detected unsupported operations") is raised as a `ValueError` naming the
    ops and the fix."""
    try:
        yield
    except tf.errors.InvalidArgumentError as err:
        refusal = _xla_refusal(err, loop)
        if refusal is None:
            raise
        raise refusal from err


class _Function:
    """A compiled call's Python function, an object of its own per `Traces`.

    TensorFlow counts traces, and warns of "excessive" retracing, per
    function code, which every closure of one `def` shares (as does every
    instance of a method): each new model of a search, traced once, counted
    as a retrace of the last, and the 5th trial's validation warned. An
    object without `__code__` is counted alone."""

    def __init__(self, run: Callable[..., Any], name: str) -> None:
        self._run = run
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: Any) -> Any:
        return self._run(*args)


def _xla_refusal(err: tf.errors.InvalidArgumentError, loop: TracedLoop) -> ValueError | None:
    """`err` explained when it is XLA refusing an op it has no kernel for.

    `FitOptions(jit_compile="auto")` turns XLA on for models without
    convolutions also on CPUs (faster there, shardfeed/_commands/bench/NOTES.md), where
    Keras' "auto" is off: an op without an XLA kernel (`tf.py_function`, a
    `tf.summary` write in `call`) then fails to compile, before any step ran.
    """
    text = str(err)
    if not loop.jit_compile or "unsupported operations" not in text or "_JIT" not in text:
        return None
    ops = sorted(set(re.findall(r"No registered '(\w+)' OpKernel", text)))
    return ValueError(
        _errors.message(
            "With XLA every op of the model needs an XLA kernel (`FitOptions(jit_compile="
            '"auto")` turns XLA on for models without convolutions, also on CPUs, where '
            "Keras' \"auto\" is off).",
            f"jit_compile={loop.options.jit_compile!r}, ops without an XLA kernel: {ops}",
            "Pass `options=shardfeed.FitOptions(jit_compile=False)`.",
        )
    )


@contextlib.contextmanager
def _trace_gradients_dropped() -> Iterator[None]:
    """Inside the block (the trace of a compiled call), what TensorFlow files
    in its process-wide gradient registry for this trace is removed after it.

    Each `tf.custom_gradient` traced in graph mode registers its gradient
    function under a new name, for good; the function's closure holds the
    trace's graph, whose captures hold the model's variables. Keras'
    optimizer files one per trace (`ReplicaContext.all_reduce` of the
    gradients, even on one device), so every fitted model's weights and
    optimizer slots stayed in memory after the model was dropped (measured:
    +50 MiB per fit of a 4.3M-parameter model with Adam; shardfeed/_commands/bench/NOTES.md).
    The gradients of our trace are taken while it is traced, and no one
    differentiates a compiled call afterwards, so its entries are dead once
    the trace is built. Entries of other graphs (a nested `tf.function` the
    model calls, whose trace lives on in its own cache) are kept.
    """
    registry = getattr(getattr(_tf_ops, "_gradient_registry", None), "_registry", None)
    if not isinstance(registry, dict):  # another TensorFlow: nothing to drop
        yield
        return
    graph = tf.compat.v1.get_default_graph()  # the FuncGraph being traced
    filed_before = set(registry)
    try:
        yield
    finally:
        filed = [name for name in registry if name not in filed_before]
        for name in filed:
            if _traced_in(_custom_gradient_graph(registry[name].get("type")), graph):
                del registry[name]


def _custom_gradient_graph(gradient_fn: Any) -> Any:
    """The graph a `tf.custom_gradient` entry's ops are in (None: not one).

    TensorFlow's `internal_grad_fn` closes over `tape_grad_fn`, which closes
    over the custom function's `result` tensors."""
    tape_grad_fn = _free_variable(gradient_fn, "tape_grad_fn")
    result = _free_variable(tape_grad_fn, "result")
    tensors = [t for t in tf.nest.flatten(result) if hasattr(t, "graph")]
    return tensors[0].graph if tensors else None


def _free_variable(fn: Any, name: str) -> Any:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or cells is None or name not in code.co_freevars:
        return None
    return cells[code.co_freevars.index(name)].cell_contents


def _traced_in(graph: Any, trace: Any) -> bool:
    """Whether `graph` is `trace` or a loop/branch body inside it."""
    while graph is not trace and isinstance(graph, ControlFlowFuncGraph):
        graph = graph.outer_graph
    return graph is trace and trace is not None
