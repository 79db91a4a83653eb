"""`shardfeed demo` at a tiny scale: it runs, and TensorFlow's start-up lines stay out."""

from __future__ import annotations

import os
import subprocess
import sys

# What TensorFlow 2.21 prints at start-up unless told otherwise (absl's
# header, the oneDNN notice, the CPU-feature notice).
NOISE = ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard")


def test_demo_output_has_no_tensorflow_start_up_lines():
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")
    }
    command = ["demo", "--rows", "2000", "--epochs", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "shardfeed._commands.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "| shardfeed.fit |" in result.stdout and "| model.fit |" in result.stdout
    assert not [line for line in output.splitlines() if any(n in line for n in NOISE)]
