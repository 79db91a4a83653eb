"""`shardfeed bench`: where an epoch's time goes -- `model.fit`, `shardfeed.fit`, the floor.

Separation of concerns: this module owns the benchmark only -- the synthetic
workloads, the variants it times, the schedule (one warm-up epoch each, then
interleaved timed rounds) and the report (Markdown, JSON, chart). It trains
through the public `shardfeed.fit`; for the floor it reuses the compiled train
step of the `Loop` that `fit` builds, so the floor moves whenever the step does.
It is a benchmark, not a test: `tests/test_bench.py` only checks that it runs.

Conditions travel with the numbers (airbench style): every report records the
CPU, cores, RAM, OS, library versions, the date, the rows scale and how many
timed epochs each median is taken over. Numbers from a shared or loaded
machine, from `--rows-scale` below 1 or from fewer than 3 timed epochs are
smoke checks, not results.

Variants, all batch 256, Adam(1e-3), same initial weights (copied from one
reference model), each with its own model instance:
    numpy      `model.fit(x, y, batch_size=256, shuffle=True)`, Keras defaults.
    tfdata     `model.fit` on `from_tensor_slices.cache.shuffle.batch.prefetch`.
    tuned      `tfdata` with the fastest `steps_per_execution` x `jit_compile`
               found by a short probe in the same process.
    shardfeed  `shardfeed.fit` with default `FitOptions()`.
    floor      `Loop._train_step` on one fixed device batch inside the same
               compiled loop shape: the compute floor, no input work at all.
Timing: each timed epoch is measured from `on_epoch_begin` to `on_epoch_end`
(the loss is read back first, so the work is done), so per-`fit`-call set-up is
excluded; the warm-up column is the whole first `fit` call, compilation
included. Variants run round-robin one epoch each, in a rotated order each
round, so drift in machine load spreads over all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed._common.units import GIB, KIB, MIB

BATCH_SIZE = 256
LEARNING_RATE = 1e-3
MIN_ROWS = 2 * BATCH_SIZE  # `--rows-scale` never goes below two batches
PROBE_SPE = (32, 128)
PROBE_JIT = (False, True)
# Steps per probe epoch: short, and whole calls of 32 and 128. (Not a repeated
# dataset with `steps_per_epoch`: Keras then runs every call's full
# steps_per_execution, past the epoch's end.)
PROBE_MAX_STEPS = 256
# Probe epochs: a warm-up, then the fastest of the rest. Keras' step function
# (reduce_retracing=True) retraces once the partial last batch arrives, so XLA
# can still be compiling in the second epoch; one timed epoch would penalise jit.
PROBE_EPOCHS = 3
# A jit_compile=True probe this many times slower than the best
# jit_compile=False one is reported as catastrophically slow (notes.md: XLA on
# CPU with convolutions inside a loop ran 7-8 s per step vs 0.2 s without).
CATASTROPHIC_FACTOR = 3.0

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
        "The compiled train step `shardfeed.fit` runs (`Loop._train_step`, same jit_compile, "
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


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark workload: data shape, model and loss.

    Attributes:
        name: "W1", "W2" or "W3".
        rows: Rows at `--rows-scale 1`.
        description: One line for the report.
        input_note: How the inputs reach the model, per variant family.
    """

    name: str
    rows: int
    description: str
    input_note: str


WORKLOADS: dict[str, Workload] = {
    "W1": Workload(
        "W1",
        60_000,
        "60,000 x 784 float32, MLP 256-256-10 (relu), sparse softmax cross-entropy",
        "float32 rows as they are.",
    ),
    "W2": Workload(
        "W2",
        1_000_000,
        "1,000,000 x 32 float32, MLP 64-64-1 (relu), MSE",
        "float32 rows as they are.",
    ),
    "W3": Workload(
        "W3",
        20_000,
        "20,000 x 32x32x3 uint8 images, CNN Conv32-Pool-Conv64-Pool-Dense128-Dense10, "
        "sparse softmax cross-entropy",
        "uint8 rows everywhere. Keras variants: the model's first layer is "
        "`Rescaling(1/255)` (casts to float32 and scales inside the step). shardfeed: "
        "`transform=lambda x: tf.cast(x, 'float32') / 255` inside the step, no Rescaling "
        "layer. Floor: one batch normalised once, outside the loop.",
    ),
}


