"""A private network namespace for local workers, so their servers are not on the network.

A short-lived holder (ctypes, no `unshare`/`ip` binaries) unshares a network
namespace (in a user namespace when not root) and brings loopback up; the
launcher keeps it alive through open `/proc/<pid>/ns/*` descriptors, and each
worker `setns`-es into it and `exec`s its program (same pid). Inside there is
only 127.0.0.1: a script that needs the network must run without isolation.
"""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
from collections.abc import Callable, Sequence

from shardfeed._common import errors as _errors

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_HOLDER_TIMEOUT_S = 30.0

# Runs in the holder. Prints one line: "ready net", "ready user" (a user
# namespace too) or "error <reason>", then waits for stdin to close.
_HOLDER = f"""\
import ctypes, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
def fail(what):
    print("error", what, flush=True)
    sys.exit(1)
kind = "net"
if libc.unshare({_CLONE_NEWNET}) != 0:
    denied = os.strerror(ctypes.get_errno())
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare({_CLONE_NEWUSER} | {_CLONE_NEWNET}) != 0:
        fail(f"unshare(CLONE_NEWNET): {{denied}}; unshare(CLONE_NEWUSER | CLONE_NEWNET): "
             f"{{os.strerror(ctypes.get_errno())}}")
    kind = "user"
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{{uid}} {{uid}} 1"),
                           ("gid_map", f"{{gid}} {{gid}} 1")):
            with open(f"/proc/self/{{name}}", "w") as f:
                f.write(text)
    except OSError as err:
        fail(f"mapping the user into the user namespace: {{err}}")
try:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, request)[:18])[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
except OSError as err:
    fail(f"bringing up the loopback interface: {{err}}")
print("ready", kind, flush=True)
sys.stdin.read()
"""

# Runs first in each worker: enter the namespaces, close their descriptors,
# become the worker's program. Its own failure exits 126, as a shell's
# "cannot execute".
_ENTER = """\
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for fd in map(int, sys.argv[1].split(",")):
    if libc.setns(fd, 0) != 0:
        sys.stderr.write("shardfeed launch: cannot enter the workers' network namespace: "
                         + os.strerror(ctypes.get_errno()) + "\\n")
        sys.exit(126)
    os.close(fd)
os.execvp(sys.argv[2], sys.argv[2:])
"""


class NetworkIsolationError(OSError):
    """The workers' private network namespace could not be made."""


@dataclasses.dataclass(frozen=True)
class PrivateNetwork:
    """An open network namespace (and user namespace, when one was needed).

    Attributes:
        fds: Descriptors of the namespaces to enter, in order (user first).
        user_namespace: Whether a user namespace was needed (not root).
        close: Closes the descriptors; the namespace ends with its last process.
    """

    fds: tuple[int, ...]
    user_namespace: bool
    close: Callable[[], None]

    def enter_argv(self, python: str, program: Sequence[str]) -> list[str]:
        """The argv that runs `program` inside the namespace (pass `fds` to it).

        Args:
            python: The interpreter that runs the small entering program.
            program: The worker's own argv.

        Returns:
            `[python, "-S", "-c", <enter>, "<fd>,<fd>", *program]`.

        Example:
            >>> network.enter_argv("/usr/bin/python3", ["python", "t.py"])[-2:]
            ['python', 't.py']
        """
        return [python, "-S", "-c", _ENTER, ",".join(map(str, self.fds)), *program]


def _close_all(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def open_private_network(python: str) -> PrivateNetwork:
    """Makes a network namespace holding only a loopback interface that is up.

    Args:
        python: The interpreter to run the holder with.

    Returns:
        The open namespace; call `close()` once the workers are gone.

    Raises:
        NetworkIsolationError: If the system does not permit it (no
            CAP_SYS_ADMIN and no unprivileged user namespaces, as in many
            containers), with the reason.

    Example:
        >>> network = open_private_network(sys.executable)
        >>> network.close()
    """
    try:
        holder = subprocess.Popen(
            [python, "-S", "-c", _HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for the launcher is not for it
        )
    except OSError as err:
        raise NetworkIsolationError(err.errno, f"cannot start {python}: {err}") from err
    fds: list[int] = []
    # Popen with stdin=PIPE and stdout=PIPE above: both pipes exist.
    assert holder.stdin is not None and holder.stdout is not None
    try:
        ready, _, _ = select.select([holder.stdout], [], [], _HOLDER_TIMEOUT_S)
        line = holder.stdout.readline().decode("utf-8", "replace").strip() if ready else ""
        if not line.startswith("ready "):
            raise NetworkIsolationError(line.removeprefix("error ") or "no answer from the holder")
        user_namespace = line == "ready user"
        for kind in ("user",) * user_namespace + ("net",):
            fds.append(os.open(f"/proc/{holder.pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
    except BaseException:
        _close_all(fds)
        raise
    finally:
        # The open descriptors keep the namespace alive: the holder can go.
        holder.stdin.close()
        try:
            holder.wait(timeout=_HOLDER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        holder.stdout.close()
    return PrivateNetwork(tuple(fds), user_namespace, lambda: _close_all(fds))


def isolation_error_message(reason: str) -> str:
    """The error for `isolate_network=True` when no namespace can be made.

    Args:
        reason: Why the namespace could not be made.

    Returns:
        The message.

    Example:
        >>> isolation_error_message("Operation not permitted")[:40]
        'Network isolation of the local workers w'
    """
    return _errors.message(
        "Network isolation of the local workers was requested, but no private network "
        "namespace could be made (it needs root, CAP_SYS_ADMIN, or unprivileged user "
        "namespaces).",
        f"isolate_network=True ({reason})",
        "Run where namespaces are permitted, or pass `--isolate-network auto` (isolate when "
        "possible) or `off` to run the workers on the host's network.",
    )
