"""The schedule: one workload's variants set up, warmed up, then timed in rotated rounds.

Round-robin, one epoch per variant per round in a rotated order, so drift in
machine load spreads over all of them; then each variant's median, ms/step and
ratios. A variant whose backend does not import is reported skipped, with why.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from shardfeed._commands.bench.variants import (
    BACKEND_FLOORS,
    OTHER_BACKENDS,
    VARIANT_TYPES,
    VARIANTS,
    Variant,
)
from shardfeed._commands.bench.workloads import Workload, build_model, make_data


def run_workload(
    workload: Workload,
    args: argparse.Namespace,
    types: Mapping[str, Callable[..., Variant]] = VARIANT_TYPES,
    baseline: str = "numpy",
) -> dict[str, Any]:
    """Times `args.variants` on one workload.

    Args:
        workload: Which workload.
        args: The `bench` flags (`variants`, `epochs`, `rows_scale`, `seed`, ...).
        types: What each variant name builds (on Keras' JAX backend:
            `jax_variants.JAX_VARIANT_TYPES`).
        baseline: The variant the speed-up column divides: Keras' `model.fit`
            on NumPy with its defaults (`numpy`; `jax` on the JAX backend).

    Returns:
        The workload's report: description, inputs, rows, batch size, steps per epoch, data
        generation seconds and, per variant, its settings, epoch seconds and the
        numbers derived from them, or `label` and `skipped` (why).

    Example:
        >>> run_workload(WORKLOADS["W2"], args)["variants"]["floor"]["ratio_to_floor"]
        1.0
    """
    rows = max(workload.min_rows, round(workload.rows * args.rows_scale))
    steps = math.ceil(rows / workload.batch_size)
    print(
        f"{workload.name}: {rows:,} rows, batch {workload.batch_size}, {steps} steps/epoch; "
        f"{workload.description}"
    )
    start = time.perf_counter()
    data = make_data(workload, rows, args.seed)
    data_s = time.perf_counter() - start
    reference = build_model(workload, False, args.seed)
    every = [types[name](workload, data, reference, args) for name in args.variants]
    try:
        results = _run_variants(workload, every, steps, args.epochs, baseline)
    finally:
        for v in every:
            v.close()  # the worker processes of variants on another backend
    del every
    gc.collect()
    return {
        "description": workload.description,
        "inputs": workload.input_note,
        "rows": rows,
        "batch_size": workload.batch_size,
        "steps_per_epoch": steps,
        "data_generation_s": data_s,
        "variants": results,
    }


def _run_variants(
    workload: Workload, every: list[Variant], steps: int, epochs: int, baseline: str
) -> dict[str, dict[str, Any]]:
    """Sets up, warms up and times `every` variant; the per-variant results."""
    setup_s, warmup_s, warmup_loss = {}, {}, {}
    for v in every:
        start = time.perf_counter()
        v.setup()
        setup_s[v.name] = time.perf_counter() - start
        if v.skipped:
            print(f"  {workload.name} {VARIANTS[v.name]}: skipped ({v.skipped})", flush=True)
    variants = [v for v in every if not v.skipped]
    for v in variants:  # warm-up: one whole first call each, compilation included
        start = time.perf_counter()
        _, warmup_loss[v.name] = v.epoch(0)
        warmup_s[v.name] = time.perf_counter() - start
        print(f"  {workload.name} warm-up {VARIANTS[v.name]}: {warmup_s[v.name]:.2f} s", flush=True)
    seconds: dict[str, list[float]] = {v.name: [] for v in variants}
    losses: dict[str, float | None] = dict(warmup_loss)
    for epoch in range(1, epochs + 1) if variants else ():  # none when all are skipped
        shift = (epoch - 1) % len(variants)
        for v in variants[shift:] + variants[:shift]:
            secs, losses[v.name] = v.epoch(epoch)
            seconds[v.name].append(secs)
        line = ", ".join(f"{v.name} {seconds[v.name][-1]:.3f} s" for v in variants)
        print(f"  {workload.name} epoch {epoch}/{epochs}: {line}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    floor = statistics.median(seconds["floor"]) if "floor" in seconds else None
    numpy_s = statistics.median(seconds[baseline]) if baseline in seconds else None
    for v in every:
        if v.skipped:
            results[v.name] = {"label": VARIANTS[v.name], "skipped": v.skipped}
            continue
        median = statistics.median(seconds[v.name])
        results[v.name] = {
            "label": VARIANTS[v.name],
            "settings": v.settings,
            "epoch_s": seconds[v.name],
            "median_epoch_s": median,
            "ms_per_step": 1000 * median / steps,
            "ratio_to_floor": median / floor if floor else None,
            "speedup_vs_numpy": numpy_s / median if numpy_s else None,
            "first_epoch_loss": warmup_loss[v.name],
            "final_loss": losses[v.name],
            "setup_s": setup_s[v.name],
            "warmup_s": warmup_s[v.name],
            **v.extra,
        }
        backend_floor = BACKEND_FLOORS.get(OTHER_BACKENDS.get(v.name, ""), "")
        if backend_floor in seconds:  # a variant on another backend, and that backend's floor
            results[v.name]["ratio_to_backend_floor"] = median / statistics.median(
                seconds[backend_floor]
            )
    return results


def release_loops() -> None:
    """Collects the workload's datasets (their compiled loops hold models and
    resident data in reference cycles)."""
    gc.collect()
