"""The launch/ recipes: shell syntax, a header saying what to edit, and a real script path.

The cluster recipes (SLURM, several hosts over ssh) get dry checks: this
machine has no cluster. The local recipe runs for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
RECIPES = [
    "slurm.sbatch",
    "mpirun-hostfile.sh",
    "horovodrun-multihost.sh",
    "local-multiworker.sh",
    "multihost-launch.sh",
]
EXAMPLE_SCRIPT = "examples/train.py"


def test_recipe_set_is_complete():
    present = sorted(p.name for p in LAUNCH.iterdir())
    assert present == sorted([*RECIPES, "hostfile.example", "README.md"])
    readme = (LAUNCH / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in RECIPES)  # each recipe is described


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to check shell syntax")
@pytest.mark.parametrize("name", RECIPES)
def test_recipe_is_valid_bash(name):
    result = subprocess.run(
        ["bash", "-n", str(LAUNCH / name)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_header_says_what_to_edit(name):
    text = (LAUNCH / name).read_text()
    assert text.startswith("#!"), "a recipe runs as a program"
    header = text.split("\n\n", 1)[0]
    assert "Edit before" in header
    assert "set -euo pipefail" in text  # a failing step stops the recipe


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_runs_the_example_script(name):
    text = (LAUNCH / name).read_text()
    assert f"SCRIPT=${{SCRIPT:-{EXAMPLE_SCRIPT}}}" in text
    assert '"$SCRIPT" "$@"' in text  # script arguments pass through unchanged
    assert (REPO / EXAMPLE_SCRIPT).is_file()


def test_slurm_recipe_starts_tasks_with_srun():
    text = (LAUNCH / "slurm.sbatch").read_text()
    assert re.search(r"^#SBATCH --ntasks-per-node=\d+$", text, re.M)
    assert re.search(r"^#SBATCH --gpus-per-task=1$", text, re.M)  # one task per GPU
    assert "\nsrun --distribution=block" in text  # the layout tf_config_from_slurm relies on


def test_mpirun_recipe_hostfile_example_exists():
    text = (LAUNCH / "mpirun-hostfile.sh").read_text()
    assert "launch/hostfile.example" in text
    lines = [
        line
        for line in (LAUNCH / "hostfile.example").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines and all(re.fullmatch(r"\S+ slots=\d+", line) for line in lines)


def test_local_recipe_uses_shardfeed_launch():
    text = (LAUNCH / "local-multiworker.sh").read_text()
    assert 'shardfeed launch --num-workers "$NUM_WORKERS"' in text


def test_multihost_recipe_runs_shardfeed_launch_with_this_hosts_index():
    text = (LAUNCH / "multihost-launch.sh").read_text()
    assert 'launch --num-workers "$NUM_WORKERS" --hosts "$HOSTS"' in text
    assert '--host-index "$HOST_INDEX"' in text
    # Without HOST_INDEX it stops before starting anything, saying what to set
    # (two hosts that both default to 0 would both claim the chief's rank).
    env = {k: v for k, v in os.environ.items() if k != "HOST_INDEX"}
    result = subprocess.run(
        ["bash", str(LAUNCH / "multihost-launch.sh")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 1
    assert "HOST_INDEX: set HOST_INDEX to the position of this host in HOSTS" in result.stderr


@pytest.mark.slow
@pytest.mark.multi_process
def test_local_recipe_trains_two_workers(tmp_path):
    """The one recipe this machine can run: two local workers train the example
    together and every rank reports the same final weights."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GRACE_S": "10",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    out = tmp_path / "result"
    result = subprocess.run(
        ["bash", str(LAUNCH / "local-multiworker.sh"), "--rows", "2000", "--epochs", "1",
         "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    ranks = sorted(tmp_path.glob("result.rank*.npz"))
    assert [p.name for p in ranks] == ["result.rank0.npz", "result.rank1.npz"]
    first, second = (np.load(p) for p in ranks)
    assert int(first["num_replicas"]) == 2  # one job of two workers, not two single ones
    np.testing.assert_array_equal(first["weights"], second["weights"])


HOROVOD_BIN = Path(sys.executable).parent


@pytest.mark.multi_process
@pytest.mark.horovod
@pytest.mark.skipif(
    not (HOROVOD_BIN / "horovodrun").exists() or not (HOROVOD_BIN / "mpirun").exists(),
    reason="needs horovodrun and an mpirun next to this interpreter (the Horovod CI tier's venv)",
)
def test_horovodrun_recipe_starts_ranks_under_mpi(tmp_path):
    """The recipe as written, on one host, with Horovod's default (MPI) controller.

    Before the fix, horovodrun's own `-bind-to none` made Open MPI 5's prterun
    take `none` for the program (exit 66, "Executable: none").
    """
    script = tmp_path / "rank.py"
    # Under the MPI controller only mpirun's variables number the ranks.
    script.write_text(
        "import os\nprint('RANK', os.environ['OMPI_COMM_WORLD_RANK'], flush=True)\n"
    )
    env = {
        **os.environ,
        "PATH": f"{HOROVOD_BIN}{os.pathsep}{os.environ['PATH']}",
        "HOSTS": "localhost:2",
        "NUM_WORKERS": "2",
        "PYTHON": sys.executable,
        "SCRIPT": str(script),
    }
    result = subprocess.run(
        ["bash", str(LAUNCH / "horovodrun-multihost.sh")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "RANK 0" in output and "RANK 1" in output


def test_mpirun_recipe_passes_the_network_interface_to_every_rank():
    text = (LAUNCH / "mpirun-hostfile.sh").read_text()
    assert "NETWORK_INTERFACE=${NETWORK_INTERFACE:-}" in text
    assert "export SHARDFEED_NETWORK_INTERFACE=$NETWORK_INTERFACE" in text
    # Open MPI: each variable set is sent to the remote ranks (Hydra: -genvall).
    assert "for variable in SHARDFEED_NETWORK_INTERFACE SHARDFEED_MTLS_DIR" in text
    assert 'flags+=(-x "$variable")' in text


MPI_BIN = Path(sys.executable).parent


@pytest.mark.multi_process
@pytest.mark.skipif(
    not (MPI_BIN / "mpirun").exists(), reason="needs an mpirun next to this interpreter"
)
def test_mpirun_recipe_ranks_announce_the_interface_address(tmp_path):
    """The recipe as written on one host (the hostfile says localhost): with
    NETWORK_INTERFACE set, every rank's TF_CONFIG names that interface's address;
    with MTLS_DIR set, every rank gets SHARDFEED_MTLS_DIR."""
    pytest.importorskip("mpi4py", reason="the MPI ranks exchange addresses with mpi4py")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    script = tmp_path / "rank.py"
    script.write_text(
        "import json\nfrom shardfeed._distribute.tf_config import tf_config_from_mpi\n"
        "print('CLUSTER', json.dumps(tf_config_from_mpi(port=None)['cluster']), flush=True)\n"
        "import os; print('MTLS', os.environ['SHARDFEED_MTLS_DIR'], flush=True)\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
        "PATH": f"{MPI_BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "HOSTFILE": str(hostfile),
        "NUM_WORKERS": "2",
        "PYTHON": sys.executable,
        "SCRIPT": str(script),
        "NETWORK_INTERFACE": "lo",
        "MTLS_DIR": str(tmp_path / "creds"),
    }
    result = subprocess.run(
        ["bash", str(LAUNCH / "mpirun-hostfile.sh")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    clusters = re.findall(r"CLUSTER (.*)", output)
    assert len(clusters) == 2 and clusters[0] == clusters[1], output[-3000:]
    assert all(a.startswith("127.0.0.1:") for a in json.loads(clusters[0])["worker"])
    assert re.findall(r"MTLS (.*)", output) == [str(tmp_path / "creds")] * 2
