"""Several hosts: what `shardfeed launch --hosts ... --host-index I` starts on host I.

The job's layout (`HostLayout`: ranks host by host, worker s of a host on
`port_base + s`), this host's checks, and its `WorkerSpec`s with the whole
cluster's TF_CONFIG. Such workers run on the host's network (their servers
reachable), which each host's launcher says in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import socket
import tempfile
from collections.abc import Mapping, Sequence

from shardfeed._common import errors as _errors
from shardfeed._common.host import is_loopback
from shardfeed._distribute import startup as _startup
from shardfeed._distribute.credentials import MTLS_DIR_VARIABLE
from shardfeed._distribute.launch_env import READY_DIR_VARIABLE
from shardfeed._distribute.tf_config import unresolvable_hosts
from shardfeed._launch.local import cluster_worker_specs
from shardfeed._launch.process import StartupWatch, System, run_workers

DEFAULT_PORT_BASE = 8888  # as SLURM's SHARDFEED_PORT_BASE (`_tf/engines/resolver.py`)

_HOSTS_FIX = (
    "Pass every host once, in the same order on every host: `--hosts 10.0.0.1,10.0.0.2` (the "
    "workers split evenly) or `--hosts 10.0.0.1:4,10.0.0.2:2` (workers per host), each host "
    "by the name or IPv4 address the others reach it at."
)


@dataclasses.dataclass(frozen=True)
class HostLayout:
    """Which host runs which ranks, and on which ports.

    Ranks go host by host: host 0 runs ranks `0 .. workers_per_host[0] - 1`,
    host 1 the next ones, and so on; worker `s` of a host (its local rank)
    listens on `port_base + s`. Every host computes the same layout from the
    same arguments, so nothing is exchanged.

    Attributes:
        hosts: Each host's name or IPv4 address, as the other hosts reach it.
        workers_per_host: How many workers each host runs.
        port_base: The first worker's port on every host.
    """

    hosts: tuple[str, ...]
    workers_per_host: tuple[int, ...]
    port_base: int = DEFAULT_PORT_BASE

    @property
    def num_workers(self) -> int:
        return sum(self.workers_per_host)

    def addresses(self) -> list[str]:
        """Every worker's "host:port", in rank order (the TF_CONFIG cluster)."""
        return [
            f"{host}:{self.port_base + slot}"
            for host, count in zip(self.hosts, self.workers_per_host, strict=True)
            for slot in range(count)
        ]

    def ranks(self, host_index: int) -> range:
        """The ranks host `host_index` runs."""
        first = sum(self.workers_per_host[:host_index])
        return range(first, first + self.workers_per_host[host_index])


