"""The bench on Keras' JAX backend (`KERAS_BACKEND=jax`): its variants, no TensorFlow.

Separation of concerns: this module owns what `shardfeed bench` times when
Keras runs on JAX -- `jax` and `jax-tuned` (the same `_KerasFit` and `_Tuned`
that a TensorFlow bench runs in a worker process, here in the bench's own
process), `shardfeed` (`shardfeed.fit` on the JAX backend) and `floor`
(Keras' own stateless train step on one fixed batch in a jitted `lax.scan`) --
and which variants a JAX bench refuses (the tf.data and TensorFlow-loop ones).
The data and models are `workloads`' (NumPy and Keras, backend-neutral); the
schedule, timing, tuning probe and report are the TensorFlow bench's.

W3 and W4: `shardfeed.augment` and the bench's `transform` are TensorFlow
ops, so on JAX every variant trains the same model: uint8 input, Keras'
`Rescaling(1/255)` first, and for W4 Keras' `RandomFlip` and
`RandomTranslation` inside the model (their seed state is a Keras variable,
carried through every stateless step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from shardfeed._commands.bench.variants import IN_WORKER_TYPES, Variant
from shardfeed._commands.bench.workloads import augments, new_model
from shardfeed._common.errors import message
from shardfeed._training.options import auto_steps_per_execution

# A JAX bench's variants, in their default order; `jax` is the speed-up's baseline.
JAX_VARIANTS = ("jax", "jax-tuned", "shardfeed", "floor")
JAX_BASELINE = "jax"
# Why a JAX bench can't run the others: they are TensorFlow's.
TENSORFLOW_ONLY = ("numpy", "tfdata", "tuned", "streaming")

JAX_VARIANT_NOTES: dict[str, str] = {
    "jax": (
        "`model.fit(x, y, batch_size=256, shuffle=True)` on NumPy arrays, Keras defaults "
        "(steps_per_execution=1, jit_compile='auto': True on JAX)."
    ),
    "jax-tuned": (
        "`jax` compiled with the fastest of steps_per_execution in {32, 128} x jit_compile in "
        "{False, True}, chosen by a short probe (the TensorFlow bench's `tuned` probe, on NumPy)."
    ),
    "shardfeed": (
        "`shardfeed.fit` on the JAX backend, on `ShardedResidentDataset(x, y, "
        "per_replica_batch_size=256, seed=0)` with default `FitOptions()`: the rows resident "
        "as `jax.Array`s, batches taken on the device, many Keras train steps per jitted call."
    ),
    "floor": (
        "Keras' own stateless `model.train_step` (the JAX trainer's, what `model.fit` and "
        "`shardfeed.fit` run on JAX) on one fixed device batch, in one jitted `lax.scan` per "
        "call of `FitOptions()`'s steps per call ('auto': about 10 calls per epoch): no input "
        "work at all. ceil(rows/256) steps per epoch. Its loss (one batch seen over and over) "
        "is not reported."
    ),
}
# Appended to every note: W3 and W4 train one model on every variant here.
IMAGES_NOTE = (
    " W3/W4: uint8 rows, Keras' `Rescaling(1/255)` first in the model, and for W4 Keras' "
    "`RandomFlip` + `RandomTranslation` in the model (`shardfeed.augment` is TensorFlow's)."
)


def check_variants(names: Iterable[str]) -> None:
    """Refuses the variants a JAX bench cannot run.

    Raises:
        ValueError: One of `names` is a TensorFlow-only variant.

    Example:
        >>> check_variants(["jax", "floor"])
    """
    refused = [n for n in names if n not in JAX_VARIANTS]
    if refused:
        raise ValueError(
            message(
                f"On Keras' JAX backend the bench runs {', '.join(JAX_VARIANTS)}; the others "
                "train on TensorFlow.",
                f"variants={','.join(refused)}, keras.backend.backend()='jax'",
                f"Pass `--variants {','.join(JAX_VARIANTS)}`, or run the bench with "
                "KERAS_BACKEND=tensorflow.",
            )
        )


def variant_notes(names: Iterable[str]) -> dict[str, str]:
    """What each of a JAX bench's variants times, for the report."""
    return {name: JAX_VARIANT_NOTES[name] + IMAGES_NOTE for name in names}


