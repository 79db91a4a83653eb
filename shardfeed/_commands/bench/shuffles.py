"""`shardfeed bench --shuffles`: what the three shuffles of several replicas cost.

W2 trained under 2 and 4 logical CPU devices and 2 MultiWorkerMirrored workers,
four ways: the global order at the default and a 1 MiB exchange buffer, the
local shuffle, and `placement="replicate"`; reported per row: epoch seconds,
the exchange's bytes, seconds and share of the epoch, device bytes per replica.

Run as a worker: `python -m shardfeed._commands.bench.shuffles --setup mirrored4 --out f.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

SETUPS = {"mirrored2": (1, 2), "mirrored4": (1, 4), "multiworker2": (2, 1)}  # workers, devices
SMALL_BUFFER_BYTES = 2**20
# (placement, shuffle, exchange_buffer_bytes; None: the default).
SHUFFLES: tuple[
    tuple[Literal["shard", "replicate"], bool | Literal["local"], int | None], ...
] = (
    ("shard", True, None),
    ("shard", True, SMALL_BUFFER_BYTES),
    ("shard", "local", None),
    ("replicate", True, None),
)
PER_REPLICA_BATCH = 256


def _worker(args: argparse.Namespace) -> int:
    import tensorflow as tf

    workers, devices = SETUPS[args.setup]
    if devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * devices
        )
    import keras

    import shardfeed
    from shardfeed._commands.bench.timing import epoch_timer
    from shardfeed._commands.bench.workloads import WORKLOADS, build_model, compile_model, make_data
    from shardfeed._data.exchange import buffer_bytes as resolved_buffer
    from shardfeed._data.exchange import staged_rows_per_row, staging_bytes

    world = shardfeed.init("multiworker" if workers > 1 else "auto")
    w2 = WORKLOADS["W2"]
    x, y = make_data(w2, args.rows, seed=0)
    results = []
    for placement, shuffle, buffer_bytes in SHUFFLES:
        options = (
            shardfeed.LoadOptions() if buffer_bytes is None
            else shardfeed.LoadOptions(exchange_buffer_bytes=buffer_bytes)
        )
        with world.scope():
            keras.utils.set_random_seed(0)
            model = compile_model(build_model(w2, False, seed=0), w2)
            ds = shardfeed.ShardedResidentDataset(
                x, y, per_replica_batch_size=PER_REPLICA_BATCH, seed=0, shuffle=shuffle,
                placement=placement, drop_remainder=True, load_options=options,
            )
        timer = epoch_timer()
        shardfeed.fit(model, ds, epochs=args.epochs + 1, callbacks=[timer], verbose=0)
        epoch_s = statistics.median(timer.seconds[1:])
        reports = ds.exchange.reports[1:] if ds.exchange is not None else []
        factor = staged_rows_per_row(world.num_replicas_in_sync, world.world_size, world.backend)
        buffer = resolved_buffer(
            options.exchange_buffer_bytes, ds.eval_plan, ds.columns.row_bytes
        )
        staged = staging_bytes(ds.eval_plan, ds.columns.row_bytes, buffer, factor) if reports else 0
        result = {
            "placement": placement,
            "shuffle": shuffle,
            "exchange_buffer_bytes": buffer,
            "rounds": statistics.median([r.rounds for r in reports]) if reports else 0,
            "epoch_s": epoch_s,
            "bytes_sent_per_replica": max((max(r.bytes_sent) for r in reports), default=0),
            "exchange_s": statistics.median([r.seconds for r in reports]) if reports else 0.0,
            "bytes_per_replica": ds.nbytes_on_device // len(ds.stores) + staged,
        }
        result["gb_per_s"] = (
            result["bytes_sent_per_replica"] / result["exchange_s"] / 1e9
            if result["exchange_s"] else 0.0
        )
        result["exchange_share"] = result["exchange_s"] / epoch_s
        results.append(result)
        del ds, model
    if world.is_chief:
        Path(args.out).write_text(json.dumps(
            {"setup": args.setup, "replicas": world.num_replicas_in_sync, "results": results}
        ))
    return 0


def run_shuffles(rows: int, epochs: int, timeout_s: float = 1800) -> list[dict[str, Any]]:
    """Runs every setup in `SETUPS`; one dict per setup (or `skipped`, why).

    Args:
        rows: W2 rows (at least 4 x 256: batches are dropped, not padded).
        epochs: Timed epochs after the warm-up one.
        timeout_s: Bound on each setup's run (its processes are killed past it).

    Returns:
        Per setup: `setup`, `replicas`, `results` (one dict per shuffle).
    """
    from shardfeed._commands.bench.engines import _run_bounded

    out_all = []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    script = str(Path(__file__).resolve())
    for setup, (workers, _) in SETUPS.items():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            args = [script, "--setup", setup, "--rows", str(rows), "--epochs", str(epochs),
                    "--out", str(out)]
            if workers > 1:
                cli = Path(sys.executable).parent / "shardfeed"
                command = [str(cli), "launch", "--num-workers", str(workers), *args]
            else:
                command = [sys.executable, *args]
            print(f"  shuffles: {setup} ...", flush=True)
            proc = _run_bounded(command, env, tmp, timeout_s)
            if proc.returncode != 0 or not out.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
                out_all.append({"setup": setup, "skipped": f"failed (exit {proc.returncode}): "
                                f"{tail[0]}"})
                continue
            out_all.append(json.loads(out.read_text()))
    return out_all


def to_markdown(setups: list[dict], rows: int, epochs: int) -> str:
    """The shuffles table: one row per setup and shuffle."""
    lines = [
        f"### Shuffles: W2 model, {rows:,} rows, per-replica batch {PER_REPLICA_BATCH}, "
        f"median of {epochs} epochs",
        "",
        "| setup | shuffle | epoch s | exchange MB sent/replica | exchange s | GB/s "
        "| share of epoch | device MB/replica |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in setups:
        if "skipped" in s:
            lines.append(f"| {s['setup']} | skipped: {s['skipped']} ||||||")
            continue
        for r in s["results"]:
            name = (
                "replicate" if r["placement"] == "replicate"
                else "shard, global" if r["shuffle"] is True else "shard, local"
            )
            if r.get("exchange_buffer_bytes") == SMALL_BUFFER_BYTES and r["shuffle"] is True:
                name += f", 1 MiB buffer ({r['rounds']:.0f} rounds)"

            lines.append(
                f"| {s['setup']} | {name} | {r['epoch_s']:.3f} "
                f"| {r['bytes_sent_per_replica'] / 1e6:.2f} | {r['exchange_s']:.3f} "
                f"| {r['gb_per_s']:.2f} | {r['exchange_share']:.0%} "
                f"| {r['bytes_per_replica'] / 1e6:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=tuple(SETUPS), required=True)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", required=True)
    return _worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
