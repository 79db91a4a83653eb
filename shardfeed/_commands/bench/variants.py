"""The timed variants: `model.fit` (numpy, tfdata, tuned), `shardfeed.fit`, streaming, floor.

Separation of concerns: this module owns what each variant does -- its set-up
(a fresh model from the reference weights, its input pipeline or dataset) and
one epoch of it, returning the epoch's seconds and loss. When and in which
order variants run is the `schedule`'s job; the settings probe is `tuning`'s.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shardfeed._commands.bench.timing import epoch_timer
from shardfeed._commands.bench.tuning import probe_keras_settings
from shardfeed._commands.bench.workloads import (
    BATCH_SIZE,
    Workload,
    augment_for,
    new_model,
    tf_data,
    transform_for,
)
from shardfeed._common.units import MIB

VARIANTS: dict[str, str] = {
    "numpy": "model.fit(numpy)",
    "tfdata": "model.fit(tf.data)",
    "tuned": "model.fit(tf.data, tuned)",
    "shardfeed": "shardfeed.fit",
    "floor": "floor",
    "streaming": "shardfeed.fit (streaming)",
}
VARIANT_ALIASES = dict(zip("abcdef", VARIANTS, strict=True))
STREAM_CHUNK_BYTES = 16 * MIB

VARIANT_NOTES: dict[str, str] = {
    "numpy": (
        "`model.fit(x, y, batch_size=256, shuffle=True)` on NumPy arrays, Keras defaults "
        "(steps_per_execution=1, jit_compile='auto')."
    ),
    "tfdata": (
        "`model.fit` on `from_tensor_slices((x, y)).cache().shuffle(rows).batch(256)"
        ".prefetch(AUTOTUNE)` (a full-size shuffle buffer: a uniform permutation per epoch, "
        "like the other variants), Keras defaults."
    ),
    "tuned": (
        "The `tfdata` pipeline, compiled with the fastest of steps_per_execution in "
        "{32, 128} x jit_compile in {False, True}, chosen by a short probe in this process."
    ),
    "shardfeed": (
        "`shardfeed.fit` on `ShardedResidentDataset(x, y, per_replica_batch_size=256, "
        "seed=0)` with default `FitOptions()`; batches gathered on the device."
    ),
    "floor": (
        "The compiled train step `shardfeed.fit` runs (`Loop.train_step`, same jit_compile, "
        "same steps per call) on one fixed, already-gathered batch: no gather, no "
        "permutation, no input work. ceil(rows/256) full steps per epoch. Its loss (one "
        "batch seen over and over) is not reported."
    ),
    "streaming": (
        "`shardfeed.fit` with `LoadOptions(streaming=True, stream_chunk_bytes=16 MiB)`: the "
        "rows flow through a two-slot ring per replica, the next chunk uploaded by a "
        "background thread while the current one trains (the fallback for shards that do "
        "not fit)."
    ),
}


class Variant:
    """One timed variant: `setup()`, then `epoch(e)` for e = 0 (warm-up), 1, 2, ...

    Args:
        workload: Which workload.
        data: `(x, y)` NumPy arrays.
        reference: Model whose weights the variant's model starts from.
        args: The `bench` flags (`seed`, `probe_budget_s`).
    """

    name = ""

    def __init__(
        self,
        workload: Workload,
        data: tuple[np.ndarray, np.ndarray],
        reference: Any,
        args: argparse.Namespace,
    ) -> None:
        self.workload = workload
        self.x, self.y = data
        self.reference = reference
        self.args = args
        self.settings: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}

    def setup(self) -> None:
        raise NotImplementedError

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        """Runs one epoch; returns (seconds, final loss or None)."""
        raise NotImplementedError


class _KerasFit(Variant):
    """`model.fit` on NumPy arrays (`numpy`) or on a tf.data pipeline."""

    def __init__(self, *a: Any, name: str, spe: int = 1, jit: bool | str = "auto") -> None:
        super().__init__(*a)
        self.name, self.spe, self.jit = name, spe, jit

    def setup(self) -> None:
        self.model = new_model(
            self.workload,
            self.reference,
            True,
            self.args.seed,
            # W4: model.fit(numpy) augments with Keras' preprocessing layers.
            keras_augment=self.name == "numpy" and augment_for(self.workload) is not None,
            steps_per_execution=self.spe,
            jit_compile=self.jit,
        )
        self.data = None if self.name == "numpy" else tf_data(self.x, self.y, self.workload)
        self.settings = {
            "steps_per_execution": self.model.steps_per_execution,
            "jit_compile": self.model.jit_compile,
        }

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        timer = epoch_timer()
        common = {"epochs": epoch + 1, "initial_epoch": epoch, "verbose": 0, "callbacks": [timer]}
        if self.data is None:
            self.model.fit(self.x, self.y, batch_size=BATCH_SIZE, shuffle=True, **common)
        else:
            self.model.fit(self.data, shuffle=False, **common)  # the pipeline shuffles
        return timer.seconds[-1], timer.losses[-1]


class _Tuned(_KerasFit):
    """`tfdata` with the probe's fastest steps_per_execution x jit_compile."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a, name="tuned")

    def setup(self) -> None:
        start = time.perf_counter()
        probe = probe_keras_settings(self.workload, self.x, self.y, self.reference, self.args)
        self.extra["probe"] = probe
        self.extra["probe_s"] = time.perf_counter() - start
        best = min(
            (p for p in probe["configs"] if p["ms_per_step"] is not None),
            key=lambda p: p["ms_per_step"],
        )
        self.spe, self.jit = best["steps_per_execution"], best["jit_compile"]
        super().setup()


