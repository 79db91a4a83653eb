"""The tuning probe: the fastest `model.fit` steps_per_execution x jit_compile here.

What the `tuned` and `jax-tuned` variants run before they are timed: the
settings tried, on how many steps, under what budget, and the note naming the
winner (and flagging a catastrophically slow XLA).
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from typing import Any

import numpy as np

from shardfeed._commands.bench.timing import epoch_timer
from shardfeed._commands.bench.workloads import (
    Workload,
    augments,
    new_model,
    tf_data,
)

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


def probe_keras_settings(
    workload: Workload,
    x: np.ndarray,
    y: np.ndarray,
    reference: Any,
    args: argparse.Namespace,
    on_numpy: bool = False,
) -> dict[str, Any]:
    """Times `model.fit` for each steps_per_execution x jit_compile.

    Each configuration gets a fresh model and runs `PROBE_EPOCHS` epochs over
    the first min(steps per epoch, 256) batches of rows, on the `tfdata`
    pipeline or (`on_numpy`) on the NumPy arrays with `shuffle=True`: the
    first epoch compiles, the fastest later one counts. A configuration whose
    run passes `args.probe_budget_s` is stopped and left out.

    Args:
        workload: Which workload.
        x: Inputs.
        y: Targets.
        reference: Model whose weights every probe starts from.
        args: Flags (`seed`, `probe_budget_s`).
        on_numpy: Probe `model.fit(x, y, batch_size=batch, shuffle=True)` (the
            `jax-tuned` variant; no TensorFlow needed) instead of tf.data.

    Returns:
        `{"steps_per_epoch": ..., "configs": [...], "note": ...}`; each config
        has `steps_per_execution`, `jit_compile`, `ms_per_step` (None when
        stopped), `warmup_s` and `stopped_after_s`.

    Raises:
        RuntimeError: Every configuration passed the budget.

    Example:
        >>> probe_keras_settings(WORKLOADS["W2"], x, y, ref, args)["configs"][0]["ms_per_step"]
        0.41
    """
    import keras

    backend = keras.backend.backend()  # tensorflow for `tuned`, jax for `jax-tuned`
    batch = workload.batch_size
    steps = min(math.ceil(len(x) / batch), PROBE_MAX_STEPS)
    x, y = x[: steps * batch], y[: steps * batch]
    data = None if on_numpy else tf_data(x, y, workload)
    configs = []
    refused_jit = False
    for spe in PROBE_SPE:
        for jit in PROBE_JIT:
            model = new_model(
                workload,
                reference,
                True,
                args.seed,
                keras_augment=on_numpy and augments(workload),  # as the variant
                steps_per_execution=spe,
                jit_compile=jit,
            )
            if jit and not model.jit_compile:
                # Keras fell back to jit_compile=False (a layer has supports_jit=False,
                # e.g. RandomTranslation in W4's Keras variants): that probe already runs.
                refused_jit = True
                continue
            timer = epoch_timer(budget_s=args.probe_budget_s)
            start = time.perf_counter()
            common = {"epochs": PROBE_EPOCHS, "verbose": 0, "callbacks": [timer]}
            if data is None:
                model.fit(x, y, batch_size=batch, shuffle=True, **common)
            else:
                model.fit(data, shuffle=False, **common)  # the pipeline shuffles
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
            print(f"  {workload.name} probe ({backend}) {config_text(configs[-1])}", flush=True)
            del model
            gc.collect()
    note = _probe_note(configs)
    if refused_jit:
        note += "; jit_compile=True not probed: Keras refuses it for this model"
    return {"steps_per_epoch": steps, "configs": configs, "note": note}


def config_text(config: dict[str, Any]) -> str:
    """One probe configuration and its result, for logs and the report."""
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
    note = f"Winner: {config_text(best)}"
    stopped = [c for c in configs if c["ms_per_step"] is None]
    if stopped:
        note += "; stopped at the budget: " + "; ".join(config_text(c) for c in stopped)
    by_jit = {
        jit: min((c["ms_per_step"] for c in done if c["jit_compile"] is jit), default=None)
        for jit in PROBE_JIT
    }
    with_jit, without_jit = by_jit[True], by_jit[False]
    if with_jit is not None and without_jit is not None:
        factor = with_jit / without_jit
        if factor > CATASTROPHIC_FACTOR:
            note += (
                f"; jit_compile=True is catastrophically slow here ({factor:.1f}x the best "
                "jit_compile=False probe): skipped"
            )
    elif by_jit[True] is None and any(c["jit_compile"] for c in stopped):
        note += "; jit_compile=True is catastrophically slow here (stopped at the budget): skipped"
    return note
