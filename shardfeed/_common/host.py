"""This host: how many workers share it, as the launcher says (`local_size`),
and which host names mean it on every host alike (`is_loopback`).

`local_size` is read by the engine to pin one GPU per local worker and by the
memory check to give each local worker its share of the host's RAM;
`is_loopback` by everything that decides whether a job stays on one host (the
launcher's `--hosts` check, TF_CONFIG's ports, the exposure lines, JAX's
coordinator).
"""

from __future__ import annotations

import ipaddress
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


def is_loopback(host: str) -> bool:
    """Whether `host` names this host's loopback on every host alike.

    The rule, one for the whole package: an IP literal (IPv6 in brackets or
    not) in 127.0.0.0/8, ::1 or an IPv4-mapped 127.x (::ffff:127.0.0.1); or
    the name "localhost", in any case, with or without the root's trailing
    dot. Nothing else: other names are never resolved here, since what a name
    resolves to depends on the host resolving it (Debian maps a host's own
    name to 127.0.1.1 while the other hosts reach its network address;
    "a.localhost" resolves to loopback only where the resolver follows RFC
    6761), so callers that need it resolve and apply this rule to the
    addresses (`unresolvable_hosts`). A name that only looks like an address
    ("127.example.org") is a name. When unsure it says no: a host taken for
    loopback silences the exposure warnings and binds JAX's coordinator to
    127.0.0.1, where the other hosts cannot reach it.

    Example:
        >>> [is_loopback(h) for h in ("127.0.0.2", "[::1]", "LocalHost.", "10.0.0.1")]
        [True, True, True, False]
    """
    try:
        address = ipaddress.ip_address(host.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        name = host.strip().lower().removesuffix(".")
        return name == "localhost"
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