# -- command line -------------------------------------------------------------


def _csv_choice(choices: dict[str, str], aliases: dict[str, str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        out = []
        for item in (t.strip() for t in text.split(",") if t.strip()):
            name = aliases.get(item, item)
            if name not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown name {item!r}; choose from {', '.join(choices)}"
                )
            if name not in out:
                out.append(name)
        if not out:
            raise argparse.ArgumentTypeError("expected at least one name")
        return out

    return parse


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, received {text!r}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `bench` flags to a subcommand parser.

    Args:
        parser: The `bench` subparser.

    Returns:
        None; the parser is extended in place.

    Example:
        >>> p = argparse.ArgumentParser(); add_arguments(p)
        >>> p.parse_args(["--workloads", "W2", "--rows-scale", "0.05"]).workloads
        ['W2']
    """
    parser.add_argument(
        "--workloads",
        type=_csv_choice(WORKLOADS, {w.lower(): w for w in WORKLOADS}),
        default=list(WORKLOADS),
        help="comma-separated, from W1,W2,W3 (default: all)",
    )
    parser.add_argument(
        "--variants",
        type=_csv_choice(VARIANTS, VARIANT_ALIASES),
        default=list(VARIANTS),
        help="comma-separated, from numpy,tfdata,tuned,shardfeed,floor,streaming "
        "(or a-f; default: all)",
    )
    parser.add_argument(
        "--epochs",
        type=_positive(int),
        default=3,
        help="timed epochs per variant, after one warm-up epoch (default: 3)",
    )
    parser.add_argument(
        "--rows-scale",
        type=_positive(float),
        default=1.0,
        help=f"scale every workload's rows (at least {MIN_ROWS}), e.g. 0.05 for a quick check",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="directory for bench.json, bench.md and bench.png (default: bench-results/)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data and weights seed (default: 0)")
    parser.add_argument(
        "--probe-budget-s",
        type=_positive(float),
        default=120.0,
        help="stop a tuning probe that runs longer than this (default: 120)",
    )
    parser.add_argument(
        "--engines",
        action="store_true",
        help="also time the engines (single device, MirroredStrategy over 2 CPU devices, "
        "2 MultiWorkerMirroredStrategy workers, 2 Horovod ranks) on the W2 model",
    )
    parser.add_argument(
        "--engine-rows",
        type=_positive(int),
        default=200_000,
        help="rows for --engines (default: 200,000)",
    )
    parser.add_argument(
        "--horovod-python",
        help="a Python with Horovod (e.g. the venv .ci/horovod_env.sh "
        "prints) for the Horovod row of --engines",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark and writes `bench.json`, `bench.md` and `bench.png`.

    Args:
        args: Parsed flags (see `add_arguments`).

    Returns:
        0 on success (the CLI's exit status).

    Example:
        >>> from shardfeed._commands.cli import main
        >>> main(["bench", "--workloads", "W2", "--rows-scale", "0.02", "--epochs", "1"])
        0
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    report: dict[str, Any] = {
        "machine": machine_info(),
        "conditions": {
            "batch_size": BATCH_SIZE,
            "optimizer": f"Adam(learning_rate={LEARNING_RATE})",
            "timed_epochs": args.epochs,
            "statistic": f"median of {args.epochs} timed epoch(s) per variant",
            "schedule": "one warm-up epoch per variant (compilation included), then "
            "round-robin one epoch per variant per round, order rotated each round",
            "rows_scale": args.rows_scale,
            "seed": args.seed,
            "variants": {v: VARIANT_NOTES[v] for v in args.variants},
        },
        "workloads": {},
    }
    for name in args.workloads:
        report["workloads"][name] = _run_workload(WORKLOADS[name], args)
        _release_loops()
    if args.engines:
        from shardfeed._commands import bench_engines as _bench_engines

        report["engines"] = _bench_engines.run_engines(
            args.engine_rows, args.epochs, args.horovod_python
        )
    args.out.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(report)
    if args.engines:
        markdown += (
            "\n"
            + _bench_engines.to_markdown(report["engines"], args.engine_rows, args.epochs)
            + "\n"
        )
    (args.out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "bench.md").write_text(markdown)
    write_chart(report, args.out / "bench.png")
    print(markdown)
    print(f"Wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}, {args.out / 'bench.png'}")
    return 0


# -- machine ----------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) * KIB / GIB, 1)  # kB -> GiB
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on.

    Returns:
        CPU model, core counts, RAM, load average, OS, Python, TensorFlow,
        Keras and NumPy versions, devices and the date (UTC).

    Example:
        >>> machine_info()["cpu_count"]
        2
    """
    import keras
    import tensorflow as tf

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "ram_gib": _ram_gib(),
        "load_average_1_5_15_min_at_start": load,
        "os": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "devices": [d.name for d in tf.config.list_logical_devices()],
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


# -- data and models -----------------------------------------------------------


def make_data(workload: Workload, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic, learnable synthetic data for a workload.

    W1: Gaussian rows, labels = argmax of a random linear teacher. W2: Gaussian
    rows, target = a random one-hidden-layer tanh teacher plus 0.1 noise. W3:
    ten random 8x8 colour prototypes upsampled to 32x32, each image its class'
    prototype (0-127) plus uniform noise (0-127), as uint8.

    Args:
        workload: Which workload.
        rows: Number of rows.
        seed: NumPy seed.

    Returns:
        `(x, y)` NumPy arrays.

    Example:
        >>> x, y = make_data(WORKLOADS["W2"], 1000, seed=0); x.shape, y.shape
        ((1000, 32), (1000, 1))
    """
    rng = np.random.default_rng(seed)
    if workload.name == "W1":
        x = rng.standard_normal((rows, 784), dtype=np.float32)
        teacher = rng.standard_normal((784, 10), dtype=np.float32)
        return x, np.argmax(x @ teacher, axis=1).astype(np.int32)
    if workload.name == "W2":
        x = rng.standard_normal((rows, 32), dtype=np.float32)
        w1 = rng.standard_normal((32, 16), dtype=np.float32) / np.float32(math.sqrt(32))
        w2 = rng.standard_normal((16, 1), dtype=np.float32)
        noise = np.float32(0.1) * rng.standard_normal((rows, 1), dtype=np.float32)
        return x, (np.tanh(x @ w1) @ w2 + noise).astype(np.float32)
    prototypes = rng.integers(0, 48, (10, 8, 8, 3), dtype=np.uint8)
    prototypes = prototypes.repeat(4, axis=1).repeat(4, axis=2)
    y = rng.integers(0, 10, rows, dtype=np.int32)
    x = prototypes[y]
    x += rng.integers(0, 208, x.shape, dtype=np.uint8)  # <= 254: no overflow
    return x, y


def build_model(workload: Workload, for_keras_fit: bool, seed: int) -> Any:
    """The workload's model, with seeded initialisers.

    Args:
        workload: Which workload.
        for_keras_fit: For W3, take uint8 input with a `Rescaling(1/255)`
            first layer (the Keras variants); else float32 input (shardfeed's
            `transform` normalises). Ignored for W1 and W2.
        seed: Initialiser seed.

    Returns:
        An uncompiled `keras.Model`.

    Example:
        >>> build_model(WORKLOADS["W2"], True, seed=0).count_params()
        6401
    """
    import keras
    from keras import layers

    seeds = iter(range(seed * 100, seed * 100 + 100))

    def dense(units: int, activation: str | None = None) -> Any:
        init = keras.initializers.GlorotUniform(seed=next(seeds))
        return layers.Dense(units, activation=activation, kernel_initializer=init)

    def conv(filters: int) -> Any:
        init = keras.initializers.GlorotUniform(seed=next(seeds))
        return layers.Conv2D(filters, 3, activation="relu", kernel_initializer=init)

    if workload.name == "W1":
        stack = [keras.Input((784,)), dense(256, "relu"), dense(256, "relu"), dense(10)]
    elif workload.name == "W2":
        stack = [keras.Input((32,)), dense(64, "relu"), dense(64, "relu"), dense(1)]
    else:
        head = (
            [keras.Input((32, 32, 3), dtype="uint8"), layers.Rescaling(1 / 255)]
            if for_keras_fit
            else [keras.Input((32, 32, 3))]
        )
        stack = [
            *head,
            conv(32),
            layers.MaxPooling2D(),
            conv(64),
            layers.MaxPooling2D(),
            layers.Flatten(),
            dense(128, "relu"),
            dense(10),
        ]
    return keras.Sequential(stack)


def _loss(workload: Workload) -> Any:
    import keras

    if workload.name == "W2":
        return keras.losses.MeanSquaredError()
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _transform(workload: Workload) -> Callable[[Any], Any] | None:
    if workload.name != "W3":
        return None
    import tensorflow as tf

    def normalise(x: Any) -> Any:
        return tf.cast(x, "float32") / 255  # shardfeed: uint8 stays resident, cast per batch

    return normalise


def _new_model(
    workload: Workload, reference: Any, for_keras_fit: bool, seed: int, **compile_kw: Any
) -> Any:
    import keras

    model = build_model(workload, for_keras_fit, seed)
    model.set_weights(reference.get_weights())
    model.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=_loss(workload), **compile_kw
    )
    return model


def _tf_data(x: np.ndarray, y: np.ndarray) -> Any:
    import tensorflow as tf

    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .cache()
        .shuffle(len(x))
        .batch(BATCH_SIZE)
        .prefetch(tf.data.AUTOTUNE)
    )


# -- timing ------------------------------------------------------------------


def _epoch_timer(budget_s: float | None = None) -> Any:
    """A callback that times epochs (begin to end, loss read back first) and,
    with `budget_s`, stops training once a call ends past the budget."""
    import keras

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self.losses: list[float] = []
            self.stopped_after_s: float | None = None
            self._start = self._epoch_start = 0.0

        def on_train_begin(self, logs: dict | None = None) -> None:
            self._start = time.perf_counter()

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self._epoch_start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            elapsed = time.perf_counter() - self._start
            if budget_s is not None and elapsed > budget_s:
                self.stopped_after_s = elapsed
                self.model.stop_training = True

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            loss = float((logs or {}).get("loss", float("nan")))  # waits for the work
            self.seconds.append(time.perf_counter() - self._epoch_start)
            self.losses.append(loss)

    return EpochTimer()


class _Variant:
    """One timed variant: `setup()`, then `epoch(e)` for e = 0 (warm-up), 1, 2, ..."""

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


class _KerasFit(_Variant):
    """`model.fit` on NumPy arrays (`numpy`) or on a tf.data pipeline."""

    def __init__(self, *a: Any, name: str, spe: int = 1, jit: bool | str = "auto") -> None:
        super().__init__(*a)
        self.name, self.spe, self.jit = name, spe, jit

    def setup(self) -> None:
        self.model = _new_model(
            self.workload,
            self.reference,
            True,
            self.args.seed,
            steps_per_execution=self.spe,
            jit_compile=self.jit,
        )
        self.data = None if self.name == "numpy" else _tf_data(self.x, self.y)
        self.settings = {
            "steps_per_execution": self.model.steps_per_execution,
            "jit_compile": self.model.jit_compile,
        }

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        timer = _epoch_timer()
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


class _Shardfeed(_Variant):
    """`shardfeed.fit` with default options."""

    name = "shardfeed"

    def load_options(self) -> Any:
        return None  # the defaults: resident

    def setup(self) -> None:
        from shardfeed import ShardedResidentDataset

        self.model = _new_model(self.workload, self.reference, False, self.args.seed)
        self.dataset = ShardedResidentDataset(
            self.x,
            self.y,
            per_replica_batch_size=BATCH_SIZE,
            seed=self.args.seed,
            transform=_transform(self.workload),
            load_options=self.load_options(),
        )

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        import shardfeed

        timer = _epoch_timer()
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


class _Floor(_Variant):
    """`Loop._train_step` on one fixed batch, k steps per compiled call."""

    name = "floor"

    def setup(self) -> None:
        import tensorflow as tf

        from shardfeed import FitOptions, ShardedResidentDataset
        from shardfeed._training.api import _loop_for

        self.model = _new_model(self.workload, self.reference, False, self.args.seed)
        # Only the first batch is needed: the loop is built for it, then the
        # dataset's other rows never enter the timed loop.
        rows = self.x[:BATCH_SIZE], self.y[:BATCH_SIZE]
        dataset = ShardedResidentDataset(
            *rows,
            per_replica_batch_size=BATCH_SIZE,
            shuffle=False,
            transform=_transform(self.workload),
        )
        loop = _loop_for(self.model, dataset, FitOptions())  # what shardfeed.fit builds
        store = dataset.stores[0]
        x, y, sw = dataset.gather(store.handles, tf.range(BATCH_SIZE))
        self.batch = (tf.identity(x), tf.identity(y), sw)
        steps = math.ceil(len(self.x) / BATCH_SIZE)
        full_steps = len(self.x) // BATCH_SIZE
        # The k shardfeed.fit resolves ("auto" over the full steps; history.params).
        k = loop._chunks(full_steps)[0][1] if full_steps else 1
        self.calls = [tf.zeros([min(k, steps - s)], tf.int32) for s in range(0, steps, k)]

        def chunk(x: Any, y: Any, sw: Any, steps: Any) -> Any:
            loss_sum = tf.zeros([], tf.float32)
            for _ in tf.range(steps.shape[0]):  # static trip count, as in Loop._train_chunk
                loss_sum += tf.cast(loop._train_step(x, y, sw), tf.float32)
            return loss_sum

        self.fn = tf.function(chunk, jit_compile=loop.whole_loop_jit)
        self.settings = {"steps_per_execution": k, "jit_compile": loop.whole_loop_jit}

    def epoch(self, epoch: int) -> tuple[float, float | None]:
        start = time.perf_counter()
        total = 0.0
        for steps in self.calls:
            total += float(self.fn(*self.batch, steps))  # float() waits for the call
        return time.perf_counter() - start, None


_VARIANT_TYPES: dict[str, Callable[..., _Variant]] = {
    "numpy": lambda *a: _KerasFit(*a, name="numpy"),
    "tfdata": lambda *a: _KerasFit(*a, name="tfdata"),
    "tuned": _Tuned,
    "shardfeed": _Shardfeed,
    "streaming": _Streaming,
    "floor": _Floor,
}


def probe_keras_settings(
    workload: Workload, x: np.ndarray, y: np.ndarray, reference: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Times `model.fit` on the tf.data pipeline for each steps_per_execution x jit_compile.

    Each configuration gets a fresh model and runs `PROBE_EPOCHS` epochs of
    the `tfdata` pipeline over the first min(steps per epoch, 256) batches of
    rows: the first epoch compiles, the fastest later one counts. A
    configuration whose run passes `args.probe_budget_s` is stopped and left
    out.

    Args:
        workload: Which workload.
        x: Inputs.
        y: Targets.
        reference: Model whose weights every probe starts from.
        args: Flags (`seed`, `probe_budget_s`).

    Returns:
        `{"steps_per_epoch": ..., "configs": [...], "note": ...}`; each config
        has `steps_per_execution`, `jit_compile`, `ms_per_step` (None when
        stopped), `warmup_s` and `stopped_after_s`.

    Example:
        >>> probe_keras_settings(WORKLOADS["W2"], x, y, ref, args)["configs"][0]["ms_per_step"]
        0.41
    """
    steps = min(math.ceil(len(x) / BATCH_SIZE), PROBE_MAX_STEPS)
    data = _tf_data(x[: steps * BATCH_SIZE], y[: steps * BATCH_SIZE])
    configs = []
    for spe in PROBE_SPE:
        for jit in PROBE_JIT:
            model = _new_model(
                workload, reference, True, args.seed, steps_per_execution=spe, jit_compile=jit
            )
            timer = _epoch_timer(budget_s=args.probe_budget_s)
            start = time.perf_counter()
            model.fit(data, epochs=PROBE_EPOCHS, shuffle=False, verbose=0, callbacks=[timer])
            done = len(timer.seconds) == PROBE_EPOCHS and timer.stopped_after_s is None
            configs.append(
                {
                    "steps_per_execution": spe,
                    "jit_compile": jit,
                    "ms_per_step": 1000 * min(timer.seconds[1:]) / steps if done else None,
                    "warmup_s": timer.seconds[0] if timer.seconds else None,
                    "total_s": time.perf_counter() - start,
                    "stopped_after_s": timer.stopped_after_s,
                }
            )
            print(f"  {workload.name} probe {_config_text(configs[-1])}", flush=True)
            del model
            gc.collect()
    return {"steps_per_epoch": steps, "configs": configs, "note": _probe_note(configs)}


def _config_text(config: dict[str, Any]) -> str:
    head = (
        f"steps_per_execution={config['steps_per_execution']}, jit_compile={config['jit_compile']}"
    )
    if config["ms_per_step"] is None:
        return f"{head}: stopped after {config['stopped_after_s']:.0f} s (budget)"
    return f"{head}: {config['ms_per_step']:.3f} ms/step"


def _probe_note(configs: list[dict[str, Any]]) -> str:
    done = [c for c in configs if c["ms_per_step"] is not None]
    if not done:
        raise RuntimeError(
            "Every tuning probe passed --probe-budget-s. Received: "
            f"probe_budget_s={configs[0]['stopped_after_s']:.0f}. Raise --probe-budget-s."
        )
    best = min(done, key=lambda c: c["ms_per_step"])
    note = f"Winner: {_config_text(best)}"
    stopped = [c for c in configs if c["ms_per_step"] is None]
    if stopped:
        note += "; stopped at the budget: " + "; ".join(_config_text(c) for c in stopped)
    by_jit = {
        jit: min((c["ms_per_step"] for c in done if c["jit_compile"] is jit), default=None)
        for jit in PROBE_JIT
    }
    if by_jit[True] is not None and by_jit[False] is not None:
        factor = by_jit[True] / by_jit[False]
        if factor > CATASTROPHIC_FACTOR:
            note += (
                f"; jit_compile=True is catastrophically slow here ({factor:.1f}x the best "
                "jit_compile=False probe): skipped"
            )
    elif by_jit[True] is None and any(c["jit_compile"] for c in stopped):
        note += "; jit_compile=True is catastrophically slow here (stopped at the budget): skipped"
    return note


# -- schedule ------------------------------------------------------------------


def _run_workload(workload: Workload, args: argparse.Namespace) -> dict[str, Any]:
    rows = max(MIN_ROWS, round(workload.rows * args.rows_scale))
    steps = math.ceil(rows / BATCH_SIZE)
    print(f"{workload.name}: {rows:,} rows, {steps} steps/epoch; {workload.description}")
    start = time.perf_counter()
    data = make_data(workload, rows, args.seed)
    data_s = time.perf_counter() - start
    reference = build_model(workload, False, args.seed)
    variants = [_VARIANT_TYPES[name](workload, data, reference, args) for name in args.variants]
    setup_s, warmup_s, warmup_loss = {}, {}, {}
    for v in variants:
        start = time.perf_counter()
        v.setup()
        setup_s[v.name] = time.perf_counter() - start
    for v in variants:  # warm-up: one whole first call each, compilation included
        start = time.perf_counter()
        _, warmup_loss[v.name] = v.epoch(0)
        warmup_s[v.name] = time.perf_counter() - start
        print(f"  {workload.name} warm-up {VARIANTS[v.name]}: {warmup_s[v.name]:.2f} s", flush=True)
    seconds: dict[str, list[float]] = {v.name: [] for v in variants}
    losses: dict[str, float | None] = dict(warmup_loss)
    for epoch in range(1, args.epochs + 1):
        shift = (epoch - 1) % len(variants)
        for v in variants[shift:] + variants[:shift]:
            secs, losses[v.name] = v.epoch(epoch)
            seconds[v.name].append(secs)
        line = ", ".join(f"{v.name} {seconds[v.name][-1]:.3f} s" for v in variants)
        print(f"  {workload.name} epoch {epoch}/{args.epochs}: {line}", flush=True)
    results = {}
    floor = statistics.median(seconds["floor"]) if "floor" in seconds else None
    numpy_s = statistics.median(seconds["numpy"]) if "numpy" in seconds else None
    for v in variants:
        median = statistics.median(seconds[v.name])
        results[v.name] = {
            "label": VARIANTS[v.name],
            "settings": v.settings,
            "epoch_s": seconds[v.name],
            "median_epoch_s": median,
            "ms_per_step": 1000 * median / steps,
            "ratio_to_floor": median / floor if floor else None,
            "speedup_vs_numpy": numpy_s / median if numpy_s else None,
            "final_loss": losses[v.name],
            "setup_s": setup_s[v.name],
            "warmup_s": warmup_s[v.name],
            **v.extra,
        }
    del variants
    gc.collect()
    return {
        "description": workload.description,
        "inputs": workload.input_note,
        "rows": rows,
        "steps_per_epoch": steps,
        "data_generation_s": data_s,
        "variants": results,
    }


def _release_loops() -> None:
    """Collects the workload's datasets (their compiled loops hold models and
    resident data in reference cycles)."""
    gc.collect()


# -- report --------------------------------------------------------------------


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:{spec}}{suffix}"


def _settings_text(settings: dict[str, Any]) -> str:
    return f"spe={settings.get('steps_per_execution')}, jit={settings.get('jit_compile')}"


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables, ready to paste into the README.

    Args:
        report: What `run` builds (also the JSON).

    Returns:
        Markdown text: conditions, then one table per workload.

    Example:
        >>> print(to_markdown(json.loads(Path("bench-results/bench.json").read_text())))
    """
    m, c = report["machine"], report["conditions"]
    lines = [
        f"## shardfeed bench ({m['date_utc'][:10]})",
        "",
        f"Machine: {m['cpu']}, {m['cpus_usable']} of {m['cpu_count']} cores usable, "
        f"{m['ram_gib']} GiB RAM, load average {m['load_average_1_5_15_min_at_start']} at "
        f"start; {m['os']}; Python {m['python']}, TensorFlow {m['tensorflow']}, "
        f"Keras {m['keras']}, NumPy {m['numpy']}.",
        f"Batch {c['batch_size']}, {c['optimizer']}; {c['statistic']}; {c['schedule']}; "
        f"rows scale {c['rows_scale']}.",
    ]
    if c["timed_epochs"] < 3 or c["rows_scale"] < 1:
        lines.append(
            "**Smoke check (fewer than 3 timed epochs or scaled-down rows): not a result.**"
        )
    lines += ["", "Variants:"]
    lines += [f"- **{VARIANTS[name]}**: {note}" for name, note in c["variants"].items()]
    for name, w in report["workloads"].items():
        lines += [
            "",
            f"### {name}: {w['description']}",
            "",
            f"{w['rows']:,} rows, {w['steps_per_epoch']} steps/epoch. Inputs: {w['inputs']}",
            "",
            "| variant | settings | s/epoch | ms/step | x floor | speed-up vs fit(numpy) "
            "| final loss | setup s | warm-up s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in w["variants"].values():
            lines.append(
                f"| {r['label']} | {_settings_text(r['settings'])} "
                f"| {_fmt(r['median_epoch_s'], '.3f')} | {_fmt(r['ms_per_step'], '.3f')} "
                f"| {_fmt(r['ratio_to_floor'], '.2f', 'x')} "
                f"| {_fmt(r['speedup_vs_numpy'], '.2f', 'x')} | {_fmt(r['final_loss'], '.4f')} "
                f"| {_fmt(r['setup_s'], '.2f')} | {_fmt(r['warmup_s'], '.2f')} |"
            )
        tuned = w["variants"].get("tuned")
        if tuned:
            probe = tuned["probe"]
            configs = "; ".join(_config_text(p) for p in probe["configs"])
            lines += [
                "",
                f"Tuning probe ({PROBE_EPOCHS} epochs of {probe['steps_per_epoch']} steps, "
                f"fastest after the first, {tuned['probe_s']:.1f} s): {configs}. "
                f"{probe['note']}.",
            ]
    return "\n".join(lines) + "\n"


def write_chart(report: dict[str, Any], path: Path) -> None:
    """A grouped bar chart of ratio to the floor per workload and variant.

    Uses Matplotlib's Agg canvas directly (no `pyplot`, no global backend).

    Args:
        report: What `run` builds.
        path: The PNG to write.

    Returns:
        None; writes `path`.

    Example:
        >>> write_chart(report, Path("bench-results/bench.png"))
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    workloads = list(report["workloads"])
    names = [n for n in VARIANTS if any(n in w["variants"] for w in report["workloads"].values())]
    fig = Figure(figsize=(max(6.0, 2.2 * len(workloads) + 2), 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ratios = [
            (report["workloads"][w]["variants"].get(name) or {}).get("ratio_to_floor")
            for w in workloads
        ]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(workloads))]
        bars = ax.bar(xs, [r or 0.0 for r in ratios], width, label=VARIANTS[name])
        ax.bar_label(bars, labels=[_fmt(r, ".2f", "x") for r in ratios], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("seconds/epoch, ratio to the floor (lower is better)")
    c, m = report["conditions"], report["machine"]
    ax.set_title(
        f"{m['cpu']} ({m['cpus_usable']} cores), TF {m['tensorflow']}, "
        f"median of {c['timed_epochs']} epoch(s), rows scale {c['rows_scale']}",
        fontsize=8,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":  # pragma: no cover
    _parser = argparse.ArgumentParser(prog="shardfeed bench")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
