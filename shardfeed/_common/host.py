"""How many workers share this host, as the launcher says (`local_size`).

Read by the engine to pin one GPU per local worker and by the memory check to
give each local worker its share of the host's RAM.
"""

from __future__ import annotations

from collections.abc import Mapping

# Variables in which launchers say how many of their processes share this host.
LOCAL_SIZE_VARIABLES = (
    "SHARDFEED_LOCAL_SIZE",
    "HOROVOD_LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
)


def local_size(environ: Mapping[str, str]) -> int | None:
    """How many workers share this host, when the launcher says so.

    Args:
        environ: The environment, e.g. `os.environ`.

    Returns:
        The first positive count found in `LOCAL_SIZE_VARIABLES`, or None.

    Example:
        >>> local_size({"SLURM_STEP_TASKS_PER_NODE": "2(x3),1"})
        2
    """
    for name in LOCAL_SIZE_VARIABLES:
        text = environ.get(name, "").split("(")[0].split(",")[0]  # SLURM: "2(x3),1"
        if text.isdigit() and int(text) > 0:
            return int(text)
    return None