def parse_hosts(
    hosts: str | Sequence[str], num_workers: int, port_base: int | None = None
) -> HostLayout:
    """Reads `--hosts`: "h1,h2" (workers split evenly) or "h1:4,h2:2" (workers per host).

    Args:
        hosts: Comma-separated entries, or a sequence of entries, `host` or
            `host:workers`.
        num_workers: The job's number of workers (`--num-workers`), on all hosts.
        port_base: The first worker's port on each host (None: 8888).

    Returns:
        The layout.

    Raises:
        ValueError: For an empty, repeated or malformed entry (IPv6 literals
            included: use a host name), counts on some entries only, counts
            that do not add up to `num_workers`, workers that do not split
            evenly, or ports past 65535.

    Example:
        >>> parse_hosts("10.0.0.1,10.0.0.2", 4).workers_per_host
        (2, 2)
    """
    text = hosts if isinstance(hosts, str) else ",".join(hosts)
    entries = [entry.strip() for entry in text.split(",")]
    received = f"hosts={text!r}, num_workers={num_workers}"
    _errors.require(
        all(entries) and all(entry.count(":") <= 1 for entry in entries),
        "Each `--hosts` entry is `host` or `host:workers` (IPv6 literals are not accepted: "
        "name the host).",
        received,
        _HOSTS_FIX,
    )
    names = [entry.partition(":")[0].strip() for entry in entries]
    counts = [entry.partition(":")[2].strip() for entry in entries]
    repeated = sorted({name for name in names if names.count(name) > 1})
    _errors.require(
        not repeated,
        "Each host appears once in `--hosts` (its workers get consecutive ranks and ports).",
        f"{received} (repeated: {', '.join(repeated)})",
        _HOSTS_FIX,
    )
    if any(counts):
        _errors.require(
            all(count.isdigit() and int(count) > 0 for count in counts)
            and sum(map(int, counts)) == num_workers,
            "With worker counts in `--hosts`, every host has a positive count and they add up "
            "to `--num-workers`.",
            received,
            _HOSTS_FIX,
        )
        per_host = tuple(map(int, counts))
    else:
        _errors.require(
            num_workers % len(names) == 0,
            "Without worker counts in `--hosts`, `--num-workers` must split evenly over the hosts.",
            received,
            "Give each host its count, e.g. `--hosts a:3,b:2`, or a multiple of the number of "
            "hosts as `--num-workers`.",
        )
        per_host = (num_workers // len(names),) * len(names)
    port_base = DEFAULT_PORT_BASE if port_base is None else port_base
    _errors.require(
        _errors.is_integer(port_base) and 0 < port_base and port_base + max(per_host) <= 65536,
        "`port_base` must leave a port in [1, 65535] for every worker of a host "
        "(port_base + workers on the host - 1).",
        f"port_base={port_base!r}, workers per host={max(per_host)}",
        "Pass a port that is free on every host, e.g. `--port-base 8888`.",
    )
    return HostLayout(tuple(names), per_host, int(port_base))


def _is_this_machine(host: str) -> bool:
    """Whether `host` resolves to an IPv4 address one of this machine's interfaces holds."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        return False
    for ip in {str(info[4][0]) for info in infos}:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((ip, 0))  # only an address of our own interfaces binds
            except OSError:
                continue
            return True
    return False


def check_this_host(layout: HostLayout, host_index: int) -> None:
    """What this host can check before starting its workers.

    - No loopback entry in a list of several hosts (the other hosts would
      reach themselves).
    - Every other host's name resolves here, and not to loopback.
    - `host_index` names this host: when its entry is not an address of this
      machine but another entry is, the index is wrong. (When no entry is
      local, e.g. behind NAT, the index is taken as given.)
    - This host's ports are free on every interface (TensorFlow's servers and
      JAX's multi-host coordinator bind them so).

    Raises:
        ValueError: For a loopback entry, an unresolvable name or a wrong index.
        OSError: (errno EADDRINUSE) For a port in use, naming it.
    """
    received = f"hosts={','.join(layout.hosts)}, host_index={host_index}"
    loopback = [host for host in layout.hosts if is_loopback(host)]
    _errors.require(
        len(layout.hosts) == 1 or not loopback,
        "A multi-host job names each host as the others reach it, never by a loopback address.",
        f"{received} (loopback: {', '.join(loopback)})",
        "Name each host by its address on the network the hosts share, e.g. 10.0.0.1.",
    )
    own = layout.hosts[host_index]
    problems = unresolvable_hosts(layout.addresses(), own)
    _errors.require(
        not problems,
        "Every host in `--hosts` must resolve on every host, to an address the workers reach.",
        f"{received}; seen from {socket.gethostname()}: {'; '.join(problems)}",
        "Use IPv4 addresses in `--hosts`, or make the names resolve (DNS or /etc/hosts).",
    )
    mine = [i for i, host in enumerate(layout.hosts) if _is_this_machine(host)]
    if mine and host_index not in mine:
        _errors.require(
            False,
            "`--host-index` is this host's position in `--hosts`.",
            f"{received}: entry {host_index} ({own}) is not an address of this host; entry "
            f"{', '.join(map(str, mine))} ({', '.join(layout.hosts[i] for i in mine)}) is",
            f"Run with `--host-index {mine[0]}` here, and each other host with its own index.",
        )
    for rank in layout.ranks(host_index):
        address = layout.addresses()[rank]
        port = int(address.rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            try:
                probe.bind(("", port))
            except OSError as err:
                if err.errno != errno.EADDRINUSE:
                    continue  # leave the verdict to TensorFlow
                raise OSError(
                    errno.EADDRINUSE,
                    _errors.message(
                        f"Port {port} of worker rank {rank} is in use on this host: the "
                        "worker must listen on it on every interface (TensorFlow's server; "
                        "on JAX, rank 0's coordinator).",
                        f"{received}, port_base={layout.port_base} -> {address}",
                        f"Stop the program that holds it (`ss -ltnp 'sport = :{port}'` names it), "
                        "or pass the same other `--port-base` on every host.",
                    ),
                ) from None


def run_multihost(
    program: Sequence[str],
    *,
    layout: HostLayout,
    host_index: int,
    base_env: Mapping[str, str],
    grace_s: float,
    timeout_s: float | None,
    system: System,
    startup_timeout_s: float | None = None,
    progress_timeout_s: float | None = None,
) -> int:
    """Starts host `host_index`'s workers of a multi-host job and waits for them.

    Each worker gets the whole cluster in TF_CONFIG, its global rank in
    `SHARDFEED_RANK`, its place on this host in `SHARDFEED_LOCAL_RANK` and
    `SHARDFEED_LOCAL_SIZE`, and `SHARDFEED_STARTUP_TIMEOUT_S` set to
    `startup_timeout_s` ("none" for None): `shardfeed.init()` waits that long
    for the workers of the other hosts, which this launcher cannot watch.

    Args:
        program: The argv every worker runs.
        layout: The job's hosts and ports (`parse_hosts`).
        host_index: This host's position in `layout.hosts`.
        base_env: The environment the workers start from.
        grace_s: Seconds between SIGTERM and SIGKILL when stopping workers.
        timeout_s: Stop this host's workers after this many seconds (None: no limit).
        system: Operating-system calls.
        startup_timeout_s: Seconds the workers wait for each other at start-up.
        progress_timeout_s: Stop when this host's workers' positions stand
            still this long while some of them wait for others (None: not
            watched; the other hosts' workers are not seen from here).

    Returns:
        The exit code, as `process.run_workers`.

    Raises:
        ValueError, OSError: As `check_this_host`, or if a worker cannot start.

    Example:
        >>> run_multihost(["python", "train.py"], layout=parse_hosts("10.0.0.1,10.0.0.2", 2),
        ...               host_index=0, base_env=dict(os.environ), grace_s=60.0,
        ...               timeout_s=None, system=System())
        0
    """
    check_this_host(layout, host_index)
    addresses = layout.addresses()
    ranks = layout.ranks(host_index)
    with contextlib.ExitStack() as stack:
        ready_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="shardfeed-ready-"))
        timeout_text = "none" if startup_timeout_s is None else f"{startup_timeout_s:g}"
        env = {
            **base_env,
            READY_DIR_VARIABLE: ready_dir,
            _startup.STARTUP_TIMEOUT_VARIABLE: timeout_text,
        }
        specs = cluster_worker_specs(program, addresses, ranks, env)
        tasks = [(f"worker {rank}", address) for rank, address in enumerate(addresses)]
        line = _startup.exposure_line(tasks)
        # The workers of a launch leave this line to their launcher, one per host.
        notes = [] if line is None else [line.removeprefix("shardfeed: ")]
        if MTLS_DIR_VARIABLE in base_env:
            notes.append(
                "JAX workers: the `jax.distributed` coordinator admits only processes holding "
                f"the credentials in {base_env[MTLS_DIR_VARIABLE]} (mutual TLS); TensorFlow and "
                "Horovod workers refuse them (no authentication there)."
            )
        return run_workers(
            specs,
            grace_s=grace_s,
            timeout_s=timeout_s,
            system=system,
            notes=notes,
            startup=StartupWatch(
                ready_dir,
                startup_timeout_s,
                first_rank=ranks.start,
                progress_timeout_s=progress_timeout_s,
            ),
        )
