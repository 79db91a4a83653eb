"""Helpers shared by the JAX tier's tests (one place, not copied; named apart from
`tests/_helpers.py`, since both directories are on `sys.path`).

Imports neither JAX nor TensorFlow itself, so `conftest.py` can read
`NUM_CPU_DEVICES` before it configures JAX.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

ORDERS = [  # (placement, shuffle)
    ("shard", False),
    ("shard", True),  # the global order: rows move between devices each epoch
    ("shard", "local"),
    ("replicate", False),
    ("replicate", True),
]


def rows_of(epoch: Any) -> Any:
    """The `y` (= row number) of every row an epoch emits, in order."""
    import numpy as np

    return np.concatenate([np.asarray(batch.y) for _, batch in epoch])


def coordinate_images(batch: int, height: int, width: int, channels: int = 2) -> Any:
    """float32 images whose pixel (i, j) holds `1000 + 100 * i + j` in every
    channel: any pixel of an augmented image names where it came from."""
    import numpy as np

    grid = 1000.0 + 100 * np.arange(height)[:, None] + np.arange(width)[None, :]
    shape = (batch, height, width, channels)
    return np.ascontiguousarray(np.broadcast_to(grid[None, :, :, None], shape), np.float32)


NUM_CPU_DEVICES = 4
SUBPROCESS_TIMEOUT_S = 120.0


def jax_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process of the JAX tier: this checkout
    first on the path, the JAX backend, the CPU split as in this session."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["KERAS_BACKEND"] = "jax"
    env.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={NUM_CPU_DEVICES}")
    env.update(extra or {})
    return env


def run_python(
    code: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = SUBPROCESS_TIMEOUT_S,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs `python -c code args...` with this interpreter in a fresh process
    (JAX's backend and `sys.modules` start empty there); `check`: raise with
    its output when it fails."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=jax_env(env),
        cwd=REPO,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
        )
    return result


# Appended to a child's code: fails the child if anything imported TensorFlow.
ASSERT_NO_TENSORFLOW = (
    "\nimport sys as _sys\n"
    "assert 'tensorflow' not in _sys.modules, [m for m in _sys.modules if 'tensorflow' in m]\n"
)


def run_jax_processes(
    code: str, args: Sequence[str] = (), *, num_processes: int = 2, devices_per_process: int = 2
) -> list[dict]:
    """Runs `code` in `num_processes` `jax.distributed` processes on 127.0.0.1
    (`sys.argv[1:3]`: the coordinator port and the process id, then `args`),
    each with `devices_per_process` CPU devices; returns each one's
    `RESULT <json>` line, in process order (a failed process fails the test
    with its output)."""
    from shardfeed._common.ports import free_port

    port = free_port()
    env = jax_env({"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}"})
    # stdout apart from stderr: XLA's C++ logging writes to fd 2 unbuffered,
    # and on one merged pipe it landed inside a child's RESULT line.
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(port), str(i), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
        )
        for i in range(num_processes)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=SUBPROCESS_TIMEOUT_S))
    finally:
        # Every process is reaped, even when one failed or timed out: a
        # survivor would fail a later test with "subprocess is still running".
        for proc in procs:
            proc.kill()
            proc.communicate()
    results = []
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, f"--- stdout\n{stdout}\n--- stderr\n{stderr}"
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
    return results
