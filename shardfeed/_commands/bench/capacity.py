"""`shardfeed bench --capacity`: the largest dataset that trains resident on one JAX device.

Grows a float32 dataset (W2's model) as shares of the device's memory, through
the public API only, until the dataset's memory check refuses it or the device
runs out. The rows are one row broadcast (no host copy); on a CPU,
`--capacity-limit-bytes` stands in for the missing `bytes_limit`.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np

from shardfeed._commands.bench.workloads import WORKLOADS, build_model, new_model
from shardfeed._common.errors import message

FEATURES = 32  # W2's rows: float32, 32 features, one float32 target
WORKLOAD = "W2"
# Shares of the device's memory the rows are tried at, in order, until one fails;
# then `REFINE` halvings of the gap between the last that trained and the first
# that failed.
SHARES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
REFINE = 2
# One short epoch per trial: enough calls to reach the steady state of the
# training loop's memory (the epoch's copy of the rows is made before step 0).
STEPS = 16
# What XLA's allocators say when a device runs out of memory.
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory")


def device_limit(limit_bytes: int | None) -> tuple[int, str]:
    """The bytes the shares are of, and where that number came from.

    Raises:
        ValueError: The device reports no `bytes_limit` and none was given.
    """
    import jax

    if limit_bytes is not None:
        return limit_bytes, "--capacity-limit-bytes"
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" not in stats:
        raise ValueError(
            message(
                "`--capacity` measures shares of the device's memory_stats()['bytes_limit'], "
                "which this device does not report.",
                f"device={device.platform}:{device.id}, memory_stats={stats or None}",
                "Pass `--capacity-limit-bytes N` (e.g. 67108864 on a CPU) to stand in for it.",
            )
        )
    return int(stats["bytes_limit"]), "memory_stats()['bytes_limit']"


def _is_oom(error: Exception) -> bool:
    text = str(error)
    return any(marker.lower() in text.lower() for marker in OOM_MARKERS)


def _trial(rows: int, model: Any, limit_given: int | None) -> dict[str, Any]:
    """Builds and trains one dataset of `rows` rows; what happened."""
    import jax

    import shardfeed

    x = np.broadcast_to(np.linspace(-1, 1, FEATURES, dtype=np.float32), (rows, FEATURES))
    y = np.broadcast_to(np.ones(1, np.float32), (rows, 1))
    # Resident only: under "auto" a dataset that does not fit streams (and trains).
    options = shardfeed.LoadOptions(device_memory_bytes=limit_given, streaming=False)
    batch = WORKLOADS[WORKLOAD].batch_size
    start = time.perf_counter()
    result: dict[str, Any] = {"rows": rows, "bytes": rows * (FEATURES + 1) * 4}
    try:
        dataset = shardfeed.ShardedResidentDataset(
            x, y, per_replica_batch_size=batch, seed=0, placement="replicate",
            load_options=options,
        )
    except MemoryError as error:
        seconds = time.perf_counter() - start
        return {**result, "result": "refused", "detail": str(error), "seconds": seconds}
    try:
        history = shardfeed.fit(model, dataset, epochs=1, steps_per_epoch=STEPS, verbose=0)
        result.update(result="trained", loss=float(history.history["loss"][-1]))
    except Exception as error:  # only an out-of-memory error is a result
        if not _is_oom(error):
            raise
        result.update(result="out of memory", detail=str(error).splitlines()[0][:300])
    finally:
        del dataset
        gc.collect()
    result["seconds"] = time.perf_counter() - start
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        result["peak_bytes_in_use"] = int(stats["peak_bytes_in_use"])
    return result


def run_capacity(limit_bytes: int | None, seed: int = 0) -> dict[str, Any]:
    """The capacity probe on this process's first JAX device (see the module docstring).

    Args:
        limit_bytes: Stands in for the device's `bytes_limit` (a CPU reports
            none); None reads it from `memory_stats()`.
        seed: The model's initialiser seed.

    Returns:
        `limit_bytes`, `limit_source`, `row_bytes`, `trials` (each: `share`,
        `rows`, `bytes`, `result` -- trained, refused or out of memory --,
        `seconds`, `detail`) and the largest that trained: `largest_rows`,
        `largest_bytes`, `largest_share` (None when none did).

    Raises:
        ValueError: No limit given and the device reports none.

    Example:
        >>> run_capacity(64 * 2**20)["largest_share"]
        0.3
    """
    import jax

    limit, source = device_limit(limit_bytes)
    row_bytes = (FEATURES + 1) * 4
    workload = WORKLOADS[WORKLOAD]
    model = new_model(workload, build_model(workload, False, seed), False, seed)
    trials: list[dict[str, Any]] = []

    def attempt(share: float) -> bool:
        rows = max(2 * workload.batch_size, int(share * limit) // row_bytes)
        trial = {"share": share, **_trial(rows, model, limit_bytes)}
        trials.append(trial)
        print(f"  capacity {share:.3f} of {limit:,} bytes: {rows:,} rows, {trial['result']}",
              flush=True)
        return bool(trial["result"] == "trained")

    good, bad = 0.0, None
    for share in SHARES:
        if not attempt(share):
            bad = share
            break
        good = share
    if bad is not None and good:
        for _ in range(REFINE):
            middle = round((good + bad) / 2, 4)
            if attempt(middle):
                good = middle
            else:
                bad = middle
    trained = [t for t in trials if t["result"] == "trained"]
    best = max(trained, key=lambda t: t["rows"]) if trained else None
    device = jax.devices()[0]
    return {
        "device": f"{device.platform}:{device.id} {device.device_kind}",
        # Replicate puts every row on every device: one device is the case measured.
        "devices": len(jax.devices()),
        "limit_bytes": limit,
        "limit_source": source,
        "row_bytes": row_bytes,
        "placement": "replicate",
        "batch_size": workload.batch_size,
        "steps_per_trial": STEPS,
        "trials": trials,
        "largest_rows": best["rows"] if best else None,
        "largest_bytes": best["bytes"] if best else None,
        "largest_share": best["bytes"] / limit if best else None,
    }


def to_markdown(capacity: dict[str, Any]) -> str:
    """The probe's table and its one-line result."""
    c = capacity
    lines = [
        f"### Capacity: the largest float32 dataset ({FEATURES} features + 1 target, "
        f"{c['row_bytes']} bytes/row) that trains resident on {c['device']}",
        "",
        f"Placement {c['placement']}, {c['devices']} device(s), W2's model, batch "
        f"{c['batch_size']}, one epoch of {c['steps_per_trial']} steps per size; shares of "
        f"{c['limit_bytes']:,} bytes "
        f"({c['limit_source']}).",
        "",
        "| share | rows | bytes of rows | result | s |",
        "|---:|---:|---:|---|---:|",
    ]
    for t in c["trials"]:
        seconds = f"{t['seconds']:.1f}" if "seconds" in t else "–"
        lines.append(
            f"| {t['share']:.3f} | {t['rows']:,} | {t['bytes']:,} | {t['result']} | {seconds} |"
        )
    if c["largest_bytes"] is None:
        lines += ["", "No size trained."]
    else:
        lines += [
            "",
            f"Largest that trained: {c['largest_rows']:,} rows, {c['largest_bytes']:,} bytes, "
            f"{c['largest_share']:.1%} of {c['limit_bytes']:,} bytes.",
        ]
    refused = next((t for t in c["trials"] if t["result"] != "trained"), None)
    if refused is not None and "detail" in refused:
        lines += ["", f"First failure ({refused['result']}): {refused['detail']}"]
    return "\n".join(lines) + "\n"
