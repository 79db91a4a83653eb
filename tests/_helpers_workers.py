"""Launching the multi-process tests' workers, in one place: the repository root,
the environment a worker gets, a checked run, and `shardfeed launch`'s command
(`two_workers` also as `horovodrun -np 2`). Backend-neutral (the standard library)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TIMEOUT_S = 240


def worker_env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    for name in (
        "TF_CONFIG",
        "SHARDFEED_RANK",
        "SHARDFEED_WORLD_SIZE",
        "SHARDFEED_LOCAL_RANK",
        "SHARDFEED_LOCAL_SIZE",
    ):
        env.pop(name, None)
    return env


def run_checked(cmd, cwd):
    proc = subprocess.run(
        cmd, cwd=cwd, env=worker_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def launch_command(num_workers, *args, engine="multiworker"):
    return [
        str(BIN / "shardfeed"),
        "launch",
        "--num-workers",
        str(num_workers),
        "--engine",
        engine,
        "--timeout-s",
        str(TIMEOUT_S - 20),
        *args,
    ]


def two_workers(engine, script, *args):
    """The command that runs `script` with `args` on two workers of `engine` (for the
    other test files' worker scripts)."""
    if engine == "horovod":  # `horovodrun -np 2` itself, as users start it
        return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                sys.executable, str(script), *args]  # fmt: skip
    return launch_command(2, str(script), *args, engine=engine)
