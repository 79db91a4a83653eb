"""The bench on Keras' JAX backend (`KERAS_BACKEND=jax`): its variants, no TensorFlow.

`jax`, `jax-tuned` (the TensorFlow bench's `_KerasFit` and `_Tuned`, in this
process), `shardfeed`, `floor` (the JAX loop's compiled training call on one
fixed batch) and, when named, `jax-nightly-tuned` (a worker process).
W3 and W4 train the same model for every variant here: `Rescaling(1/255)`
and Keras' random layers inside it (the bench's `transform` is TensorFlow ops).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shardfeed._commands.bench.timing import epoch_timer
from shardfeed._commands.bench.variants import (
    IN_WORKER_TYPES,
    VARIANT_NOTES,
    VARIANT_TYPES,
    Variant,
)
from shardfeed._commands.bench.workloads import augments, new_model
from shardfeed._common.errors import message

# A JAX bench's variants, in their default order; `jax` is the speed-up's baseline.
JAX_VARIANTS = ("jax", "jax-tuned", "shardfeed", "floor")
JAX_BASELINE = "jax"
# Run when named in `--variants` (`variants.OPTIONAL_VARIANTS`).
JAX_OPTIONAL_VARIANTS = ("jax-nightly-tuned",)

JAX_VARIANT_NOTES: dict[str, str] = {
    "jax": (
        "`model.fit(x, y, batch_size=batch, shuffle=True)` on NumPy arrays at the workload's "
        "batch, Keras defaults (steps_per_execution=1, jit_compile='auto': True on JAX)."
    ),
    "jax-tuned": (
        "`jax` compiled with the fastest of steps_per_execution in {32, 128} x jit_compile in "
        "{False, True}, chosen by a short probe (the TensorFlow bench's `tuned` probe, on NumPy)."
    ),
    "shardfeed": (
        "`shardfeed.fit` on the JAX backend, on `ShardedResidentDataset(x, y, "
        "per_replica_batch_size=batch, seed=0)` with default `FitOptions()`: the rows resident "
        "as `jax.Array`s, batches taken on the device, `fit`'s steps per jitted call."
    ),
    "floor": (
        "The compiled training call `shardfeed.fit` runs on JAX (Keras' stateless "
        "`model.train_step`, the same steps per jitted call) on one fixed "
        "device batch: no input work at all. ceil(rows/batch) steps per epoch. Its loss (one "
        "batch seen over and over) is not reported."
    ),
    "jax-nightly-tuned": VARIANT_NOTES["jax-nightly-tuned"],
}
# Appended to every note: W3 and W4 train one model on every variant here.
IMAGES_NOTE = (
    " W3/W4: uint8 rows, Keras' `Rescaling(1/255)` first in the model, and for W4 Keras' "
    "`RandomFlip` + `RandomTranslation` in the model, the same model in every variant."
)


def check_variants(names: Iterable[str]) -> None:
    """Refuses the variants a JAX bench cannot run.

    Raises:
        ValueError: One of `names` is a TensorFlow-only variant.

    Example:
        >>> check_variants(["jax", "floor"])
    """
    refused = [n for n in names if n not in JAX_VARIANTS + JAX_OPTIONAL_VARIANTS]
    if refused:
        runs = ", ".join(JAX_VARIANTS + JAX_OPTIONAL_VARIANTS)
        raise ValueError(
            message(
                f"On Keras' JAX backend the bench runs {runs}; the others train on TensorFlow.",
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


class _JaxShardfeed(Variant):
    """`shardfeed.fit` on the JAX backend with default options."""

    name = "shardfeed"

    def setup(self) -> None:
        import shardfeed  # the public names, resolved to the JAX backend's

        self.model = _model(self)
        self.dataset = shardfeed.ShardedResidentDataset(
            self.x, self.y, per_replica_batch_size=self.workload.batch_size, seed=self.args.seed
        )

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        import shardfeed

        timer = epoch_timer()
        history = shardfeed.fit(
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
                "steps_per_execution": params["steps_per_execution"],
                "jit_compile": params["jit_compile"],
            }
        return timer.seconds[-1], timer.losses[-1]


class _FixedBatch:
    """The floor's `batch_fn`: the same batch at every step (no input work),
    with the entry points the loop calls on a `BatchFn` (`unchecked` in the
    compiled calls, `jitted` in un-jitted steps)."""

    def __call__(self, batch: Any, step: Any) -> Any:
        return batch

    unchecked = jitted = __call__


_fixed_batch = _FixedBatch()


class _JaxFloor(Variant):
    """The compiled training call `shardfeed.fit` runs on JAX, on one fixed batch."""

    name = "floor"

    def setup(self) -> None:
        from shardfeed._jax.compiled import loop_for
        from shardfeed._jax.dataset import ShardedResidentDataset
        from shardfeed._training.options import FitOptions

        b = self.workload.batch_size
        self.model = _model(self)
        # The loop is built for the first batch only; the other rows never
        # enter the timed calls.
        dataset = ShardedResidentDataset(
            self.x[:b], self.y[:b], per_replica_batch_size=b, shuffle=False
        )
        loop = loop_for(self.model, dataset.world, FitOptions())  # what shardfeed.fit builds
        epoch = dataset.epoch(0)
        loop.build(epoch, "train")
        self.batch = epoch.batch(0)  # on the device, laid out as fit's batches
        steps, full_steps = math.ceil(len(self.x) / b), len(self.x) // b
        k = loop.steps_per_call(full_steps) if full_steps else 1
        self.calls = [min(k, steps - s) for s in range(0, steps, k)]
        # The one place the bench reaches into the JAX loop: its compiled
        # k-step training call (Keras' `train_step` in `lax.scan`), here fed
        # by `_fixed_batch`, so the floor moves whenever fit's step does.
        self.fn = loop._compiled("train", False)
        self.state = loop.state("train")
        self.settings = {"steps_per_execution": k, "jit_compile": True}

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        start = time.perf_counter()
        for steps in self.calls:
            logs, self.state = self.fn(self.state, self.batch, np.int32(0), _fixed_batch, steps)
        float(logs["loss"])  # waits for the last call, and so for all of them
        return time.perf_counter() - start, None


JAX_VARIANT_TYPES: dict[str, Callable[..., Variant]] = {
    "jax": IN_WORKER_TYPES["jax"],  # the worker's model.fit variants, in this process
    "jax-tuned": IN_WORKER_TYPES["jax-tuned"],
    "shardfeed": _JaxShardfeed,
    "floor": _JaxFloor,
    "jax-nightly-tuned": VARIANT_TYPES["jax-nightly-tuned"],  # a worker process, as on TF
}
# What a TensorFlow bench's `backend_worker` process runs for `shardfeed-jax`
# and `floor-jax` (beside `variants.IN_WORKER_TYPES`).
IN_WORKER_TYPES_JAX: dict[str, Callable[..., Variant]] = {
    "shardfeed-jax": _JaxShardfeed,
    "floor-jax": _JaxFloor,
}