def _model(variant: Variant) -> Any:
    """The JAX bench's model for `variant`: what `jax` (model.fit) trains too."""
    w = variant.workload
    return new_model(w, variant.reference, True, variant.args.seed, augments(w))


def _has_convolutions(model: Any) -> bool:
    import keras

    return any(isinstance(layer, keras.layers.Conv2D) for layer in model._flatten_layers())


class _JaxShardfeed(Variant):
    """`shardfeed.fit` on the JAX backend; skipped, saying why, where it has none."""

    name = "shardfeed"

    def setup(self) -> None:
        import shardfeed

        try:
            dataset_type, self._fit = shardfeed.ShardedResidentDataset, shardfeed.fit
        except (ImportError, NotImplementedError) as error:  # no JAX implementation here
            self.skipped = (
                f"shardfeed.fit has no JAX implementation in this checkout "
                f"({type(error).__name__}: {str(error).splitlines()[0]})"
            )
            return
        self.model = _model(self)
        self.dataset = dataset_type(
            self.x, self.y, per_replica_batch_size=self.workload.batch_size, seed=self.args.seed
        )

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        from shardfeed._commands.bench.timing import epoch_timer

        timer = epoch_timer()
        history = self._fit(
            self.model,
            self.dataset,
            epochs=epoch + 1,
            initial_epoch=epoch,
            verbose=0,
            callbacks=[timer],
        )
        if epoch == 0:
            params = history.params
            self.settings = {
                "steps_per_execution": params.get("steps_per_execution"),
                "jit_compile": params.get("jit_compile"),
            }
        return timer.seconds[-1], timer.losses[-1]


class _JaxFloor(Variant):
    """Keras' stateless `train_step` on one fixed batch, k steps per jitted `lax.scan`."""

    name = "floor"

    def setup(self) -> None:
        import jax
        import jax.numpy as jnp

        b = self.workload.batch_size
        model = _model(self)
        batch = (jnp.asarray(self.x[:b]), jnp.asarray(self.y[:b]), None)
        model._symbolic_build(data_batch=batch)  # Keras' own build, as train_on_batch does
        self.state = tuple(
            [v.value for v in variables]
            for variables in (
                model.trainable_variables,
                model.non_trainable_variables,
                model.optimizer.variables,
                model.metrics_variables,
            )
        )
        steps = math.ceil(len(self.x) / b)
        full_steps = len(self.x) // b
        # FitOptions()' "auto", resolved as shardfeed.fit resolves it.
        k = auto_steps_per_execution(full_steps) if full_steps else 1
        self.calls = [min(k, steps - s) for s in range(0, steps, k)]
        self.batch = batch

        def chunk(state: Any, batch: Any, steps: int) -> tuple[Any, Any]:
            def one_step(state: Any, _: Any) -> tuple[Any, Any]:
                logs, state = model.train_step(state, batch)
                return state, logs["loss"]

            state, losses = jax.lax.scan(one_step, state, None, length=steps, unroll=unroll)
            return state, jnp.sum(losses)

        # XLA:CPU runs convolutions inside a rolled loop catastrophically slowly
        # (W4, 256 images: 192 s for the first step of a 2-step scan vs 2 s/step
        # unrolled, on this project's 2-core CPU): unroll there, not on GPUs.
        unroll = jax.default_backend() == "cpu" and _has_convolutions(model)

        # The state is donated, as Keras' own jitted train step donates it.
        self.fn: Callable[..., Any] = jax.jit(chunk, static_argnums=2, donate_argnums=0)
        self.settings = {"steps_per_execution": k, "jit_compile": True, "unrolled": unroll}
        self.model = model

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        start = time.perf_counter()
        for steps in self.calls:
            self.state, total = self.fn(self.state, self.batch, steps)
        float(total)  # waits for the last call, and so for all of them
        return time.perf_counter() - start, None


JAX_VARIANT_TYPES: dict[str, Callable[..., Variant]] = {
    "jax": IN_WORKER_TYPES["jax"],  # the worker's model.fit variants, in this process
    "jax-tuned": IN_WORKER_TYPES["jax-tuned"],
    "shardfeed": _JaxShardfeed,
    "floor": _JaxFloor,
}
