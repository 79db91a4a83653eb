"""The skip of the tests that run `horovodrun`, in one place: every tier but the
Horovod one lacks it. Backend-neutral (pytest and the standard library)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

NO_HOROVOD = pytest.mark.skipif(
    not (Path(sys.executable).parent / "horovodrun").exists(),
    reason="Horovod is not installed in this environment (TF 2.21 has no Horovod build); "
    "the Horovod CI tier runs this test in the venv .ci/horovod_env.sh prepares",
)

# The two-worker engines a multi-process test runs on: MultiWorkerMirroredStrategy,
# and Horovod where horovodrun is installed.
TWO_WORKER_ENGINES = [
    "multiworker",
    pytest.param("horovod", marks=[pytest.mark.horovod, NO_HOROVOD]),
]
