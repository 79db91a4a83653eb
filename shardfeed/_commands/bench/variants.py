"""The timed variants: `model.fit` (numpy, tfdata, tuned; on JAX: jax, jax-tuned;
Keras-nightly on JAX: jax-nightly-tuned), `shardfeed.fit` (also on JAX:
shardfeed-jax), streaming, floor (also on JAX: floor-jax; and floor-opaque).

Each variant is a class: its set-up (a fresh model from the reference weights,
its input pipeline or dataset) and one epoch, returning seconds and loss. A
variant on another Keras backend runs in a worker process (`_OtherBackend`,
`backend_worker`): Keras picks its backend once per process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed._commands.bench.timing import epoch_timer
from shardfeed._commands.bench.tuning import probe_keras_settings
from shardfeed._commands.bench.workloads import (
    Workload,
    augment_for,
    augments,
    new_model,
    tf_data,
    transform_for,
)
from shardfeed._common.units import MIB

VARIANTS: dict[str, str] = {
    "numpy": "model.fit(numpy)",
    "tfdata": "model.fit(tf.data)",
    "tuned": "model.fit(tf.data, tuned)",
    "jax": "Keras on JAX, model.fit(numpy)",
    "jax-tuned": "Keras on JAX, model.fit(numpy, tuned)",
    "shardfeed": "shardfeed.fit",
    "floor": "floor",
    "streaming": "shardfeed.fit (streaming)",
    "floor-opaque": "floor, batch opaque to XLA",
    "shardfeed-jax": "shardfeed.fit on JAX",
    "floor-jax": "floor on JAX",
    "jax-nightly-tuned": "Keras-nightly on JAX, model.fit(numpy, tuned)",
}
# Run only when named in `--variants`: the peer Keras ships next, installed
# apart from the Keras the bench imports (`NIGHTLY_PATH_ENV`).
OPTIONAL_VARIANTS = ("jax-nightly-tuned",)
# The folder(s) (os.pathsep-separated) holding keras-nightly, e.g. what
# `pip install --no-deps --target DIR keras-nightly` made; put first on the
# `jax-nightly-tuned` worker's PYTHONPATH, so its `keras` is the nightly.
NIGHTLY_PATH_ENV = "SHARDFEED_KERAS_NIGHTLY_PATH"
# The letters predate the JAX variants: a-f keep their meaning, g and h are new.
VARIANT_ALIASES = dict(
    zip(
        "abcdefgh",
        ("numpy", "tfdata", "tuned", "shardfeed", "floor", "streaming", "jax", "jax-tuned"),
        strict=True,
    )
)
# Variants on another Keras backend: the backend each worker process runs.
OTHER_BACKENDS = {
    "jax": "jax",
    "jax-tuned": "jax",
    "shardfeed-jax": "jax",
    "floor-jax": "jax",
    "jax-nightly-tuned": "jax",
}
# Each backend's own floor: the ratio a variant on that backend is also given.
BACKEND_FLOORS = {"jax": "floor-jax"}
WORKER_MODULE = "shardfeed._commands.bench.backend_worker"
STREAM_CHUNK_BYTES = 16 * MIB

VARIANT_NOTES: dict[str, str] = {
    "numpy": (
        "`model.fit(x, y, batch_size=batch, shuffle=True)` on NumPy arrays (the workload's "
        "batch), Keras defaults (steps_per_execution=1, jit_compile='auto')."
    ),
    "tfdata": (
        "`model.fit` on `from_tensor_slices((x, y)).cache().shuffle(rows).batch(batch)"
        ".prefetch(AUTOTUNE)` (a full-size shuffle buffer: a uniform permutation per epoch, "
        "like the other variants), Keras defaults."
    ),
    "tuned": (
        "The `tfdata` pipeline, compiled with the fastest of steps_per_execution in "
        "{32, 128} x jit_compile in {False, True}, chosen by a short probe in this process."
    ),
    "jax": (
        "`model.fit(x, y, batch_size=batch, shuffle=True)` on NumPy arrays, Keras defaults "
        "(steps_per_execution=1, jit_compile='auto': True on JAX), in a worker process with "
        "`KERAS_BACKEND=jax` (same data and initial weights; no TensorFlow in it)."
    ),
    "jax-tuned": (
        "`jax` compiled with the fastest of steps_per_execution in {32, 128} x jit_compile in "
        "{False, True}, chosen by the same short probe as `tuned`, on NumPy, in its worker "
        "process."
    ),
    "shardfeed": (
        "`shardfeed.fit` on `ShardedResidentDataset(x, y, per_replica_batch_size=batch, "
        "seed=0)` with default `FitOptions()`; batches gathered on the device."
    ),
    "floor": (
        "The compiled train step `shardfeed.fit` runs (`Loop.train_step`, same jit_compile, "
        "same steps per call) on one fixed, already-gathered batch: no gather, no "
        "permutation, no input work. ceil(rows/batch) full steps per epoch. Its loss (one "
        "batch seen over and over) is not reported."
    ),
    "streaming": (
        "`shardfeed.fit` with `LoadOptions(streaming=True, stream_chunk_bytes=16 MiB)`: the "
        "rows flow through a two-slot ring per replica, the next chunk uploaded by a "
        "background thread while the current one trains (the fallback for shards that do "
        "not fit)."
    ),
    "floor-opaque": (
        "`floor` with its fixed batch multiplied by `step >= 0` inside each step: the same "
        "values, but XLA can no longer hoist work on the batch out of the step loop, as it "
        "cannot for any input that changes from step to step. The floor an input path "
        "could reach if reading a new batch cost nothing."
    ),
    "shardfeed-jax": (
        "`shardfeed.fit` on Keras' JAX backend (default `FitOptions()`; the rows resident as "
        "`jax.Array`s), in a worker process with `KERAS_BACKEND=jax`, same data and initial "
        "weights. Its ratio to `floor-jax` is also given."
    ),
    "floor-jax": (
        "The JAX loop's compiled training call (Keras' stateless `train_step` in a jitted "
        "`lax.scan`, `shardfeed.fit`'s steps per call) on one fixed device batch, in a worker "
        "process with `KERAS_BACKEND=jax`: the floor of the variants on JAX."
    ),
    "jax-nightly-tuned": (
        "`jax-tuned` on keras-nightly (3.16.0.dev: `steps_per_execution` runs its steps in "
        "an on-device `lax.scan`, keras #23527; each call still fed from host NumPy), with "
        "its own probe, in a worker process whose PYTHONPATH starts with "
        f"${NIGHTLY_PATH_ENV} (skipped, saying why, without it)."
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
    skipped: str | None = None  # why it did not run, set by `setup()`

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

    def close(self) -> None:
        """Releases what `setup()` started (a worker process); idempotent."""


class _KerasFit(Variant):
    """`model.fit` on NumPy arrays (`numpy`, `jax`) or on a tf.data pipeline."""

    def __init__(
        self,
        *a: Any,
        name: str,
        on_numpy: bool,
        spe: int = 1,
        jit: bool | str = "auto",
    ) -> None:
        super().__init__(*a)
        self.name, self.on_numpy, self.spe, self.jit = name, on_numpy, spe, jit

    def setup(self) -> None:
        self.model = new_model(
            self.workload,
            self.reference,
            True,
            self.args.seed,
            # W4: model.fit(numpy) augments with Keras' preprocessing layers.
            keras_augment=self.on_numpy and augments(self.workload),
            steps_per_execution=self.spe,
            jit_compile=self.jit,
        )
        self.data = None if self.on_numpy else tf_data(self.x, self.y, self.workload)
        self.settings = {
            "steps_per_execution": self.model.steps_per_execution,
            "jit_compile": self.model.jit_compile,
        }

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        timer = epoch_timer()
        common = {"epochs": epoch + 1, "initial_epoch": epoch, "verbose": 0, "callbacks": [timer]}
        if self.data is None:
            batch = self.workload.batch_size
            self.model.fit(self.x, self.y, batch_size=batch, shuffle=True, **common)
        else:
            self.model.fit(self.data, shuffle=False, **common)  # the pipeline shuffles
        return timer.seconds[-1], timer.losses[-1]


class _Tuned(_KerasFit):
    """`tfdata` (`tuned`) or `jax` (`jax-tuned`) with the probe's fastest
    steps_per_execution x jit_compile."""

    def setup(self) -> None:
        start = time.perf_counter()
        probe = probe_keras_settings(
            self.workload, self.x, self.y, self.reference, self.args, on_numpy=self.on_numpy
        )
        self.extra["probe"] = probe
        self.extra["probe_s"] = time.perf_counter() - start
        best = min(
            (p for p in probe["configs"] if p["ms_per_step"] is not None),
            key=lambda p: p["ms_per_step"],
        )
        self.spe, self.jit = best["steps_per_execution"], best["jit_compile"]
        super().setup()


class _OtherBackend(Variant):
    """A Keras variant on another Keras backend, run by a worker process.

    `setup()` starts `python -m backend_worker` with `KERAS_BACKEND` set, sends
    it the workload, the rows, the seed and the reference weights (an .npz
    file: initialisers draw different numbers on each backend), and reads back
    its settings, or why it cannot run (`skipped`: the backend does not import
    there). Each `epoch(e)` is one request and one reply, so the schedule
    interleaves it with the in-process variants and only one trains at a time.
    The worker regenerates the data itself (`make_data` is deterministic).
    """

    # Folders put before the bench's own PYTHONPATH in the worker, and whether
    # the worker must find a keras-nightly there (`_KerasNightly`).
    first_on_path: tuple[str, ...] = ()
    keras_nightly = False

    def __init__(self, *a: Any, name: str) -> None:
        super().__init__(*a)
        self.name = name
        self.backend = OTHER_BACKENDS[name]
        self._proc: subprocess.Popen[str] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def setup(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="shardfeed-bench-")
        weights = os.path.join(self._dir.name, "reference.npz")
        np.savez(weights, *self.reference.get_weights())
        # This checkout's shardfeed, also when the worker's Python has another.
        here = str(Path(__file__).resolve().parents[3])
        path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self._proc = subprocess.Popen(
            [self.args.jax_python, "-m", WORKER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # the replies only: the worker prints to stderr
            text=True,
            env=dict(
                os.environ,
                KERAS_BACKEND=self.backend,
                PYTHONPATH=os.pathsep.join([*self.first_on_path, *path, here]),
            ),
        )
        reply = self._request(
            {
                "variant": self.name,
                "workload": self.workload.name,
                "rows": len(self.x),
                "seed": self.args.seed,
                "probe_budget_s": self.args.probe_budget_s,
                "weights_path": weights,
                "keras_nightly": self.keras_nightly,
            }
        )
        if "skipped" in reply:
            self.skipped = reply["skipped"]
            self.close()
            return
        self.settings, self.extra = reply["settings"], reply["extra"]

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        reply = self._request({"epoch": epoch})
        self.settings = reply.get("settings", self.settings)
        return reply["seconds"], reply["loss"]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.close()  # end of requests: the worker exits
            except BrokenPipeError:
                pass  # it has exited already
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            self.close()
            raise RuntimeError(
                f"The {self.name} variant's worker process ({WORKER_MODULE}, "
                f"KERAS_BACKEND={self.backend}) exited with status {proc.returncode} before "
                f"replying to {message}; its traceback is on stderr above."
            )
        reply: dict[str, Any] = json.loads(line)
        return reply


class _KerasNightly(_OtherBackend):
    """`jax-tuned` on keras-nightly: a worker whose PYTHONPATH starts with the
    folder(s) `$SHARDFEED_KERAS_NIGHTLY_PATH` names, so its `keras` is the
    nightly while the bench's own process keeps its Keras. Skipped, saying
    why, when that is unset or holds no `keras` package; the worker skips it
    when the `keras` it imports is not a dev build (`backend_worker`)."""

    keras_nightly = True

    def __init__(self, *a: Any) -> None:
        super().__init__(*a, name="jax-nightly-tuned")

    def setup(self) -> None:
        setting = os.environ.get(NIGHTLY_PATH_ENV, "")
        folders = tuple(p for p in setting.split(os.pathsep) if p)
        install = (
            "Install it into a folder of its own (`pip install --no-deps --target DIR "
            f"keras-nightly`; .ci/gpu-check.sh does) and set {NIGHTLY_PATH_ENV}=DIR"
        )
        if not folders:
            self.skipped = f"keras-nightly is not installed for the bench: {NIGHTLY_PATH_ENV} is "
            self.skipped += f"not set. {install}"
            return
        if not any(Path(f, "keras", "__init__.py").is_file() for f in folders):
            self.skipped = f"{NIGHTLY_PATH_ENV}={setting!r} holds no `keras` package. {install}"
            return
        self.first_on_path = folders
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
            per_replica_batch_size=self.workload.batch_size,
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
    from shardfeed._tf.compiled import loop_for

    loop = loop_for(model, dataset, FitOptions())  # what shardfeed.fit builds (and caches)
    k = loop.steps_per_call(full_steps) if full_steps else 1
    return loop.train_step, k, loop.whole_loop_jit


class _Floor(Variant):
    """`Loop.train_step` on one fixed batch, k steps per compiled call
    (`floor-opaque`: the batch made to depend on the step first)."""

    name = "floor"

    def __init__(self, *a: Any, opaque: bool = False) -> None:
        super().__init__(*a)
        self.opaque = opaque
        self.name = "floor-opaque" if opaque else "floor"

    def setup(self) -> None:
        import tensorflow as tf

        from shardfeed import ShardedResidentDataset
        from shardfeed._tf.augment import step_seed

        self.model = new_model(self.workload, self.reference, False, self.args.seed)
        # Only the first batch is needed: the loop is built for it, then the
        # dataset's other rows never enter the timed loop.
        batch = self.workload.batch_size
        rows = self.x[:batch], self.y[:batch]
        dataset = ShardedResidentDataset(
            *rows,
            per_replica_batch_size=batch,
            shuffle=False,
            transform=transform_for(self.workload),
        )
        steps = math.ceil(len(self.x) / batch)
        train_step, k, jit = _fit_step(self.model, dataset, len(self.x) // batch)
        store = dataset.stores[0]
        x, y, sw = dataset.gather(store.handles, tf.range(batch))
        self.batch = (tf.identity(x), tf.identity(y), sw)
        self.calls = [tf.zeros([min(k, steps - s)], tf.int32) for s in range(0, steps, k)]
        augment = augment_for(self.workload)

        def augmented(x: Any, i: Any) -> Any:
            if augment is None:
                return x
            return augment(x, step_seed(self.args.seed, tf.constant(0), i, tf.constant(0)))

        def opaque(t: Any, i: Any) -> Any:
            # Times one: XLA does not prove `i >= 0`, so the batch is no longer
            # loop-invariant and nothing computed from it leaves the loop.
            return t * tf.cast(i >= 0, t.dtype) if self.opaque and t is not None else t

        def chunk(x: Any, y: Any, sw: Any, steps: Any) -> Any:
            loss_sum = tf.zeros([], tf.float32)
            for i in tf.range(steps.shape[0]):  # static trip count, as in Loop._steps
                step_x, step_y = opaque(x, i), opaque(y, i)
                loss_sum += tf.cast(train_step(augmented(step_x, i), step_y, sw), tf.float32)
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
    "numpy": lambda *a: _KerasFit(*a, name="numpy", on_numpy=True),
    "tfdata": lambda *a: _KerasFit(*a, name="tfdata", on_numpy=False),
    "tuned": lambda *a: _Tuned(*a, name="tuned", on_numpy=False),
    "jax": lambda *a: _OtherBackend(*a, name="jax"),
    "jax-tuned": lambda *a: _OtherBackend(*a, name="jax-tuned"),
    "shardfeed": _Shardfeed,
    "streaming": _Streaming,
    "floor": _Floor,
    "floor-opaque": lambda *a: _Floor(*a, opaque=True),
    "shardfeed-jax": lambda *a: _OtherBackend(*a, name="shardfeed-jax"),
    "floor-jax": lambda *a: _OtherBackend(*a, name="floor-jax"),
    "jax-nightly-tuned": _KerasNightly,
}

# What a `backend_worker` process runs for each variant on another backend
# (`shardfeed-jax` and `floor-jax`: `jax_variants.IN_WORKER_TYPES_JAX`).
IN_WORKER_TYPES: dict[str, Callable[..., Variant]] = {
    "jax": lambda *a: _KerasFit(*a, name="jax", on_numpy=True),
    "jax-tuned": lambda *a: _Tuned(*a, name="jax-tuned", on_numpy=True),
    "jax-nightly-tuned": lambda *a: _Tuned(*a, name="jax-nightly-tuned", on_numpy=True),
}