class _Shardfeed(Variant):
    """`shardfeed.fit` with default options."""

    name = "shardfeed"

    def load_options(self) -> Any:
        return None  # the defaults: resident

    def setup(self) -> None:
        from shardfeed import ShardedResidentDataset

        self.model = new_model(self.workload, self.reference, False, self.args.seed)
        self.dataset = ShardedResidentDataset(
            self.x,
            self.y,
            per_replica_batch_size=BATCH_SIZE,
            seed=self.args.seed,
            transform=transform_for(self.workload),
            augment=augment_for(self.workload),
            load_options=self.load_options(),
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


class _Streaming(_Shardfeed):
    """`shardfeed.fit` streaming its rows through the two-slot ring."""

    name = "streaming"

    def load_options(self) -> Any:
        from shardfeed import LoadOptions

        return LoadOptions(streaming=True, stream_chunk_bytes=STREAM_CHUNK_BYTES)


def _fit_step(model: Any, dataset: Any, full_steps: int) -> tuple[Callable[..., Any], int, bool]:
    """What the floor takes from the `Loop` that `shardfeed.fit` builds for `model`.

    The only place the bench reaches into the training loop: the compiled
    per-replica train step, the steps per call `fit` resolves for an epoch of
    `full_steps` full steps ("auto" over the full steps; `history.params`), and
    whether the whole step loop is one XLA call.

    Args:
        model: A compiled model.
        dataset: A `ShardedResidentDataset` the loop is built for.
        full_steps: Full steps in one epoch.

    Returns:
        `(train_step, steps_per_call, whole_loop_jit)`; `train_step(x, y, sw)`
        runs one optimizer step on a batch and returns its loss.
    """
    from shardfeed import FitOptions
    from shardfeed._training.compiled import loop_for

    loop = loop_for(model, dataset, FitOptions())  # what shardfeed.fit builds (and caches)
    k = loop.steps_per_call(full_steps) if full_steps else 1
    return loop.train_step, k, loop.whole_loop_jit


class _Floor(Variant):
    """`Loop.train_step` on one fixed batch, k steps per compiled call."""

    name = "floor"

    def setup(self) -> None:
        import tensorflow as tf

        from shardfeed import ShardedResidentDataset
        from shardfeed._data.augment import step_seed

        self.model = new_model(self.workload, self.reference, False, self.args.seed)
        # Only the first batch is needed: the loop is built for it, then the
        # dataset's other rows never enter the timed loop.
        rows = self.x[:BATCH_SIZE], self.y[:BATCH_SIZE]
        dataset = ShardedResidentDataset(
            *rows,
            per_replica_batch_size=BATCH_SIZE,
            shuffle=False,
            transform=transform_for(self.workload),
        )
        steps = math.ceil(len(self.x) / BATCH_SIZE)
        train_step, k, jit = _fit_step(self.model, dataset, len(self.x) // BATCH_SIZE)
        store = dataset.stores[0]
        x, y, sw = dataset.gather(store.handles, tf.range(BATCH_SIZE))
        self.batch = (tf.identity(x), tf.identity(y), sw)
        self.calls = [tf.zeros([min(k, steps - s)], tf.int32) for s in range(0, steps, k)]
        augment = augment_for(self.workload)

        def augmented(x: Any, i: Any) -> Any:
            if augment is None:
                return x
            return augment(x, step_seed(self.args.seed, tf.constant(0), i, tf.constant(0)))

        def chunk(x: Any, y: Any, sw: Any, steps: Any) -> Any:
            loss_sum = tf.zeros([], tf.float32)
            for i in tf.range(steps.shape[0]):  # static trip count, as in Loop._train_chunk
                loss_sum += tf.cast(train_step(augmented(x, i), y, sw), tf.float32)
            return loss_sum

        def augment_only(x: Any, steps: Any) -> Any:
            total = tf.zeros([], x.dtype)
            for i in tf.range(steps.shape[0]):
                total += tf.reduce_sum(augmented(x, i)[:, 0, 0, 0])
            return total

        self.fn = tf.function(chunk, jit_compile=jit)
        self.settings = {"steps_per_execution": k, "jit_compile": jit}
        if augment is not None:
            self.extra["augment_ms_per_step"] = _time_augment(
                tf.function(augment_only, jit_compile=jit), self.batch[0], self.calls
            )

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        start = time.perf_counter()
        total = 0.0
        for steps in self.calls:
            total += float(self.fn(*self.batch, steps))  # float() waits for the call
        return time.perf_counter() - start, None


def _time_augment(fn: Callable[..., Any], x: Any, calls: list[Any]) -> float:
    """Milliseconds per step of the augmentation alone (median of 3 epochs' worth
    of calls, after one warm-up call)."""
    float(fn(x, calls[0]))
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        for steps in calls:
            float(fn(x, steps))
        runs.append((time.perf_counter() - start) / sum(int(c.shape[0]) for c in calls))
    return 1000 * sorted(runs)[1]


VARIANT_TYPES: dict[str, Callable[..., Variant]] = {
    "numpy": lambda *a: _KerasFit(*a, name="numpy"),
    "tfdata": lambda *a: _KerasFit(*a, name="tfdata"),
    "tuned": _Tuned,
    "shardfeed": _Shardfeed,
    "streaming": _Streaming,
    "floor": _Floor,
}
