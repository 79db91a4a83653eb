"""`shardfeed bench --search`: a KerasTuner hyperparameter search, in trials per minute.

KerasTuner's `RandomSearch` over one of `SEARCH_MODELS` (`--search-model`:
W2's MLP, keras-io's text Transformer or its time-series Conv1D network; units
and learning rate searched), `--search-trials` trials of `--search-epochs`
epochs, timed whole:
building, compiling, uploading, training and validating every trial. Each
variant runs in a fresh process (cold caches, as a user's search starts):
Keras' `fit` from NumPy, from `tf.data`, tuned (`steps_per_execution=128`,
XLA), and shardfeed through Keras' own `model.fit`, on a resident dataset
and on arrays in resident mode (each upload counted once, inside the time);
the TensorFlow variants in this Python, the JAX ones in `--jax-python`.

Run a variant alone as `python -m shardfeed._commands.bench.search VARIANT
ROWS TRIALS EPOCHS SEED MODEL`: one JSON line out.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from shardfeed._commands.bench.workloads import WORKLOADS

# variant -> (Keras backend, what it is)
SEARCH_VARIANTS: dict[str, tuple[str, str]] = {
    "numpy": ("tensorflow", "Keras `fit` from NumPy (`batch_size=256`)"),
    "tfdata": ("tensorflow", "Keras `fit` from `tf.data` (cache, shuffle, batch, prefetch)"),
    "tuned": ("tensorflow", "`tfdata`, compiled with `steps_per_execution=128, jit_compile=True`"),
    "resident": ("tensorflow", "Keras `fit` on a `ShardedResidentDataset` (resident mode on)"),
    "resident-mode": ("tensorflow", "Keras `fit` from NumPy in `shardfeed.resident_arrays()`"),
    "jax": ("jax", "Keras on JAX, `fit` from NumPy"),
    "jax-tuned": ("jax", "`jax`, compiled with `steps_per_execution=128, jit_compile=True`"),
    "jax-resident": ("jax", "Keras on JAX, `fit` on a `ShardedResidentDataset`"),
    "jax-resident-mode": ("jax", "Keras on JAX, `fit` from NumPy in resident mode"),
}
BATCH_SIZE = 256
WORKER_TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True)
class SearchModel:
    """A model the search tunes (`--search-model`).

    Attributes:
        rows: Training rows at `--rows-scale 1`.
        description: What it is, for the table's head.
    """

    rows: int
    description: str


# The shapes of the short fits users run on these: keras-io's examples, at a
# size this project's 2-core CPU trains in seconds per epoch.
SEARCH_MODELS: dict[str, SearchModel] = {
    "mlp": SearchModel(WORKLOADS["W2"].rows, "W2's model (MLP, 32 features, MSE)"),
    "transformer": SearchModel(
        50_000,
        "keras-io's text-classification Transformer (token and position embeddings of "
        "width 32, one block of 2-head attention, sequences of 64 tokens from 5,000, "
        "2 classes)",
    ),
    "conv1d": SearchModel(
        20_000,
        "keras-io's time-series classification CNN (three Conv1D-BatchNorm-ReLU, global "
        "average pooling, sequences of 128 x 1, 2 classes)",
    ),
}
SEQUENCE_LENGTH, VOCABULARY, EMBEDDING_WIDTH = 64, 5_000, 32  # the Transformer's
WAVE_STEPS = 128  # the Conv1D network's


def search_data(model: str, rows: int, seed: int) -> tuple[Any, Any]:
    """Deterministic, learnable data for `model`: W2's for the MLP; token
    sequences labelled by whether most tokens are in the vocabulary's lower
    half; noisy sine waves labelled by whether their frequency is high."""
    if model == "mlp":
        from shardfeed._commands.bench.workloads import make_data

        return make_data(WORKLOADS["W2"], rows, seed)
    rng = np.random.default_rng(seed)
    if model == "transformer":
        low = rng.uniform(0.3, 0.7, (rows, 1))
        lower = rng.random((rows, SEQUENCE_LENGTH)) < low
        half = VOCABULARY // 2
        tokens = np.where(lower, rng.integers(1, half, lower.shape),
                          rng.integers(half, VOCABULARY, lower.shape))
        return tokens.astype(np.int32), (lower.mean(1) > 0.5).astype(np.int32)
    frequency = rng.uniform(1.0, 8.0, (rows, 1))
    t = np.linspace(0.0, 1.0, WAVE_STEPS, dtype=np.float64)[None, :]
    waves = np.sin(2 * np.pi * frequency * t + rng.uniform(0, 2 * np.pi, (rows, 1)))
    waves += 0.3 * rng.standard_normal(waves.shape)
    return waves[..., None].astype(np.float32), (frequency[:, 0] > 4.5).astype(np.int32)


def _hypermodel(model: str, compile_kw: dict[str, Any]) -> Any:
    import keras
    from keras import layers

    def mlp(units: int) -> Any:
        return keras.Sequential(
            [
                keras.Input((32,)),
                layers.Dense(units, activation="relu"),
                layers.Dense(units, activation="relu"),
                layers.Dense(1),
            ]
        )

    def transformer(units: int) -> Any:
        tokens = keras.Input((SEQUENCE_LENGTH,), dtype="int32")
        positions = keras.ops.arange(SEQUENCE_LENGTH)
        h = layers.Embedding(VOCABULARY, EMBEDDING_WIDTH)(tokens)
        h = h + layers.Embedding(SEQUENCE_LENGTH, EMBEDDING_WIDTH)(positions)
        attention = layers.MultiHeadAttention(num_heads=2, key_dim=EMBEDDING_WIDTH)(h, h)
        h = layers.LayerNormalization(epsilon=1e-6)(h + layers.Dropout(0.1)(attention))
        ff = layers.Dense(EMBEDDING_WIDTH)(layers.Dense(units, activation="relu")(h))
        h = layers.LayerNormalization(epsilon=1e-6)(h + layers.Dropout(0.1)(ff))
        h = layers.Dropout(0.1)(layers.GlobalAveragePooling1D()(h))
        h = layers.Dropout(0.1)(layers.Dense(20, activation="relu")(h))
        return keras.Model(tokens, layers.Dense(2, activation="softmax")(h))

    def conv1d(units: int) -> Any:
        h = inputs = keras.Input((WAVE_STEPS, 1))
        for _ in range(3):
            h = layers.Conv1D(units, 3, padding="same")(h)
            h = layers.ReLU()(layers.BatchNormalization()(h))
        h = layers.GlobalAveragePooling1D()(h)
        return keras.Model(inputs, layers.Dense(2, activation="softmax")(h))

    def build(hp: Any) -> Any:
        if model == "mlp":
            net, loss = mlp(hp.Int("units", 32, 256, step=32)), "mse"
        else:
            net = (transformer if model == "transformer" else conv1d)(
                hp.Int("units", 32, 64, step=32)
            )
            loss = "sparse_categorical_crossentropy"
        rate = hp.Choice("learning_rate", [1e-3, 3e-3])
        net.compile(optimizer=keras.optimizers.Adam(rate), loss=loss, **compile_kw)
        return net

    return build


def run_variant(
    variant: str, rows: int, trials: int, epochs: int, seed: int, model: str = "mlp"
) -> dict[str, Any]:
    """One variant's search over `model` in this process (its backend already chosen)."""
    import keras
    import keras_tuner

    # One teacher for both: the validation rows follow the training rows.
    val_rows = max(BATCH_SIZE, rows // 10)
    x_all, y_all = search_data(model, rows + val_rows, seed)
    x, y, x_val, y_val = x_all[:rows], y_all[:rows], x_all[rows:], y_all[rows:]
    tuned = variant.endswith("tuned")
    compile_kw = {"steps_per_execution": 128, "jit_compile": True} if tuned else {}
    keras.utils.set_random_seed(seed)
    with tempfile.TemporaryDirectory() as folder:
        tuner = keras_tuner.RandomSearch(
            _hypermodel(model, compile_kw), objective="val_loss", max_trials=trials, seed=seed,
            overwrite=True, directory=folder, project_name="search",
        )
        start = time.perf_counter()
        if variant in ("resident", "jax-resident"):
            import shardfeed

            with shardfeed.resident_arrays():  # the validation arrays: uploaded once too
                train = shardfeed.ShardedResidentDataset(
                    x, y, per_replica_batch_size=BATCH_SIZE, seed=seed
                )
                tuner.search(train, epochs=epochs, validation_data=(x_val, y_val), verbose=0)
        elif variant.endswith("resident-mode"):
            import shardfeed

            with shardfeed.resident_arrays():
                tuner.search(x, y, batch_size=BATCH_SIZE, epochs=epochs,
                             validation_data=(x_val, y_val), verbose=0)
        elif variant in ("tfdata", "tuned"):
            from shardfeed._commands.bench.workloads import tf_data

            train = tf_data(x, y, WORKLOADS["W2"])
            val = tf_data(x_val, y_val, WORKLOADS["W2"])
            tuner.search(train, epochs=epochs, validation_data=val, verbose=0)
        else:
            tuner.search(x, y, batch_size=BATCH_SIZE, epochs=epochs,
                         validation_data=(x_val, y_val), verbose=0)
        seconds = time.perf_counter() - start
        best = tuner.oracle.get_best_trials(1)[0].score
    done = len(tuner.oracle.trials)
    return {
        "variant": variant,
        "model": model,
        "backend": keras.backend.backend(),
        "trials": done,
        "epochs": epochs,
        "rows": rows,
        "seconds": seconds,
        "trials_per_minute": 60.0 * done / seconds,
        "best_val_loss": float(best),
    }


def run_search(
    names: list[str], rows: int, trials: int, epochs: int, seed: int, jax_python: str,
    model: str = "mlp",
) -> list[dict[str, Any]]:
    """Each variant in a process of its own; a variant that cannot run (no
    KerasTuner, no JAX in `jax_python`) is reported skipped with the reason."""
    results = []
    for name in names:
        backend = SEARCH_VARIANTS[name][0]
        python = jax_python if backend == "jax" else sys.executable
        env = {**os.environ, "KERAS_BACKEND": backend}
        command = [python, "-m", "shardfeed._commands.bench.search", name, str(rows),
                   str(trials), str(epochs), str(seed), model]
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=WORKER_TIMEOUT_S, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            results.append({"variant": name, "model": model, "backend": backend,
                            "skipped": why})
        else:
            results.append(json.loads(lines[-1]))
        print(f"search {name}: {results[-1]}", file=sys.stderr, flush=True)
    return results


def to_markdown(results: list[dict[str, Any]]) -> str:
    """The table: trials per minute per variant, and against Keras' `fit`
    from NumPy on the same backend."""
    base = {
        r["backend"]: r["trials_per_minute"]
        for r in results
        if r["variant"] in ("numpy", "jax") and "skipped" not in r
    }
    first = next((r for r in results if "skipped" not in r), None)
    head = (
        f"### Hyperparameter search (KerasTuner RandomSearch, "
        f"{SEARCH_MODELS[first['model']].description}, {first['rows']:,} rows, "
        f"{first['trials']} trials x {first['epochs']} epochs, "
        "compile and upload included)\n\n"
        if first
        else "### Hyperparameter search\n\n"
    )
    lines = [
        head + "| variant | backend | seconds | trials per minute | x Keras fit(numpy) | "
        "best val_loss |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        what = SEARCH_VARIANTS[r["variant"]][1]
        if "skipped" in r:
            lines.append(f"| {r['variant']}: {what} | {r['backend']} | skipped: "
                         f"{r['skipped']} | | | |")
            continue
        ratio = r["trials_per_minute"] / base[r["backend"]] if r["backend"] in base else None
        lines.append(
            f"| {r['variant']}: {what} | {r['backend']} | {r['seconds']:.1f} | "
            f"{r['trials_per_minute']:.2f} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
            f"{r['best_val_loss']:.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    variant, rows, trials, epochs, seed, model = argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = run_variant(variant, int(rows), int(trials), int(epochs), int(seed), model)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
