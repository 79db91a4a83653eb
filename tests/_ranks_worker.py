"""One worker of the rank-agreement tests (not a test module).

`data MODE CALL`: builds this rank's arrays (`same`: identical on every rank;
`rows`: 1,000 rows on rank 0 and 1,037 others on rank 1; `permuted`: the same
1,000 rows in a per-rank order) and calls `fit`, `evaluate` or `predict`.
`save WHAT PATH`: `save_model` to PATH, or `fit` with a `BackupAndRestore`
writing to PATH. `memory SHUFFLE STREAMING`: rank 1 alone has little device
memory (`device_memory_bytes`, which may differ per host); builds the
dataset with that `shuffle` and `LoadOptions.streaming` and fits one epoch.
`fitargs all fit`: the `FIT_CASES`, one `fit` each with one
argument other on rank 1 (`fit_setting_outcomes`, which the JAX tier's
two-process test runs too), outcomes joined by newlines. Each case is one
`--case TASK MODE ARG`; a job may run several, in order, each on a model and
arrays of its own (the ranks refuse together, so they stay in step for the
next). Each rank records what each case raised (or "ok"), a JSON list in
`OUT.rankN.json`, so the test sees every rank's error, not only the first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def _arrays(mode: str, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rows = 1037 if mode == "rows" and rank == 1 else 1000
    rng = np.random.default_rng(1 if mode == "rows" and rank == 1 else 0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True).astype("float32")
    if mode == "permuted":  # an unseeded shuffle before building the dataset
        order = np.random.default_rng(100 + rank).permutation(rows)
        x, y = x[order], y[order]
    return x, y


# One fit argument other on rank 1 per case; "same" last: after refusing
# together the ranks are still in step.
# Then what `compile` set: another loss, a loss function of the same name with other
# code, `run_eagerly` on rank 1 only (before: trained wrong without a word, or failed
# later in a collective).
FIT_CASES = [
    "epochs", "steps_per_epoch", "validation_data", "steps_per_execution",
    "loss", "loss_function", "run_eagerly", "same",
]  # fmt: skip
# Then one `evaluate` each: other steps per call, arrays on rank 1 only, the same;
# then one `predict` each (before it compared nothing: the ranks ran other calls).
EVALUATE_CASES = ["steps_per_execution", "arrays", "same"]
PREDICT_CASES = ["steps_per_execution", "arrays", "same"]


_CALL_REFUSAL = (
    "ValueError: Every worker must call `fit` with the same arguments: they decide how "
    "many steps and collectives each rank runs. Received: ranks disagree on fit's "
)
# What each of `FIT_CASES`, then `EVALUATE_CASES` and `PREDICT_CASES`, raises on
# every rank (before: a rank with other epochs or validation data hung in a
# collective the other never joined).
FIT_CASE_REFUSALS = [
    _CALL_REFUSAL + "`epochs`: rank 0 has 1, rank 1 has 2. Pass the same arguments",
    _CALL_REFUSAL + "`steps_per_epoch`: rank 0 has None, rank 1 has 3. Pass the same",
    _CALL_REFUSAL + '`validation_data`: rank 0 has None, rank 1 has [{"rows": 100}, '
    '{"rows": 100}]. Pass the same',
    _CALL_REFUSAL + "`options.steps_per_execution`: rank 0 has 'auto', rank 1 has 2. Pass",
    _CALL_REFUSAL + "`compile's loss`: rank 0 has 'mse', rank 1 has 'mae'. Pass the same",
    _CALL_REFUSAL + "`compile's loss function`: rank 0 has '_compiled_for.<locals>.squared #",
    _CALL_REFUSAL + "`compile's run_eagerly`: rank 0 has False, rank 1 has True. Pass the",
    "ok",
    _CALL_REFUSAL.replace("`fit`", "`evaluate`").replace("fit's", "evaluate's")
    + "`options.steps_per_execution`: rank 0 has 'auto', rank 1 has 2. Pass",
    _CALL_REFUSAL.replace("`fit`", "`evaluate`").replace("fit's", "evaluate's")
    + "`data`: rank 0 has 'ShardedResidentDataset', rank 1 has 'arrays'. Pass",
    "ok",
    _CALL_REFUSAL.replace("`fit`", "`predict`").replace("fit's", "predict's")
    + "`options.steps_per_execution`: rank 0 has 'auto', rank 1 has 2. Pass",
    _CALL_REFUSAL.replace("`fit`", "`predict`").replace("fit's", "predict's")
    + "`data`: rank 0 has 'ShardedResidentDataset', rank 1 has 'arrays'. Pass",
    "ok",
]


def assert_fit_case_outcomes(outcomes: list[str]) -> None:
    """Both ranks refused each case with the same words, then trained."""
    for outcome in outcomes:
        lines = outcome.split("\n")
        assert len(lines) == len(FIT_CASE_REFUSALS), outcome
        for line, expected in zip(lines, FIT_CASE_REFUSALS, strict=True):
            assert line.startswith(expected), line
    assert outcomes[0] == outcomes[1]


def _compiled_for(model, case: str, rank: int) -> None:
    """Compiles `model` as `case` wants on this rank ("loss", "loss_function",
    "run_eagerly": other on rank 1; anything else: the same everywhere)."""
    import keras

    factor = 2.0 if rank == 1 and case == "loss_function" else 1.0

    def squared(y_true, y_pred):  # the same name on every rank, other code on rank 1
        return factor * keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)

    loss = {"loss": "mae" if rank == 1 else "mse", "loss_function": squared}.get(case, "mse")
    model.compile(optimizer="sgd", loss=loss, run_eagerly=rank == 1 and case == "run_eagerly")


def fit_setting_outcomes(shardfeed, model, dataset, x, y, rank: int, scope) -> list[str]:
    """What `fit` raised (or "ok") for each of `FIT_CASES`, then `evaluate`
    for each of `EVALUATE_CASES` and `predict` for each of `PREDICT_CASES`,
    on this rank (`scope`: the world's, where the model is compiled)."""
    outcomes = []
    for case in FIT_CASES:
        kwargs = {}
        with scope():
            _compiled_for(model, case, rank)
        if rank == 1 and case == "epochs":
            kwargs["epochs"] = 2
        elif rank == 1 and case == "steps_per_epoch":
            kwargs["steps_per_epoch"] = 3
        elif rank == 1 and case == "validation_data":
            kwargs["validation_data"] = (x[:100], y[:100])
        elif rank == 1 and case == "steps_per_execution":
            kwargs["options"] = shardfeed.FitOptions(steps_per_execution=2)
        try:
            shardfeed.fit(model, dataset, verbose=0, **{"epochs": 1, **kwargs})
            outcomes.append("ok")
        except Exception as err:  # recorded for the test, whatever it is
            outcomes.append(f"{type(err).__name__}: {err}")
    for case in EVALUATE_CASES:
        args, kwargs = (dataset,), {}
        if rank == 1 and case == "steps_per_execution":
            kwargs["options"] = shardfeed.FitOptions(steps_per_execution=2)
        elif rank == 1 and case == "arrays":
            args = (x, y)
        try:
            shardfeed.evaluate(model, *args, **kwargs)
            outcomes.append("ok")
        except Exception as err:  # recorded for the test, whatever it is
            outcomes.append(f"{type(err).__name__}: {err}")
    for case in PREDICT_CASES:
        args, kwargs = (dataset,), {}
        if rank == 1 and case == "steps_per_execution":
            kwargs["options"] = shardfeed.FitOptions(steps_per_execution=2)
        elif rank == 1 and case == "arrays":
            args = (x,)
        try:
            shardfeed.predict(model, *args, **kwargs)
            outcomes.append("ok")
        except Exception as err:  # recorded for the test, whatever it is
            outcomes.append(f"{type(err).__name__}: {err}")
    return outcomes


def case_outcome(keras, shardfeed, world, task: str, mode: str, arg: str) -> str:
    """What one case raised on this rank (or "ok"); a model of its own."""
    with world.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x, y = _arrays(mode if mode in ("rows", "permuted") else "same", world.rank)
    try:
        if task == "fitargs":
            ds = shardfeed.ShardedResidentDataset(
                x, y, per_replica_batch_size=50, seed=0, strategy=world.strategy
            )
            outcomes = fit_setting_outcomes(shardfeed, model, ds, x, y, world.rank, world.scope)
            return "\n".join(outcomes)
        if task == "data":
            if arg == "fit":
                # "seed": another seed on rank 1, replicated (each rank draws its own
                # share of the order: some rows trained twice, some never).
                # "transform": rank 1 forgets to scale (trained wrong, rc 0).
                other = mode in ("seed", "transform") and world.rank == 1
                scale = (lambda x: x) if other else (lambda x: x / 255.0)
                ds = shardfeed.ShardedResidentDataset(
                    x, y, per_replica_batch_size=50,
                    seed=1 if other and mode == "seed" else 0,
                    placement="replicate" if mode == "seed" else "shard",
                    transform=scale if mode == "transform" else None,
                    strategy=world.strategy,
                )
                shardfeed.fit(model, ds, epochs=1, verbose=0)
            elif arg == "evaluate":
                shardfeed.evaluate(model, x, y, verbose=0)
            else:
                shardfeed.predict(model, x)
        elif task == "memory":
            # 1,000 rows of 20 bytes over 2 replicas: 10,000 bytes a shard;
            # rank 1 may use 8,000 (4,000 a ring slot: 4 steps of 50 rows).
            options = shardfeed.LoadOptions(device_memory_bytes=10_000 if world.rank == 1 else None,
                                  streaming={"auto": "auto", "off": False}[arg])
            ds = shardfeed.ShardedResidentDataset(
                x, y, per_replica_batch_size=50, seed=0, strategy=world.strategy,
                shuffle={"global": True, "local": "local"}[mode], load_options=options,
            )
            shardfeed.fit(model, ds, epochs=1, verbose=0)
            return f"ok: {ds.stream}"
        elif mode == "save_model":
            shardfeed.save_model(model, arg)
        else:
            ds = shardfeed.ShardedResidentDataset(
                x, y, per_replica_batch_size=50, seed=0, strategy=world.strategy
            )
            backup = keras.callbacks.BackupAndRestore(arg)
            shardfeed.fit(model, ds, epochs=1, verbose=0, callbacks=[backup])
        return "ok"
    except Exception as err:  # recorded for the test, whatever it is
        return f"{type(err).__name__}: {err}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--case", nargs=3, action="append", required=True, metavar=("TASK", "MODE", "ARG")
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()
    for task, _, _ in args.case:
        if task not in ("data", "save", "fitargs", "memory"):
            p.error(f"unknown task {task!r}")

    import keras

    import shardfeed
    world = shardfeed.init()
    outcomes = [case_outcome(keras, shardfeed, world, *case) for case in args.case]
    with open(f"{args.out}.rank{world.rank}.json", "w") as f:
        json.dump(outcomes, f)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
