"""Two simulated hosts for multi-host tests: network namespaces joined by a veth pair.

Each "host" is a network namespace holding a loopback interface and one end of
a veth pair with a private address (10.231.0.1/30 and 10.231.0.2/30): traffic
flows only between the two, never to the machine's own network. Creating
them needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the `ip` tool;
`two_hosts_or_skip` says which is missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence

ADDRESSES = ("10.231.0.1", "10.231.0.2")
INTERFACE = "sfnet"  # each host's end of the veth pair, renamed to one name as on a cluster


@dataclasses.dataclass(frozen=True)
class TwoHosts:
    namespaces: tuple[str, str]
    addresses: tuple[str, str] = ADDRESSES
    interface: str = INTERFACE

    def argv(self, host: int, program: Sequence[str]) -> list[str]:
        """`program` run inside host `host`'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[host], *program]

    def ssh_stand_in(self, path: str) -> str:
        """Writes an `ssh` stand-in at `path`: `AGENT [options] HOST COMMAND` runs
        COMMAND (one shell string, as ssh takes it) inside HOST's namespace."""
        cases = "".join(
            f"        {address}) ns={namespace}; shift; break;;\n"
            for address, namespace in zip(self.addresses, self.namespaces, strict=True)
        )
        with open(path, "w") as f:
            f.write(
                "#!/bin/bash\nwhile [ $# -gt 0 ]; do\n    case \"$1\" in\n"
                f"{cases}        *) shift;;\n    esac\ndone\n"
                'exec ip netns exec "$ns" sh -c "$*"\n'
            )
        os.chmod(path, 0o755)
        return path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def why_not() -> str | None:
    """Why two hosts cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "needs the `ip` tool (iproute2) to create network namespaces"
    if os.geteuid() != 0:
        return "creating network namespaces and a veth pair needs root (ip netns add)"
    return None


@contextlib.contextmanager
def two_hosts() -> Iterator[TwoHosts]:
    """Creates the two namespaces and their veth pair; deletes them (and it) on exit."""
    tag = f"{os.getpid() % 100000}"
    names = (f"sf{tag}a", f"sf{tag}b")  # also the veth ends' names (<= 15 characters)
    created: list[str] = []
    try:
        for name in names:
            _ip("netns", "add", name)
            created.append(name)
        _ip("link", "add", names[0], "type", "veth", "peer", "name", names[1])
        for name, address in zip(names, ADDRESSES, strict=True):
            _ip("link", "set", name, "netns", name)
            _ip("-n", name, "link", "set", name, "name", INTERFACE)
            _ip("-n", name, "addr", "add", f"{address}/30", "dev", INTERFACE)
            _ip("-n", name, "link", "set", INTERFACE, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield TwoHosts(names)
    finally:
        for name in created:  # deleting a namespace deletes its veth end, and the pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            _ip("link", "del", names[0])  # only if it never moved into its namespace
