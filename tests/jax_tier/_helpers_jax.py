"""Helpers shared by the JAX tier's tests (one place, not copied; named apart from
`tests/_helpers.py`, since both directories are on `sys.path`).

Imports neither JAX nor TensorFlow itself, so `conftest.py` can read
`NUM_CPU_DEVICES` before it configures JAX.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
