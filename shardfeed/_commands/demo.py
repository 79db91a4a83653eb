"""`shardfeed demo`: Keras' own `model.fit` on a resident dataset, then on the NumPy arrays.

The bench's W2 workload (300,000 x 32 float32, MLP 64-64-1, batch 256: the
regime where per-step input overhead sets the speed), trained with
`model.fit(ShardedResidentDataset(...))` and then an identical copy with
`model.fit(x, y)`; prints the whole fit (upload and compile included), the
first and a later epoch, and the final loss of each.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=300_000, help="rows (default 300,000)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (default 2)")
    parser.add_argument("--batch-size", type=int, default=256, help="per-replica batch")
    parser.add_argument("--seed", type=int, default=0)


def _model(seed: int) -> Any:
    """The W2 model, compiled (Adam, MSE, plus MAE to watch), with global seeds set.

    The global seed makes `model.fit`'s shuffling repeatable; the weights come
    from the workload's seeded initialisers.
    """
    import keras

    from shardfeed._commands.bench.workloads import WORKLOADS, build_model, compile_model

    keras.utils.set_random_seed(seed)
    w2 = WORKLOADS["W2"]
    return compile_model(build_model(w2, True, seed), w2, metrics=["mae"])


def quiet_tensorflow_logs() -> None:
    """Keeps TensorFlow's start-up lines out of the demo's output.

    Only takes effect before TensorFlow is imported, and only where the user
    set nothing. `TF_CPP_MIN_LOG_LEVEL=2` hides the C++ INFO and WARNING lines
    (CPU features, XLA start-up). The "oneDNN custom operations are on" line
    (and absl's "All log messages before absl::InitializeLog()" header that
    precedes it) ignores that level in TensorFlow 2.21 and is only silent
    with `TF_ENABLE_ONEDNN_OPTS=0`; the demo's small MLP ran at the same
    speed without oneDNN here, and both of its runs use the same setting.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def run(args: argparse.Namespace) -> int:
    quiet_tensorflow_logs()
    import time

    import keras

    import shardfeed
    from shardfeed._commands.bench.timing import epoch_timer
    from shardfeed._commands.bench.workloads import WORKLOADS, make_data

    x, y = make_data(WORKLOADS["W2"], args.rows, args.seed)
    print(
        f"shardfeed demo: {args.rows:,} rows x 32 float32, MLP 64-64-1, batch "
        f"{args.batch_size}, {args.epochs} epochs, Keras {keras.__version__} on "
        f"{keras.backend.backend()}\n"
    )
    model = _model(args.seed)
    print("== model.fit on a ShardedResidentDataset (shardfeed) ==")
    ours = epoch_timer()
    start = time.perf_counter()
    dataset = shardfeed.ShardedResidentDataset(
        x, y, per_replica_batch_size=args.batch_size, seed=args.seed
    )
    history = model.fit(dataset, epochs=args.epochs, callbacks=[ours])
    ours_whole = time.perf_counter() - start
    print(dataset.describe())
    print(
        f"(steps per compiled call: {history.params['steps_per_execution']}, "
        f"XLA: {history.params['jit_compile']})\n"
    )

    print("== model.fit on the NumPy arrays (Keras' own input path) ==")
    reference = _model(args.seed)
    theirs = epoch_timer()
    start = time.perf_counter()
    ref_history = reference.fit(
        x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=[theirs]
    )
    theirs_whole = time.perf_counter() - start

    def row(name: str, whole: float, times: list[float], hist: Any) -> str:
        # The first epoch includes tracing/compilation; later epochs are steady.
        steady = min(times[1:]) if len(times) > 1 else times[0]
        return (
            f"| {name} | {whole:.2f} | {times[0]:.2f} | {steady:.2f} | "
            f"{hist.history['loss'][-1]:.4f} |"
        )

    print(
        "\n| run | whole fit (s: upload, compile, epochs) | first epoch (s, incl. compile) "
        "| later epoch (s) | final loss |"
    )
    print("|---|---|---|---|---|")
    print(row("model.fit(ShardedResidentDataset)", ours_whole, ours.seconds, history))
    print(row("model.fit(x, y)", theirs_whole, theirs.seconds, ref_history))
    print(f"\nWhole fit: {_faster(theirs_whole, ours_whole)}, compile and upload included.")
    if len(ours.seconds) > 1 and len(theirs.seconds) > 1:
        steady = _faster(min(theirs.seconds[1:]), min(ours.seconds[1:]))
        print(f"Later epochs: {steady} per epoch.")
    return 0


def _faster(theirs: float, ours: float) -> str:
    """`Nx faster` or `Nx slower` (never a speed-up below 1 read as one)."""
    if ours <= theirs:
        return f"{theirs / max(ours, 1e-9):.1f}x faster"
    return f"{ours / max(theirs, 1e-9):.1f}x slower"
