"""The interpreter under test imports this checkout, from anywhere (workers start elsewhere).

A cached venv once held an editable install of an older clone: tests run from
the repository root imported the checkout (the root sits on `sys.path`), while
worker processes started from other directories imported the stale one or
nothing. Both tiers (the main `.venv` and the Horovod venv) run this test.
"""

import os
import subprocess
import sys

import pytest

# The Horovod tier runs `-m "horovod or install"`: it checks its own venv too.
pytestmark = pytest.mark.install

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_workers_started_elsewhere_import_this_checkout():
    out = subprocess.run(
        [sys.executable, "-c", "import shardfeed; print(shardfeed.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    imported = os.path.dirname(os.path.dirname(os.path.realpath(out.stdout.strip())))
    assert imported == os.path.realpath(REPO_ROOT)


def test_console_script_is_installed_beside_the_interpreter():
    script = os.path.join(os.path.dirname(sys.executable), "shardfeed")
    assert os.access(script, os.X_OK), f"{script} missing: the venv has no install of shardfeed"
