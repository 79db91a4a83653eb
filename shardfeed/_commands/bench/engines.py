"""`shardfeed bench --engines`: per-step time of each engine, and what crosses.

One worker process (or several) per engine, training a bench workload (W2
unless `--engine-workloads` says otherwise) with `shardfeed.fit`; reported per
engine: replicas, ms per step, seconds per epoch, the ratio to one device and
the gradient bytes each replica sends per step.

Run as a worker: `python -m shardfeed._commands.bench.engines --engine mirrored --out f.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ENGINES = ("single", "mirrored", "multiworker", "horovod")
PER_REPLICA_BATCH = 256  # W2's batch; every workload trains at its own batch per replica
REPLICAS = 2
DEFAULT_ROWS = {"W2": 200_000}  # other workloads: their full rows


def default_rows(workload: str) -> int:
    """The rows `--engines` trains `workload` on when `--engine-rows` is not given."""
    from shardfeed._commands.bench.workloads import WORKLOADS

    return DEFAULT_ROWS.get(workload, WORKLOADS[workload].rows)


def _bytes_sent_per_step(model: Any, batch: int) -> int:
    """What one replica sends in a step's exchange: every dense gradient
    (float32), and for an `Embedding` the `batch` rows it looked up (repeats
    included), their int32 indices and a row count (`_tf/engines/gradients.py`)."""
    import keras
    import numpy as np

    sparse = {
        id(layer.embeddings)
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.Embedding)
    }
    sent = 0
    for v in model.trainable_variables:
        if id(v) in sparse:
            sent += (batch * (int(np.prod(v.shape[1:])) + 1) + 1) * 4
        else:
            sent += int(np.prod(v.shape)) * 4
    return sent


def _worker(args: argparse.Namespace) -> int:
    """One process of one engine: train and write timings (rank 0)."""
    import tensorflow as tf

    if args.engine == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * REPLICAS
        )
    import keras

    import shardfeed
    from shardfeed._commands.bench.timing import epoch_timer
    from shardfeed._commands.bench.workloads import WORKLOADS, build_model, compile_model, make_data

    world = shardfeed.init(args.engine)
    workload = WORKLOADS[args.workload]
    batch = workload.batch_size
    x, y = make_data(workload, args.rows, seed=0)
    with world.scope():
        keras.utils.set_random_seed(0)
        model = compile_model(build_model(workload, False, seed=0), workload)
        ds = shardfeed.ShardedResidentDataset(
            x, y, per_replica_batch_size=batch, seed=0, drop_remainder=True
        )
    timer = epoch_timer()
    history = shardfeed.fit(model, ds, epochs=args.epochs + 1, callbacks=[timer], verbose=0)
    times = timer.seconds
    if world.is_chief:
        steps = ds.plan.steps_per_epoch
        epoch_s = statistics.median(times[1:])
        result = {
            "engine": world.backend if args.engine == "auto" else args.engine,
            "workload": workload.name,
            "replicas": world.num_replicas_in_sync,
            "workers": world.world_size,
            "global_batch_size": ds.global_batch_size,
            "steps_per_epoch": steps,
            "warmup_s": times[0],
            "epoch_s": epoch_s,
            "ms_per_step": 1000 * epoch_s / steps,
            "gradient_bytes_per_step": _bytes_sent_per_step(model, batch),
            "final_loss": history.history["loss"][-1],
        }
        Path(args.out).write_text(json.dumps(result))
    return 0


def _command(engine: str, worker_args: list[str], horovod_python: str | None) -> list[str]:
    """The command that starts `engine`'s worker process(es).

    Workers run this module's file as a script: `shardfeed launch` and
    horovodrun start scripts, not `-m` modules.
    """
    script = str(Path(__file__).resolve())
    if engine == "multiworker":
        shardfeed_cli = Path(sys.executable).parent / "shardfeed"
        return [str(shardfeed_cli), "launch", "--num-workers", str(REPLICAS), script, *worker_args]
    if engine == "horovod":
        python = Path(horovod_python or sys.executable)
        return [
            str(python.parent / "horovodrun"),
            "-np",
            str(REPLICAS),
            "-H",
            f"localhost:{REPLICAS}",
            "--gloo",
            str(python),
            script,
            *worker_args,
        ]
    return [sys.executable, script, *worker_args]


def _run_bounded(
    command: list[str], env: dict[str, str], cwd: str, timeout_s: float
) -> subprocess.CompletedProcess:
    """Runs `command` in its own process group; past `timeout_s` the whole
    group is killed (the launcher and the workers it started, not only the
    launcher) before `subprocess.TimeoutExpired` is raised."""
    with subprocess.Popen(
        command,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def run_engines(
    rows: int,
    epochs: int,
    horovod_python: str | None,
    timeout_s: float = 900,
    workload: str = "W2",
) -> list[dict[str, Any]]:
    """Runs every available engine and returns one result dict each.

    Horovod runs only where `horovodrun` is installed (next to
    `horovod_python`, e.g. the venv `.ci/horovod_env.sh` makes); otherwise
    its row says why it was skipped.

    Args:
        rows: Rows each engine trains on (at least 2 batches of the
            workload for a full step on 2 replicas: batches are dropped, not
            padded).
        epochs: Timed epochs after the warm-up one.
        horovod_python: A Python with Horovod and `horovodrun` beside it.
        timeout_s: Bound on each engine's run; past it its processes are
            killed and `subprocess.TimeoutExpired` is raised.
        workload: The bench workload trained (`workloads.WORKLOADS`), at its
            batch per replica.

    Returns:
        One dict per engine in `ENGINES`: the worker's numbers plus
        `x_single`, or `engine` and `skipped` (why).

    Raises:
        subprocess.TimeoutExpired: An engine ran past `timeout_s`.

    Example:
        >>> [r["engine"] for r in run_engines(512, 1, None)]
        ['single', 'mirrored', 'multiworker', 'horovod']
    """
    results: list[dict[str, Any]] = []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for engine in ENGINES:
        python = Path(horovod_python or sys.executable)
        if engine == "horovod" and not (python.parent / "horovodrun").exists():
            results.append(
                {
                    "engine": engine,
                    "workload": workload,
                    "skipped": "horovodrun not installed here (pass "
                    "--horovod-python with the venv .ci/horovod_env.sh makes)",
                }
            )
            continue
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            worker_args = [
                "--engine",
                engine,
                "--workload",
                workload,
                "--rows",
                str(rows),
                "--epochs",
                str(epochs),
                "--out",
                str(out),
            ]
            print(f"  engines: {workload} {engine} ...", flush=True)
            proc = _run_bounded(_command(engine, worker_args, horovod_python), env, tmp, timeout_s)
            if proc.returncode != 0 or not out.exists():
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
                results.append(
                    {
                        "engine": engine,
                        "workload": workload,
                        "skipped": f"failed (exit {proc.returncode}): {tail[0]}",
                    }
                )
                continue
            results.append(json.loads(out.read_text()))
    single = next((r for r in results if r["engine"] == "single" and "ms_per_step" in r), None)
    for r in results:
        if single is not None and "ms_per_step" in r:
            r["x_single"] = r["ms_per_step"] / single["ms_per_step"]
    return results


def to_markdown(results: list[dict], rows: int, epochs: int, workload: str = "W2") -> str:
    """The engines table of one workload, one row per engine (a skipped one says why).

    Args:
        results: What `run_engines` returns for `workload`.
        rows: The rows it ran with.
        epochs: The timed epochs it ran with.
        workload: The workload it trained.

    Returns:
        Markdown: a heading with the conditions, then the table.
    """
    from shardfeed._commands.bench.workloads import WORKLOADS

    lines = [
        f"### Engines: {workload} model, {rows:,} rows, per-replica batch "
        f"{WORKLOADS[workload].batch_size}, median of {epochs} epochs",
        "",
        "| engine | workers x replicas | global batch | ms/step | s/epoch | x single device "
        "| bytes sent per replica per step | warm-up s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['engine']} | skipped: {r['skipped'].splitlines()[0]} |||||||")
            continue
        lines.append(
            f"| {r['engine']} | {r['workers']} x {r['replicas'] // r['workers']} "
            f"| {r['global_batch_size']} | {r['ms_per_step']:.3f} | {r['epoch_s']:.2f} "
            f"| {r.get('x_single', 1.0):.2f}x "
            f"| {r['gradient_bytes_per_step'] if r['replicas'] > 1 else 0:,} "
            f"| {r['warmup_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--workload", default="W2")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", required=True)
    return _worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
