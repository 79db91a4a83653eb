"""`shardfeed demo`: the main job on built-in data, then the same with model.fit.

The bench's W2 workload (300,000 x 32 float32, MLP 64-64-1, batch 256: the
regime where per-step input overhead sets the speed), trained with
`shardfeed.fit` and then an identical copy with `model.fit` on the NumPy
arrays; prints time per epoch and final loss of each.
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
    import keras

    import shardfeed
    from shardfeed._commands.bench.timing import epoch_timer
    from shardfeed._commands.bench.workloads import WORKLOADS, make_data

    x, y = make_data(WORKLOADS["W2"], args.rows, args.seed)
    print(
        f"shardfeed demo: {args.rows:,} rows x 32 float32, MLP 64-64-1, batch "
        f"{args.batch_size}, {args.epochs} epochs, Keras {keras.__version__}\n"
    )
    model = _model(args.seed)
    dataset = shardfeed.ShardedResidentDataset(
        x, y, per_replica_batch_size=args.batch_size, seed=args.seed
    )
    print(dataset.describe(), "\n")
    print("== shardfeed.fit ==")
    ours = epoch_timer()
    history = shardfeed.fit(model, dataset, epochs=args.epochs, callbacks=[ours])
    print(
        f"(steps per compiled call: {history.params['steps_per_execution']}, "
        f"XLA: {history.params['jit_compile']})\n"
    )

    print("== model.fit (NumPy arrays) ==")
    reference = _model(args.seed)
    theirs = epoch_timer()
    ref_history = reference.fit(
        x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=[theirs]
    )

    def row(name, times, hist):
        # The first epoch includes tracing/compilation; later epochs are steady.
        steady = min(times[1:]) if len(times) > 1 else times[0]
        return f"| {name} | {times[0]:.2f} | {steady:.2f} | {hist.history['loss'][-1]:.4f} |"

    print("\n| run | first epoch (s, incl. compile) | later epoch (s) | final loss |")
    print("|---|---|---|---|")
    print(row("shardfeed.fit", ours.seconds, history))
    print(row("model.fit", theirs.seconds, ref_history))
    if len(ours.seconds) > 1 and len(theirs.seconds) > 1:
        speedup = min(theirs.seconds[1:]) / min(ours.seconds[1:])
        print(f"\nshardfeed.fit: {speedup:.1f}x faster per epoch")
    return 0
