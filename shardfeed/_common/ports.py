"""Free TCP ports for workers, picked by the kernel and held until launch.

Separation of concerns: this module only finds ports; `local.py` writes them
into `TF_CONFIG` and `process.py` starts the workers.

How a port is picked: bind a socket to port 0 on the address the workers will
use and let the kernel choose an unused port. Holding every socket open until
just before the workers start means no two reservations (ours or another
program's bind to port 0) can get the same port while we build the workers'
environments.

The window that remains: a port is free again from `release()` until the
worker's gRPC server binds it, which happens after the worker has started
Python and imported TensorFlow (typically a few seconds). A process that binds
that exact port in the meantime makes the worker fail with "address already in
use"; the launcher then reports that worker's exit and stops the others, and a
rerun picks new ports. The kernel hands out port-0 binds from the ephemeral
range in a spread-out order, so an unrelated program taking the same port in
those seconds is unlikely, not impossible. Passing the bound socket itself to
the worker would close the window, but TensorFlow's server cannot adopt a
socket.
"""

from __future__ import annotations

import errno
import socket

from shardfeed._common import errors as _errors


class PortReservation:
    """Holds `count` kernel-chosen free ports on `host` until released.

    Args:
        count: Number of distinct ports to reserve.
        host: IPv4 address to bind, e.g. "127.0.0.1" for local workers or ""
            for every interface.

    Raises:
        ValueError: If `count` is not a positive integer.
        OSError: If the kernel cannot bind a socket.

    Example:
        >>> with PortReservation(2, "127.0.0.1") as reservation:
        ...     ports = reservation.ports
        ...     reservation.release()  # just before starting the workers
        ...     start_workers(ports)
    """

    def __init__(self, count: int, host: str = "127.0.0.1") -> None:
        if not isinstance(count, int) or count < 1:
            raise ValueError(
                _errors.message(
                    "The number of ports to reserve must be a positive integer.",
                    f"count={count!r}",
                    "Pass the number of workers.",
                )
            )
        self.host = host
        self._sockets: list[socket.socket] = []
        try:
            for _ in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self._sockets.append(sock)
                # No SO_REUSEADDR: it would let a second bind share a port we hold.
                sock.bind((host, 0))
        except BaseException:
            self.release()
            raise
        self.ports: tuple[int, ...] = tuple(s.getsockname()[1] for s in self._sockets)

    def release(self) -> None:
        """Closes the held sockets so the workers can bind the ports.

        Call it as late as possible: right before the workers start. Calling it
        twice is harmless.
        """
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def free_port(host: str = "127.0.0.1") -> int:
    """Returns one port that was free on `host` a moment ago.

    The socket is closed before returning, so the window described in the
    module docstring starts now; prefer `PortReservation` when you can hold
    the port until the consumer starts.

    Args:
        host: IPv4 address to bind ("" for every interface).

    Returns:
        The port number.

    Example:
        >>> port = free_port("127.0.0.1")
    """
    with PortReservation(1, host) as reservation:
        return reservation.ports[0]


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket holds `port` on `host` ("" for every interface).

    Binds the port with SO_REUSEADDR, as gRPC does, so that a closed
    connection's TIME_WAIT does not count; the port is free again when this
    returns. False also when the bind fails for another reason (e.g. no IPv4
    here): the runtime that binds it next reports that itself.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
    except OSError as err:
        return err.errno == errno.EADDRINUSE
    finally:
        probe.close()
    return False
