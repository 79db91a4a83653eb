"""The compiled loop on TensorFlow (`Loop`): many steps per call, batches gathered on the device.

Owns the step arithmetic (forward, backward, loss scaling, optimizer and metric
updates, with exact global numbers) and the compiled calls' bodies, composed as
Keras' `make_train_function`: one step on a replica's rows (`_replica_step`: ours or
the model's own, per mode) under a driver over a `[k, batch]` slice of the epoch's
indices (`_steps`, `_steps_in_replica`) or the partial last step (`_partial`), plus one
replica's XLA pair (`train_gathered` over `train_rows`). `Traces.call` compiles
them; `run` is the one host entry. Batches come from the `ResidentEpoch` each body
takes, distribution from the engine.

Why columns go in as resource handles and a `Loop` holds its dataset weakly: a
trace keeps the variables passed to it and Keras' optimizer keeps every trace,
yet dropping a dataset must free its rows. A one-replica training call gathers
with TensorFlow's kernel piece by piece beside the XLA loop (`train_gathered`):
XLA's own gather cost more than the rest of W2's input per step.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from shardfeed._data.plan import ShardPlan
from shardfeed._distribute import progress as _progress
from shardfeed._tf import model_steps as _model_steps
from shardfeed._tf import predictions as _predictions
from shardfeed._tf import step_optimizers as _step_optimizers
from shardfeed._tf.calls import EpochCalls, EpochInputs, gather_pieces
from shardfeed._tf.dataset import ShardedResidentDataset
from shardfeed._tf.engines.engine import Engine
from shardfeed._tf.epoch import Batch, ResidentEpoch, augmented, open_epoch
from shardfeed._tf.functions import Mode, Piece, compiled, steps_from
from shardfeed._tf.traces import Bound, Traces, xla_refusals
from shardfeed._training.calls import epoch_calls
from shardfeed._training.class_weights import ClassWeights
from shardfeed._training.options import FitOptions, auto_steps_per_execution, has_convolution


def _map_leaves(fn: Callable[[Any], Any], batch: Batch) -> Batch:
    """`fn` on every tensor of `batch` (None fields and leaves stay None)."""

    def over(structure: Any) -> Any:
        if structure is None:
            return None
        return keras.tree.map_structure(lambda t: None if t is None else fn(t), structure)

    return Batch(*(over(field) for field in batch))


# Keras' own words when `compile(jit_compile=True, run_eagerly=True)`.
EAGER_JIT_WARNING = (
    "If `run_eagerly` is True, then `jit_compile` cannot also be True. Disabling `jit_compile`."
)


def run_eagerly(model: keras.Model) -> bool:
    """Whether the model asks for its steps to run eagerly (`compile(run_eagerly=True)`
    or `model.run_eagerly = True`)."""
    return bool(getattr(model, "run_eagerly", False))


def resolve_jit_compile(jit_compile: bool | str, model: keras.Model) -> bool:
    """`"auto"`: XLA on GPUs; on CPUs only for models without convolutions.

    Measured on this project's 2-core CPU (shardfeed/_commands/bench/NOTES.md): XLA made the
    MLPs faster per step, but the small CNN inside an XLA loop ran 2.5x slower
    (82 vs 33 ms/step).
    """
    if jit_compile != "auto":
        return bool(jit_compile)
    if not all(getattr(layer, "supports_jit", True) for layer in model._flatten_layers()):
        return False
    if tf.config.list_logical_devices("GPU"):
        return True
    return not has_convolution(model)


class Loop:
    """Compiled train/test/predict functions for one model and one dataset.

    Args:
        model: A compiled Keras 3 model (built inside the engine's scope).
        dataset: The resident dataset.
        engine: The engine the replicas run under.
        options: Steps per call and XLA.
        class_weights: `fit`'s `class_weight`: training batches get weights by class.
        traces: The compiled calls, shared with other loops whose traces are
            interchangeable (see `Traces`); None: its own.
    """

    def __init__(
        self,
        model: keras.Model,
        dataset: ShardedResidentDataset,
        engine: Engine,
        options: FitOptions,
        class_weights: ClassWeights | None = None,
        traces: Traces | None = None,
    ) -> None:
        # Weak: the loop is cached per model and dataset (`compiled.loop_for`)
        # and must keep neither alive (nor the dataset's rows).
        self._model = weakref.ref(model)
        self.class_weights = class_weights
        self._dataset = weakref.ref(dataset)
        self.engine = engine
        self.options = options
        # `compile(run_eagerly=True)`: the same calls and steps, run as Python
        # (Keras' debug switch), so no XLA either, as Keras.
        self.run_eagerly = run_eagerly(model)
        if self.run_eagerly and options.jit_compile is True:
            warnings.warn(EAGER_JIT_WARNING, stacklevel=2)
        self.jit_compile = not self.run_eagerly and resolve_jit_compile(options.jit_compile, model)
        self.whole_loop_jit = self.jit_compile and engine.can_compile_whole_loop
        self._num_replicas = engine.num_replicas_in_sync
        self.traces = traces or Traces(engine, self.whole_loop_jit, self.run_eagerly)
        self._loss_sum = self.traces.loss_sum
        self._prescale = engine.loss_prescale
        forward_backward = self._forward_backward
        if self.jit_compile and not self.whole_loop_jit:
            forward_backward = compiled(forward_backward, jit_compile=True)
        self._fb = forward_backward
        # A model's own `train_step`/`test_step`/`predict_step` replaces ours
        # (`model_steps.py`).
        self.model_steps = _model_steps.ModelSteps.of(model)
        self._own = _model_steps.OwnSteps(self)
        # Our own step on one replica under XLA gathers a call's rows up front
        # (`train_gathered`; the memory counted for it is the resident
        # dataset's: a streamed one's ring slots take the memory there);
        # otherwise each step gathers its batch.
        self.gathers_per_call = (
            self.whole_loop_jit and not self.model_steps.train and not dataset.is_streaming
        )

    @property
    def model(self) -> keras.Model:
        model = self._model()
        if model is None:
            raise RuntimeError("The model this loop was built for has been deleted.")
        return model

    @property
    def dataset(self) -> ShardedResidentDataset:
        dataset = self._dataset()
        if dataset is None:
            raise RuntimeError("The dataset this loop was built for has been deleted.")
        return dataset

    def handles(self, order: ResidentEpoch) -> Any:
        """The columns' handles per local replica, for the compiled calls."""
        return self.engine.distribute(order.handles())

    # -- per-replica step pieces ---------------------------------------------

    def _regularization(self) -> tf.Tensor | None:
        losses = self.model.losses
        if not losses:
            return None
        return tf.add_n([tf.reduce_sum(tf.cast(l, keras.backend.floatx())) for l in losses])

    def _unscaled(self, loss: tf.Tensor, reg: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        """Splits `compute_loss`'s value into (data loss mean, total), undoing
        Keras' division of every loss term by the strategy's replica count
        inside a replica (`scale_loss_for_distribution`)."""
        total = loss * self._prescale if self._prescale > 1 else loss
        data = total if reg is None else total - reg
        return data, total

    def _forward_backward(self, x, y, sw, real_rows, all_rows):
        """Forward and backward on one replica's batch.

        `real_rows`/`all_rows` are None for full steps, else the rows of this
        replica and of all replicas in a partial step.
        """
        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            # Keras' wrapper: also a `compute_loss` override without `training`.
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=True)
            reg = self._regularization()
            data, total = self._unscaled(loss, reg)
            if real_rows is None:
                objective = loss if self._num_replicas == 1 else total / self._num_replicas
            else:
                objective = data * (tf.cast(real_rows, data.dtype) / tf.cast(all_rows, data.dtype))
                if reg is not None:
                    objective += reg / self._num_replicas
            objective = model.optimizer.scale_loss(objective)
        grads = tape.gradient(objective, model.trainable_variables)
        return total, y_pred, grads

    def train_step(self, x, y, sw, real_rows=None, all_rows=None) -> tf.Tensor:
        """One optimizer step on one replica's batch, inside a compiled call:
        forward/backward, gradient allreduce, update, metrics. Returns the
        batch's loss sum (`(data_loss + reg) * rows`). The bench's floor runs
        exactly this on a fixed batch."""
        total, y_pred, grads = self._fb(x, y, sw, real_rows, all_rows)
        sparse_as_dense = self.options.sparse_as_dense
        grads = self.engine.reduce_gradients(grads, sparse_as_dense)
        # Under a strategy the optimizer sums them: one exchange per step.
        # With XLA on and a loop that is not one XLA cluster, the update is
        # compiled on its own (W5: the dense Adam update was 85% of a step).
        compile_updates = self.jit_compile and not self.whole_loop_jit
        with _step_optimizers.exchanged(sparse_as_dense, compile_updates):
            self.model.optimizer.apply(grads, self.model.trainable_variables)
        self.model.compute_metrics(x, y, y_pred, sample_weight=sw)
        return total

    def train_batch(self, epoch: ResidentEpoch, handles, indices, where=None, i=0, r=None):
        """A training step's batch (`indices` of the epoch's rows): gathered,
        weighed (`training_batch`)."""
        return self.training_batch(*epoch.gather(handles, indices), where, i, r)

    def training_batch(self, x, y, sw, where=None, i=0, r=None):
        """A gathered training batch with its class weights (only training
        batches get them, as in Keras) and, given `where` (`[epoch, first
        step of the call]`, an int64 tensor: a Python int would retrace per
        call), augmented for step `i` of the call on global replica `r`."""
        if self.class_weights is not None:
            sw = self.class_weights.weights(y)
        if where is not None:
            x = augmented(self.dataset, x, where[0], where[1] + tf.cast(i, tf.int64), r)
        return x, y, sw

    def _test_step(self, x, y, sw) -> tf.Tensor:
        model = self.model
        y_pred = model(x, training=False)
        loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=False)
        _, total = self._unscaled(loss, self._regularization())
        model.compute_metrics(x, y, y_pred, sample_weight=sw)
        return total

    # -- bodies of the compiled calls (`body`) ---------------------------------
    #
    # Composed as Keras' `make_train_function`: one step on a replica's rows
    # (`_replica_step`, Keras' `one_step_on_data`), run by one of three drivers
    # over a call's steps or the partial last step's real rows. Each driver's
    # loop sits where its mode needs it: a strategy cannot merge (all-reduce
    # gradients) inside a while loop of the replica function, so training
    # steps loop outside `engine.run`; evaluation and prediction loop inside.

    def body(self, mode: Mode, piece: Piece) -> Callable[..., Any]:
        """What the compiled call `(mode, piece)` runs (see `Traces.call`).
        Each body takes the epoch, then the call's tensors."""
        if piece == "gathered":
            return self.train_gathered
        if piece == "rows":
            return self.train_rows
        own = self.model_steps.own(mode)
        if piece == "partial":
            return functools.partial(self._partial, mode, own)
        if mode == "predict" or (mode == "test" and not own):
            return functools.partial(self._steps_in_replica, mode, own)
        return functools.partial(self._steps, mode, own)

    def _replica_step(
        self, mode: Mode, own: bool, epoch: ResidentEpoch, where: Any = None, nested: bool = False
    ) -> Callable[..., Any]:
        """`step(handles, rows, i, r, real_rows=None, all_rows=None)`: one step
        of `mode` on one replica's `rows` of the epoch (step `i` of the call,
        global replica `r`, for augmentation; `real_rows`/`all_rows` in a
        partial training step). Our training step adds its loss sum to
        `loss_sum` and our test step returns its loss; the model's own step
        returns its outputs, and prediction the model's outputs.
        `nested`: the model's own `train_step` as a function of its own."""
        if mode == "predict":
            forward = self._own.predict_forward if own else self._forward

            def predict(handles, rows, i, r, real_rows=None, all_rows=None):
                x, _, _ = epoch.gather(handles, rows, with_targets=False)
                return forward(x)

            return predict
        if mode == "test":
            if own:
                return lambda handles, rows, *_: self._own.test_on_rows(epoch, handles, rows)

            def test(handles, rows, i, r, real_rows=None, all_rows=None):
                x, y, sw = epoch.gather(handles, rows)
                return tf.cast(self._test_step(x, y, sw), tf.float32)

            return test
        if own:
            if nested:
                # One replica, no strategy: the step is a function of its own,
                # so the loop's body and its last step share one trace of the
                # model's `train_step` (Keras traces it at most twice; a
                # strategy's merge call cannot run inside such a nested
                # function).
                fn, bound = self._own_train_fn, Bound(self, epoch)
                return lambda handles, rows, i, r, *_: fn(bound, handles, rows, where, i, r)
            return lambda handles, rows, i, r, *_: self._own.train_on_rows(
                epoch, handles, rows, where, i, r
            )

        def train(handles, rows, i, r, real_rows=None, all_rows=None):
            x, y, sw = self.train_batch(epoch, handles, rows, where, i, r)
            total = tf.cast(self.train_step(x, y, sw, real_rows, all_rows), tf.float32)
            n = rows.shape[0] if real_rows is None else tf.cast(real_rows, tf.float32)
            self._loss_sum.assign_add(total * n)

        return train

    @functools.cached_property
    def _own_train_fn(self) -> Callable[..., Any]:
        """`_replica_step`'s nested own train step (`Traces.nested`)."""
        return self.traces.nested(self._own.train_on_rows)

    def _forward(self, x: Any) -> Any:
        return self.model(x, training=False)

    def _steps(self, mode, own, epoch, handles, indices, first, where=None, replicas=None):
        """Training steps, or the model's own test steps, over a `[k, batch]`
        slice: the step loop outside `engine.run`. Ours: per-replica loss sums
        go to a sync-on-read accumulator, reduced once per call rather than
        once per step. The model's own: the logs are the last step's (as
        Keras' `multi_step_on_iterator`), which runs after the loop, so only
        its outputs are reduced. Steps before `first` were run by an earlier
        call (`Loop.run`'s window)."""
        engine = self.engine
        steps = engine.local_results(indices)[0].shape[0]
        nested = own and mode == "train" and engine.can_compile_whole_loop
        step = self._replica_step(mode, own, epoch, where, nested)

        def replica(handles, indices, i, r=None):
            return step(handles, indices[i], i, r)

        def run(i):
            args = (handles, indices, i) if replicas is None else (handles, indices, i, replicas)
            return engine.run(replica, args)

        if own:
            steps_from(first, steps - 1, run)
            return self._own.reduced(run(tf.constant(steps - 1, tf.int32)))
        self._loss_sum.assign(0.0)
        steps_from(first, steps, run)
        return engine.read_sum(self._loss_sum)

    def _steps_in_replica(self, mode, own, epoch, handles, indices, first=None):
        """Our test steps (their loss sum) and every prediction (each
        replica's outputs for every step of the slice, stacked per step): the
        step loop inside one `engine.run`."""
        step = self._replica_step(mode, own, epoch)
        engine = self.engine
        if mode == "test":

            def test(handles, indices, first):
                def one(i, loss_sum):
                    return (loss_sum + step(handles, indices[i], i, None) * indices.shape[1],)

                return steps_from(first, indices.shape[0], one, tf.zeros([], tf.float32))[0]

            return engine.sum_across_replicas(engine.run(test, (handles, indices, first)))

        def predict(handles, indices):
            steps = indices.shape[0]
            # The first step outside the loop gives the outputs' structure.
            outputs = keras.tree.map_structure(
                lambda t: tf.TensorArray(t.dtype, size=steps).write(0, t),
                step(handles, indices[0], 0, None),
            )

            def write(i, outputs):
                out = step(handles, indices[i], i, None)
                return (keras.tree.map_structure(lambda ta, t: ta.write(i, t), outputs, out),)

            (outputs,) = steps_from(tf.constant(1), steps, write, outputs)
            return keras.tree.map_structure(lambda ta: ta.stack(), outputs)

        return engine.run(predict, (handles, indices))

    def _partial(
        self, mode, own, epoch, handles, indices, real_rows, all_rows=None, where=None,
        replicas=None,
    ):
        """The epoch's partial last step on each replica's real rows: ours
        trains and evaluates it there (a replica may have none in
        evaluation); the model's own step gets just its real rows, as under
        Keras (its training step weighs a partial batch itself; a replica
        without a real row runs it on an empty batch, as a replica handed an
        empty batch by `tf.distribute` does)."""
        step = self._replica_step(mode, own, epoch, where)
        engine = self.engine
        if mode == "train":

            def train(handles, indices, real_rows, r):
                return step(handles, indices[:real_rows], 0, r, real_rows, all_rows)

            if not own:
                self._loss_sum.assign(0.0)
            out = engine.run(train, (handles, indices, real_rows, replicas))
            return self._own.reduced(out) if own else engine.read_sum(self._loss_sum)
        if mode == "test" and not own:

            def test(handles, indices, real_rows):
                def one():
                    loss = step(handles, indices[:real_rows], 0, None)
                    return loss * tf.cast(real_rows, tf.float32)

                # A replica may have no real row in the last evaluation step
                # (a Python int with one replica: decided while tracing).
                if isinstance(real_rows, int):
                    return one() if real_rows > 0 else tf.zeros([], tf.float32)
                return tf.cond(real_rows > 0, one, lambda: tf.zeros([], tf.float32))

            return engine.sum_across_replicas(engine.run(test, (handles, indices, real_rows)))

        def own_step(handles, indices, real_rows):
            return step(handles, indices[:real_rows], 0, None)

        out = engine.run(own_step, (handles, indices, real_rows))
        return self._own.reduced(out) if mode == "test" else out

    def train_gathered(self, epoch, handles, indices, first, where, replicas):
        # One replica (no `engine.run`): a call's rows in one gather per column
        # and piece (TensorFlow's kernel, outside XLA), then the XLA step loop
        # over them (`train_rows`). Same steps, same rows, same order as
        # our `_steps`. A shorter last piece takes the piece's length of
        # steps ending where it ends and skips the ones before it: every
        # piece has one shape, so `train_rows` compiles once. (Pieces before
        # `first` are gathered and skipped: at most one call's gather, in an
        # epoch's last call.)
        steps, batch = indices.shape[:2]
        pieces = gather_pieces(steps, epoch.steps_per_gather)
        size = pieces[0][1] - pieces[0][0]
        train_rows = self.traces.call("train", "rows")

        def rows_of(a: int, b: int, after: Any) -> Batch:
            # After the steps `after` ran: the rows of at most two pieces are
            # held at a time, what the memory plan counts.
            with tf.control_dependencies([] if after is None else [after]):
                flat = tf.reshape(indices[a:b], [-1])
                rows = epoch.gather_rows(handles, flat)
            return _map_leaves(lambda t: tf.reshape(t, [b - a, batch, *t.shape[1:]]), rows)

        self._loss_sum.assign(0.0)
        # The next piece's gather waits only for the piece before this one,
        # so TensorFlow's executor runs it beside this piece's XLA steps (on
        # the other core); with room for one piece's rows, after them.
        overlap = epoch.steps_per_gather >= 2
        windows = [(b - size, b) for _, b in pieces]
        rows, before = rows_of(*windows[0], None), None
        for j, ((a, _), (w, _)) in enumerate(zip(pieces, windows, strict=True)):
            after = windows[j + 1] if j + 1 < len(windows) else None
            if after is not None and overlap:
                ahead = rows_of(*after, before)
            offset = tf.constant([0, w], tf.int64)
            skip = tf.maximum(first, a) - w
            before = train_rows(Bound(self, epoch), rows, skip, where + offset, replicas)
            if after is not None:
                rows = ahead if overlap else rows_of(*after, before)
        return self._loss_sum.read_value()

    def train_rows(self, epoch, rows, first, where, replicas):
        # The XLA step loop of `train_gathered`: step i reads rows[i], from
        # step `first` on. An optional input may be None; any other leaf
        # gives the shape.
        leaf = next(t for t in keras.tree.flatten(rows.x) if t is not None)
        steps, batch = leaf.shape[:2]

        def step(i):
            x, y, sw = _map_leaves(lambda t: t[i], rows)
            x, y, sw = self.training_batch(epoch.transformed(x), y, sw, where, i, replicas)
            total = self.train_step(x, y, sw)
            self._loss_sum.assign_add(tf.cast(total, tf.float32) * batch)

        steps_from(first, steps, step)
        return tf.zeros([])

    # -- host side -----------------------------------------------------------

    def run(self, inputs: EpochInputs, mode: Mode, start: int, stop: int) -> tuple[Any, int]:
        """Runs data steps `[start, stop)` of the epoch `inputs` holds in one
        compiled call of `mode` (the partial last step alone, where the mode
        takes it apart); returns its value and the real rows it ran."""
        plan, order, engine = inputs.plan, inputs.order, self.engine
        bound = Bound(self, order)

        def call(mode: Mode, piece: Piece) -> Callable[..., Any]:
            return functools.partial(self.traces.call(mode, piece), bound)

        with xla_refusals(self):
            if start == plan.full_steps_per_epoch and self._partial_apart(mode, plan):
                last = engine.distribute([i[0] for i in order.indices(start, start + 1)])
                real_rows, all_rows = self._real_rows(plan), sum(plan.last_step_rows)
                if mode == "train":
                    total = all_rows if self.whole_loop_jit else tf.constant(all_rows, tf.int32)
                    where = tf.constant([inputs.epoch, start], tf.int64)
                    value = call(mode, "partial")(
                        inputs.handles, last, real_rows, total, where, inputs.replicas
                    )
                else:
                    value = call(mode, "partial")(inputs.handles, last, real_rows)
                return value, all_rows
            if mode == "predict":
                indices = engine.distribute(order.indices(start, stop))
                value = call(mode, "steps")(inputs.handles, indices)
                return value, (stop - start) * plan.global_batch_size
            begin = self._window(start, stop, plan)
            indices = engine.distribute(order.indices(begin, stop))
            first = tf.constant(start - begin, tf.int32)
            if mode == "train":
                piece: Piece = "gathered" if self.gathers_per_call else "steps"
                where = tf.constant([inputs.epoch, begin], tf.int64)
                value = call(mode, piece)(inputs.handles, indices, first, where, inputs.replicas)
            else:
                value = call(mode, "steps")(inputs.handles, indices, first)
            return value, (stop - start) * plan.global_batch_size

    def _window(self, start: int, stop: int, plan: ShardPlan) -> int:
        """The first step of the steps a train or test call's compiled
        function takes. A call shorter than the epoch's others (its last, a
        resumed epoch's first) takes as many steps as they do, ending at
        `stop`, and skips those before `start`: one trace, and one XLA
        compile, for every call of an epoch, where each length was compiled
        apart (0.25-1 s each for W2's MLP under XLA on this project's CPU).
        A streamed epoch's steps are resident only call by call: its calls
        keep their own lengths."""
        k = self.steps_per_call(plan.full_steps_per_epoch)
        if stop - start >= k or stop < k or self.dataset.is_streaming:
            return start
        return stop - k

    def _partial_apart(self, mode: Mode, plan: ShardPlan) -> bool:
        """Whether the epoch's partial last step is a call of its own: ours
        trains and evaluates it on its real rows; predicting, ours runs it
        padded among full steps (`predictions` drops the padding) and only a
        model's own `predict_step` sees just its real rows."""
        return plan.has_partial_step and (mode != "predict" or self.model_steps.predict)

    def own_logs(self, value: Any) -> dict[str, Any]:
        """The logs of a call of the model's own step (what it returned)."""
        return self._own.logs(value)

    def steps_per_call(self, num_steps: int) -> int:
        """Steps per compiled call for an epoch of `num_steps` full steps
        (`FitOptions.steps_per_execution`, resolved when "auto")."""
        k = self.options.steps_per_execution
        return auto_steps_per_execution(num_steps) if k == "auto" else k

    def _real_rows(self, plan) -> Any:
        if self.whole_loop_jit:
            (real_rows,) = plan.last_step_rows
            return real_rows
        return self.engine.distribute(
            [
                tf.constant(plan.last_step_rows[r], tf.int32)
                for r in self.engine.world.global_replica_ids
            ]
        )

    def epoch(
        self,
        epoch: int,
        training: bool,
        plan: ShardPlan | None = None,
        steps: tuple[int, int] | None = None,
        step_offset: int = 0,
        totals: tuple[float, int] = (0.0, 0),
    ) -> EpochCalls:
        """The compiled calls of one epoch, or of steps `[start, stop)` of it.

        Args:
            epoch: Epoch number (seeds the shuffle).
            training: Train (True) or evaluate (False).
            plan: The training plan (default: the dataset's; a resume on
                another number of replicas passes its own, see `resume.adapt`).
            steps: Only steps `[start, stop)` (a resumed or short epoch); each
                step's rows stay those of the whole epoch.
            step_offset: The data step that is step 0 of the calls' step
                counter (a `fit` epoch that starts inside a pass).
            totals: The epoch's running `(loss sum, rows)` to continue (a resume).

        Returns:
            An `EpochCalls`: iterate it for the `Call`s, run each with `run`.

        Example:
            >>> with loop.epoch(0, training=True) as calls:
            ...     for call in calls:
            ...         logs = calls.run(call)
        """
        ds = self.dataset
        if plan is None:
            plan = ds.plan if training else ds.eval_plan
        first, last = steps or (0, plan.steps_per_epoch)
        order = open_epoch(ds, epoch, training, 0, False, plan)
        if training and self.model_steps.train:
            self._own.create_variables(order)  # once, before the first training trace
        inputs = EpochInputs(
            order, plan, epoch, self.handles(order), self._replica_ids()
        )
        return EpochCalls(self, inputs, training, first, last, step_offset, totals)

    def _replica_ids(self) -> Any:
        """Each local replica's global id, placed on its replica (augmentation's seeds)."""
        ids = self.engine.world.global_replica_ids
        return self.engine.distribute([tf.constant(r, tf.int64) for r in ids])

    def logs(self, loss: float) -> dict[str, float]:
        """Current logs: our exact loss, then the model's compiled metrics."""
        logs = {"loss": loss}
        for name, value in self.engine.metric_results(self.model, skip_loss=True).items():
            if name != "loss":
                logs[name] = value
        return logs

    def predict(self) -> Any:
        """Predictions for every row of every worker, in the original row order,
        on every worker."""
        order = self.dataset.epoch(0, training=False)
        plan = order.plan
        inputs = EpochInputs(order, plan, 0, self.handles(order), None)
        chunks: list[list[Any]] = [[] for _ in order.handles()]
        structure = None
        partial = self._partial_apart("predict", plan)
        try:
            steps = plan.full_steps_per_epoch if partial else plan.steps_per_epoch
            k = self.steps_per_call(steps)
            calls = epoch_calls(0, steps, k, bounds=order.call_bounds or ())
            for start, stop in (piece for call in calls for piece in call.pieces):
                with _progress.call("a compiled predict call"):  # `shardfeed launch` watches
                    out, _ = self.run(inputs, "predict", start, stop)
                for local, value in enumerate(self._local_structures(out)):
                    structure = value
                    chunks[local].append([np.asarray(t) for t in keras.tree.flatten(value)])
            if partial:
                with _progress.call("a compiled predict call"):
                    out, _ = self.run(inputs, "predict", steps, steps + 1)
                for local, value in enumerate(self._local_structures(out)):
                    structure = self._own.padded(value, plan.per_replica_batch_size)
                    chunks[local].append([t for t in keras.tree.flatten(structure)])
        finally:
            order.close()
        return _predictions.in_row_order(self.engine, order, chunks, structure)

    def _local_structures(self, out: Any) -> list[Any]:
        flat = keras.tree.flatten(out)
        per_leaf = [self.engine.local_results(t) for t in flat]
        return [
            keras.tree.pack_sequence_as(out, [leaf[i] for leaf in per_leaf])
            for i in range(self.engine.world.replicas_in_process)
        ]

